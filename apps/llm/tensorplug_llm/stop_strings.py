"""Stop strings over streamed text, as OpenAI's and llama.cpp's ``stop`` parameter.

Generation produces text a token at a time, and a stop string can be split across
tokens (``"\\n\\n"`` as two ``"\\n"`` tokens, ``"END"`` as ``"EN"`` + ``"D"``). So text
that could still be the start of a stop string is held back rather than sent: once
the next pieces show it is not one, it goes out; once a stop string is complete,
everything from its first character on is dropped and the request is over. A client
never sees any part of a stop string, which is what OpenAI documents ("the returned
text will not contain the stop sequence").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["StopMatcher", "StopResult"]


@dataclass(frozen=True)
class StopResult:
    """What may be sent now, and whether a stop string ended the text."""

    text: str
    stopped: bool


class StopMatcher:
    """Feeds text pieces, returns what is safe to send; ``flush`` returns the held rest."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        #: the stop string that ended the text (llama-server's ``stopping_word``)
        self.matched: str | None = None

    def feed(self, piece: str) -> StopResult:
        if self.stopped:
            return StopResult("", True)
        text = self._held + piece
        found = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if found:
            first, self.matched = min(found, key=lambda f: f[0])
            self._held = ""
            self.stopped = True
            return StopResult(text[:first], True)
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return StopResult(text[: len(text) - keep], False)

    def flush(self) -> str:
        """The text held back as a possible stop string that the end proved was not."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

"""The chat's input line: line editing, history, and Ctrl-C at the prompt.

On a terminal, lines are read with :func:`input` after importing :mod:`readline` where
the platform has it (GNU readline or libedit: arrows, Ctrl-A/E, Ctrl-R, the up arrow for
earlier messages). The history is kept between sessions in the user's state folder
(``platformdirs``: ``~/.local/state/tensorplug/chat_history`` on Linux), at most
:data:`HISTORY_LENGTH` lines, so that it never grows without bound. Without a terminal
(a pipe, a file) lines are read as they come, with no prompt.

Ctrl-C at the prompt clears what was typed; at an empty prompt right after another
Ctrl-C (one that stopped a reply, or one at the prompt) it leaves the chat, as Ctrl-D
does. One stray Ctrl-C never ends a conversation.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TextIO

from tensorplug.signals import HeldCtrlC

__all__ = ["HISTORY_LENGTH", "PROMPT", "PromptReader", "history_path"]

#: Lines of history kept between sessions.
HISTORY_LENGTH = 1000
#: What the chat shows when it waits for a message.
PROMPT = "> "


def history_path() -> Path:
    """Where the chat's history lives: the user's state folder (XDG_STATE_HOME on Linux)."""
    from platformdirs import user_state_path

    return user_state_path("tensorplug") / "chat_history"


def _readline() -> ModuleType | None:
    """The platform's readline module, or None (Windows without pyreadline)."""
    try:
        import readline
    except ImportError:
        return None
    return readline


class PromptReader:
    """The messages typed, one per line, after ``first`` (``-p``) when given.

    Iterating ends at end of input (Ctrl-D) or at a second Ctrl-C in a row at an empty
    prompt; :meth:`reply_interrupted` tells it that a Ctrl-C just stopped a reply, so
    that one more at the prompt leaves."""

    def __init__(self, first: str | None = None, log: TextIO | None = None) -> None:
        self.first = first
        self.log = log or sys.stderr
        self.interactive = sys.stdin.isatty() and sys.stdout.isatty()
        self.readline = _readline() if self.interactive else None
        self.history: Path | None = None
        self._interrupted = False

    def reply_interrupted(self) -> None:
        self._interrupted = True

    def __iter__(self) -> Iterator[str]:
        if self.first:
            yield self.first
        if not self.interactive:
            yield from sys.stdin
            return
        self._load_history()
        try:
            while (line := self._read()) is not None:
                yield line
        finally:
            # leaving already: a Ctrl-C now (a third one in a row) must not cut the write
            # short and surface as a traceback from this generator's close
            with HeldCtrlC():
                self._save_history()

    def _read(self) -> str | None:
        """The next line, or None when the user leaves."""
        while True:
            try:
                line = input(PROMPT)
            except EOFError:  # Ctrl-D
                print(file=self.log)
                return None
            except KeyboardInterrupt:
                typed = self.readline.get_line_buffer() if self.readline is not None else ""
                if self._interrupted and not typed.strip():
                    print(file=self.log)
                    return None
                self._interrupted = True
                print("\n(Ctrl-C again or Ctrl-D leaves the chat)", file=self.log)
                continue
            self._interrupted = False
            return line

    def _load_history(self) -> None:
        if self.readline is None:
            return
        self.history = history_path()
        self.readline.set_history_length(HISTORY_LENGTH)
        with contextlib.suppress(OSError):  # none yet, or unreadable: start afresh
            self.readline.read_history_file(str(self.history))

    def _save_history(self) -> None:
        if self.readline is None or self.history is None:
            return
        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            self.readline.write_history_file(str(self.history))
        except OSError as e:  # a read-only home: the chat itself went fine
            print(f"note: the chat history was not saved to {self.history}: {e}", file=self.log)

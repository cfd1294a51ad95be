"""SentencePiece (``tokenizer.ggml.model = llama``), as llama.cpp's ``llm_tokenizer_spm``.

Spaces become ``▁`` (with one prepended to a fragment that starts the text or follows
a special token, when ``add_space_prefix``), the text is split into characters, and
adjacent pieces merge greedily — always the pair whose merged text is the
highest-scoring vocabulary entry, leftmost first on ties — until no pair forms a
token. A piece that is not a token is spelt as its UTF-8 bytes with the ``<0xXX>``
byte tokens ("byte fallback"), or the unknown token where a byte has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tensorplug.errors import RunError

from .merge import merge_symbols

__all__ = ["SPACE", "SpmTokenizer"]

SPACE = "\u2581"  # ▁


class SpmTokenizer:
    """Encodes raw text fragments with a SentencePiece vocabulary."""

    def __init__(
        self,
        ids: Mapping[str, int],
        scores: Sequence[float],
        unk: int | None,
        add_space_prefix: bool,
    ) -> None:
        self.ids = ids
        self.scores = scores
        self.unk = unk
        self.add_space_prefix = add_space_prefix
        self.byte_ids = [ids.get(f"<0x{b:02X}>") for b in range(256)]

    def _key(self, left: str, right: str) -> float | None:
        tid = self.ids.get(left + right)
        return None if tid is None else -self.scores[tid]

    def encode(self, text: str, after_special: bool) -> list[int]:
        """Ids of one fragment; ``after_special``: it starts the text or follows a
        special token, so it gets the space prefix (llama.cpp's ``is_prev_special``)."""
        if self.add_space_prefix and after_special:
            text = " " + text
        out: list[int] = []
        for piece in merge_symbols(list(text.replace(" ", SPACE)), self._key):
            tid = self.ids.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte_fallback(piece))
        return out

    def _byte_fallback(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            tid = self.byte_ids[b]
            if tid is None:
                tid = self.unk
            if tid is None:
                raise RunError(
                    f"cannot encode {piece!r}: the vocabulary has neither a byte token "
                    f"<0x{b:02X}> nor an unknown token"
                )
            ids.append(tid)
        return ids

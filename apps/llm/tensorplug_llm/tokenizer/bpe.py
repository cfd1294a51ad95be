"""Byte-level BPE (``tokenizer.ggml.model = gpt2``), as llama.cpp's ``llm_tokenizer_bpe``.

GPT-2's trick: every byte is first mapped to a printable character (``' '`` → ``Ġ``,
``'\\n'`` → ``Ċ``), so a token is a string of such characters and any text, in any
encoding, can be spelt. The text is cut into words by the pre-tokenizer, each word is
byte-mapped and merged by the ranked rules of ``tokenizer.ggml.merges`` (lowest rank
first), and a piece that is not a token is spelt one byte-token at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .merge import merge_symbols
from .pretokenize import PreTokenizer

__all__ = ["BYTE_TO_CHAR", "CHAR_TO_BYTE", "BpeTokenizer", "byte_decode"]


def _byte_chars() -> list[str]:
    """GPT-2's byte → character table: printable Latin-1 bytes stand for themselves,
    the other 68 take the code points from 256 on, in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars: list[str] = [""] * 256
    for b in keep:
        chars[b] = chr(b)
    n = 0
    for b in range(256):
        if not chars[b]:
            chars[b] = chr(256 + n)
            n += 1
    return chars


BYTE_TO_CHAR: list[str] = _byte_chars()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(text: str) -> str:
    """``text``'s UTF-8 bytes, each as its GPT-2 character."""
    return text.encode("utf-8").decode("latin-1").translate(_ENCODE_TABLE)


def byte_decode(token: str) -> bytes:
    """The bytes a byte-level token stands for. A character outside the table (a
    hand-added token) is kept as its own UTF-8."""
    out = bytearray()
    for c in token:
        b = CHAR_TO_BYTE.get(c)
        if b is None:
            out += c.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


class BpeTokenizer:
    """Encodes raw text fragments with a byte-level BPE vocabulary."""

    _CACHE_LIMIT = 1 << 16

    def __init__(self, ids: Mapping[str, int], merges: Sequence[str], pre: PreTokenizer) -> None:
        self.ids = ids
        self.pre = pre
        # a rule "a b" joins a and b; byte-level symbols never hold a space, so the rule's
        # own text is the lookup key (llama.cpp splits at the first space after index 0)
        self.ranks = {rule: rank for rank, rule in enumerate(merges)}
        self._words: dict[str, list[int]] = {}  # the same word always gives the same ids

    def _key(self, left: str, right: str) -> int | None:
        return self.ranks.get(f"{left} {right}")

    def encode(self, text: str, after_special: bool = False) -> list[int]:
        """Ids of one fragment (``after_special`` is unused: BPE has no space prefix)."""
        out: list[int] = []
        for word in self.pre.split(text):
            ids = self._words.get(word)
            if ids is None:
                ids = self._encode_word(byte_encode(word))
                if len(self._words) >= self._CACHE_LIMIT:
                    self._words.clear()
                self._words[word] = ids
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> list[int]:
        if self.pre.ignore_merges and word in self.ids:
            return [self.ids[word]]
        out: list[int] = []
        for piece in merge_symbols(list(word), self._key):
            tid = self.ids.get(piece)
            if tid is not None:
                out.append(tid)
                continue
            for c in piece:  # spell it byte by byte; bytes without a token are dropped
                byte_id = self.ids.get(c)
                if byte_id is not None:
                    out.append(byte_id)
        return out

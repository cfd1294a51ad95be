"""WordPiece (``tokenizer.ggml.model = bert``), as llama.cpp's ``llm_tokenizer_wpm``.

BERT-style normalisation first: optionally strip accents (NFD, then drop combining
marks) and lowercase; drop control characters; split on whitespace, and make every
punctuation mark, ASCII symbol and CJK ideograph a word of its own. Then each word,
with a phantom ``▁`` in front, is cut greedily into the longest vocabulary entries
from the left; a word that cannot be cut completely becomes one unknown token.

GGUF stores BERT's vocabulary the way llama.cpp's converter rewrites it: a word-initial
piece ``hello`` as ``▁hello`` and a continuation ``##llo`` as plain ``llo``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from .spm import SPACE

__all__ = ["WpmTokenizer", "bert_words"]

_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip


def _is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def bert_words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """BERT's basic tokenizer: ``text`` normalised and cut into words."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words: list[str] = []
    word: list[str] = []

    def finish() -> None:
        if word:
            words.append("".join(word))
            word.clear()

    for c in text:
        if c.isspace():
            finish()
            continue
        cat = unicodedata.category(c)
        if c in "\x00\ufffd" or cat in ("Cc", "Cf", "Co", "Cs"):
            continue
        if strip_accents and cat.startswith("M"):
            continue
        if lowercase:
            c = c.lower()[0]  # the simple one-character mapping, as llama.cpp's tolower
        if cat.startswith("P") or (c < "\x7f" and cat.startswith("S")) or _is_cjk(c):
            finish()
            words.append(c)
        else:
            word.append(c)
    finish()
    return words


class WpmTokenizer:
    """Encodes raw text fragments with a WordPiece vocabulary."""

    def __init__(
        self, ids: Mapping[str, int], unk: int | None, lowercase: bool, strip_accents: bool
    ) -> None:
        self.ids = ids
        self.unk = unk
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.max_len = max((len(t) for t in ids), default=1)

    def encode(self, text: str, after_special: bool = False) -> list[int]:
        """Ids of one fragment (``after_special`` is unused: every word gets its ``▁``)."""
        out: list[int] = []
        for word in bert_words(text, self.lowercase, self.strip_accents):
            ids = self._cut(SPACE + word)
            if ids:
                out.extend(ids)
            elif self.unk is not None:
                out.append(self.unk)
        return out

    def _cut(self, word: str) -> list[int]:
        """Longest-match-first pieces of ``word``, or [] when some position has none."""
        ids: list[int] = []
        i, n = 0, len(word)
        while i < n:
            for j in range(min(n, i + self.max_len), i, -1):
                tid = self.ids.get(word[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                return []
        return ids

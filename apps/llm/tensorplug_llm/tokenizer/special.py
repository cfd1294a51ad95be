"""Special and user-defined tokens, found in raw text before the model's algorithm runs.

llama.cpp (``tokenizer_st_partition``) cuts the text at every occurrence of a special
token's text, longest tokens first, so ``<|im_start|>`` becomes its one id instead of
``<``, ``|``, ``im``… Control and unknown tokens are matched only when the caller
asks (``parse_special``: chat templates, never user-typed text, which must not be able
to forge them); user-defined tokens always are, as Hugging Face tokenizers do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["Fragment", "partition"]

Fragment = str | int  # raw text still to encode, or a token id already found


def partition(text: str, specials: Iterable[tuple[str, int]]) -> list[Fragment]:
    """``text`` cut at each occurrence of the given ``(token text, id)`` pairs, tried
    in the order given (llama.cpp: longest first); empty text pieces are left out."""
    fragments: list[Fragment] = [text] if text else []
    for token, tid in specials:
        cut: list[Fragment] = []
        for frag in fragments:
            if isinstance(frag, int) or token not in frag:
                cut.append(frag)
                continue
            parts = frag.split(token)
            for k, part in enumerate(parts):
                if k:
                    cut.append(tid)
                if part:
                    cut.append(part)
        fragments = cut
    return fragments


def by_length(tokens: Sequence[str], ids: Iterable[int]) -> list[tuple[str, int]]:
    """``(text, id)`` of ``ids``, longest text first (the stable order keeps ties by id)."""
    return sorted(((tokens[i], i) for i in ids if tokens[i]), key=lambda p: -len(p[0]))

"""The word moves of a repack (:mod:`..repack`): every move of a block of eight rows
done before the next block.

A repacked block is the eight rows' blocks transposed, a word of each row side by side
(:class:`..repack.PackedLayout`). numpy makes each of a layout's moves a pass of its own
over the whole matrix, in loops of eight words: each pass writes a part of every cache
line of the destination again (Q6_K's codes are six moves, each a third of every 96
bytes), and numpy's cost per loop comes every eight words. Repacking that way runs at a
fraction of a copy's speed, and would be most of what a launch of a model of Q6_K or
Q8_0 weights does beyond llama.cpp's. Here a block's bytes are written once, while they
are in the cache, which takes a good part off each matrix's moves.

The moves come as a table, one row a move: ``(item, at, to, words, every)`` (bytes of
a word: 1, 2 or 4; its meaning is :class:`..repack.Move`'s). The arrays come as the
views the words need, which the caller checks are aligned: the natural blocks as
16-bit words (every move starts at an even byte of an even-sized block) and bytes,
the repacked ones as 32-bit words (every repacked block and move is a multiple of 4
bytes), 16-bit words and bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._numba_cache import kernel

__all__ = ["repack_moves"]


@kernel()
def repack_moves(
    natural16: Any, natural8: Any, packed32: Any, packed16: Any, packed8: Any,
    groups: int, nb: int, size: int, block: int, moves: Any,
) -> None:  # fmt: skip
    """Groups of eight rows of ``nb`` blocks of ``size`` bytes (``natural``: row after
    row) into repacked blocks of ``block`` bytes (``packed``: group after group, block
    after block), by the move table ``moves``."""
    row = nb * size
    half_row = row // 2
    for g in range(groups):
        for b in range(nb):
            src = g * 8 * row + b * size
            dst = (g * nb + b) * block
            for m in range(moves.shape[0]):
                item, at, to = moves[m, 0], moves[m, 1], moves[m, 2]
                words, step = moves[m, 3], moves[m, 4] * 8 * moves[m, 0]
                if item == 4:  # two 16-bit halves: a natural block's words are unaligned
                    for w in range(words):
                        d = (dst + to + w * step) // 4
                        s = (src + at + 4 * w) // 2
                        for r in range(8):
                            lo = np.uint32(natural16[s + r * half_row])
                            hi = np.uint32(natural16[s + r * half_row + 1])
                            packed32[d + r] = lo | (hi << np.uint32(16))
                elif item == 2:
                    for w in range(words):
                        d = (dst + to + w * step) // 2
                        s = (src + at + 2 * w) // 2
                        for r in range(8):
                            packed16[d + r] = natural16[s + r * half_row]
                else:
                    for w in range(words):
                        d = dst + to + w * step
                        s = src + at + w
                        for r in range(8):
                            packed8[d + r] = natural8[s + r * row]

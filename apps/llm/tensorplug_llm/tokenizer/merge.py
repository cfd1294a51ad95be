"""Greedy pair merging, the loop SPM and BPE share.

Both algorithms start from a word split into symbols and repeatedly join one adjacent
pair: the pair with the best key, and of equal keys the leftmost. SPM's key is the
merged token's score (higher first), BPE's the merge rule's rank (lower first); this
module takes the key as a function so one implementation serves both.

The order is llama.cpp's: a priority queue of pairs, stale entries skipped when
popped, one merge at a time. A pair a merge creates competes at once with the rest,
so ids match llama.cpp even for merge lists no trainer would write; and a long word
costs O(n log n), not the O(n²) of rescanning every pair after each merge.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["merge_symbols"]


def merge_symbols(sym: list[str], key: Callable[[str, str], float | None]) -> list[str]:
    """Merge adjacent symbols of ``sym`` (modified in place) while some pair has a key;
    the smallest key merges first, the leftmost of equal keys.

    A linked list over ``sym`` and a heap of candidate pairs ``(key, left, right, text)``:
    a popped pair whose sides changed since it was pushed is stale and skipped — the
    same lazy deletion llama.cpp uses, so the merge order is the same.
    """
    n = len(sym)
    nxt = [*range(1, n), -1]
    prv = list(range(-1, n - 1))
    heap: list[tuple[float, int, int, str]] = []

    def push(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        k = key(sym[left], sym[right])
        if k is not None:
            heapq.heappush(heap, (k, left, right, sym[left] + sym[right]))

    for i in range(n - 1):
        push(i, i + 1)
    while heap:
        _, left, right, text = heapq.heappop(heap)
        if not sym[left] or not sym[right] or sym[left] + sym[right] != text:
            continue
        sym[left] = text
        sym[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        push(prv[left], left)
        push(left, nxt[left])
    return [s for s in sym if s]

"""Copies of a graph placed in one buffer, every tensor fenced by sentinel bytes.

The conformance kit does its own simple placement instead of using the graph
allocator: every tensor that owns memory (leafs and non-view nodes) gets its own
aligned slot — no reuse, so every intermediate result survives for comparison — with a
gap of at least :data:`GAP` bytes before and after it. The gaps hold a known pattern;
after each node runs they are read back, and a changed byte is an out-of-bounds write
whose neighbours name the culprit. Tensor memory itself starts out as :data:`POISON`
(``0xFF``: NaN for every float type and for a quantized block's scale, ``-1`` for
integers), so an element a kernel forgot to write shows up as a NaN, never as a
plausible stale value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..buffer import Buffer, BufferType
from ..tensor import Tensor
from ..transfer import tensor_alloc, tensor_get, tensor_set, view_init
from ..types import Type

__all__ = ["GAP", "POISON", "Placement", "footprint"]

#: Minimum sentinel bytes before and after every tensor.
GAP = 64
#: The byte every tensor's memory is filled with before inputs are written.
POISON = 0xFF

# A fixed pseudo-random byte pattern, indexed by absolute buffer offset so that no two
# gaps look alike and no plain constant (0, 0xFF, a float's bytes) can match it.
_PATTERN = ((np.arange(4096, dtype=np.uint32) * 2654435761) >> 13).astype(np.uint8)


def _pattern(start: int, stop: int) -> np.ndarray:
    idx = np.arange(start, stop) % _PATTERN.size
    return _PATTERN[idx]


def footprint(view: Tensor) -> np.ndarray:
    """Which bytes of its base a view's elements cover, as a boolean mask of the base span."""
    base = view.base
    mask = np.zeros(base.nbytes, dtype=bool)
    t = view.type
    shape = list(view.shape)
    if t.is_quantized:
        shape[-1] //= t.block_size
    starts = np.full((1,) * len(shape), view.view_offs, dtype=np.int64)
    for axis, (n, stride) in enumerate(zip(shape, view.strides, strict=True)):
        ax = np.arange(n, dtype=np.int64).reshape(
            [-1 if i == axis else 1 for i in range(len(shape))]
        )
        starts = starts + ax * stride
    cover = (starts.reshape(-1, 1) + np.arange(t.type_size)).reshape(-1)
    mask[cover[cover < mask.size]] = True
    return mask


@dataclass(frozen=True)
class _Fence:
    start: int
    stop: int
    before: Tensor | None  # the tensor that ends where the gap starts
    after: Tensor | None  # the tensor that starts where the gap stops


class Placement:
    """Tensors placed in one fresh buffer of ``buft``, each fenced by sentinel gaps.

    ``owners`` are tensors that own memory (not views); views are given memory with
    :meth:`init_views`. With ``gap=0`` this is plain back-to-back placement (no sentinels).
    """

    def __init__(self, buft: BufferType, owners: Sequence[Tensor], gap: int = GAP) -> None:
        align = max(1, buft.alignment)
        offsets: list[int] = []
        fences: list[_Fence] = []
        cursor, prev = 0, None
        for t in owners:
            offset = -(-(cursor + gap) // align) * align
            if gap:
                fences.append(_Fence(cursor, offset, prev, t))
            offsets.append(offset)
            cursor, prev = offset + buft.alloc_size(t), t
        size = cursor + gap
        if gap:
            fences.append(_Fence(cursor, size, prev, None))
        # one I8 tensor over the whole buffer reads and writes the gaps
        self.arena = Tensor(Type.I8, (max(size, 1),), name="sentinel-arena")
        size = max(size, 1, buft.alloc_size(self.arena))
        self.buffer: Buffer = buft.alloc_buffer(size)
        tensor_alloc(self.buffer, self.arena, 0)
        for t, offset in zip(owners, offsets, strict=True):
            tensor_alloc(self.buffer, t, offset)
        self.fences = fences

    @staticmethod
    def init_views(tensors: Sequence[Tensor]) -> None:
        for t in tensors:
            if t.view_src is not None and t.buffer is None:
                view_init(t)

    def fill(self) -> None:
        """Poison every byte, then write the sentinel pattern into each gap."""
        self.buffer.clear(POISON)
        for f in self.fences:
            tensor_set(self.arena, _pattern(f.start, f.stop), f.start)

    def violations(self) -> list[str]:
        """A message for each gap whose sentinel bytes changed (empty when all are intact)."""
        if not self.fences:
            return []
        mem = np.frombuffer(tensor_get(self.arena), dtype=np.uint8)
        found = []
        for f in self.fences:
            changed = np.flatnonzero(mem[f.start : f.stop] != _pattern(f.start, f.stop))
            if changed.size:
                found.append(_describe(f, changed))
        return found

    def free(self) -> None:
        self.buffer.free()


def _describe(f: _Fence, changed: np.ndarray) -> str:
    first, last = int(changed[0]), int(changed[-1])
    gap = f.stop - f.start
    n = f"{changed.size} of {gap} sentinel bytes changed"
    # blame the nearer neighbour: a write past one tensor's end lands early in the gap
    if f.before is not None and (f.after is None or first < gap - 1 - last):
        where = f"from {first} bytes past its end"
        return f"out-of-bounds write after {f.before.describe()} ({n}, {where})"
    if f.after is not None:
        return (
            f"out-of-bounds write before {f.after.describe()} "
            f"({n}, from {gap - last} bytes before its start)"
        )
    return f"out-of-bounds write in the buffer's guard bytes ({n})"

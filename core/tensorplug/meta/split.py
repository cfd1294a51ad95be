"""Split states: how one tensor of the meta device is laid out over its member devices.

As in ggml's ``ggml-backend-meta.h``, a tensor is *mirrored* (a full copy on every
member), *split* along one axis (each member holds a slice), or *partial* (each member
holds a partial sum, to be added up by an all-reduce). Axes are numbered as in ggml:
**axis 0 is the innermost** (numpy's last axis, ``shape[-1]``), axis 1 the next one
out, and so on, so an axis means the same thing for tensors of any rank. For a weight
``W (n_out, n_in)``, axis 1 is its rows (output features) and axis 0 its columns (the
reduction dimension of ``mul_mat``).

A split may be uneven and may have *segments*: a fused QKV matrix splits each of its
Q, K and V parts over the members separately, so each member gets a slice of all
three. ``sizes[s][d]`` is the extent of segment ``s`` on member ``d``.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError, ShapeError
from ..tensor import Tensor
from ..types import Type

__all__ = [
    "SplitAxis",
    "SplitState",
    "check_state",
    "even_sizes",
    "host_assemble",
    "host_slice",
    "np_axis",
    "slice_shape",
]


class SplitAxis(enum.IntEnum):
    AXIS_0 = 0
    AXIS_1 = 1
    AXIS_2 = 2
    AXIS_3 = 3
    MIRRORED = 10
    PARTIAL = 11


@dataclass(frozen=True)
class SplitState:
    """The layout of one tensor over the members (see the module docstring)."""

    axis: SplitAxis
    sizes: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def mirrored(cls) -> SplitState:
        return _MIRRORED

    @classmethod
    def partial(cls) -> SplitState:
        return _PARTIAL

    @classmethod
    def split(cls, axis: int, sizes: Sequence[int] | Sequence[Sequence[int]]) -> SplitState:
        """Split along ggml ``axis`` with one extent per member, or one tuple of extents per
        member for each segment (``[[q0, q1], [k0, k1], [v0, v1]]``)."""
        if not 0 <= axis <= 3:
            raise InvalidArgumentError(
                f"split axis must be 0..3 (ggml numbering, 0 = innermost), got {axis}"
            )
        if sizes and isinstance(sizes[0], (list, tuple)):
            segs = [tuple(int(n) for n in seg) for seg in sizes]  # type: ignore[union-attr]
        else:
            segs = [tuple(int(n) for n in sizes)]  # type: ignore[arg-type]
        if not segs or not segs[0] or any(len(s) != len(segs[0]) for s in segs):
            raise InvalidArgumentError("every segment needs one extent per member device")
        if any(n < 0 for s in segs for n in s):
            raise InvalidArgumentError(f"split extents must be >= 0, got {segs}")
        return cls(SplitAxis(axis), tuple(segs))

    @property
    def is_split(self) -> bool:
        return self.axis <= SplitAxis.AXIS_3

    @property
    def n_members(self) -> int:
        return len(self.sizes[0]) if self.sizes else 0

    def extent(self, member: int) -> int:
        """Member ``member``'s total extent along the split axis (all segments)."""
        return sum(seg[member] for seg in self.sizes)

    @property
    def total(self) -> int:
        return sum(sum(seg) for seg in self.sizes)

    def ranges(self, member: int) -> list[tuple[int, int]]:
        """The ``[start, stop)`` index ranges along the axis that member ``member`` holds."""
        out, base = [], 0
        for seg in self.sizes:
            start = base + sum(seg[:member])
            out.append((start, start + seg[member]))
            base += sum(seg)
        return out

    def scaled(self, axis: int, factor_num: int, factor_den: int) -> SplitState | None:
        """The same partition on another axis, each extent × num / den; None if not whole."""
        segs = []
        for seg in self.sizes:
            new = []
            for n in seg:
                if (n * factor_num) % factor_den:
                    return None
                new.append(n * factor_num // factor_den)
            segs.append(tuple(new))
        return SplitState(SplitAxis(axis), tuple(segs))

    def moved(self, axis: int) -> SplitState:
        return SplitState(SplitAxis(axis), self.sizes) if self.is_split else self

    def describe(self) -> str:
        if not self.is_split:
            return self.axis.name.lower()
        parts = "+".join("/".join(str(n) for n in seg) for seg in self.sizes)
        return f"axis {int(self.axis)} [{parts}]"


_MIRRORED = SplitState(SplitAxis.MIRRORED)
_PARTIAL = SplitState(SplitAxis.PARTIAL)


def np_axis(axis: int, ndim: int) -> int:
    """numpy's axis for ggml ``axis`` of a tensor with ``ndim`` dimensions."""
    return ndim - 1 - axis


def even_sizes(n: int, weights: Sequence[float], granularity: int = 1) -> tuple[int, ...]:
    """``n`` split in proportion to ``weights``, each part a multiple of ``granularity``.

    llama.cpp's ``--tensor-split 3,1`` semantics: the parts follow the cumulative
    proportions, rounded to the granularity, so they always add up to ``n``.
    """
    if n % granularity:
        raise ShapeError(f"cannot split {n} into parts that are multiples of {granularity}")
    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise InvalidArgumentError(
            f"split proportions must be >= 0 with a positive sum, got {list(weights)}"
        )
    units, acc, bounds = n // granularity, 0.0, [0]
    for w in weights:
        acc += w
        bounds.append(round(units * acc / total))
    bounds[-1] = units
    return tuple((b - a) * granularity for a, b in itertools.pairwise(bounds))


def slice_shape(tensor: Tensor, state: SplitState, member: int) -> tuple[int, ...]:
    """The shape of member ``member``'s part of ``tensor``."""
    if not state.is_split:
        return tensor.shape
    ax = np_axis(int(state.axis), tensor.ndim)
    shape = list(tensor.shape)
    shape[ax] = state.extent(member)
    return tuple(shape)


def member_offset(base: Tensor, state: SplitState, member: int, byte_offset: int) -> int:
    """Where a contiguous view starting ``byte_offset`` bytes into ``base`` starts in member
    ``member``'s part of ``base``. Valid when the view begins on a whole split block (the
    inner axes and the split axis in full), which the split rules require of such views."""
    k = int(state.axis)
    inner = 1
    for a in range(k):
        inner *= base.shape[np_axis(a, base.ndim)]
    ts, bs = base.type.type_size, base.type.block_size
    elems = byte_offset * bs // ts
    return (elems // (inner * state.total)) * inner * state.extent(member) * ts // bs


def _byte_view(t: Type, shape: Sequence[int], data: np.ndarray) -> np.ndarray:
    """Raw bytes as ``(*shape[:-1], row_bytes)``: the last axis in bytes, blocks kept whole."""
    row = shape[-1] // t.block_size * t.type_size
    return data.reshape(*shape[:-1], row)


def _byte_ranges(tensor: Tensor, state: SplitState, member: int) -> list[tuple[int, int]]:
    """:meth:`SplitState.ranges` in units of the byte view's split axis (bytes on axis 0)."""
    if int(state.axis) != 0:
        return state.ranges(member)
    ts, bs = tensor.type.type_size, tensor.type.block_size
    return [(a * ts // bs, b * ts // bs) for a, b in state.ranges(member)]


def host_slice(tensor: Tensor, state: SplitState, member: int, full: np.ndarray) -> np.ndarray:
    """Member ``member``'s part of ``full`` (the tensor's bytes, C order) as contiguous bytes."""
    arr = _byte_view(tensor.type, tensor.shape, full)
    if not state.is_split:
        return arr.reshape(-1)
    ax = np_axis(int(state.axis), tensor.ndim)
    pieces = [arr.take(range(a, b), axis=ax) for a, b in _byte_ranges(tensor, state, member)]
    return np.ascontiguousarray(np.concatenate(pieces, axis=ax)).reshape(-1)


def host_assemble(tensor: Tensor, state: SplitState, parts: Sequence[np.ndarray]) -> np.ndarray:
    """The tensor's bytes put together from every member's part (:func:`host_slice` undone)."""
    if not state.is_split:
        return parts[0]
    out = _byte_view(tensor.type, tensor.shape, np.empty(tensor.nbytes, np.uint8))
    ax = np_axis(int(state.axis), tensor.ndim)
    for member, part in enumerate(parts):
        ranges = _byte_ranges(tensor, state, member)
        shape = list(out.shape)
        shape[ax] = sum(b - a for a, b in ranges)
        piece, at = part.reshape(shape), 0
        for a, b in ranges:
            dst: list[slice] = [slice(None)] * out.ndim
            src: list[slice] = [slice(None)] * out.ndim
            dst[ax], src[ax] = slice(a, b), slice(at, at + b - a)
            out[tuple(dst)] = piece[tuple(src)]
            at += b - a
    return out.reshape(-1)


def check_state(tensor: Tensor, state: SplitState, n_members: int) -> None:
    """Refuse a state that does not fit ``tensor`` (wrong total, partial quant blocks)."""
    if not state.is_split:
        return
    if state.n_members != n_members:
        raise ShapeError(
            f"split state of {tensor.describe()} names {state.n_members} members, the meta "
            f"device has {n_members}"
        )
    if int(state.axis) >= tensor.ndim:
        raise ShapeError(f"{tensor.describe()} has no axis {int(state.axis)} to split")
    extent = tensor.shape[np_axis(int(state.axis), tensor.ndim)]
    if state.total != extent:
        raise ShapeError(
            f"split of {tensor.describe()} along axis {int(state.axis)} adds up to {state.total}, "
            f"not its extent {extent}"
        )
    bs = tensor.type.block_size
    if int(state.axis) == 0 and any(n % bs for seg in state.sizes for n in seg):
        raise ShapeError(
            f"{tensor.describe()} is split inside its {tensor.type.name} blocks of {bs}: every "
            f"extent along axis 0 must be a multiple of {bs}"
        )
    if any(state.extent(m) == 0 for m in range(n_members)):
        raise ShapeError(
            f"split of {tensor.describe()} leaves a member with nothing ({state.describe()}); "
            "give every member a share, or mirror the tensor"
        )

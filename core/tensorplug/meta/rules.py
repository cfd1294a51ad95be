"""How each op carries split states from its sources to its result (ggml's per-op switch).

:func:`plan` answers for one node: the state of its result, and for each source whether
a *mirrored* source must be cut to a split state on the fly (each member then reads its
own part of its full copy, through a view). A combination the meta device cannot compute
raises :class:`MetaUnsupported` with the reason — ggml's meta backend asserts there; we
report "unsupported", and the scheduler runs that node on a plain device.

``mul_mat`` follows ggml (Megatron's column and row parallelism):

=====================  ==================  =====================================
weight ``W``           input ``x``         result
=====================  ==================  =====================================
mirrored               mirrored            mirrored
axis 1 (output rows)   mirrored            axis 0 (features)
mirrored               axis ≥ 1 (tokens)   that axis
axis 0 (reduction)     axis 0, same parts  partial → all-reduce → mirrored
axis 0 (reduction)     mirrored            partial (``x`` cut to match) → mirrored
=====================  ==================  =====================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UnsupportedError
from ..opcodes import Op
from ..tensor import Tensor
from .split import SplitAxis, SplitState, np_axis

__all__ = ["MetaUnsupported", "Plan", "plan"]

MIRRORED = SplitState.mirrored()


class MetaUnsupported(UnsupportedError):
    """The meta device cannot split this node; the reason says why."""


@dataclass(frozen=True)
class Plan:
    """A node's result state and, per source, the state a mirrored source is cut to
    (None: each member uses its own copy of the source as it is)."""

    out: SplitState
    cut: tuple[SplitState | None, ...]

    @property
    def all_reduce(self) -> bool:
        return self.out.axis is SplitAxis.PARTIAL


def _no(node: Tensor, why: str) -> MetaUnsupported:
    return MetaUnsupported(f"{node.op.value} {node.describe()}: {why}")


def _ne(t: Tensor, axis: int) -> int:
    """ggml extent ``ne[axis]`` (1 beyond the tensor's rank)."""
    return t.shape[np_axis(axis, t.ndim)] if axis < t.ndim else 1


def _fit(node: Tensor, src: Tensor, have: SplitState, want: SplitState) -> SplitState | None:
    """How ``src`` (in state ``have``) serves a computation in state ``want``: as it is
    (None), or cut from its mirrored copy (the returned state)."""
    if have == want or not want.is_split:
        if have.is_split and not want.is_split:
            raise _no(node, f"source {src.describe()} is split ({have.describe()}) but the "
                      f"result is {want.describe()}")  # fmt: skip
        return None
    if have.is_split:
        raise _no(node, f"sources are split differently ({have.describe()} vs {want.describe()})")
    if have.axis is SplitAxis.PARTIAL:
        raise _no(node, "a partial source must be all-reduced first")
    extent = _ne(src, int(want.axis))
    if extent == 1:
        return None  # broadcast along the split axis: every member reads it whole
    if extent != want.total:
        raise _no(node, f"source {src.describe()} spans {extent} along axis {int(want.axis)}, "
                  f"the split covers {want.total}")  # fmt: skip
    if int(want.axis) == 0 and any(n % src.type.block_size for seg in want.sizes for n in seg):
        raise _no(node, f"cannot cut {src.describe()} inside its quantization blocks")
    return want


def _elementwise(node: Tensor, states: Sequence[SplitState]) -> Plan:
    """Result shaped like ``src[0]``: the one split among the sources wins; mirrored
    sources are cut to it (or broadcast)."""
    split = [s for s in states if s.is_split]
    want = split[0] if split else MIRRORED
    for t, s in zip(node.src, states, strict=True):
        if s.is_split and _ne(t, int(s.axis)) != _ne(node, int(s.axis)):
            raise _no(node, f"source {t.describe()} is split along a broadcast axis")
    return Plan(want, tuple(_fit(node, t, s, want) for t, s in zip(node.src, states, strict=True)))


def _rows_whole(node: Tensor, states: Sequence[SplitState], what: str) -> None:
    if states[0].is_split and int(states[0].axis) == 0:
        raise _no(node, f"{what} works along axis 0, which is split; split another axis")


def _mul_mat(node: Tensor, w: SplitState, x: SplitState) -> Plan:
    W, X = node.src
    if not w.is_split and not x.is_split:
        return Plan(MIRRORED, (None, None))
    if w.is_split and W.ndim != 2:
        raise _no(node, "only 2-d weights may be split")
    if w.is_split and int(w.axis) == 1 and not x.is_split:
        return Plan(w.moved(0), (None, None))
    if not w.is_split and x.is_split and int(x.axis) >= 1:
        return Plan(x, (None, None))
    if w.is_split and int(w.axis) == 0:
        if x.is_split and x != w:
            raise _no(
                node, f"x is split as {x.describe()}, the weight's reduction as {w.describe()}"
            )
        return Plan(SplitState.partial(), (None, _fit(node, X, x, w)))
    raise _no(node, f"weight {w.describe()} with input {x.describe()} has no split rule")


def _reshape_like(node: Tensor, src: Tensor, s: SplitState, elem_offset: int) -> SplitState:
    """The split of a contiguous re-layout of ``src`` (reshape, contiguous view)."""
    if not s.is_split:
        return s
    if len(s.sizes) > 1:
        raise _no(node, "a segmented split cannot be re-laid out")
    if not src.is_contiguous:
        raise _no(node, f"source {src.describe()} is not contiguous")
    k = int(s.axis)
    inner = 1
    for a in range(k):
        inner *= _ne(src, a)
    block = inner * _ne(src, k)
    if elem_offset % block:
        raise _no(node, "the view starts inside a split block")
    acc = 1
    for k2 in range(node.ndim):
        prev, acc = acc, acc * _ne(node, k2)
        if acc == block:
            moved = s.scaled(k2, inner, prev)
            if moved is not None:
                return moved
            break
        if acc > block:
            break
    raise _no(node, f"the re-layout cuts through the split ({s.describe()}) of {src.describe()}")


def _permuted(node: Tensor, s: SplitState) -> SplitState:
    if not s.is_split:
        return s
    nd = node.ndim
    src_np = np_axis(int(s.axis), nd)
    if node.op is Op.TRANSPOSE:
        axes = list(range(nd))
        axes[-1], axes[-2] = axes[-2], axes[-1]
    else:
        axes = list(node.op_params["axes"])
    return s.moved(np_axis(axes.index(src_np), nd))


def _view(node: Tensor, src: Tensor, s: SplitState) -> SplitState:
    if not s.is_split:
        return s
    from ..tensor import contiguous_strides

    if node.strides != contiguous_strides(node.type, node.shape):
        raise _no(node, "only contiguous views of a split tensor are supported")
    offset = node.op_params.get("offset", 0)
    per_elem = node.type.type_size / node.type.block_size
    return _reshape_like(node, src, s, int(offset / per_elem))


def plan(node: Tensor, states: Sequence[SplitState]) -> Plan:
    """The split plan of ``node`` given its sources' states (one per ``node.src``)."""
    op = node.op
    if any(s.axis is SplitAxis.PARTIAL for s in states):
        raise _no(node, "a partial source must be all-reduced first")
    none = tuple(None for _ in node.src)
    if all(not s.is_split for s in states) and op is not Op.MUL_MAT:
        return Plan(MIRRORED, none)
    s0 = states[0]
    if op is Op.CPY:  # the result is the destination's memory: it keeps that layout
        if node.src[0].shape != node.src[1].shape:
            raise _no(node, "a copy between different shapes of a split tensor")
        return Plan(states[1], (_fit(node, node.src[0], s0, states[1]), None))
    if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
        return _elementwise(node, states)
    if op in (Op.SCALE, Op.UNARY, Op.DUP) or (op is Op.CONT and node.shape == node.src[0].shape):
        return Plan(s0, none)
    if op is Op.GLU:
        if len(node.src) == 1:
            _rows_whole(node, states, "a glu of one split-in-half operand")
            return Plan(s0, none)
        return _elementwise(node, states)
    if op in (Op.NORM, Op.RMS_NORM, Op.ARGSORT, Op.SUM_ROWS):
        _rows_whole(node, states, op.value)
        return Plan(s0, none)
    if op is Op.ARGMAX:
        _rows_whole(node, states, "argmax")
        return Plan(s0.moved(int(s0.axis) - 1) if node.ndim < node.src[0].ndim else s0, none)
    if op is Op.SOFT_MAX:
        _rows_whole(node, states, "soft_max")
        if len(node.src) > 1 and int(s0.axis) == 1:
            raise _no(node, "soft_max with a mask and rows split over members")
        if node.op_params.get("max_bias", 0.0) > 0 and int(s0.axis) == 2:
            raise _no(node, "ALiBi slopes depend on the global head index; heads are split")
        return _elementwise(node, states)
    if op is Op.MUL_MAT:
        return _mul_mat(node, states[0], states[1])
    if op is Op.GET_ROWS:
        if states[1].is_split:
            raise _no(node, "the row indices must be mirrored")
        if s0.is_split and int(s0.axis) != 0:
            raise _no(node, "only a table split along axis 0 (its columns) can be gathered from")
        return Plan(s0, none)
    if op is Op.SET_ROWS:
        if states[2].is_split or (s0.is_split and int(s0.axis) != 0):
            raise _no(node, "set_rows needs mirrored indices and a destination split along axis 0")
        return Plan(s0, (None, _fit(node, node.src[1], states[1], s0), None))
    if op is Op.ROPE:
        if any(s.is_split for s in states[1:]):
            raise _no(node, "positions and frequency factors must be mirrored")
        _rows_whole(node, states, "rope")
        if int(s0.axis) == 2:
            raise _no(node, "tokens are split: their positions would have to be split too")
        return Plan(s0, none)
    if op is Op.FLASH_ATTN_EXT:
        return _flash_attn(node, states)
    if op is Op.CONCAT:
        if s0.is_split and int(s0.axis) == node.op_params["axis"]:
            raise _no(node, "concatenation along the split axis")
        return _elementwise(node, states)
    if op in (Op.RESHAPE, Op.CONT):
        return Plan(_reshape_like(node, node.src[0], s0, 0), none)
    if op in (Op.PERMUTE, Op.TRANSPOSE):
        return Plan(_permuted(node, s0), none)
    if op is Op.VIEW:
        return Plan(_view(node, node.src[0], s0), none)
    raise _no(node, "this op has no split rule")


def _flash_attn(node: Tensor, states: Sequence[SplitState]) -> Plan:
    q, k, v = states[:3]
    if any(s.is_split for s in states[3:]):
        raise _no(node, "the mask and the order must be mirrored")
    if not (q.is_split and k.is_split and v.is_split):
        raise _no(node, "q, k and v must all be split along their heads (axis 2)")
    if {int(q.axis), int(k.axis), int(v.axis)} != {2} or k != v:
        raise _no(node, f"q {q.describe()}, k {k.describe()}, v {v.describe()}: split by heads")
    if node.op_params.get("max_bias", 0.0) > 0:
        raise _no(node, "ALiBi slopes depend on the global head index; heads are split")
    H, Hkv = _ne(node.src[0], 2), _ne(node.src[1], 2)
    group = H // Hkv
    if any(q.extent(m) != group * k.extent(m) for m in range(q.n_members)):
        raise _no(node, "each member must hold the query heads of its own KV heads")
    return Plan(q.moved(1), tuple(None for _ in node.src))

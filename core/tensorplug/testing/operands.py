"""The operands conformance cases are built from, shared by every family module.

``make`` names a case; ``leaf``, ``transposed``, ``permuted`` and ``strided`` make an
input tensor of a given logical shape laid out in memory in the ways kernels most often
get wrong (a strided view, swapped axes, rows with gaps), so that every family tests its
op on non-contiguous operands with the same few helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .. import ops
from ..opcodes import Op
from ..tensor import Tensor
from ..types import Type
from .cases import Case, InitFn, Inputs, case_name

__all__ = [
    "FLOAT_TYPES", "LAYOUTS", "QUANT_TYPES", "Build", "Layout", "Shape",
    "leaf", "make", "permuted", "strided", "transposed",
]  # fmt: skip

FLOAT_TYPES = (Type.F32, Type.F16, Type.BF16)
QUANT_TYPES = (Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1)

Build = Callable[[Inputs], Tensor | Sequence[Tensor]]
Shape = tuple[int, ...]


def make(
    op: Op,
    build: Build,
    quick: bool,
    label: str | None = None,
    *,
    tags: Iterable[str] = (),
    max_nmse: float | None = None,
    **params: object,
) -> Case:
    """A case named ``LABEL(k=v,...)``; the label defaults to the op's name."""
    name = case_name(label or op.value.upper(), **params)
    return Case(name, op, build, frozenset(tags), max_nmse, quick)


# -- operand shapes ------------------------------------------------------------------------------


def leaf(ins: Inputs, t: Type, shape: Shape, init: InitFn | None = None) -> Tensor:
    return ins.new(t, shape, init)


def transposed(ins: Inputs, t: Type, shape: Shape, init: InitFn | None = None) -> Tensor:
    """A tensor of ``shape`` whose last two axes are stored swapped: a strided view."""
    base = ins.new(t, (*shape[:-2], shape[-1], shape[-2]), init)
    return ops.transpose(base)


def permuted(ins: Inputs, t: Type, shape: Shape, init: InitFn | None = None) -> Tensor:
    """A tensor of ``shape`` stored with its first axis innermost (no dense rows)."""
    base = ins.new(t, (*shape[1:], shape[0]), init)
    return ops.permute(base, (base.ndim - 1, *range(base.ndim - 1)))


def strided(ins: Inputs, t: Type, shape: Shape, init: InitFn | None = None, pad: int = 7) -> Tensor:
    """A tensor of ``shape`` whose rows sit ``pad`` elements apart: dense rows, gaps between."""
    pad = -(-pad // t.block_size) * t.block_size
    base = ins.new(t, (*shape[:-1], shape[-1] + pad), init)
    return ops.view(base, shape, base.strides, 0)


Layout = Callable[..., Tensor]
LAYOUTS: dict[str, Layout] = {"transposed": transposed, "permuted": permuted, "strided": strided}

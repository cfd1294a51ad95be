"""Views: new shapes and strides over an existing tensor's memory; no kernel runs."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from ..errors import OpParamError
from ..opcodes import Op
from ..tensor import Tensor, contiguous_strides
from ._build import fail, view_like

# -- views ----------------------------------------------------------------------------------------


def view(
    a: Tensor, shape: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0
) -> Tensor:
    """A tensor over ``a``'s memory at byte ``offset`` with its own shape and strides.

    Without ``strides`` the view is contiguous. It must lie inside ``a``'s base tensor.
    """
    if offset < 0:
        raise fail("view", f"offset {offset} is negative")
    if strides is None:
        strides = contiguous_strides(a.type, shape)
    return view_like(a, shape, strides, offset, Op.VIEW, {"offset": offset})


def reshape(a: Tensor, shape: Sequence[int]) -> Tensor:
    """The same contiguous memory seen with another shape of equal element count."""
    if not a.is_contiguous:
        raise fail("reshape", f"{a.describe()} is not contiguous; make it so with cont() first")
    count = 1
    for d in shape:
        count *= d
    if count != a.nelements:
        raise fail("reshape", f"cannot reshape {a.describe()} to {tuple(shape)}")
    return view_like(a, shape, contiguous_strides(a.type, shape), 0, Op.RESHAPE)


def permute(a: Tensor, axes: Sequence[int]) -> Tensor:
    """Reorder axes like ``numpy.transpose``: ``out.shape[i] == a.shape[axes[i]]``.

    This is numpy's convention, not ggml's (whose ``ggml_permute`` says where each
    axis goes). A quantized tensor must keep its last axis last.
    """
    try:
        given = [operator.index(x) for x in axes if not isinstance(x, bool)]
    except TypeError:
        given = []
    if len(given) != len(tuple(axes)):
        raise OpParamError(f"permute: axes must be whole numbers, got {tuple(axes)!r}")
    axes = tuple(x % a.ndim if -a.ndim <= x < a.ndim else -1 for x in given)
    if sorted(axes) != list(range(a.ndim)):
        raise fail("permute", f"axes {axes} are not a permutation of range({a.ndim})")
    if a.type.is_quantized and axes[-1] != a.ndim - 1:
        raise fail("permute", f"quantized {a.describe()} must keep its last axis last")
    shape = [a.shape[i] for i in axes]
    strides = [a.strides[i] for i in axes]
    return view_like(a, shape, strides, 0, Op.PERMUTE, {"axes": axes})


def transpose(a: Tensor) -> Tensor:
    """Swap the last two axes (``ggml_transpose``)."""
    if a.ndim < 2:
        raise fail("transpose", f"{a.describe()} needs at least 2 dimensions")
    axes = list(range(a.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    out = permute(a, axes)
    out.op = Op.TRANSPOSE
    return out

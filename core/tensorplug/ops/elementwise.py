"""Elementwise ops: arithmetic (b repeated onto a), scale, the unary functions, clamp and
the gated units."""

from __future__ import annotations

import math

from ..opcodes import GluOp, Op, UnaryOp
from ..tensor import Tensor
from ._build import (
    FLOAT_TYPES,
    OpParamError,
    check_broadcast,
    check_type,
    enum_member,
    fail,
    new_result,
)

# -- elementwise arithmetic ----------------------------------------------------------------


def _binary(op: Op, a: Tensor, b: Tensor) -> Tensor:
    check_type(op.value, "a", a, FLOAT_TYPES)
    check_type(op.value, "b", b, FLOAT_TYPES)
    check_broadcast(op.value, a, b)
    return new_result(a.type, a.shape, op, (a, b))


def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.ADD, a, b)


def sub(a: Tensor, b: Tensor) -> Tensor:
    """``a - b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.SUB, a, b)


def mul(a: Tensor, b: Tensor) -> Tensor:
    """``a * b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.MUL, a, b)


def div(a: Tensor, b: Tensor) -> Tensor:
    """``a / b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.DIV, a, b)


def scale(a: Tensor, s: float, bias: float = 0.0) -> Tensor:
    """``a * s + bias`` elementwise (``ggml_scale_bias``); same type and shape as ``a``."""
    check_type("scale", "a", a, FLOAT_TYPES)
    return new_result(a.type, a.shape, Op.SCALE, (a,), {"scale": float(s), "bias": float(bias)})


def unary(a: Tensor, fn: UnaryOp | str) -> Tensor:
    """Apply an elementwise function; same type and shape as ``a``.

    abs ``|x|``; neg ``-x``; relu ``max(x, 0)``; gelu with ggml's tanh approximation
    ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, 0 for x <= -10 and x for x >= 10 as
    ggml clamps it (so gelu(-inf) = 0, gelu(inf) = inf); gelu_quick ``x·σ(1.702·x)``;
    gelu_erf ``0.5·x·(1 + erf(x/√2))``; silu ``x·σ(x)``; exp ``eˣ``;
    tanh; sigmoid ``σ(x) = 1/(1 + e⁻ˣ)``.
    """
    fn = UnaryOp(enum_member("unary", "fn", UnaryOp, fn))
    check_type(f"unary({fn.value})", "a", a, FLOAT_TYPES)
    return new_result(a.type, a.shape, Op.UNARY, (a,), {"fn": fn})


def abs(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.ABS)


def neg(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.NEG)


def relu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.RELU)


def gelu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.GELU)


def silu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.SILU)


def gelu_quick(a: Tensor) -> Tensor:
    """``x·σ(1.702·x)`` (``ggml_gelu_quick``)."""
    return unary(a, UnaryOp.GELU_QUICK)


def gelu_erf(a: Tensor) -> Tensor:
    """``0.5·x·(1 + erf(x/√2))``, the exact GELU (``ggml_gelu_erf``)."""
    return unary(a, UnaryOp.GELU_ERF)


def exp(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.EXP)


def tanh(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.TANH)


def sigmoid(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.SIGMOID)


def clamp(a: Tensor, min: float, max: float) -> Tensor:
    """``max(min(x, hi), lo)`` elementwise, written as ggml's ``MAX(MIN(x, hi), lo)``.

    The bounds may be infinite, not NaN. Following ggml's comparisons a NaN input gives
    ``hi``, and ``lo > hi`` gives ``lo`` everywhere. Same type and shape as ``a``
    (ggml's ``ggml_clamp`` returns a view of ``a``; the allocator's in-place reuse gives
    the same memory saving here without aliasing surprises).
    """
    check_type("clamp", "a", a, FLOAT_TYPES)
    lo, hi = float(min), float(max)
    if math.isnan(lo) or math.isnan(hi):
        raise OpParamError(f"clamp: bounds must not be NaN, got min={min!r}, max={max!r}")
    return new_result(a.type, a.shape, Op.CLAMP, (a,), {"min": lo, "max": hi})


def glu(
    a: Tensor, b: Tensor | None = None, fn: GluOp | str = GluOp.SWIGLU, *, swapped: bool = False
) -> Tensor:
    """A gated unit ``act(x) * g`` (``ggml_glu`` / ``ggml_glu_split``); ``fn`` picks the
    activation: swiglu (silu), reglu (relu), geglu (gelu, tanh form, clamped as ggml),
    geglu_erf (gelu, erf form), geglu_quick (gelu_quick).

    With ``b``: ``act(a) * b``; both have the same shape, the result too.
    Without ``b``: ``a``'s last axis (even length ``2n``) is split in halves
    ``x = a[..., :n]`` and ``g = a[..., n:]`` and the result is ``act(x) * g`` with
    last axis ``n`` (``swapped`` exchanges the roles of the halves). Same type as ``a``.
    """
    fn = GluOp(enum_member("glu", "fn", GluOp, fn))
    name = fn.value
    check_type(name, "a", a, FLOAT_TYPES)
    params = {"fn": fn, "swapped": bool(swapped)}
    if b is not None:
        if swapped:
            raise fail(name, "swapped applies to the split form only; with b, swap the operands")
        check_type(name, "b", b, {a.type})
        if b.shape != a.shape:
            raise fail(name, f"b {b.describe()} must have the shape of a {a.describe()}")
        return new_result(a.type, a.shape, Op.GLU, (a, b), params)
    if a.shape[-1] % 2:
        raise fail(name, f"a {a.describe()} needs an even last dimension to split in halves")
    return new_result(a.type, (*a.shape[:-1], a.shape[-1] // 2), Op.GLU, (a,), params)


def swiglu(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """SwiGLU, ``silu(x) * g``, the gated MLP of llama (``ggml_swiglu``); see :func:`glu`."""
    return glu(a, b, GluOp.SWIGLU, swapped=swapped)


def reglu(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``relu(x) * g`` (``ggml_reglu``); see :func:`glu`."""
    return glu(a, b, GluOp.REGLU, swapped=swapped)


def geglu(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``gelu(x) * g``, gelu's tanh form as ggml clamps it (``ggml_geglu``); see :func:`glu`."""
    return glu(a, b, GluOp.GEGLU, swapped=swapped)


def geglu_erf(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``gelu_erf(x) * g`` (``ggml_geglu_erf``); see :func:`glu`."""
    return glu(a, b, GluOp.GEGLU_ERF, swapped=swapped)


def geglu_quick(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``gelu_quick(x) * g`` (``ggml_geglu_quick``); see :func:`glu`."""
    return glu(a, b, GluOp.GEGLU_QUICK, swapped=swapped)

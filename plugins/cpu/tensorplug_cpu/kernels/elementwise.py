"""Elementwise arithmetic, activations, row normalisations and row reductions.

Each builder returns a :data:`~.common.Step` writing into the node's own memory with
numpy's ``out=``; every temporary is allocated here, once per plan. Formulas and the
order of float32 operations follow ggml's CPU kernels (``ggml-cpu/ops.cpp``,
``vec.h``), with ggml's double-precision accumulators where it has them (norms, sums).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.opcodes import GLU_ACTIVATION, GluOp, Op, SortOrder, UnaryOp
from tensorplug.types import Type

from .common import F32, BuildContext, Step, reshape_view, sequence

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

__all__ = [
    "UNARY_FNS",
    "build_argmax",
    "build_argsort",
    "build_binary",
    "build_clamp",
    "build_concat",
    "build_glu",
    "build_norm",
    "build_rms_norm",
    "build_scale",
    "build_sum_rows",
    "build_top_k",
    "build_unary",
    "tiled_operands",
]

_UFUNCS = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}
_NUMPY_NATIVE = (Type.F32, Type.F16)
_SQRT_2_OVER_PI = np.float32(math.sqrt(2.0 / math.pi))
_GELU_COEF_A = np.float32(0.044715)
_GELU_QUICK_COEF = np.float32(-1.702)
_SQRT_2_INV = np.float32(math.sqrt(0.5))
#: The most negative float32: -inf clamped to it keeps every activation's formula finite
#: (``x·σ(x)`` at -inf is ``-inf·0 = NaN``, at the lowest float it is ``-0``).
_LOWEST = np.float32(np.finfo(np.float32).min)


def tiled_operands(
    a: np.ndarray, b: np.ndarray, out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views that turn ggml's tiling broadcast into numpy broadcasting.

    Wherever ``b``'s extent ``B`` divides ``a``'s ``A`` without being 1 or ``A``, that
    axis of ``a`` and ``out`` becomes ``(A/B, B)`` and ``b``'s becomes ``(1, B)``:
    element ``i`` then meets ``b[i % B]``. Splitting an axis never copies.
    """
    bp = b.reshape((1,) * (a.ndim - b.ndim) + b.shape)
    pairs: list[tuple[int, int]] = list(zip(a.shape, bp.shape, strict=True))
    if all(db in (1, da) for da, db in pairs):
        return a, bp, out
    ashape: list[int] = []
    bshape: list[int] = []
    for da, db in pairs:
        if db in (1, da):
            ashape.append(da)
            bshape.append(db)
        else:
            ashape += [da // db, db]
            bshape += [1, db]
    av, bv, ov = (
        reshape_view(x, tuple(sh)) for x, sh in ((a, ashape), (bp, bshape), (out, ashape))
    )
    assert av is not None and bv is not None and ov is not None  # splits are always views
    return av, bv, ov


def build_binary(node: Tensor, ctx: BuildContext) -> Step:
    """add / sub / mul / div with numpy broadcasting (the op contract's broadcasting).

    For F32 and F16 operands numpy's own loops already widen to float32, compute and
    round once, which is ggml's rule, so the ufunc runs straight on the tensors' memory.
    BF16 is not a numpy type and goes through float32 staging.
    """
    ufunc = _UFUNCS[node.op]
    a, b = node.src
    if all(t.type in _NUMPY_NATIVE for t in (a, b, node)):
        return partial(ufunc, *tiled_operands(ctx.view(a), ctx.view(b), ctx.view(node)))
    av, load_a = ctx.f32_in(a)
    bv, load_b = ctx.f32_in(b)
    out, store = ctx.f32_out(node)
    return sequence(load_a, load_b, partial(ufunc, *tiled_operands(av, bv, out)), store)


def build_scale(node: Tensor, ctx: BuildContext) -> Step:
    """``x·s + bias`` (``ggml_scale_bias``)."""
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    s, bias = F32.type(node.op_params["scale"]), F32.type(node.op_params.get("bias", 0.0))
    mul = partial(np.multiply, x, s, out=out)
    add = partial(np.add, out, bias, out=out) if bias else None
    return sequence(load, mul, add, store)


def _silu_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``x / (1 + e^-x)`` as ggml writes it, with -inf giving the limit 0; ``out`` may
    alias ``x`` (not ``tmp``)."""
    np.maximum(x, _LOWEST, out=tmp)  # NaN stays NaN
    np.negative(tmp, out=out)
    np.exp(out, out=out)
    out += 1
    np.divide(tmp, out, out=out)


def _sigmoid_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    np.negative(x, out=tmp)
    np.exp(tmp, out=tmp)
    tmp += 1
    np.divide(1, tmp, out=out)


def _gelu_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))``, ggml's ``ggml_gelu_f32``, and
    exactly 0 for ``x <= -10`` as ggml's CPU path (``x >= 10`` gives ``x`` by itself:
    the tanh is exactly 1 there in float32)."""
    np.maximum(x, _LOWEST, out=tmp)
    np.copyto(out, tmp)  # out may alias x: keep the (clamped) input in out, work in tmp
    np.multiply(out, out, out=tmp)
    tmp *= _GELU_COEF_A
    tmp += 1
    tmp *= out
    tmp *= _SQRT_2_OVER_PI
    np.tanh(tmp, out=tmp)
    tmp += 1
    tmp *= 0.5
    # the factor is 0 where x <= -10, which makes -inf·0 impossible: x was clamped
    np.copyto(tmp, 0, where=out <= -10)
    np.multiply(tmp, out, out=out)


def _gelu_quick_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``x·(1/(1 + e^(-1.702·x)))``, ggml's ``ggml_gelu_quick_f32``; -inf gives 0."""
    np.maximum(x, _LOWEST, out=tmp)
    np.multiply(tmp, _GELU_QUICK_COEF, out=out)
    np.exp(out, out=out)
    out += 1
    np.divide(1, out, out=out)
    np.multiply(tmp, out, out=out)


# erfc(z) ≈ t·e^(-z² + P(t)), t = 1/(1 + z/2), z >= 0 (Numerical Recipes' erfcc, a
# Chebyshev fit): relative error under 1.2e-7 for every z, so the far negative tail of
# gelu_erf stays accurate. numpy has no erf, and 1 + erf(x) = erfc(-x) for x < 0 needs no
# cancelling subtraction.
_ERFC_P = tuple(np.float32(c) for c in (
    0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
    0.09678418, 0.37409196, 1.00002368, -1.26551223,
))  # fmt: skip


def _gelu_erf_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``0.5·x·(1 + erf(x/√2))`` (ggml's ``ggml_vec_gelu_erf_f32``); -inf gives 0.

    ``tmp`` holds three planes of ``out``'s shape (see :data:`_TMP_PLANES`)."""
    xc, z, acc = tmp.reshape(3, *out.shape)
    np.maximum(x, _LOWEST, out=xc)
    np.multiply(xc, _SQRT_2_INV, out=z)
    np.abs(z, out=z)
    np.multiply(z, 0.5, out=out)
    out += 1
    np.divide(1, out, out=out)  # t
    np.multiply(out, _ERFC_P[0], out=acc)
    for c in _ERFC_P[1:-1]:  # Horner in t
        acc += c
        acc *= out
    acc += _ERFC_P[-1]
    np.multiply(z, z, out=z)
    acc -= z
    np.exp(acc, out=acc)
    acc *= out  # erfc(|x|/√2)
    # 1 + erf(x/√2) is erfc(|x|/√2) for x < 0 and 2 - erfc(|x|/√2) otherwise
    np.subtract(2, acc, out=z)
    np.copyto(z, acc, where=xc < 0)
    np.multiply(xc, 0.5, out=out)
    out *= z


def _relu_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    # fmax ignores NaN, giving 0 for NaN like ggml's ``x > 0 ? x : 0``
    np.fmax(x, 0, out=out)


UnaryFn = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _direct(fn: np.ufunc) -> UnaryFn:
    def run(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
        fn(x, out=out)

    return run


#: Unary functions on float32 arrays: ``fn(x, tmp, out)`` with a scratch ``tmp``.
UNARY_FNS: dict[UnaryOp, UnaryFn] = {
    UnaryOp.ABS: _direct(np.abs),
    UnaryOp.NEG: _direct(np.negative),
    UnaryOp.RELU: _relu_into,
    UnaryOp.GELU: _gelu_into,
    UnaryOp.SILU: _silu_into,
    UnaryOp.EXP: _direct(np.exp),
    UnaryOp.TANH: _direct(np.tanh),
    UnaryOp.SIGMOID: _sigmoid_into,
    UnaryOp.GELU_QUICK: _gelu_quick_into,
    UnaryOp.GELU_ERF: _gelu_erf_into,
}
#: Planes of scratch (each of the result's shape) a function needs as ``tmp``.
_TMP_PLANES = {
    UnaryOp.GELU: 1, UnaryOp.SILU: 1, UnaryOp.SIGMOID: 1, UnaryOp.GELU_QUICK: 1,
    UnaryOp.GELU_ERF: 3,
}  # fmt: skip


def _unary_tmp(ctx: BuildContext, fn: UnaryOp, shape: tuple[int, ...]) -> np.ndarray | None:
    planes = _TMP_PLANES.get(fn, 0)
    return ctx.scratch((planes, *shape)).reshape((planes, *shape)) if planes else None


def build_unary(node: Tensor, ctx: BuildContext) -> Step:
    fn = UnaryOp(node.op_params["fn"])
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    tmp = _unary_tmp(ctx, fn, node.shape)
    if tmp is not None and tmp.shape[0] == 1:
        tmp = tmp[0]
    return sequence(load, partial(UNARY_FNS[fn], x, out if tmp is None else tmp, out), store)


def build_clamp(node: Tensor, ctx: BuildContext) -> Step:
    """ggml's ``MAX(MIN(x, hi), lo)``: fmin/fmax pick the bound over a NaN, as those
    C comparisons do (NaN gives ``hi``)."""
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    lo, hi = F32.type(node.op_params["min"]), F32.type(node.op_params["max"])

    def run() -> None:
        np.fmin(x, hi, out=out)
        np.fmax(out, lo, out=out)

    return sequence(load, run, store)


def build_glu(node: Tensor, ctx: BuildContext) -> Step:
    """``act(x)·g`` (act by :data:`GLU_ACTIVATION`); without ``b`` the halves of ``a``'s
    rows are ``x`` and ``g``."""
    a, load_a = ctx.f32_in(node.src[0])
    load_b = None
    if len(node.src) == 2:
        x = a
        g, load_b = ctx.f32_in(node.src[1])
    else:
        n = node.shape[-1]
        x, g = a[..., :n], a[..., n:]
        if node.op_params.get("swapped"):
            x, g = g, x
    out, store = ctx.f32_out(node)
    fn = UNARY_FNS[GLU_ACTIVATION[GluOp(node.op_params["fn"])]]
    act = ctx.scratch(node.shape)
    tmp = _unary_tmp(ctx, GLU_ACTIVATION[GluOp(node.op_params["fn"])], node.shape)
    work = act if tmp is None else (tmp[0] if tmp.shape[0] == 1 else tmp)

    def run() -> None:
        fn(x, work, act)
        np.multiply(act, g, out=out)

    return sequence(load_a, load_b, run, store)


def _row_stats(ctx: BuildContext, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A float64 accumulator and a float32 value per row."""
    rows = (*shape[:-1], 1)
    return ctx.scratch(rows, np.float64), ctx.scratch(rows)


def build_norm(node: Tensor, ctx: BuildContext) -> Step:
    """``(x - mean) / sqrt(var + eps)``: sums in float64, the rest in float32, as ggml."""
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    n, eps = node.shape[-1], F32.type(node.op_params["eps"])
    acc, stat = _row_stats(ctx, node.shape)
    centred = ctx.scratch(node.shape)

    def run() -> None:
        np.sum(x, axis=-1, keepdims=True, dtype=np.float64, out=acc)
        np.divide(acc, n, out=acc)
        np.copyto(stat, acc, casting="same_kind")  # mean, rounded to float32
        np.subtract(x, stat, out=centred)
        np.multiply(centred, centred, out=out)
        np.sum(out, axis=-1, keepdims=True, dtype=np.float64, out=acc)
        np.divide(acc, n, out=acc)
        np.copyto(stat, acc, casting="same_kind")  # variance
        np.add(stat, eps, out=stat)
        np.sqrt(stat, out=stat)
        np.divide(1, stat, out=stat)
        np.multiply(centred, stat, out=out)

    return sequence(load, run, store)


def build_rms_norm(node: Tensor, ctx: BuildContext) -> Step:
    """``x / sqrt(mean(x²) + eps)``: the sum of squares in float64, as ggml."""
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    n, eps = node.shape[-1], F32.type(node.op_params["eps"])
    acc, stat = _row_stats(ctx, node.shape)
    sq = ctx.scratch(node.shape)

    def run() -> None:
        np.multiply(x, x, out=sq)
        np.sum(sq, axis=-1, keepdims=True, dtype=np.float64, out=acc)
        np.divide(acc, n, out=acc)
        np.copyto(stat, acc, casting="same_kind")
        np.add(stat, eps, out=stat)
        np.sqrt(stat, out=stat)
        np.divide(1, stat, out=stat)
        np.multiply(x, stat, out=out)

    return sequence(load, run, store)


def build_sum_rows(node: Tensor, ctx: BuildContext) -> Step:
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    acc = ctx.scratch(node.shape, np.float64)

    def run() -> None:
        np.sum(x, axis=-1, keepdims=True, dtype=np.float64, out=acc)
        np.copyto(out, acc, casting="same_kind")

    return sequence(load, run, store)


def build_argmax(node: Tensor, ctx: BuildContext) -> Step:
    """Last index of each row's maximum, as ``ggml_vec_argmax_f32``; NaN counts as -inf.

    numpy's argmax returns the first maximum, so it runs on the rows reversed (a view)
    and the index is mirrored back.
    """
    x = ctx.view(node.src[0])
    if x.ndim == 1:
        x = x[None]
    rev = x[..., ::-1]
    last = x.shape[-1] - 1
    out = ctx.view(node)
    idx = ctx.scratch(x.shape[:-1], np.intp)

    def run() -> None:
        if np.isnan(x).any():
            np.argmax(np.where(np.isnan(rev), -np.inf, rev), axis=-1, out=idx)
        else:
            np.argmax(rev, axis=-1, out=idx)
        np.subtract(last, idx, out=idx)
        np.copyto(out, idx.reshape(out.shape), casting="same_kind")

    return run


def build_argsort(node: Tensor, ctx: BuildContext) -> Step:
    """Stable per-row argsort; descending keeps equal values in their original order."""
    x = ctx.view(node.src[0])
    out = ctx.view(node)
    desc = SortOrder(node.op_params["order"]) == SortOrder.DESC

    def run() -> None:
        # negating keeps stability for descending order (ties stay in index order)
        idx = np.argsort(np.negative(x) if desc else x, axis=-1, kind="stable")
        np.copyto(out, idx, casting="same_kind")

    return run


def build_top_k(node: Tensor, ctx: BuildContext) -> Step:
    """The ``k`` largest per row, largest first, ties by lower index: a stable sort of
    the negated row, cut (a partial sort could not keep the tie order at the cut)."""
    x = ctx.view(node.src[0])
    out = ctx.view(node)
    k = node.shape[-1]

    def run() -> None:
        idx = np.argsort(np.negative(x), axis=-1, kind="stable")
        np.copyto(out, idx[..., :k], casting="same_kind")

    return run


def build_concat(node: Tensor, ctx: BuildContext) -> Step:
    """Byte-exact join along an axis; works on the stored values of any non-quantized type."""
    a, b = (ctx.view(s) for s in node.src)
    return partial(np.concatenate, (a, b), axis=node.op_params["axis"], out=ctx.view(node))

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

from tensorplug.opcodes import GluOp, Op, SortOrder, UnaryOp
from tensorplug.types import Type

from .common import F32, BuildContext, Step, reshape_view, sequence, split_rows, tiled_operands
from .gelu_table import gelu_table_into

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
]

_UFUNCS = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}
_NUMPY_NATIVE = (Type.F32, Type.F16)


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
    # the scalars as one-element float32 arrays: numpy's float32 operation as with a scalar,
    # and the binary step form a program lowers to a job (Gemma's embedding scale)
    s = np.full(1, node.op_params["scale"], F32)
    bias = np.full(1, node.op_params.get("bias", 0.0), F32)
    mul = partial(np.multiply, x, s, out)
    add = partial(np.add, out, bias, out) if bias[0] else None
    return sequence(load, mul, add, store)


def _silu_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``x / (1 + e^-x)`` as ggml writes it (so silu(-inf) is NaN, as in ggml); ``out``
    may alias ``x`` or ``tmp``."""
    np.negative(x, out=tmp)
    with np.errstate(over="ignore"):
        np.exp(tmp, out=tmp)
    tmp += 1
    with np.errstate(invalid="ignore"):
        np.divide(x, tmp, out=out)


def _sigmoid_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    np.negative(x, out=tmp)
    np.exp(tmp, out=tmp)
    tmp += 1
    np.divide(1, tmp, out=out)


def _gelu_quick_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``x·σ(1.702·x)`` = ``x / (1 + exp(-1.702·x))``, ggml's ``ggml_gelu_quick_f32``."""
    with np.errstate(over="ignore"):
        np.multiply(x, np.float32(-1.702), out=tmp)
        np.exp(tmp, out=tmp)
    tmp += 1
    np.divide(x, tmp, out=out)


#: Coefficients of Numerical Recipes' erfc (fractional error below 1.2e-7 everywhere).
_ERFC_C = tuple(np.float32(c) for c in (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
))  # fmt: skip


def one_plus_erf(x: np.ndarray) -> np.ndarray:
    """``1 + erf(x)`` in float32 without cancellation: ``erfc(-x)`` for x < 0 and
    ``2 - erfc(x)`` for x >= 0, erfc from a rational fit (numpy has no erf). The GPU
    kernels compute the same expression (``tp_one_plus_erf``)."""
    z = np.abs(x).astype(np.float32)
    t = np.float32(1) / (np.float32(1) + np.float32(0.5) * z)
    poly = _ERFC_C[-1]
    for c in reversed(_ERFC_C[1:-1]):
        poly = c + t * poly
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        erfc = t * np.exp(-z * z + _ERFC_C[0] + t * poly)
    return np.where(x < 0, erfc, np.float32(2) - erfc).astype(np.float32)


def _gelu_erf_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``0.5·x·(1 + erf(x/√2))``, ggml's ``ggml_gelu_erf``."""
    tmp[...] = one_plus_erf(x * np.float32(1 / math.sqrt(2)))
    tmp *= 0.5
    with np.errstate(invalid="ignore"):
        np.multiply(tmp, x, out=out)


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
    UnaryOp.GELU: gelu_table_into,  # ggml's f16 table, as its CPU computes gelu
    UnaryOp.SILU: _silu_into,
    UnaryOp.EXP: _direct(np.exp),
    UnaryOp.TANH: _direct(np.tanh),
    UnaryOp.SIGMOID: _sigmoid_into,
    UnaryOp.GELU_QUICK: _gelu_quick_into,
    UnaryOp.GELU_ERF: _gelu_erf_into,
}
_NEEDS_TMP = {UnaryOp.GELU, UnaryOp.SILU, UnaryOp.SIGMOID, UnaryOp.GELU_QUICK, UnaryOp.GELU_ERF}

#: The activation of each gated unit (:class:`~tensorplug.GluOp`).
_GLU_ACTIVATIONS: dict[GluOp, UnaryFn] = {
    GluOp.SWIGLU: _silu_into,
    GluOp.REGLU: _relu_into,
    GluOp.GEGLU: gelu_table_into,
    GluOp.GEGLU_ERF: _gelu_erf_into,
    GluOp.GEGLU_QUICK: _gelu_quick_into,
}


def build_unary(node: Tensor, ctx: BuildContext) -> Step:
    fn = UnaryOp(node.op_params["fn"])
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    tmp = ctx.scratch(node.shape) if fn in _NEEDS_TMP else out
    return sequence(load, partial(UNARY_FNS[fn], x, tmp, out), store)


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
    """``act(x)·g``; without ``b`` the halves of ``a``'s rows are ``x`` and ``g``. geglu
    is 0 wherever x <= -10, whatever g is, as ggml's loop sets it."""
    fn = GluOp(node.op_params["fn"])
    act = _GLU_ACTIVATIONS[fn]
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
    fused = _jit_glu(node, ctx, x, g, out)
    if fused is not None:
        return sequence(load_a, load_b, fused, store)
    tmp = ctx.scratch(node.shape)

    def run() -> None:
        act(x, tmp, tmp)
        with np.errstate(invalid="ignore"):
            np.multiply(tmp, g, out=out)
        if fn is GluOp.GEGLU:
            out[x <= -10] = 0

    return sequence(load_a, load_b, run, store)


def _jit_glu(
    node: Tensor, ctx: BuildContext, x: np.ndarray, g: np.ndarray, out: np.ndarray
) -> Step | None:
    """The numba step for swiglu and geglu, any row count, or None where numpy runs it.
    Both loops are numba's for prompts too: SwiGLU's is vectorised (its exp is a
    polynomial), about twice as fast as numpy's on a prompt; geglu's f16-table lookup is
    several passes over the values in numpy (its f16 rounding, the costliest, then a
    gather through int64 indices and the clamps' masks) against numba's one."""
    fn, n = GluOp(node.op_params["fn"]), node.shape[-1]
    if ctx.jit is None or not ctx.jit.has_glu(fn):
        return None
    x2, g2, out2 = (reshape_view(v, (-1, n)) for v in (x, g, out))
    if x2 is None or g2 is None or out2 is None:
        return None
    jit = ctx.jit
    jit.expect(jit.glu_rows, fn, x2, g2, out2)  # (its row chunks are arrays of x2's kind)
    return split_rows(x2.shape[0], out2.size,
                      lambda r: jit.bound(jit.glu_rows, fn, x2[r], g2[r], out2[r]))  # fmt: skip


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
    jit = ctx.jit
    x2, out2 = reshape_view(x, (-1, n)), reshape_view(out, (-1, n))
    if jit is not None and x2 is not None and out2 is not None:
        e = float(eps)
        jit.expect(jit.rms_norm_rows, x2, out2, e)
        norm = split_rows(x2.shape[0], x2.size,
                          lambda r: jit.bound(jit.rms_norm_rows, x2[r], out2[r], e))  # fmt: skip
        return sequence(load, norm, store)
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
    """Index of each row's maximum as ggml's CPU loop gives it: the last one on ties, and
    a NaN restarts the search (see :func:`tensorplug.testing.reference.argmax_row`)."""
    x = ctx.view(node.src[0])
    if x.ndim == 1:
        x = x[None]
    out = ctx.view(node)
    idx = ctx.scratch(x.shape[:-1], np.intp)
    n = x.shape[-1]

    def run() -> None:
        np.argmax(x[..., ::-1], axis=-1, out=idx)  # the first from the end: the last
        np.subtract(n - 1, idx, out=idx)
        if np.isnan(x).any():
            rows, flat = x.reshape(-1, n), idx.reshape(-1)
            for r in np.flatnonzero(np.isnan(rows).any(axis=-1)):
                flat[r] = _argmax_after_nan(rows[r])
        np.copyto(out, idx.reshape(out.shape), casting="same_kind")

    return run


def _argmax_after_nan(row: np.ndarray) -> int:
    """ggml's loop on a row with NaNs: the last maximum of the stretch after the last
    NaN that some number follows (0 when every value is NaN)."""
    finite = np.flatnonzero(~np.isnan(row))
    if finite.size == 0:
        return 0
    end = int(finite[-1]) + 1
    nans = np.flatnonzero(np.isnan(row[:end]))
    start = int(nans[-1]) + 1 if nans.size else 0
    seg = row[start:end]
    return start + len(seg) - 1 - int(np.argmax(seg[::-1]))


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

"""Elementwise arithmetic, activations, row normalisations and row reductions.

Each builder returns a :data:`~.common.Step` writing into the node's own memory with
numpy's ``out=``; every temporary is allocated here, once per plan. Formulas and the
order of float32 operations follow ggml's CPU kernels (``ggml-cpu/ops.cpp``,
``vec.h``), with ggml's double-precision accumulators where it has them (norms, sums).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.opcodes import GluOp, Op, SortOrder, UnaryOp
from tensorplug.types import Type

from .common import F32, BuildContext, Step, sequence, tiled_operands
from .unary import NEEDS_TMP, UNARY_FNS

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


def build_unary(node: Tensor, ctx: BuildContext) -> Step:
    fn = UnaryOp(node.op_params["fn"])
    x, load = ctx.f32_in(node.src[0])
    out, store = ctx.f32_out(node)
    tmp = ctx.scratch(node.shape) if fn in NEEDS_TMP else out
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
    return sequence(load_a, load_b, ctx.kernels.bind_glu(fn, x, g, out, ctx.scratch), store)


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
    eps = F32.type(node.op_params["eps"])
    return sequence(load, ctx.kernels.bind_rms_norm(x, out, eps, ctx.scratch), store)


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

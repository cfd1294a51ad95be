"""The one driver of every integer matrix × vector kernel, and the one-row loops for the
rows left over from groups of four.

ggml multiplies a quantized matrix by a vector by quantizing the vector too — 32-value
blocks of int8 with an f16 scale (Q8_0, "the vec_dot type",
:func:`._numba_quant.quantize_q8_0`) — and summing products of 8-bit integers per
block, scaling once per block. That reads the weights as bytes and does 32
multiply-adds in two instructions on AVX2 (``vpmaddubsw`` then ``vpmaddwd``), where
decoding to float32 first costs a conversion and a float FMA per weight, several times
slower. The rows go four (or one) at a time through the IR loops of
:mod:`._numba_introw`; the few rows left over take the loops below, whose per-block
integer dot (:func:`._numba_ir.dot_i8`) is ``pmaddubsw``/``pmaddwd`` where the host has
AVX2, a portable widening multiply and vector reduction elsewhere. They read a row of
blocks through the row's data pointer, so rows must hold their blocks contiguously (the
table of :mod:`.dispatch` sends other layouts to the float32 kernels).

A K-quant's sub-blocks line up with the activation blocks (Q4_K: 32 values per scale
and min; Q6_K: 16 per scale, two to a block), so one Q8_0 activation block serves one
Q4_K sub-block or two Q6_K ones. ggml uses 256-value Q8_K activations here; the
32-value blocks round finer, so results sit a little closer to the exact product than
llama.cpp's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from tensorplug.types import Type

from ._numba_cache import kernel
from ._numba_introw import (
    rows1_dot_q6_k,
    rows1_dot_q8_0,
    rows4_dot_q4_0,
    rows4_dot_q4_1,
    rows4_dot_q4_k,
    rows4_dot_q5_0,
    rows4_dot_q5_1,
)
from ._numba_ir import I8, I32, dot_i8, f32_from_bits, load_array, runtime_splat, splat, vec_of
from ._numba_kquant import scale_min_k4
from ._numba_quant import DOT_FASTMATH, ROW_CHUNKS, chunk_span, f16_at, quantize_activations
from .kernel_shapes import INT8_ROWS

# the type ids the driver branches on
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K = (
    int(t) for t in (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q6_K)
)
#: the ids of the types whose kernel takes one weight row at a time (the dispatch table's
#: :data:`~.kernel_shapes.INT8_ROWS`), the others' four
_ONE_ROW = tuple(int(t) for t, n in INT8_ROWS.items() if n == 1)


@intrinsic
def _dot_nibbles(typingctx: Any, w: Any, wo: Any, shift: Any, x: Any, xo: Any) -> Any:
    """Σ_j ((w[wo+j] >> shift) & 15) · x[xo+j] over 32 bytes (Q4_K: low nibbles are one
    sub-block, high nibbles the next)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        q = load_array(builder, context, sig.args[0], args[0], args[1], 32)
        nib = builder.and_(builder.lshr(q, runtime_splat(builder, args[2], 32)),
                           splat(I8, 32, 15))  # fmt: skip
        return dot_i8(builder, nib, load_array(builder, context, sig.args[3], args[3], args[4], 32))

    return types.int32(w, wo, shift, x, xo), codegen


# -- one row of weights times one row of quantized activations, per type --------------------


@intrinsic
def _dot_q4(typingctx: Any, w: Any, wo: Any, x: Any, xo: Any) -> Any:
    """Σ_j nibble_j · x_j over one block: ``w[wo:wo+16]`` packs 32 nibbles (low halves are
    elements 0-15), ``x[xo:xo+32]`` int8. The -8 offset is the caller's (Σx per block)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        q = load_array(builder, context, sig.args[0], args[0], args[1], 16)
        lo = builder.and_(q, splat(I8, 16, 15))
        hi = builder.lshr(q, splat(I8, 16, 4))
        order = ir.Constant(vec_of(I32, 32), list(range(32)))
        nibbles = builder.shuffle_vector(lo, hi, order)
        return dot_i8(
            builder, nibbles, load_array(builder, context, sig.args[2], args[2], args[3], 32)
        )

    return types.int32(w, wo, x, xo), codegen


@intrinsic
def _dot_q5(typingctx: Any, w: Any, wo: Any, x: Any, xo: Any) -> Any:
    """Σ_j (nibble_j | bit_j << 4) · x_j over one Q5 block whose ``qh`` (a little-endian
    u32 of fifth bits) starts at ``w[wo]`` and whose 16 nibble bytes follow it."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        # byte j // 8 of qh holds bit j: spread each byte over 8 lanes, test one bit each
        four = load_array(builder, context, sig.args[0], args[0], args[1], 4)
        order = ir.Constant(vec_of(I32, 32), [j // 8 for j in range(32)])
        spread = builder.shuffle_vector(four, four, order)
        mask = ir.Constant(vec_of(I8, 32), [1 << (j % 8) for j in range(32)])
        set_ = builder.icmp_unsigned("!=", builder.and_(spread, mask), splat(I8, 32, 0))
        high = builder.shl(builder.zext(set_, vec_of(I8, 32)), splat(I8, 32, 4))
        qs_at = builder.add(args[1], ir.Constant(args[1].type, 4))
        q = load_array(builder, context, sig.args[0], args[0], qs_at, 16)
        lo = builder.and_(q, splat(I8, 16, 15))
        hi = builder.lshr(q, splat(I8, 16, 4))
        nibbles = builder.shuffle_vector(lo, hi, ir.Constant(vec_of(I32, 32), list(range(32))))
        codes = builder.or_(nibbles, high)
        return dot_i8(
            builder, codes, load_array(builder, context, sig.args[2], args[2], args[3], 32)
        )

    return types.int32(w, wo, x, xo), codegen


@njit(inline="always")
def row_q4_0(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_w·d_x·(Σ_j nibble·x − 8·Σx)`` over a row of 18-byte blocks."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q4(row, 18 * b + 2, xr, 32 * b) - 8 * xs[b]  # type: ignore[call-arg]
        total += f16_at(row, 18 * b, table) * xd[b] * np.float32(isum)
    return total


@njit(inline="always")
def row_q4_1(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_w·d_x·Σ_j nibble·x + m_w·s_x`` over a row of 20-byte blocks (``xs``
    holds the Q8_1 activations' ``s`` as float32 bits)."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q4(row, 20 * b + 4, xr, 32 * b)  # type: ignore[call-arg]
        dm = f16_at(row, 20 * b, table) * np.float32(isum)
        s = f32_from_bits(xs[b])  # type: ignore[call-arg]
        total += xd[b] * dm + f16_at(row, 20 * b + 2, table) * s
    return total


@njit(inline="always")
def row_q5_0(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_w·d_x·(Σ_j q5·x − 16·Σx)`` over a row of 22-byte blocks."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q5(row, 22 * b + 2, xr, 32 * b) - 16 * xs[b]  # type: ignore[call-arg]
        total += f16_at(row, 22 * b, table) * xd[b] * np.float32(isum)
    return total


@njit(inline="always")
def row_q5_1(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_w·d_x·Σ_j q5·x + m_w·s_x`` over a row of 24-byte blocks (``xs`` holds
    the Q8_1 activations' ``s`` as float32 bits)."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q5(row, 24 * b + 4, xr, 32 * b)  # type: ignore[call-arg]
        dm = f16_at(row, 24 * b, table) * np.float32(isum)
        s = f32_from_bits(xs[b])  # type: ignore[call-arg]
        total += xd[b] * dm + f16_at(row, 24 * b + 2, table) * s
    return total


@njit(inline="always")
def _row_q4_k(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b Σ_s d_x·(d·sc_s·Σ q·x − dmin·m_s·Σx)`` over a row of 144-byte blocks."""
    total = np.float32(0)
    for b in range(xd.size // 8):
        at = 144 * b
        d, dmin = f16_at(row, at, table), f16_at(row, at + 2, table)
        for s in range(8):
            sc, mn = scale_min_k4(row, s, at)
            qs, k = at + 16 + 32 * (s >> 1), 8 * b + s
            isum: int = _dot_nibbles(row, qs, 4 * (s & 1), xr, 32 * k)  # type: ignore[call-arg]
            total += xd[k] * (d * np.float32(sc * isum) - dmin * np.float32(mn * xs[k]))
    return total


@njit(inline="always")
def _rows4(rows: Any, o: int, xr: Any, xd: Any, xs: Any, table: Any, kind: int) -> Any:
    """Rows ``o..o+3`` times one activation row (:mod:`._numba_introw`)."""
    nb = xd.size
    if kind == Q4_0:
        return rows4_dot_q4_0(rows, o, xr, xd, xs, table, nb)
    if kind == Q5_0:
        return rows4_dot_q5_0(rows, o, xr, xd, xs, table, nb)
    if kind == Q4_1:
        return rows4_dot_q4_1(rows, o, xr, xd, xs, table, nb)
    if kind == Q4_K:
        return rows4_dot_q4_k(rows, o, xr, xd, xs, table, nb)
    return rows4_dot_q5_1(rows, o, xr, xd, xs, table, nb)


@njit(inline="always")
def _row1(rows: Any, o: int, xr: Any, xd: Any, xs: Any, table: Any, kind: int) -> Any:
    """Row ``o`` times one activation row, for the types streamed one row at a time."""
    if kind == Q8_0:
        return rows1_dot_q8_0(rows, o, xr, xd, xs, table, xd.size)[0]
    return rows1_dot_q6_k(rows, o, xr, xd, xs, table, xd.size)[0]


@njit(inline="always")
def _matvec_range(
    rows: Any, o: int, end: int, xq: Any, xd: Any, xs: Any, out: Any, table: Any, kind: int
) -> None:
    """Output rows ``o..end-1``: Q8_0 and Q6_K one row after another (see
    :mod:`._numba_introw` for why), the other types four at a time, sharing each
    activation block between them. The last rows, fewer than four, are the end of the
    four rows that end at ``end`` (their first rows computed again, to the same bits):
    every row then goes through the four-row kernel, whose IR is fixed, while the
    one-row loops below are vectorized by LLVM as the function they are inlined into
    allows, and the serial and the parallel kernel could round a row differently. Only
    a matrix of fewer than four rows uses them, and it always runs serially
    (``JitKernels.bind_matvec``)."""
    if kind in _ONE_ROW:
        for one in range(o, end):
            for t in range(xq.shape[0]):
                out[t, one] = _row1(rows, one, xq[t], xd[t], xs[t], table, kind)
        return
    while o + 4 <= end:
        for t in range(xq.shape[0]):
            four = _rows4(rows, o, xq[t], xd[t], xs[t], table, kind)
            out[t, o], out[t, o + 1], out[t, o + 2], out[t, o + 3] = four
        o += 4
    if o < end and end >= 4:
        for t in range(xq.shape[0]):
            four = _rows4(rows, end - 4, xq[t], xd[t], xs[t], table, kind)
            for i in range(o, end):
                out[t, i] = four[i - end + 4]
        o = end
    for left in range(o, end):
        row = rows[left]
        for t in range(xq.shape[0]):
            xr, xdt, xst = xq[t], xd[t], xs[t]
            if kind == Q4_0:
                out[t, left] = row_q4_0(row, xr, xdt, xst, table)
            elif kind == Q4_K:
                out[t, left] = _row_q4_k(row, xr, xdt, xst, table)
            elif kind == Q5_0:
                out[t, left] = row_q5_0(row, xr, xdt, xst, table)
            elif kind == Q4_1:
                out[t, left] = row_q4_1(row, xr, xdt, xst, table)
            else:
                out[t, left] = row_q5_1(row, xr, xdt, xst, table)


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_int8(
    x: Any, rows: Any, xq: Any, xd: Any, xs: Any, out: Any, table: Any, kind: int
) -> None:
    """``out[t, o] = W[o]·x[t]`` for weights of ggml type ``kind`` as byte rows
    ``(n_out, row_bytes)``: the rows of ``x`` quantized by :func:`quantize_q8_0` into
    ``xq, xd, xs`` (on the calling thread), then output rows split in chunks (of whole
    groups of four) across threads."""
    quantize_activations(x, xq, xd, xs, table, kind)
    n = rows.shape[0]
    for c in prange(ROW_CHUNKS):
        lo, hi = chunk_span(c, n, 4)
        _matvec_range(rows, lo, hi, xq, xd, xs, out, table, kind)


@kernel(nogil=True, fastmath=DOT_FASTMATH)
def matvec_int8_serial(
    x: Any, rows: Any, xq: Any, xd: Any, xs: Any, out: Any, table: Any, kind: int
) -> None:
    """:func:`matvec_int8` on the calling thread, without a parallel region: on one
    thread the parallel kernel still opens one, a cost paid for each of a token's many
    layer products, each of which takes only tens of microseconds."""
    quantize_activations(x, xq, xd, xs, table, kind)
    _matvec_range(rows, 0, rows.shape[0], xq, xd, xs, out, table, kind)


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_int8_siblings(
    x: Any, rows: Any, outs: Any, kinds: Any, starts: Any, xq: Any, xd: Any, xs: Any, table: Any
) -> None:
    """:func:`matvec_int8` for several matrices that multiply the same ``x`` (a layer's
    Q, K and V; its gate and up): ``x`` quantized once, one parallel region for all.
    ``rows``, ``outs`` and ``kinds`` are tuples, matrix ``m``'s rows sitting at
    ``starts[m]..`` of one concatenated row range (each start a multiple of four, so a
    chunk's share of a matrix begins on a four-row group: every row takes the four-row
    kernel, and its bits are those of :func:`matvec_int8`)."""
    quantize_activations(x, xq, xd, xs, table, kinds[0])
    total = starts[len(rows)]
    for c in prange(ROW_CHUNKS):
        lo, hi = chunk_span(c, total, 4)
        for m in range(len(rows)):
            o, end = max(lo, starts[m]) - starts[m], min(hi, starts[m] + rows[m].shape[0])
            if o < end - starts[m]:
                _matvec_range(rows[m], o, end - starts[m], xq, xd, xs, outs[m], table,
                              kinds[m])  # fmt: skip

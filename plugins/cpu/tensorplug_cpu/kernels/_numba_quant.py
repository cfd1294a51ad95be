"""numba kernels for the quantized types; imported only by :mod:`.jit` when numba works.

Every kernel is a plain module-level function (no closures) so that numba's on-disk
cache can tell them apart and reuse them across processes. Arguments:

* ``blocks``: raw blocks ``(rows, nblocks, type_size)`` uint8 (strided views are fine);
* ``table``: float32 value of every f16 bit pattern (the block scales are f16);
* ``x`` ``(T, n)`` float32 and ``out`` ``(T, rows)`` for the matvec kernels,
  ``out`` ``(rows, n)`` float32 for the dequantize kernels.

Decoding performs ``d·q`` (then ``+ m``) in float32 without fast-math, which is what
:mod:`tensorplug.quants` and ggml do, so decoded weights are bit-identical. The dot
products allow reassociation, as ggml's SIMD reductions do.

:func:`quantize_q8_0` quantizes activations as ggml's x86 path does (``d = amax/127``
stored as f16, ``q = round-half-even(x · 127/amax)``), for the integer kernels
(:mod:`._numba_kint8`, :mod:`._numba_repack`), whose results therefore follow
llama.cpp's rather than the exact float32 product.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from tensorplug.types import Type

from ._numba_cache import kernel
from ._numba_ir import f32_bits, f32_from_bits

#: the fast-math flags of the kernels whose sums may be reordered (a dot product's)
DOT_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

# the weight type ids whose activations are not Q8_0 (:mod:`.activations`)
_Q4_1, _Q5_1 = int(Type.Q4_1), int(Type.Q5_1)
_SUPER_BLOCK = tuple(int(t) for t in Type if t.is_quantized and t.block_size == 256)


@njit(inline="always")
def f16_at(blk: Any, off: int, table: Any) -> Any:
    """The f16 at byte ``off`` of bytes ``blk``, widened by the f16 → f32 ``table``."""
    return table[np.int32(blk[off]) | (np.int32(blk[off + 1]) << 8)]


@njit(inline="always")
def as_int8(u: Any) -> Any:
    """A uint8 byte read as int8."""
    return (np.int32(u) ^ 0x80) - 0x80


@njit(inline="always")
def _u32(blk: Any, off: int) -> Any:
    """The little-endian u32 at ``off`` (the fifth bits ``qh``), as int64."""
    return (
        np.int64(blk[off])
        | (np.int64(blk[off + 1]) << 8)
        | (np.int64(blk[off + 2]) << 16)
        | (np.int64(blk[off + 3]) << 24)
    )


# -- matrix × a few vectors ----------------------------------------------------------------
#
# Each row keeps 32 float32 partial sums, one per position in a block, in a small
# scratch row: LLVM then turns the block loop into a handful of 8-wide FMAs per block
# with no horizontal reduction until the row is done (several times faster than a
# scalar sum per block). Rows are split into chunks, one scratch row per chunk.

#: the chunks a product's rows are split into (:func:`chunk_span`)
ROW_CHUNKS = 64


@njit(inline="always")
def chunk_span(c: int, n: int, unit: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of chunk ``c`` of ``ROW_CHUNKS`` over ``n`` rows, in whole ``unit``
    rows (the last chunk's end excepted): ⌊units/64⌋ or one more units each.

    numba splits a ``prange`` statically, in equal runs of iterations a thread. With
    ``ceil(n / 64)`` rows a chunk, the chunks past the rows' end would be empty: a
    768-row product (96 groups of eight) would fill chunks 0-47, so of two threads the
    first would take 64 groups and the second 32, and a 256-row one would give the
    second thread nothing (two threads then fall well short of twice one thread's
    speed). Any split gives the same bits: a row is computed alone."""
    units = (n + unit - 1) // unit
    return min(n, c * units // ROW_CHUNKS * unit), min(n, (c + 1) * units // ROW_CHUNKS * unit)


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_q8_0(blocks: Any, x: Any, out: Any, table: Any) -> None:
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                xr = x[t]
                for b in range(blocks.shape[1]):
                    blk = blocks[o, b]
                    d = f16_at(blk, 0, table)
                    for j in range(32):
                        acc[j] += d * np.float32(as_int8(blk[2 + j])) * xr[b * 32 + j]
                out[t, o] = acc.sum()


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_q4_0(blocks: Any, x: Any, out: Any, table: Any) -> None:
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                xr = x[t]
                for b in range(blocks.shape[1]):
                    blk = blocks[o, b]
                    d = f16_at(blk, 0, table)
                    for j in range(16):
                        q = np.int32(blk[2 + j])
                        acc[j] += d * np.float32((q & 15) - 8) * xr[b * 32 + j]
                        acc[16 + j] += d * np.float32((q >> 4) - 8) * xr[b * 32 + 16 + j]
                out[t, o] = acc.sum()


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_q4_1(blocks: Any, x: Any, out: Any, table: Any) -> None:
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                xr = x[t]
                for b in range(blocks.shape[1]):
                    blk = blocks[o, b]
                    d, m = f16_at(blk, 0, table), f16_at(blk, 2, table)
                    for j in range(16):
                        q = np.int32(blk[4 + j])
                        acc[j] += (d * np.float32(q & 15) + m) * xr[b * 32 + j]
                        acc[16 + j] += (d * np.float32(q >> 4) + m) * xr[b * 32 + 16 + j]
                out[t, o] = acc.sum()


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_q5_0(blocks: Any, x: Any, out: Any, table: Any) -> None:
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                xr = x[t]
                for b in range(blocks.shape[1]):
                    blk = blocks[o, b]
                    d = f16_at(blk, 0, table)
                    qh = _u32(blk, 2)
                    for j in range(16):
                        q = np.int64(blk[6 + j])
                        lo = ((q & 15) | (((qh >> j) & 1) << 4)) - 16
                        hi = ((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16
                        acc[j] += d * np.float32(lo) * xr[b * 32 + j]
                        acc[16 + j] += d * np.float32(hi) * xr[b * 32 + 16 + j]
                out[t, o] = acc.sum()


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_q5_1(blocks: Any, x: Any, out: Any, table: Any) -> None:
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                xr = x[t]
                for b in range(blocks.shape[1]):
                    blk = blocks[o, b]
                    d, m = f16_at(blk, 0, table), f16_at(blk, 2, table)
                    qh = _u32(blk, 4)
                    for j in range(16):
                        q = np.int64(blk[8 + j])
                        lo = (q & 15) | (((qh >> j) & 1) << 4)
                        hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
                        acc[j] += (d * np.float32(lo) + m) * xr[b * 32 + j]
                        acc[16 + j] += (d * np.float32(hi) + m) * xr[b * 32 + 16 + j]
                out[t, o] = acc.sum()


# -- decoding to float32 -----------------------------------------------------------------------
#
# Serial and nogil: a product decodes its weights chunk by chunk on the worker pool's
# threads (see ..workers), each chunk right before the BLAS call that reads it.


@kernel(nogil=True)
def dequantize_q8_0(blocks: Any, out: Any, table: Any) -> None:
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            blk = blocks[r, b]
            d = f16_at(blk, 0, table)
            for j in range(32):
                out[r, b * 32 + j] = d * np.float32(as_int8(blk[2 + j]))


@kernel(nogil=True)
def dequantize_q4_0(blocks: Any, out: Any, table: Any) -> None:
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            blk = blocks[r, b]
            d = f16_at(blk, 0, table)
            for j in range(16):
                q = np.int32(blk[2 + j])
                out[r, b * 32 + j] = d * np.float32((q & 15) - 8)
                out[r, b * 32 + 16 + j] = d * np.float32((q >> 4) - 8)


@kernel(nogil=True)
def dequantize_q4_1(blocks: Any, out: Any, table: Any) -> None:
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            blk = blocks[r, b]
            d, m = f16_at(blk, 0, table), f16_at(blk, 2, table)
            for j in range(16):
                q = np.int32(blk[4 + j])
                out[r, b * 32 + j] = d * np.float32(q & 15) + m
                out[r, b * 32 + 16 + j] = d * np.float32(q >> 4) + m


@kernel(nogil=True)
def dequantize_q5_0(blocks: Any, out: Any, table: Any) -> None:
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            blk = blocks[r, b]
            d = f16_at(blk, 0, table)
            qh = _u32(blk, 2)
            for j in range(16):
                q = np.int64(blk[6 + j])
                lo = ((q & 15) | (((qh >> j) & 1) << 4)) - 16
                hi = ((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16
                out[r, b * 32 + j] = d * np.float32(lo)
                out[r, b * 32 + 16 + j] = d * np.float32(hi)


@kernel(nogil=True)
def dequantize_q5_1(blocks: Any, out: Any, table: Any) -> None:
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            blk = blocks[r, b]
            d, m = f16_at(blk, 0, table), f16_at(blk, 2, table)
            qh = _u32(blk, 4)
            for j in range(16):
                q = np.int64(blk[8 + j])
                lo = (q & 15) | (((qh >> j) & 1) << 4)
                hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
                out[r, b * 32 + j] = d * np.float32(lo) + m
                out[r, b * 32 + 16 + j] = d * np.float32(hi) + m


# -- activations as Q8_0, for the integer kernels -------------------------------------------
# the mat×vec kernels (fast-math) call these two, which must round as ggml: kernel()'s
# fastmath=False keeps numba from handing them the callers' flags


@kernel()
def f32_to_f16_bits(f: Any) -> Any:
    """IEEE f16 bits of ``f`` rounded to nearest even (``GGML_FP32_TO_FP16``)."""
    a = np.int64(f32_bits(np.float32(f))) & 0xFFFFFFFF  # type: ignore[call-arg]
    sign = (a >> 16) & 0x8000
    a &= 0x7FFFFFFF
    if a >= 0x47800000:  # >= 65520 rounds to inf; NaN stays NaN
        r = 0x7E00 if a > 0x7F800000 else 0x7C00
    elif a < 0x38800000:  # subnormal f16: let float addition round
        shifted = f32_from_bits(np.int32(a)) + np.float32(0.5)  # type: ignore[call-arg]
        r = np.int64(f32_bits(shifted)) - 0x3F000000  # type: ignore[call-arg]
    else:
        r = (a + 0xC8000FFF + ((a >> 13) & 1)) >> 13
    return (r | sign) & 0xFFFF


#: 1.5·2^23: ``(y + _ROUNDER) − _ROUNDER`` is ``y`` rounded half to even for |y| < 2^22
#: (ggml's ``nearest_int``), a vector add where ``np.rint`` is a call per value
_ROUNDER = np.float32(12582912.0)


@njit(inline="always")
def nearest_int(y: Any) -> Any:
    """``y`` (|y| ≤ 127 and a little, or inf or NaN) rounded half to even, as an int32:
    ``np.rint``'s value for every |y| < 2^22, and inf and NaN convert as they did."""
    return np.int32((y + _ROUNDER) - _ROUNDER)


@njit(inline="always")
def largest_magnitude(x: Any, t: int, start: int, n: int) -> Any:
    """``max |x[t, start : start + n]|`` (``n`` a multiple of 8), NaN values skipped as a
    running ``max(amax, |v|)`` skips them: eight running maxima side by side, where one
    would be a chain of dependent compares, and eight run faster than four (max is
    exact, so the order of the comparisons changes nothing)."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(0)
    for j in range(start, start + n, 8):
        m0 = max(m0, abs(x[t, j]))
        m1 = max(m1, abs(x[t, j + 1]))
        m2 = max(m2, abs(x[t, j + 2]))
        m3 = max(m3, abs(x[t, j + 3]))
        m4 = max(m4, abs(x[t, j + 4]))
        m5 = max(m5, abs(x[t, j + 5]))
        m6 = max(m6, abs(x[t, j + 6]))
        m7 = max(m7, abs(x[t, j + 7]))
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@njit(inline="always")
def _q8_0_codes(x: Any, t: int, xq: Any, xd: Any, xs: Any) -> None:
    """Row ``t`` of ``x`` as Q8_0's codes ``xq`` and code sums ``xs``, each block's
    largest magnitude left in ``xd`` (for the caller's scales): the magnitudes first,
    then the codes; in one loop the compiler vectorizes neither, several times
    slower."""
    for b in range(x.shape[1] // 32):
        xd[t, b] = largest_magnitude(x, t, 32 * b, 32)
    for b in range(x.shape[1] // 32):
        amax = xd[t, b]
        inv = np.float32(127) / amax if amax != 0 else np.float32(0)
        total = 0
        for j in range(32):
            q = nearest_int(x[t, 32 * b + j] * inv)
            xq[t, 32 * b + j] = q
            total += q
        xs[t, b] = total


@kernel()  # see f32_to_f16_bits
def quantize_q8_0(x: Any, xq: Any, xd: Any, xs: Any, table: Any) -> None:
    """Rows of ``x`` (T, n) float32 as ggml's Q8_0: int8 ``xq`` (T, n), the f16-rounded
    scales ``xd`` (T, n/32) and each block's sum of codes ``xs`` (T, n/32)."""
    for t in range(x.shape[0]):
        _q8_0_codes(x, t, xq, xd, xs)
        for b in range(x.shape[1] // 32):
            xd[t, b] = table[f32_to_f16_bits(xd[t, b] / np.float32(127))]


@kernel()  # see f32_to_f16_bits
def quantize_q8_1(x: Any, xq: Any, xd: Any, xs: Any, table: Any) -> None:
    """Rows of ``x`` as ggml's Q8_1 (x86's ``quantize_row_q8_1``): Q8_0's codes and
    scales, and in ``xs`` the float32 bits of each block's ``s = f16(d·Σcode)`` (``d``
    the unrounded float32 scale), which the Q4_1/Q5_1 kernels multiply by the weights'
    offset ``m`` in place of ``d_x·Σcode``."""
    for t in range(x.shape[0]):
        _q8_0_codes(x, t, xq, xd, xs)
        for b in range(x.shape[1] // 32):
            d = xd[t, b] / np.float32(127)
            s = d * np.float32(xs[t, b])
            xs[t, b] = f32_bits(table[f32_to_f16_bits(s)])  # type: ignore[call-arg]
            xd[t, b] = table[f32_to_f16_bits(d)]


@kernel()  # see f32_to_f16_bits
def quantize_q8_k(x: Any, xq: Any, xd: Any, xs: Any, table: Any) -> None:
    """Rows of ``x`` as ggml's Q8_K (``quantize_row_q8_K_ref``, which x86 runs): per 256
    values, ``iscale = −127/max`` with ``max`` the first value of largest magnitude,
    codes ``min(127, round-half-even(iscale·x))``, ``d = 1/iscale`` in float32. Written
    in the 32-value layout of the other activations: each of a super-block's eight
    blocks gets its ``d`` in ``xd`` and its code sum in ``xs`` (ggml's ``bsums`` are
    the sums of 16, which the kernels take from these or from the codes). The largest
    magnitude is found as :func:`quantize_q8_0` finds it, then its first value by a
    scan (in one loop of compares, the compiler vectorizes nothing, several times
    slower).

    A super-block whose ``iscale`` is zero has every code 0, as ggml's: one of zeros
    and NaNs (``amax`` 0: ggml writes zeros and ``d = 0``), or one whose largest
    magnitude is infinite (``−127/±inf`` is a signed zero: ggml's ``nearest_int``
    makes 0 of each ``0·x``, and of the NaN ``0·inf``, and ``d = 1/iscale`` is an
    infinity of the sign opposite to that value's, so the products are NaN as
    llama.cpp's). The codes are written as 0 there rather than rounded: this kernel's
    int32 conversion of that NaN is INT32_MIN, which went into the code sums (and the
    division by the zero raised ZeroDivisionError before kernels divided as IEEE does,
    :func:`._numba_cache.kernel`)."""
    for t in range(x.shape[0]):
        for sb in range(x.shape[1] // 256):
            amax = largest_magnitude(x, t, 256 * sb, 256)
            big = np.float32(0)
            if amax != 0:
                j = 256 * sb
                while abs(x[t, j]) != amax:
                    j += 1
                big = x[t, j]
            iscale = np.float32(-127) / big if amax != 0 else np.float32(0)
            d = np.float32(1) / iscale if amax != 0 else np.float32(0)
            if iscale == 0:  # zeros and NaNs only, or an infinite largest magnitude
                for b in range(8 * sb, 8 * sb + 8):
                    xq[t, 32 * b : 32 * b + 32] = 0
                    xs[t, b] = 0
                    xd[t, b] = d
                continue
            for b in range(8 * sb, 8 * sb + 8):
                total = 0
                for j in range(32):
                    q = min(nearest_int(iscale * x[t, 32 * b + j]), 127)
                    xq[t, 32 * b + j] = q
                    total += q
                xs[t, b] = total
                xd[t, b] = d


@kernel()  # see f32_to_f16_bits
def quantize_activations(x: Any, xq: Any, xd: Any, xs: Any, table: Any, kind: int) -> None:
    """Rows of ``x`` quantized to the ``vec_dot_type`` ggml uses for weights of type id
    ``kind`` (:func:`.activations.vec_dot_type`): Q8_1 for Q4_1 and Q5_1, Q8_K for the
    256-value K-quants, else Q8_0."""
    if kind in (_Q4_1, _Q5_1):
        quantize_q8_1(x, xq, xd, xs, table)
    elif kind in _SUPER_BLOCK:
        quantize_q8_k(x, xq, xd, xs, table)
    else:
        quantize_q8_0(x, xq, xd, xs, table)


@kernel(nogil=True)
def round_activations(
    x: Any, out: Any, corr: Any, xq: Any, xd: Any, xs: Any, table: Any, kind: int
) -> None:
    """``out = d·code`` of rows ``x`` quantized by :func:`quantize_activations` for weight
    type id ``kind``, for the paths that multiply float32 decoded weights (the same
    values as :func:`.activations.round_rows`, which numpy computes several times
    slower); for
    Q8_1 also ``corr[t, b] = s − d·Σcode`` (:func:`.activations.q8_1_offset_correction`)."""
    quantize_activations(x, xq, xd, xs, table, kind)
    q8_1 = kind in (_Q4_1, _Q5_1)
    for t in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            d = xd[t, b]
            total = 0
            for j in range(32):
                q = np.int32(xq[t, 32 * b + j])
                out[t, 32 * b + j] = d * np.float32(q)
                total += q
            if q8_1:
                s = f32_from_bits(xs[t, b])  # type: ignore[call-arg, var-annotated]
                corr[t, b] = s - d * np.float32(total)

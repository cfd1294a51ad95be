"""numba kernels for the K-quants (Q2_K … Q6_K); imported by :mod:`.jit` with numba.

Per type, a decoder turns a 256-element super-block into float32 values with the float
steps of :mod:`tensorplug.kquants` (so the batched path's weights are bit-identical to
numpy's), and a fused dot product accumulates the same values times the activations
without storing them. The two drivers — matrix × a few vectors, and decoding a matrix —
take the type's ggml id (``kind``) and branch once per block, which costs nothing next
to the 256 values a block holds. Arguments are those of
:mod:`._numba_quant`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from tensorplug.kquants import K_TYPES

from ._numba_cache import kernel
from ._numba_quant import DOT_FASTMATH, ROW_CHUNKS, as_int8, chunk_span, f16_at

# the type ids the drivers branch on
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (int(t) for t in K_TYPES)


@njit(inline="always")
def _q2_k(blk: Any, table: Any, vals: Any) -> None:
    d, dmin = f16_at(blk, 80, table), f16_at(blk, 82, table)
    for s in range(16):
        sc = np.int32(blk[s])
        dl, ml = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
        hb, pair, l0 = s >> 3, (s >> 1) & 3, (s & 1) * 16
        for i in range(16):
            q = (np.int32(blk[16 + 32 * hb + l0 + i]) >> (2 * pair)) & 3
            vals[16 * s + i] = dl * np.float32(q) - ml


@njit(inline="always")
def _q3_scale(blk: Any, s: int) -> Any:
    """Sub-block ``s``'s signed 6-bit scale (4 low bits, then 2 high bits of byte 104+)."""
    lo = np.int32(blk[96 + s] & 15) if s < 8 else np.int32(blk[96 + s - 8] >> 4)
    hi = (np.int32(blk[104 + (s & 3)]) >> (2 * (s >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit(inline="always")
def _q3_k(blk: Any, table: Any, vals: Any) -> None:
    d = f16_at(blk, 108, table)
    for s in range(16):
        dl = d * np.float32(_q3_scale(blk, s))
        hb, pair, l0 = s >> 3, (s >> 1) & 3, (s & 1) * 16
        for i in range(16):
            low = (np.int32(blk[32 + 32 * hb + l0 + i]) >> (2 * pair)) & 3
            high = (np.int32(blk[l0 + i]) >> (4 * hb + pair)) & 1
            vals[16 * s + i] = dl * np.float32(low - 4 + 4 * high)


@njit(inline="always")
def scale_min_k4(blk: Any, s: int, at: int = 0) -> tuple[Any, Any]:
    """Sub-block ``s``'s 6-bit scale and min (ggml's ``get_scale_min_k4``) of the Q4_K or
    Q5_K block at byte ``at`` of ``blk``: the decoders pass a block, the integer row
    kernels a whole row and the block's offset."""
    q = at + 4  # the scales start at byte 4 of Q4_K and Q5_K
    if s < 4:
        return np.int32(blk[q + s] & 63), np.int32(blk[q + s + 4] & 63)
    sc = np.int32(blk[q + s + 4] & 15) | ((np.int32(blk[q + s - 4]) >> 6) << 4)
    mn = (np.int32(blk[q + s + 4]) >> 4) | ((np.int32(blk[q + s]) >> 6) << 4)
    return sc, mn


@njit(inline="always")
def _q45_k(blk: Any, table: Any, vals: Any, five: bool) -> None:
    d, dmin = f16_at(blk, 0, table), f16_at(blk, 2, table)
    base = 48 if five else 16
    for s in range(8):
        sc, mn = scale_min_k4(blk, s)
        d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
        shift = 4 * (s & 1)
        for i in range(32):
            q = (np.int32(blk[base + 32 * (s >> 1) + i]) >> shift) & 15
            if five:
                q |= ((np.int32(blk[16 + i]) >> s) & 1) << 4
            vals[32 * s + i] = d1 * np.float32(q) - m1


@njit(inline="always")
def _q6_k(blk: Any, table: Any, vals: Any) -> None:
    d = f16_at(blk, 208, table)
    for s in range(16):
        dl = d * np.float32(as_int8(blk[192 + s]))
        hb, pair, l0 = s >> 3, (s >> 1) & 3, (s & 1) * 16
        for i in range(16):
            nib = (np.int32(blk[64 * hb + 32 * (pair & 1) + l0 + i]) >> (4 * (pair >> 1))) & 15
            high = (np.int32(blk[128 + 32 * hb + l0 + i]) >> (2 * pair)) & 3
            vals[16 * s + i] = dl * np.float32((nib | (high << 4)) - 32)


@njit(inline="always")
def _decode(kind: int, blk: Any, table: Any, vals: Any) -> None:
    if kind == Q2_K:
        _q2_k(blk, table, vals)
    elif kind == Q3_K:
        _q3_k(blk, table, vals)
    elif kind == Q4_K:
        _q45_k(blk, table, vals, False)
    elif kind == Q5_K:
        _q45_k(blk, table, vals, True)
    else:
        _q6_k(blk, table, vals)


# -- fused dot products: decode a sub-block straight into 32 partial sums ----------------
#
# As in _numba_quant: each (row, token) keeps 32 float32 partial sums that LLVM holds in
# vector registers; every sub-block's values are decoded and multiplied in one
# vectorisable loop of 16 or 32, with no intermediate array.


@njit(inline="always")
def _dot_q2_k(blk: Any, table: Any, x: Any, acc: Any) -> None:
    d, dmin = f16_at(blk, 80, table), f16_at(blk, 82, table)
    for r in range(8):  # runs of 32: two 16-element sub-blocks
        hb, shift = r >> 2, 2 * (r & 3)
        s0, s1 = np.int32(blk[2 * r]), np.int32(blk[2 * r + 1])
        d0, m0 = d * np.float32(s0 & 15), dmin * np.float32(s0 >> 4)
        d1, m1 = d * np.float32(s1 & 15), dmin * np.float32(s1 >> 4)
        for i in range(32):
            q = np.float32((np.int32(blk[16 + 32 * hb + i]) >> shift) & 3)
            v = d0 * q - m0 if i < 16 else d1 * q - m1
            acc[i] += v * x[32 * r + i]


@njit(inline="always")
def _dot_q3_k(blk: Any, table: Any, x: Any, acc: Any) -> None:
    d = f16_at(blk, 108, table)
    for r in range(8):  # runs of 32: two 16-element sub-blocks
        shift = 2 * (r & 3)
        d0 = d * np.float32(_q3_scale(blk, 2 * r))
        d1 = d * np.float32(_q3_scale(blk, 2 * r + 1))
        for i in range(32):
            low = (np.int32(blk[32 + 32 * (r >> 2) + i]) >> shift) & 3
            high = (np.int32(blk[i]) >> r) & 1
            dl = d0 if i < 16 else d1
            acc[i] += dl * np.float32(low - 4 + 4 * high) * x[32 * r + i]


@njit(inline="always")
def _dot_q4_k(blk: Any, table: Any, x: Any, acc: Any) -> None:
    d, dmin = f16_at(blk, 0, table), f16_at(blk, 2, table)
    for s in range(8):
        sc, mn = scale_min_k4(blk, s)
        d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
        base, shift = 16 + 32 * (s >> 1), 4 * (s & 1)
        for i in range(32):
            q = (np.int32(blk[base + i]) >> shift) & 15
            acc[i] += (d1 * np.float32(q) - m1) * x[32 * s + i]


@njit(inline="always")
def _dot_q5_k(blk: Any, table: Any, x: Any, acc: Any) -> None:
    d, dmin = f16_at(blk, 0, table), f16_at(blk, 2, table)
    for s in range(8):
        sc, mn = scale_min_k4(blk, s)
        d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
        base, shift = 48 + 32 * (s >> 1), 4 * (s & 1)
        for i in range(32):
            q = ((np.int32(blk[base + i]) >> shift) & 15) | (
                ((np.int32(blk[16 + i]) >> s) & 1) << 4
            )
            acc[i] += (d1 * np.float32(q) - m1) * x[32 * s + i]


@njit(inline="always")
def _dot_q6_k(blk: Any, table: Any, x: Any, acc: Any) -> None:
    # runs of 32 (two 16-element sub-blocks, two scales): one vectorisable loop each
    d = f16_at(blk, 208, table)
    for r in range(8):
        hb, pair = r >> 2, r & 3
        d0 = d * np.float32(as_int8(blk[192 + 2 * r]))
        d1 = d * np.float32(as_int8(blk[193 + 2 * r]))
        ql, qh = 64 * hb + 32 * (pair & 1), 128 + 32 * hb
        nshift, hshift = 4 * (pair >> 1), 2 * pair
        for i in range(32):
            nib = (np.int32(blk[ql + i]) >> nshift) & 15
            high = (np.int32(blk[qh + i]) >> hshift) & 3
            dl = d0 if i < 16 else d1
            acc[i] += dl * np.float32((nib | (high << 4)) - 32) * x[32 * r + i]


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_k(blocks: Any, x: Any, out: Any, table: Any, kind: int) -> None:
    """``out[t, o] = Σᵢ x[t, i]·W[o, i]``, output rows split in chunks across threads."""
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                for b in range(blocks.shape[1]):
                    blk, xb = blocks[o, b], x[t, b * 256 : (b + 1) * 256]
                    if kind == Q4_K:
                        _dot_q4_k(blk, table, xb, acc)
                    elif kind == Q6_K:
                        _dot_q6_k(blk, table, xb, acc)
                    elif kind == Q5_K:
                        _dot_q5_k(blk, table, xb, acc)
                    elif kind == Q3_K:
                        _dot_q3_k(blk, table, xb, acc)
                    else:
                        _dot_q2_k(blk, table, xb, acc)
                out[t, o] = acc.sum()


@kernel(nogil=True)
def dequantize_k(blocks: Any, out: Any, table: Any, kind: int) -> None:
    """Serial and nogil, like :mod:`._numba_quant`'s decoders (they run per chunk on
    the worker pool)."""
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            _decode(kind, blocks[r, b], table, out[r, b * 256 : (b + 1) * 256])

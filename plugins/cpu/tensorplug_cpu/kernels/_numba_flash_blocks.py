"""numba flash attention over a quantized K cache, in the arithmetic of ggml's kernel.

ggml's ``one_chunk`` reads a quantized K row as it stores it: the query is quantized to
K's ``vec_dot_type`` (Q8_0, or Q8_1 for Q4_1 and Q5_1 keys) and each score is K's
``ggml_vec_dot_*`` on x86, eight lanes of four integer products each, every block's
lanes scaled by ``d_k·d_q`` into eight float accumulators (fused), summed across lanes
at the end, plus for Q4_1/Q5_1 the offsets' ``Σ m_k·s_q`` kept beside. The online
softmax and the value rows are :func:`._numba_flash.flash_attend`'s: an F16 V
accumulated in f16, any other V decoded to float32 and accumulated in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from . import _numba_ir as _ir
from ._numba_attention import cell_rows, visible_cells
from ._numba_cache import kernel
from ._numba_flash import online_cell
from ._numba_ir import f32_from_bits
from ._numba_quant import f16_at, quantize_activations

#: ggml's type ids of the key types read here
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL = 2, 3, 6, 7, 8, 20
#: IQ4_NL's sixteen values (ggml's ``kvalues_iq4nl``)
_IQ4_NL_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32
)


@njit(inline="always")
def _bytes_of(kind: int) -> int:
    if kind == Q4_0:
        return 18
    if kind == Q4_1:
        return 20
    if kind == Q5_0:
        return 22
    if kind == Q5_1:
        return 24
    if kind == IQ4_NL:
        return 18
    return 34


@njit(inline="always")
def _block_codes(row: Any, at: int, kind: int, codes: Any) -> None:
    """The 32 values of the block at ``row[at]`` as the integers ggml's ``vec_dot``
    multiplies, into ``codes``: Q8_0's int8; Q4_0's nibble − 8; Q5_0's five bits − 16;
    Q4_1's and Q5_1's codes as they are (their minimum is the ``m·s`` term); IQ4_NL's
    levels. Low nibbles hold values 0–15, high nibbles 16–31. One loop per type, so
    each is a plain loop the compiler vectorizes."""
    if kind == Q8_0:
        for i in range(32):
            codes[i] = np.int32(np.int8(row[at + 2 + i]))
        return
    if kind == IQ4_NL:
        for i in range(16):
            byte = np.int32(row[at + 2 + i])
            codes[i] = _IQ4_NL_VALUES[byte & 15]
            codes[16 + i] = _IQ4_NL_VALUES[byte >> 4]
        return
    head = 2 if kind == Q4_0 else (4 if kind == Q4_1 else (6 if kind == Q5_0 else 8))
    offset = 8 if kind == Q4_0 else (16 if kind == Q5_0 else 0)
    for i in range(16):
        byte = np.int32(row[at + head + i])
        codes[i] = byte & 15
        codes[16 + i] = byte >> 4
    if kind in (Q5_0, Q5_1):
        q = head - 4
        qh = (np.int32(row[at + q]) | (np.int32(row[at + q + 1]) << 8)
              | (np.int32(row[at + q + 2]) << 16) | (np.int32(row[at + q + 3]) << 24))  # fmt: skip
        for i in range(32):
            codes[i] |= ((qh >> i) & 1) << 4
    for i in range(32):
        codes[i] -= offset


@njit(inline="always")
def _block_lanes(codes: Any, xr: Any, first: int, d: Any, lanes: Any, base: int) -> None:
    """``lanes[base + l] ← fma(d, Σ_j codes·x over values 4l..4l+3, lanes[base + l])``:
    one block's eight integer partial sums (``vpmaddubsw`` then ``vpmaddwd``)."""
    for lane in range(8):
        isum = np.int32(0)
        for j in range(4):
            isum += codes[4 * lane + j] * np.int32(xr[first + 4 * lane + j])
        lanes[base + lane] = _ir.fmaf(d, np.float32(isum), lanes[base + lane])


@njit(inline="always")
def _hsum8(lanes: Any) -> Any:
    """``hsum_float_8``: the halves added, then pairs, then the last two."""
    r0, r1 = lanes[4] + lanes[0], lanes[5] + lanes[1]
    r2, r3 = lanes[6] + lanes[2], lanes[7] + lanes[3]
    return (r0 + r2) + (r1 + r3)


@njit(inline="always")
def _vec_dot(row: Any, xr: Any, xd: Any, xs: Any, kind: int, n_blocks: int, table: Any,
             lanes: Any, codes: Any) -> Any:  # fmt: skip
    """K's ``ggml_vec_dot`` (x86, AVX2) of one key row ``row`` (its blocks' bytes) and a
    query quantized to ``xr`` (codes), ``xd`` (f16-rounded scales) and ``xs`` (Q8_1's
    ``s`` as float32 bits). IQ4_NL's takes its blocks in pairs onto two accumulators,
    added before the sum across lanes, and an odd last block in integers after."""
    size = _bytes_of(kind)
    for lane in range(16):
        lanes[lane] = np.float32(0)
    if kind == IQ4_NL:
        b = 0
        while b + 1 < n_blocks:
            for k in range(2):
                at = (b + k) * size
                _block_codes(row, at, kind, codes)
                d = xd[b + k] * f16_at(row, at, table)
                _block_lanes(codes, xr, 32 * (b + k), d, lanes, 8 * k)
            b += 2
        for lane in range(8):
            lanes[lane] = lanes[lane] + lanes[8 + lane]
        total = _hsum8(lanes)
        while b < n_blocks:
            at = b * size
            _block_codes(row, at, kind, codes)
            isum = np.int32(0)
            for i in range(32):
                isum += codes[i] * np.int32(xr[32 * b + i])
            total = _ir.fmaf(xd[b] * f16_at(row, at, table), np.float32(isum), total)
            b += 1
        return total
    offsets = kind in (Q4_1, Q5_1)
    summs = np.float32(0)
    for b in range(n_blocks):
        at = b * size
        if offsets:
            s = f32_from_bits(xs[b])  # type: ignore[call-arg, var-annotated]  # numba intrinsic
            summs = _ir.fmaf(f16_at(row, at + 2, table), s, summs)
        _block_codes(row, at, kind, codes)
        _block_lanes(codes, xr, 32 * b, f16_at(row, at, table) * xd[b], lanes, 0)
    total = _hsum8(lanes)
    return total + summs if offsets else total


@kernel(parallel=True)
def flash_attend_blocks(q: Any, xq: Any, xd: Any, xs: Any, k: Any, v: Any, mask: Any,
                        order: Any, used: int, scale: float, softcap: float, kind: int,
                        half_v: bool, out: Any, table: Any) -> None:  # fmt: skip
    """``out[b, r, h] = softmax_j(s_j)·v_j`` over cache rows ``j < used`` as ggml's
    ``one_chunk`` computes it for a K cache of type id ``kind``.

    q (B, H, n_q, D) C-contiguous float32, quantized here into ``xq`` (B·H·n_q, D) int8,
    ``xd`` and ``xs`` (B·H·n_q, D/32) float32 and int32; k (Bk, Hkv, n_kv, bytes) each
    head's blocks of a cell; v (Bk, Hkv, n_kv, Dv) raw f16 (``half_v``) or float32;
    ``mask`` the term added to the scores (Bm, Hm, ≥n_q, ≥used), float32 or raw f16, or
    shape (0, 0, 0, 0) for none; ``order`` int32 (n_kv,) or (0,); out (B, n_q, H, Dv). A
    query that sees no cell gets zeros. One task per (batch, query head)."""
    n_b, n_h, n_q, n_d = q.shape
    quantize_activations(q.reshape(n_b * n_h * n_q, n_d), xq, xd, xs, table, kind)
    group = n_h // k.shape[1]
    n_dv, n_blocks = v.shape[3], n_d // 32
    has_mask = mask.shape[0] > 0
    sc, cap = np.float32(scale), np.float32(softcap)
    width = max(used, 1)
    for task in prange(n_b * n_h):
        t = np.int64(task)
        b, h = t // n_h, t % n_h
        kb = b if k.shape[0] > 1 else 0
        hk = h // group
        values = cell_rows(v, table, kb, used)
        cols, biases = np.empty(width, np.int64), np.empty(width, np.float32)
        acc, lanes = np.empty(n_dv, np.float32), np.empty(16, np.float32)
        codes = np.empty(32, np.int32)
        mb = b if has_mask and mask.shape[0] > 1 else 0
        mh = h if has_mask and mask.shape[1] > 1 else 0
        for r in range(n_q):
            row = (b * n_h + h) * n_q + r
            m = visible_cells(mask, table, mb, mh, r, used, has_mask, order, cols, biases)
            for d in range(n_dv):
                acc[d] = np.float32(0)
            big, total = np.float32(-np.inf), np.float32(0)
            for c in range(m):
                col = cols[c]
                s = _vec_dot(k[kb, hk, col], xq[row], xd[row], xs[row], kind, n_blocks, table,
                             lanes, codes) * sc  # fmt: skip
                big, total = online_cell(values, table, hk, col, s, cap, biases[c], big, total,
                                         half_v, acc)  # fmt: skip
            inv = np.float32(0) if total == 0 else np.float32(1) / total
            for d in range(n_dv):
                out[b, r, h, d] = acc[d] * inv

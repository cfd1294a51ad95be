"""numba attention in the arithmetic of ggml's own CPU flash attention kernel.

llama.cpp with flash attention on (``flash_attn=True``) runs
``ggml_compute_forward_flash_attn_ext_f16``, whose roundings are not those of its graph
without it (:mod:`._numba_attention`): an online softmax that rescales its running sum
and output at each new maximum, libm's ``expf``, and for an F16 V an output accumulated
in f16. Two of its ways are reproduced here, chosen as ggml chooses them:

- a row at a time (``one_chunk``; a generation step, a prompt of fewer than
  :data:`~.kernel_shapes.FLASH_TILE_Q` rows, or a cache that is neither F16 nor F32):
  the query rounded to K's ``vec_dot_type`` and each score by K's ``vec_dot``
  (``ggml_vec_dot_f16`` or ``ggml_vec_dot_f32``), a cell at a time;
- in tiles (``tiled``; a step of :data:`~.kernel_shapes.FLASH_TILE_Q` query rows or
  more over an F16 or F32 cache): the float32 query, scores by ``simd_gemm`` (one fused
  chain a score), each tile of :data:`~.kernel_shapes.FLASH_TILE_KV` cells softmaxed by
  ``ggml_vec_soft_max_f32`` against the running maximum, and its weights·V by
  ``simd_gemm`` onto the float32 output.

A row's visible cells are taken in ``order`` (cache order when empty) and its ``c``-th
visible cell stands where ggml's cell ``c`` does: the same for one sequence in cells
``0…n``, as llama.cpp fills its cache. ggml's split over the cache for a generation
step beyond 512 cells (whose chunks follow its thread count) is not reproduced.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

from . import _numba_ir as _ir
from ._numba_attention import (
    EXP_LANES,
    cell_rows,
    cell_value,
    halving_sum,
    round_to_f16,
    visible_cells,
)
from ._numba_attention_ir import SCORE_LANES, score_row
from ._numba_cache import kernel
from ._numba_rows import ggml_expf
from .kernel_shapes import FLASH_TILE_KV


@njit(inline="always")
def _dot(keys: Any, table: Any, hk: int, col: int, qs: Any, half: bool) -> Any:
    """``k[hk, col]·q`` as K's ``vec_dot``: ``ggml_vec_dot_f16`` (``half``; ``qs``
    already rounded to f16) or ``ggml_vec_dot_f32``, in their 64 lanes, the terms past
    the last run of 64 added after (to a float64 sum for f16, fused for float32)."""
    n_d = qs.shape[1]
    runs = n_d // SCORE_LANES
    whole = runs * SCORE_LANES
    s = np.float32(0)
    if runs > 0:
        s = score_row(keys, hk, col, qs, 0, runs)  # type: ignore[call-arg]  # numba
    if whole == n_d:
        return s
    if half:
        wide = np.float64(s)
        for d in range(whole, n_d):
            wide += np.float64(cell_value(keys, table, hk, col, d) * qs[0, d])
        return np.float32(wide)
    for d in range(whole, n_d):
        s = _ir.fmaf(cell_value(keys, table, hk, col, d), qs[0, d], s)
    return s


@njit(inline="always")
def _online_row(keys: Any, values: Any, table: Any, hk: int, qs: Any, cols: Any,
                biases: Any, m: int, sc: Any, cap: Any, half_k: bool, half_v: bool,
                acc: Any) -> Any:  # fmt: skip
    """One query row (``qs[0]``) over its ``m`` visible cells the ``one_chunk`` way:
    ``acc`` ← the unnormalised output (float32; f16 values where ``half_v``), returns
    the running sum ``S``."""
    n_dv = acc.shape[0]
    for d in range(n_dv):
        acc[d] = np.float32(0)
    big = np.float32(-np.inf)
    total = np.float32(0)
    for c in range(m):
        s = _dot(keys, table, hk, cols[c], qs, half_k) * sc
        if cap != 0:
            s = cap * np.float32(math.tanh(s))
        s = s + biases[c]
        ms, vs = np.float32(1), np.float32(1)
        if s > big:
            ms = np.float32(math.exp(big - s))
            big = s
            for d in range(n_dv):
                acc[d] = round_to_f16(acc[d] * ms, table) if half_v else acc[d] * ms
        else:
            vs = np.float32(math.exp(s - big))
        col = cols[c]
        for d in range(n_dv):
            a = _ir.fmaf(cell_value(values, table, hk, col, d), vs, acc[d])
            acc[d] = round_to_f16(a, table) if half_v else a
        total = _ir.fmaf(total, ms, vs)
    return total


@njit(inline="always")
def _tiled_row(keys: Any, values: Any, table: Any, hk: int, qs: Any, cols: Any,
               biases: Any, m: int, sc: Any, cap: Any, acc: Any, kq: Any,
               block: Any) -> Any:  # fmt: skip
    """One query row (``qs[0]``, float32) over its ``m`` visible cells the ``tiled``
    way: ``acc`` ← the unnormalised float32 output, returns the running sum ``S``."""
    n_d, n_dv = qs.shape[1], acc.shape[0]
    for d in range(n_dv):
        acc[d] = np.float32(0)
    big = np.float32(-np.inf)
    total = np.float32(0)
    for c0 in range(0, m, FLASH_TILE_KV):
        n = min(FLASH_TILE_KV, m - c0)
        best = np.float32(-np.inf)
        for t in range(n):
            col = cols[c0 + t]
            a = np.float32(0)
            for d in range(n_d):
                a = _ir.fmaf(qs[0, d], cell_value(keys, table, hk, col, d), a)
            a = a * sc
            if cap != 0:
                a = np.float32(math.tanh(a)) * cap
            a = a + biases[c0 + t]
            kq[t] = a
            best = a if a > best else best
        if best == -np.inf:
            continue
        new = big if big > best else best
        if new > big:
            ms = np.float32(math.exp(big - new))
            for d in range(n_dv):
                acc[d] = acc[d] * ms
            total = total * ms
        big = new
        wide = 0.0
        for b0 in range(0, FLASH_TILE_KV, EXP_LANES):
            for i in range(EXP_LANES):
                t = b0 + i
                e = ggml_expf(kq[t] - big) if t < n else np.float32(0)
                kq[t] = e
                block[i] = e
            wide += np.float64(halving_sum(block, EXP_LANES))
        total = np.float32(np.float64(total) + wide)
        for d in range(n_dv):
            a = acc[d]
            for t in range(n):
                a = _ir.fmaf(kq[t], cell_value(values, table, hk, cols[c0 + t], d), a)
            acc[d] = a
    return total


@kernel(parallel=True)
def flash_attend(q: Any, k: Any, v: Any, mask: Any, order: Any, used: int, scale: float,
                 softcap: float, half: bool, tiled: bool, out: Any,
                 table: Any) -> None:  # fmt: skip
    """``out[b, r, h] = softmax_j(s_j)·v_j`` over cache rows ``j < used`` as ggml's CPU
    flash attention kernel computes it (see the module): the ``tiled`` way where
    ``tiled`` (ggml takes it for an F16 or F32 cache and
    :data:`~.kernel_shapes.FLASH_TILE_Q` query rows or more), else ``one_chunk``.

    q (B, H, n_q, D) float32; k (Bk, Hkv, n_kv, D) and v (Bk, Hkv, n_kv, Dv) float32,
    or uint16 holding f16 (read through ``table``: ``half``); ``mask`` the term added to the
    scores (Bm, Hm, ≥n_q, ≥used), float32 or raw f16, -inf hiding a cell, or shape
    (0, 0, 0, 0) for none; ``order`` int32 (n_kv,) or (0,); out (B, n_q, H, Dv). A
    query that sees no cell gets zeros, as ggml's. One task per (batch, query head)."""
    n_b, n_h, n_q, n_d = q.shape
    n_hk, n_dv = k.shape[1], v.shape[3]
    group = n_h // n_hk
    has_mask = mask.shape[0] > 0
    sc, cap = np.float32(scale), np.float32(softcap)
    width = max(used, 1)
    for task in prange(n_b * n_h):
        t = np.int64(task)
        b, h = t // n_h, t % n_h
        hk = h // group
        kb = b if k.shape[0] > 1 else 0
        mb = b if has_mask and mask.shape[0] > 1 else 0
        mh = h if has_mask and mask.shape[1] > 1 else 0
        keys, values = cell_rows(k, table, kb, used), cell_rows(v, table, kb, used)
        cols, biases = np.empty(width, np.int64), np.empty(width, np.float32)
        qs, acc = np.empty((1, n_d), np.float32), np.empty(n_dv, np.float32)
        kq, block = np.empty(FLASH_TILE_KV, np.float32), np.empty(EXP_LANES, np.float32)
        for r in range(n_q):
            m = visible_cells(mask, table, mb, mh, r, used, has_mask, order, cols, biases)
            for d in range(n_d):
                x = q[b, h, r, d]
                qs[0, d] = round_to_f16(x, table) if half and not tiled else x
            if tiled:
                total = _tiled_row(keys, values, table, hk, qs, cols, biases, m, sc, cap,
                                   acc, kq, block)  # fmt: skip
            else:
                total = _online_row(keys, values, table, hk, qs, cols, biases, m, sc, cap,
                                    half, half, acc)  # fmt: skip
            inv = np.float32(0) if total == 0 else np.float32(1) / total
            for d in range(n_dv):
                out[b, r, h, d] = acc[d] * inv

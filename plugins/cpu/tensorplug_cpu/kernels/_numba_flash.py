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

import functools
import math
from typing import Any

import numpy as np
from numba import carray, njit, prange, types
from numba.extending import overload

from . import _numba_ir as _ir
from ._numba_attention import (
    EXP_LANES,
    attention_views,
    cell_rows,
    cell_value,
    halving_sum,
    head_scores,
    round_to_f16,
    value_of,
    visible_cells,
    visible_columns,
)
from ._numba_attention_ir import (
    MAX_HEADS,
    ONLINE_DIMS,
    ONLINE_HEADS,
    SCORE_LANES,
    online_values,
    score_row,
)
from ._numba_cache import kernel
from ._numba_pool import address, view4
from ._numba_rows import ggml_expf
from .job_blocks import (
    FLASH_FIELDS,
    FLASH_GROUPED,
    FLASH_KV_SPAN,
    FLASH_ORDER_SEEN,
    FLASH_RUNS,
    FLASH_TABLE,
    FLASH_TILED,
    FLASH_USED,
    FLASH_VISIBLE,
    ROWS_PER_TASK,
)
from .job_function import job_function
from .kernel_shapes import FLASH_TILE_KV

_ONLINE_1, _ONLINE_2, _ONLINE_3, _ONLINE_4 = (online_values(h) for h in range(1, MAX_HEADS + 1))


@njit(inline="always")
def _dot(keys: Any, table: Any, hk: int, col: int, qs: Any, g: int, half: bool) -> Any:
    """``k[hk, col]·qs[g]`` as K's ``vec_dot``: ``ggml_vec_dot_f16`` (``half``; ``qs``
    already rounded to f16) or ``ggml_vec_dot_f32``, in their 64 lanes, the terms past
    the last run of 64 added after (to a float64 sum for f16, fused for float32)."""
    n_d = qs.shape[1]
    runs = n_d // SCORE_LANES
    whole = runs * SCORE_LANES
    s = np.float32(0)
    if runs > 0:
        s = score_row(keys, hk, col, qs, g, runs)  # type: ignore[call-arg]  # numba
    if whole == n_d:
        return s
    if half:
        wide = np.float64(s)
        for d in range(whole, n_d):
            wide += np.float64(cell_value(keys, table, hk, col, d) * qs[g, d])
        return np.float32(wide)
    for d in range(whole, n_d):
        s = _ir.fmaf(cell_value(keys, table, hk, col, d), qs[g, d], s)
    return s


@njit(inline="always")
def _online_row(keys: Any, values: Any, table: Any, hk: int, qs: Any, cols: Any,
                biases: Any, m: int, sc: Any, cap: Any, half_k: bool, half_v: bool,
                acc: Any) -> Any:  # fmt: skip
    """One query row (``qs[0]``) over its ``m`` visible cells the ``one_chunk`` way:
    ``acc`` ← the unnormalised output (float32; f16 values where ``half_v``), returns
    the running sum ``S``."""
    for d in range(acc.shape[0]):
        acc[d] = np.float32(0)
    big = np.float32(-np.inf)
    total = np.float32(0)
    for c in range(m):
        s = _dot(keys, table, hk, cols[c], qs, 0, half_k) * sc
        big, total = online_cell(values, table, hk, cols[c], s, cap, biases[c], big, total,
                                 half_v, acc)  # fmt: skip
    return total


@njit(inline="always")
def online_cell(values: Any, table: Any, hk: int, col: int, s: Any, cap: Any, bias: Any,
                big: Any, total: Any, half_v: bool, acc: Any) -> tuple[Any, Any]:  # fmt: skip
    """One visible cell of ``one_chunk`` after its score ``s`` (scaled): soft-capped,
    masked, then the running maximum ``big``, the output ``acc`` (f16 values where
    ``half_v``) and the running sum ``total`` moved on by cell ``col``'s V row; returns
    the new ``(big, total)``."""
    if cap != 0:
        s = cap * np.float32(math.tanh(s))
    s = s + bias
    ms, vs = np.float32(1), np.float32(1)
    if s > big:
        ms = np.float32(math.exp(big - s))
        big = s
        for d in range(acc.shape[0]):
            acc[d] = round_to_f16(acc[d] * ms, table) if half_v else acc[d] * ms
    else:
        vs = np.float32(math.exp(s - big))
    for d in range(acc.shape[0]):
        a = _ir.fmaf(cell_value(values, table, hk, col, d), vs, acc[d])
        acc[d] = round_to_f16(a, table) if half_v else a
    return big, _ir.fmaf(total, ms, vs)


def unit_row(a: Any, h: int, j: int) -> Any:
    """Row ``a[h, j]`` of 3-d cache rows whose last axis is unit-stride, as a
    C-contiguous 1-d array (compiled per dtype, see the overload): the cache reaches a
    job through strided views (any layout, to numba), where a loop over a row can be
    neither assumed unit-stride nor vectorized."""
    raise NotImplementedError  # only ever called from compiled code


@overload(unit_row, inline="always")
def _unit_row_impl(a, h, j):  # type: ignore[no-untyped-def]  # numba: names only
    # the two dtypes a cache row has here: raw f16, or float32 (widened or F32)
    dtype = np.uint16 if a.dtype == types.uint16 else np.float32

    def impl(a, h, j):  # type: ignore[no-untyped-def]
        return carray(address(a[h, j].ctypes.data), a.shape[2], dtype)

    return impl


@njit(inline="always")
def _online_group(keys: Any, values: Any, table: Any, hk: int, qs: Any, cols: Any,
                  biases: Any, m: int, sc: Any, cap: Any, acc: Any, total: Any, rescale: Any,
                  w: Any) -> None:  # fmt: skip
    """:func:`_online_row` for the query heads of KV head ``hk`` at once (``qs`` their
    rows, rounded to f16; an F16 cache), over the ``m`` cells they all see: ``acc[g]``
    ← head ``g``'s unnormalised output (f16 values), ``total[g]`` its running sum.

    Each head's arithmetic is :func:`_online_row`'s, term for term, in another order of
    work: every score first (``w``, by :func:`._numba_attention.head_scores`, the exact
    kernel's sixteen cells at a time: ``ggml_vec_dot_f16``'s lanes, ·scale,
    soft-capped, + mask, as :func:`_dot` and :func:`_online_row` take them one by one);
    then the running maximum and sum cell by cell, each cell's weight (``w``) and the
    factor it rescales the output by (``rescale``: 1 where the maximum stays); then the
    f16 output, value by value over the cells (:func:`_online_outputs`)."""
    head_scores(keys, values, table, hk, hk + 1, acc.shape[0], qs, cols, biases, m, sc, cap,
                w, False, True)  # fmt: skip
    for g in range(acc.shape[0]):
        top, run = np.float32(-np.inf), np.float32(0)
        for c in range(m):
            s = w[g, c]
            ms, vs = np.float32(1), np.float32(1)
            if s > top:
                ms = np.float32(math.exp(top - s))
                top = s
            else:
                vs = np.float32(math.exp(s - top))
            run = _ir.fmaf(run, ms, vs)
            w[g, c], rescale[g, c] = vs, ms
        total[g] = run
    _online_outputs(values, table, hk, cols, m, w, rescale, acc)


def _online_outputs(values: Any, table: Any, hk: int, cols: Any, m: int, w: Any,
                    rescale: Any, acc: Any) -> None:  # fmt: skip
    """``acc[g]`` ← the f16 output of :func:`_online_group`'s heads: from +0, cell by
    cell, rounded to f16 after a rescale (``rescale[g, c]`` not 1) and after each fused
    term ``v·w[g, c]``, as ggml's ``one_chunk`` accumulates an F16 V (compiled per CPU,
    see the overload)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(_online_outputs, inline="always")
def _online_outputs_impl(values, table, hk, cols, m, w, rescale, acc):  # type: ignore[no-untyped-def]  # numba: names only
    if _ir.HAS_F16C:  # runs of ONLINE_DIMS values, ONLINE_HEADS heads, in registers

        def in_registers(values, table, hk, cols, m, w, rescale, acc):  # type: ignore[no-untyped-def]
            n_g, n_dv = acc.shape[0], acc.shape[1]
            whole = n_dv - n_dv % ONLINE_DIMS
            for d0 in range(0, whole, ONLINE_DIMS):
                for g0 in range(0, n_g, ONLINE_HEADS):
                    left = min(n_g - g0, ONLINE_HEADS)
                    if left >= 4:
                        _ONLINE_4(values, hk, cols, m, w, rescale, g0, d0, acc)
                    elif left == 3:
                        _ONLINE_3(values, hk, cols, m, w, rescale, g0, d0, acc)
                    elif left == 2:
                        _ONLINE_2(values, hk, cols, m, w, rescale, g0, d0, acc)
                    else:
                        _ONLINE_1(values, hk, cols, m, w, rescale, g0, d0, acc)
            _outputs_from(values, table, hk, cols, m, w, rescale, acc, whole)

        return in_registers

    def in_memory(values, table, hk, cols, m, w, rescale, acc):  # type: ignore[no-untyped-def]
        _outputs_from(values, table, hk, cols, m, w, rescale, acc, 0)

    return in_memory


@njit(inline="always")
def _outputs_from(values: Any, table: Any, hk: int, cols: Any, m: int, w: Any, rescale: Any,
                  acc: Any, d0: int) -> None:  # fmt: skip
    """:func:`_online_outputs` for values ``d0`` on, a cell at a time, in memory."""
    n_g, n_dv = acc.shape[0], acc.shape[1]
    for g in range(n_g):
        for d in range(d0, n_dv):
            acc[g, d] = np.float32(0)
    for c in range(m):
        row = unit_row(values, hk, cols[c])
        for g in range(n_g):
            ms, vs = rescale[g, c], w[g, c]
            if ms != 1:
                for d in range(d0, n_dv):
                    acc[g, d] = round_to_f16(acc[g, d] * ms, table)
            for d in range(d0, n_dv):
                a = _ir.fmaf(value_of(row, table, d), vs, acc[g, d])
                acc[g, d] = round_to_f16(a, table)


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


@njit(inline="always")
def _attend_row(q: Any, keys: Any, values: Any, mask: Any, order: Any, table: Any, b: int,
                h: int, hk: int, r: int, used: int, has_mask: bool, sc: Any, cap: Any,
                half: bool, tiled: bool, out: Any, cols: Any, biases: Any, qs: Any,
                acc: Any, kq: Any, block: Any) -> None:  # fmt: skip
    """``out[b, r, h]``: query row ``r`` of head ``h`` (KV head ``hk``) over the cells
    ``keys`` and ``values`` of its batch, the ``tiled`` way or a row at a time."""
    n_d, n_dv = q.shape[3], acc.shape[0]
    mb = b if has_mask and mask.shape[0] > 1 else 0
    mh = h if has_mask and mask.shape[1] > 1 else 0
    m = visible_cells(mask, table, mb, mh, r, used, has_mask, order, cols, biases)
    for d in range(n_d):
        x = q[b, h, r, d]
        qs[0, d] = round_to_f16(x, table) if half and not tiled else x
    if tiled:
        total = _tiled_row(keys, values, table, hk, qs, cols, biases, m, sc, cap, acc, kq,
                           block)  # fmt: skip
    else:
        total = _online_row(keys, values, table, hk, qs, cols, biases, m, sc, cap, half, half,
                            acc)  # fmt: skip
    inv = np.float32(0) if total == 0 else np.float32(1) / total
    for d in range(n_dv):
        out[b, r, h, d] = acc[d] * inv


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
    group = n_h // k.shape[1]
    n_dv = v.shape[3]
    has_mask = mask.shape[0] > 0
    sc, cap = np.float32(scale), np.float32(softcap)
    width = max(used, 1)
    for task in prange(n_b * n_h):
        t = np.int64(task)
        b, h = t // n_h, t % n_h
        kb = b if k.shape[0] > 1 else 0
        keys, values = cell_rows(k, table, kb, used), cell_rows(v, table, kb, used)
        cols, biases = np.empty(width, np.int64), np.empty(width, np.float32)
        qs, acc = np.empty((1, n_d), np.float32), np.empty(n_dv, np.float32)
        kq, block = np.empty(FLASH_TILE_KV, np.float32), np.empty(EXP_LANES, np.float32)
        for r in range(n_q):
            _attend_row(q, keys, values, mask, order, table, b, h, h // group, r, used,
                        has_mask, sc, cap, half, tiled, out, cols, biases, qs, acc, kq,
                        block)  # fmt: skip


def _flash_job(job: Any, lo: Any, hi: Any) -> None:
    """:func:`flash_attend` over an F16 cache and mask as a job of :mod:`.pool` (a step
    of the compiled program, on the spinning helpers): the prologue finds the visible
    columns (``used``, kept in the block for the chunks) and the shortest start of
    ``order`` that holds every cell before them (:func:`_order_seen`), which is all a
    row walks. Where every query head sees
    the same cells (one mask for all heads) and rows go one at a time, chunk ``t`` takes
    one query row of one KV head's query heads (:func:`_online_group`), or of every KV
    head's (``FLASH_KV_SPAN``: a step of many rows, whose row then finds its visible
    cells once for all heads); otherwise a run of :data:`~.job_blocks.ROWS_PER_TASK`
    query rows of one query head. Either way each row's arithmetic is
    :func:`flash_attend`'s."""
    j = carray(address(job), FLASH_FIELDS, np.int64)
    table = carray(address(j[FLASH_TABLE]), 1 << 16, np.float32)
    if lo < 0:
        used = visible_columns(view4(j, FLASH_VISIBLE, np.uint16), table)
        j[FLASH_USED] = used
        j[FLASH_ORDER_SEEN] = _order_seen(attention_views(j)[5], used)
        return
    q, out, k, v, mask, order, scales = attention_views(j)
    order = order[: j[FLASH_ORDER_SEEN]]
    sc, cap = np.float32(scales[0]), np.float32(scales[1])
    tiled = j[FLASH_TILED] != 0
    used, runs, grouped = j[FLASH_USED], j[FLASH_RUNS], j[FLASH_GROUPED] != 0
    n_h, n_q, n_d, n_dv = q.shape[1], q.shape[2], q.shape[3], v.shape[3]
    n_hk = k.shape[1]
    group = n_h // n_hk
    width = max(used, 1)
    cols, biases = np.empty(width, np.int64), np.empty(width, np.float32)
    kq, block = np.empty(FLASH_TILE_KV, np.float32), np.empty(EXP_LANES, np.float32)
    if grouped:
        qs, acc = np.empty((group, n_d), np.float32), np.empty((group, n_dv), np.float32)
        total = np.empty(group, np.float32)
        rescale, w = np.empty((group, width), np.float32), np.empty((group, width), np.float32)
        span = j[FLASH_KV_SPAN]  # the KV heads of a chunk: 1, or all
        parts = n_hk // span
        for t in range(lo, hi):
            bp, r = t // n_q, t % n_q
            b, part = bp // parts, bp % parts
            kb = b if k.shape[0] > 1 else 0
            mb = b if mask.shape[0] > 1 else 0
            keys, values = cell_rows(k, table, kb, used), cell_rows(v, table, kb, used)
            m = visible_cells(mask, table, mb, 0, r, used, True, order, cols, biases)
            for hk in range(part * span, (part + 1) * span):
                for g in range(group):
                    for d in range(n_d):
                        qs[g, d] = round_to_f16(q[b, hk * group + g, r, d], table)
                _online_group(keys, values, table, hk, qs, cols, biases, m, sc, cap, acc, total,
                              rescale, w)  # fmt: skip
                for g in range(group):
                    inv = np.float32(0) if total[g] == 0 else np.float32(1) / total[g]
                    for d in range(n_dv):
                        out[b, r, hk * group + g, d] = acc[g, d] * inv
        return
    qs, acc = np.empty((1, n_d), np.float32), np.empty(n_dv, np.float32)
    for t in range(lo, hi):
        bh, run = t // runs, t % runs
        b, h = bh // n_h, bh % n_h
        kb = b if k.shape[0] > 1 else 0
        keys, values = cell_rows(k, table, kb, used), cell_rows(v, table, kb, used)
        for r in range(run * ROWS_PER_TASK, min(n_q, (run + 1) * ROWS_PER_TASK)):
            _attend_row(q, keys, values, mask, order, table, b, h, h // group, r, used, True,
                        sc, cap, True, tiled, out, cols, biases, qs, acc, kq,
                        block)  # fmt: skip


@njit(inline="always")
def _order_seen(order: Any, used: int) -> int:
    """1 + the last place of ``order`` that holds a cell before ``used`` (0 for an empty
    order: cache order). The cells after it are hidden from every row: a row's walk
    stops there, in the same order, where it would otherwise step over each of them
    (the runner puts the cells past its step's sequences last, so a wide step's rows
    walk only its own cells)."""
    n = order.shape[0]
    while n > 0 and order[n - 1] >= used:
        n -= 1
    return n


@functools.cache
def flash_job() -> Any:
    """:func:`_flash_job` as a C function for :mod:`.pool`, made once (not compiled yet:
    :func:`.job_function.job_function`)."""
    job = job_function(_flash_job, "flash_job_f16")
    job.tensorplug_origin = ("made_job", __name__, "flash_job")  # how another process makes it
    return job

"""numba flash attention for a few query rows (token generation).

At one query row per head, numpy's batched products are a dozen calls of a few
microseconds each around a few thousand multiply-adds: on SmolLM2-135M they took
0.2 ms per layer, 6 of a 29 ms step. This kernel walks the visible cache rows once per
(batch, head, query) with an online softmax (running max and sum, as ggml's CPU kernel
does), reading an F16 cache in place (as raw ``uint16``, widened through the f16 table)
or an F32 one directly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import _numba_ir as _ir
from ._numba_cache import kernel
from ._numba_quant import _DOT
from ._numba_rows import expf


def _value(a: Any, table: Any, i: int, j: int, r: int, d: int) -> Any:
    """``a[i, j, r, d]`` as float32 (compiled per dtype, see the overload below)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(_value, inline="always")
def _value_impl(a, table, i, j, r, d):  # type: ignore[no-untyped-def]  # numba: names only
    if isinstance(a, types.Array) and a.dtype == types.uint16:

        def widened(a, table, i, j, r, d):  # type: ignore[no-untyped-def]
            return table[a[i, j, r, d]]

        return widened

    def direct(a, table, i, j, r, d):  # type: ignore[no-untyped-def]
        return a[i, j, r, d]

    return direct


@intrinsic
def _widen_f16_at(typingctx: Any, a: Any, i: Any, j: Any, r: Any, row: Any) -> Any:
    """``row[:] = a[i, j, r, :]`` for raw f16 (``uint16``) ``a`` whose last axis is
    contiguous, eight values per ``vcvtph2ps``; the address is computed from the
    strides, so no array view (and no reference count) is made per cache row."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        dst = context.make_array(sig.args[4])(context, builder, args[4])
        i64 = ir.IntType(64)
        offset = ir.Constant(i64, 0)
        for axis, index in zip(range(3), args[1:4], strict=True):
            stride = builder.extract_value(arr.strides, axis)
            offset = builder.add(offset, builder.mul(builder.sext(index, i64), stride))
        base = builder.gep(builder.bitcast(arr.data, ir.IntType(8).as_pointer()), [offset])
        src = builder.bitcast(base, ir.HalfType().as_pointer())
        n = builder.extract_value(dst.shape, 0)
        zero, one, eight = (ir.Constant(i64, c) for c in (0, 1, 8))
        v8h, v8f = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.FloatType(), 8)
        whole = builder.sdiv(n, eight)  # runs of eight
        with cgutils.for_range_slice(builder, zero, whole, one) as (k, _):
            at = builder.mul(k, eight)
            halves = builder.load(builder.bitcast(builder.gep(src, [at]), v8h.as_pointer()),
                                  align=2)  # fmt: skip
            out = builder.bitcast(builder.gep(dst.data, [at]), v8f.as_pointer())
            builder.store(builder.fpext(halves, v8f), out, align=4)
        with cgutils.for_range_slice(builder, builder.mul(whole, eight), n, one) as (k, _):
            value = builder.fpext(builder.load(builder.gep(src, [k])), ir.FloatType())
            builder.store(value, builder.gep(dst.data, [k]))
        return context.get_dummy_value()

    return types.void(a, i, j, r, row), codegen


def _widen_row(a: Any, table: Any, i: int, j: int, r: int, row: Any) -> None:
    """``row[:] = a[i, j, r, :]`` as float32 (compiled per dtype, see the overload)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(_widen_row, inline="always")
def _widen_row_impl(a, table, i, j, r, row):  # type: ignore[no-untyped-def]  # numba: names only
    if _ir.HAS_F16C and isinstance(a, types.Array) and a.dtype == types.uint16 and a.ndim == 4:

        def f16c(a, table, i, j, r, row):  # type: ignore[no-untyped-def]
            if a.strides[3] == 2:
                _widen_f16_at(a, i, j, r, row)
            else:
                for d in range(row.size):
                    row[d] = table[a[i, j, r, d]]

        return f16c

    def one_by_one(a, table, i, j, r, row):  # type: ignore[no-untyped-def]
        for d in range(row.size):
            row[d] = _value(a, table, i, j, r, d)

    return one_by_one


@kernel(nogil=True)  # pool threads
def widen_f16_rows(raw: Any, out: Any, used: int, table: Any) -> None:
    """``out[b, h, j] = raw[b, h, j]`` as float32 for ``j < used``: raw f16 (``uint16``)
    K, V or mask ``(B, H, n, D)`` into a float32 scratch whose rows are unit-stride, for
    the prompt's BLAS products. numpy converts f16 at ~2 ns a value: with eight per
    ``vcvtph2ps`` here, and :func:`visible_columns` in place of numpy's scan of the
    mask, a 100M model's 128-token attention went from 2.2 to 1.6 ms a layer on one
    core of the dev machine (widening its K, V and mask: ~17 µs each)."""
    for b in range(raw.shape[0]):
        for h in range(raw.shape[1]):
            for j in range(used):
                _widen_row(raw, table, b, h, j, out[b, h, j])


@kernel()
def visible_columns(mask: Any, table: Any) -> int:
    """1 + the last column of ``mask`` (4-d, float32 or raw f16) that some query can
    see, at least 1 (a query masked everywhere still needs a column for its zeros)."""
    n0, n1, n2, n3 = mask.shape
    for j in range(n3 - 1, 0, -1):
        for a in range(n0):
            for b in range(n1):
                for r in range(n2):
                    if _value(mask, table, a, b, r, j) != -np.inf:
                        return j + 1
    return 1


@njit(inline="always", fastmath=_DOT)
def _attend_kv_head(
    q: Any, k: Any, v: Any, mask: Any, used: int, scale: float, softcap: float, out: Any,
    table: Any, b: int, hk: int,
) -> None:  # fmt: skip
    """:func:`attend` for the query heads of batch ``b`` that share KV head ``hk``."""
    n_q, n_d = q.shape[2], q.shape[3]
    n_dv = v.shape[3]
    group = q.shape[1] // k.shape[1]
    has_mask = mask.shape[0] > 0
    per_head_mask = has_mask and mask.shape[1] > 1
    krow = np.empty(n_d, np.float32)
    vrow = np.empty(n_dv, np.float32)
    qrows = np.empty((group, n_d), np.float32)  # contiguous, so the dot vectorizes
    weights = np.empty((group, used), np.float32)
    acc = np.empty((group, n_dv), np.float32)
    total = np.empty(group, np.float32)
    kb = b if k.shape[0] > 1 else 0
    mb = b if has_mask and mask.shape[0] > 1 else 0
    for r in range(n_q):
        for g in range(group):
            for d in range(n_d):
                qrows[g, d] = q[b, hk * group + g, r, d] * np.float32(scale)
        for j in range(used):
            seen = not has_mask
            if has_mask and not per_head_mask:  # one mask for every head: read once
                bias = _value(mask, table, mb, 0, r, j)
                for g in range(group):
                    weights[g, j] = bias
                seen = bias != -np.inf
            else:
                for g in range(group):
                    mh = hk * group + g if per_head_mask else 0
                    bias = _value(mask, table, mb, mh, r, j) if has_mask else np.float32(0)
                    weights[g, j] = bias
                    seen = seen or bias != -np.inf
            if not seen:
                continue
            _widen_row(k, table, kb, hk, j, krow)
            for g in range(group):
                if weights[g, j] == -np.inf:
                    continue
                s = np.float32(0)
                for d in range(n_d):
                    s += qrows[g, d] * krow[d]
                if softcap != 0:
                    s = softcap * math.tanh(s)
                weights[g, j] += s
        for g in range(group):
            wg = weights[g]
            best = np.float32(-np.inf)
            for j in range(used):
                best = max(best, wg[j])
            t = np.float32(0)
            if best != -np.inf:
                for j in range(used):  # expf has no branch and no call: this vectorizes
                    p = expf(wg[j] - best)  # 0 where masked, NaN for a NaN score
                    wg[j] = p
                    t += p
            else:  # max skips NaN: scores all NaN (a NaN query) or -inf look alike
                for j in range(used):
                    if wg[j] != wg[j]:
                        t = np.float32(np.nan)
            total[g] = t  # NaN for a NaN score, as ggml's sum: the row comes out NaN
        acc[:] = 0
        for j in range(used):
            seen = False
            for g in range(group):
                seen = seen or (total[g] > 0 and weights[g, j] != 0)
            if not seen:
                continue
            _widen_row(v, table, kb, hk, j, vrow)
            for g in range(group):
                p = weights[g, j]
                if total[g] > 0 and p != 0:  # 0·garbage in a masked row could be NaN
                    for d in range(n_dv):
                        acc[g, d] += p * vrow[d]
        for g in range(group):
            h = hk * group + g
            for d in range(n_dv):
                # ggml's S == 0 ? 0 : 1/S: zeros for a row that sees nothing, NaN for NaN
                out[b, r, h, d] = acc[g, d] / total[g] if total[g] != 0 else np.float32(0)


@kernel(fastmath=_DOT, parallel=True)
def attend(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    used: int,
    scale: float,
    softcap: float,
    out: Any,
    table: Any,
) -> None:
    """``out[b, r, h] = softmax_j(s_j)·v_j`` with ``s_j = q·k_j·scale`` (then
    ``softcap·tanh``) ``+ mask[b, h, r, j]``, over cache rows ``j < used``.

    q (B, H, n_q, D) float32; k (Bk, Hkv, n_kv, D) and v (Bk, Hkv, n_kv, Dv) float32, or
    uint16 holding f16 (read through ``table``); mask (Bm, Hm, ≥n_q, ≥used) float32 or
    raw f16 with 1 for a broadcast extent, or shape (0, 0, 0, 0) for none; out
    (B, n_q, H, Dv). A query that sees no row gets zeros, as in ggml, and a masked row
    (-inf) is never read, so garbage in it cannot reach the result.

    Three passes per query row, the query heads sharing a KV head together (each cache
    row is widened once for all of them): every score, then each head's softmax weights
    (with :func:`expf`, which vectorizes: ``math.exp`` is a call per weight), then the
    weighted sum of V rows. Two walks over the cache cost less than an online softmax
    here: its running maximum made every step wait on the last one's ``exp`` and
    rescale the accumulator (12 heads over 4 KV heads, 150 F16 rows, one core: 49 µs
    online against 37 µs in passes). The KV heads are shared out across threads.
    """
    n_b, n_hk = q.shape[0], k.shape[1]
    for bh in prange(n_b * n_hk):  # each KV head's query heads on one thread
        _attend_kv_head(q, k, v, mask, used, scale, softcap, out, table, bh // n_hk, bh % n_hk)


@kernel(fastmath=_DOT, nogil=True)
def attend_serial(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    used: int,
    scale: float,
    softcap: float,
    out: Any,
    table: Any,
) -> None:
    """:func:`attend` on the calling thread, without a parallel region (for a short
    cache, a thread woken for its share cost more than the share)."""
    n_b, n_hk = q.shape[0], k.shape[1]
    for bh in range(n_b * n_hk):
        _attend_kv_head(q, k, v, mask, used, scale, softcap, out, table, bh // n_hk, bh % n_hk)


@kernel(nogil=True, error_model="numpy", fastmath={"reassoc"})  # pool threads
def softmax_rows(s: Any, mask: Any, used: int, scale: float, row: Any) -> None:
    """A prompt's attention weights, in place: ``s[g, r, j] ← e^(s·scale + mask − max_r)``
    for ``j < used`` and ``row[g, r] ← 1/Σ_j`` (0 for a row that sees no column; its
    weights are 0), for scores ``s`` (G, N, ≥used) float32 and a float32 ``mask``
    (1 or G, ≥N, ≥used), or shape (0, 0, 0) for none; rows unit-stride (C-contiguous
    arrays let LLVM vectorize). One pass for scale, mask and maximum, one for the
    exponentials (:func:`expf`) and their sum: numpy's eight whole-block passes, with
    temporaries, took 2.4 ms of a 100M model's 128-token attention per layer."""
    n_g, n_r = s.shape[0], s.shape[1]
    has_mask = mask.shape[0] > 0
    sc = np.float32(scale)
    for g in range(n_g):
        mg = g if has_mask and mask.shape[0] > 1 else 0
        for r in range(n_r):
            sr = s[g, r]
            best = np.float32(-np.inf)
            if has_mask:
                mr = mask[mg, r]
                for j in range(used):
                    v = sr[j] * sc + mr[j]
                    sr[j] = v
                    best = v if v > best else best
            else:
                for j in range(used):
                    v = sr[j] * sc
                    sr[j] = v
                    best = v if v > best else best
            if best == -np.inf:  # sees nothing: ggml outputs zeros; NaN if a score is
                nan = np.float32(0)  # (the maximum skips NaN: a NaN query looks masked)
                for j in range(used):
                    if sr[j] != sr[j]:
                        nan = np.float32(np.nan)
                sr[:used] = np.float32(0)
                row[g, r] = nan
                continue
            total = np.float32(0)
            for j in range(used):
                p = expf(sr[j] - best)
                sr[j] = p
                total += p
            row[g, r] = np.float32(1) / total

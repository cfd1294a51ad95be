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
from numba import njit, prange, types
from numba.extending import overload

from ._numba_quant import _DOT


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


@njit(cache=True)
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


@njit(fastmath=_DOT, parallel=True, cache=True)
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
    (B, n_q, H, Dv). A query that sees no row gets zeros, as in ggml. The query heads
    sharing a KV head are done together, so each cache row is widened once.
    """
    n_b, n_h, n_q, n_d = q.shape
    n_dv = v.shape[3]
    n_hk = k.shape[1]
    group = n_h // n_hk
    has_mask = mask.shape[0] > 0
    for bh in prange(n_b * n_hk):  # each KV head's query heads on one thread
        b, hk = bh // n_hk, bh % n_hk
        krow = np.empty(n_d, np.float32)
        vrow = np.empty(n_dv, np.float32)
        acc = np.empty((group, n_dv), np.float32)
        best = np.empty(group, np.float32)
        total = np.empty(group, np.float32)
        kb = b if k.shape[0] > 1 else 0
        mb = b if has_mask and mask.shape[0] > 1 else 0
        for r in range(n_q):
            acc[:] = 0
            best[:] = -np.inf
            total[:] = 0
            for j in range(used):
                for d in range(n_d):
                    krow[d] = _value(k, table, kb, hk, j, d)
                for d in range(n_dv):
                    vrow[d] = _value(v, table, kb, hk, j, d)
                for g in range(group):
                    h = hk * group + g
                    mh = h if has_mask and mask.shape[1] > 1 else 0
                    bias = _value(mask, table, mb, mh, r, j) if has_mask else np.float32(0)
                    if bias == -np.inf:
                        continue
                    s = np.float32(0)
                    for d in range(n_d):
                        s += q[b, h, r, d] * krow[d]
                    s *= scale
                    if softcap != 0:
                        s = softcap * math.tanh(s)
                    s += bias
                    if s > best[g]:
                        shrink = np.float32(math.exp(best[g] - s))  # 0 while best is -inf
                        total[g] *= shrink
                        for d in range(n_dv):
                            acc[g, d] *= shrink
                        best[g] = s
                    p = np.float32(math.exp(s - best[g]))
                    total[g] += p
                    for d in range(n_dv):
                        acc[g, d] += p * vrow[d]
            for g in range(group):
                h = hk * group + g
                for d in range(n_dv):
                    out[b, r, h, d] = acc[g, d] / total[g] if total[g] > 0 else np.float32(0)

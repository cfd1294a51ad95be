"""numba flash attention in llama.cpp's arithmetic, for every step size.

Each query row is computed on its own, in ggml's order of operations (:func:`attend`),
so its bits depend only on its own query and the cells it sees: batching changes no
bit, which a server needs. A task (batch, KV head, run of query rows) widens the cells
its rows see to float32 once, reading an F16 cache in place (raw ``uint16``, eight
values per ``vcvtph2ps``) or an F32 one; then each row and head takes its scores (64
fused lanes in registers, :func:`_lanes_dot`), ggml's softmax and its weights·V over
unit-stride rows that LLVM vectorizes. A 128-token prompt's attention costs about 2x
numpy's BLAS path (which rounds by the step's row count).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import _numba_ir as _ir
from ._numba_cache import job_function, kernel
from ._numba_pool import ARRAY4_FIELDS, address, describe4, view4
from ._numba_rows import expf, ggml_expf
from .attention import DOT_LANES


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


def _hidden(a: Any, i: int, j: int, r: int, d: int) -> bool:
    """Whether mask value ``a[i, j, r, d]`` is -inf (compiled per dtype, see the
    overload)."""
    raise NotImplementedError  # only ever called from compiled code


#: float16 -inf's bits: the one raw f16 mask value that hides a cell
_F16_MINUS_INF = 0xFC00


@overload(_hidden, inline="always")
def _hidden_impl(a, i, j, r, d):  # type: ignore[no-untyped-def]  # numba: names only
    if isinstance(a, types.Array) and a.dtype == types.uint16:

        def raw(a, i, j, r, d):  # type: ignore[no-untyped-def]
            return a[i, j, r, d] == _F16_MINUS_INF  # the bits: no widening per cell

        return raw

    def direct(a, i, j, r, d):  # type: ignore[no-untyped-def]
        return a[i, j, r, d] == -np.inf

    return direct


@intrinsic
def _widen_f16_at(typingctx: Any, a: Any, i: Any, j: Any, r: Any, dst: Any, row: Any) -> Any:
    """``dst[row, :] = a[i, j, r, :]`` for raw f16 (``uint16``) ``a`` whose last axis is
    contiguous, and a float32 ``dst`` whose rows are, eight values per ``vcvtph2ps``;
    both addresses are computed from the strides, so no array view (and no reference
    count) is made per cache row."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        out = context.make_array(sig.args[4])(context, builder, args[4])
        i64, i8p = ir.IntType(64), ir.IntType(8).as_pointer()
        offset = ir.Constant(i64, 0)
        for axis, index in zip(range(3), args[1:4], strict=True):
            stride = builder.extract_value(arr.strides, axis)
            offset = builder.add(offset, builder.mul(builder.sext(index, i64), stride))
        base = builder.gep(builder.bitcast(arr.data, i8p), [offset])
        src = builder.bitcast(base, ir.HalfType().as_pointer())
        row_at = builder.mul(builder.sext(args[5], i64), builder.extract_value(out.strides, 0))
        dst = builder.bitcast(builder.gep(builder.bitcast(out.data, i8p), [row_at]),
                              ir.FloatType().as_pointer())  # fmt: skip
        n = builder.extract_value(arr.shape, 3)
        zero, one, eight = (ir.Constant(i64, c) for c in (0, 1, 8))
        v8h, v8f = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.FloatType(), 8)
        whole = builder.sdiv(n, eight)  # runs of eight
        with cgutils.for_range_slice(builder, zero, whole, one) as (k, _):
            at = builder.mul(k, eight)
            halves = builder.load(builder.bitcast(builder.gep(src, [at]), v8h.as_pointer()),
                                  align=2)  # fmt: skip
            target = builder.bitcast(builder.gep(dst, [at]), v8f.as_pointer())
            builder.store(builder.fpext(halves, v8f), target, align=4)
        with cgutils.for_range_slice(builder, builder.mul(whole, eight), n, one) as (k, _):
            value = builder.fpext(builder.load(builder.gep(src, [k])), ir.FloatType())
            builder.store(value, builder.gep(dst, [k]))
        return context.get_dummy_value()

    return types.void(a, i, j, r, dst, row), codegen


def _widen_rows(a: Any, table: Any, i: int, j: int, used: int, seen: Any, dst: Any) -> None:
    """``dst[r, :] = a[i, j, r, :]`` as float32 for each ``r < used`` with ``seen[r]``
    (every one for an empty ``seen``); compiled per dtype, see the overload. The loop
    over rows is inside: an inlined call's array arguments are copies whose reference
    counts are atomic, and one call per row made them most of a decode step's attention
    (six atomic pairs a cell for K and V)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(_widen_rows, inline="always")
def _widen_rows_impl(a, table, i, j, used, seen, dst):  # type: ignore[no-untyped-def]  # numba: names only
    if _ir.HAS_F16C and isinstance(a, types.Array) and a.dtype == types.uint16 and a.ndim == 4:

        def f16c(a, table, i, j, used, seen, dst):  # type: ignore[no-untyped-def]
            every = seen.size == 0
            packed = a.strides[3] == 2
            for r in range(used):
                if every or seen[r]:
                    if packed:
                        _widen_f16_at(a, i, j, r, dst, r)
                    else:
                        for d in range(a.shape[3]):
                            dst[r, d] = table[a[i, j, r, d]]

        return f16c

    def one_by_one(a, table, i, j, used, seen, dst):  # type: ignore[no-untyped-def]
        every = seen.size == 0
        for r in range(used):
            if every or seen[r]:
                for d in range(a.shape[3]):
                    dst[r, d] = _value(a, table, i, j, r, d)

    return one_by_one


@kernel(nogil=True)  # pool threads
def widen_f16_rows(raw: Any, out: Any, used: int, table: Any) -> None:
    """``out[b, h, j] = raw[b, h, j]`` as float32 for ``j < used``: raw f16 (``uint16``)
    K, V or mask ``(B, H, n, D)`` into a float32 scratch whose rows are unit-stride, for
    the prompt's BLAS products. numpy converts f16 at ~2 ns a value: with eight per
    ``vcvtph2ps`` here, and :func:`visible_columns` in place of numpy's scan of the
    mask, a 100M model's 128-token attention went from 2.2 to 1.6 ms a layer on one
    core of the dev machine (widening its K, V and mask: ~17 µs each)."""
    every = np.zeros(0, np.bool_)
    for b in range(raw.shape[0]):
        for h in range(raw.shape[1]):
            _widen_rows(raw, table, b, h, used, every, out[b, h])


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


#: Lanes of one ``ggml_v_expf`` vector, whose sum ``ggml_vec_soft_max_f32`` adds at once.
EXP_LANES = 16


@njit(inline="always")
def _halve(lanes: Any, n: int) -> Any:
    """``lanes[0] + … + lanes[n−1]`` (n a power of two, the array overwritten) by adding
    the top half onto the bottom until one is left: ggml's reduction of its four
    accumulators (``x0+x2``, ``x1+x3``, then ``x0+x1``) followed by
    ``_mm512_reduce_add_ps`` (8, 4, 2, 1) is exactly this tree."""
    h = n // 2
    while h >= 1:
        for i in range(h):
            lanes[i] = lanes[i] + lanes[i + h]
        h //= 2
    return lanes[0]


@intrinsic
def _lanes_dot(typingctx: Any, x: Any, x_at: Any, y: Any, y_at: Any, runs: Any) -> Any:
    """``Σ x[x_at + i]·y[y_at + i]`` over the first ``runs`` runs of 64 of two 1-d
    unit-stride float32 arrays, in ``ggml_vec_dot_f32``'s AVX-512 order: one
    ``<64 x float>`` of lanes that fused multiply-adds each run into (lane ``i mod 64``),
    then halved down to one lane (``_halve``'s tree). Written as IR so the lanes stay in
    registers: numba's loop over a lanes array went through memory, 30 ns a 64-term
    score, most of a prompt's attention; ``llvm.fma`` rounds each lane once whatever the
    vector width. Offsets, not row views: a view per score cost two atomic reference
    counts, a quarter of a decode step's attention."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        v64 = ir.VectorType(f32, DOT_LANES)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v64, [v64, v64, v64]), "llvm.fma.v64f32"
        )
        xp = context.make_array(sig.args[0])(context, builder, args[0]).data
        yp = context.make_array(sig.args[2])(context, builder, args[2]).data
        xp = builder.gep(xp, [builder.sext(args[1], i64)])
        yp = builder.gep(yp, [builder.sext(args[3], i64)])

        def run(i: Any, acc: list[Any]) -> list[Any]:
            xv = builder.load(builder.bitcast(builder.gep(xp, [i]), v64.as_pointer()), align=4)
            yv = builder.load(builder.bitcast(builder.gep(yp, [i]), v64.as_pointer()), align=4)
            return [builder.call(fma, [xv, yv, acc[0]])]

        end = builder.mul(builder.sext(args[4], i64), ir.Constant(i64, DOT_LANES))
        zero = ir.Constant(v64, [0.0] * DOT_LANES)
        [acc] = _ir.carried_loop(builder, "lanes", ir.Constant(i64, 0), end, DOT_LANES,
                                 [zero], run)  # fmt: skip
        n = DOT_LANES
        while n > 1:
            h = n // 2
            lo, hi = (ir.Constant(ir.VectorType(i32, h), list(range(a, a + h))) for a in (0, h))
            acc = builder.fadd(builder.shuffle_vector(acc, acc, lo),
                               builder.shuffle_vector(acc, acc, hi))  # fmt: skip
            n = h
        return builder.extract_element(acc, ir.Constant(i32, 0))

    return types.float32(x, x_at, y, y_at, runs), codegen


@njit(inline="always")
def _vec_dot(x: Any, x_at: int, y: Any, y_at: int, n: int) -> Any:
    """``Σ x[x_at + i]·y[y_at + i]`` for ``i < n`` as ``ggml_vec_dot_f32`` on AVX-512:
    lane ``i mod 64`` accumulates its terms with fused multiply-adds over each full run
    of 64, the 64 lanes are halved down to one (:func:`_lanes_dot`), and the leftover
    terms are fused on one by one. ``x`` and ``y`` are 1-d and unit-stride."""
    whole = n - n % DOT_LANES
    s: Any = _lanes_dot(x, x_at, y, y_at, whole // DOT_LANES)  # type: ignore[call-arg]  # numba: typingctx
    for i in range(whole, n):
        s = _ir.fmaf(x[x_at + i], y[y_at + i], s)
    return s


@njit(inline="always")
def _softmax_ggml(w: Any, m: int, block: Any) -> Any:
    """Turn the scores ``w[:m]`` into softmax weights in place and return their float64
    sum's float32 reciprocal's product form, as ``ggml_compute_forward_soft_max_f32``
    with ``ggml_vec_soft_max_f32``: ``e = ggml_v_expf(w − max)`` per 16 lanes, each run of
    16 summed by the 8-4-2-1 tree in float32 and added to a float64 total, then every
    ``e`` multiplied by ``float(1/total)``. Runs are counted in visible columns (the
    hidden ones are 0 in ggml and add nothing). Returns False for a row with no
    finite score (left as is for the caller to zero)."""
    best = np.float32(-np.inf)
    for c in range(m):
        best = w[c] if w[c] > best else best
    if best == -np.inf:
        return False
    total = 0.0
    whole = m - m % EXP_LANES
    for c0 in range(0, whole, EXP_LANES):  # full runs: no test in the loop, it vectorizes
        for i in range(EXP_LANES):
            e = ggml_expf(w[c0 + i] - best)
            w[c0 + i] = e
            block[i] = e
        total += np.float64(_halve(block, EXP_LANES))
    if whole < m:
        for i in range(EXP_LANES):
            c = whole + i
            if c < m:
                e = ggml_expf(w[c] - best)
                w[c] = e
                block[i] = e
            else:
                block[i] = np.float32(0)
        total += np.float64(_halve(block, EXP_LANES))
    inv = np.float32(1.0 / total)  # NaN for a NaN score: the row comes out NaN, as ggml's
    for c in range(m):
        w[c] = w[c] * inv
    return True


@njit(inline="always")
def _visible(mask: Any, table: Any, mb: int, mh: int, r: int, used: int, has_mask: bool,
             order: Any, cols: Any, biases: Any) -> int:  # fmt: skip
    """The cells row ``r`` of mask head ``mh`` sees, in ``order`` (cell indices, all
    ``n_kv`` of them; cache order when empty), into ``cols`` (their indices) and
    ``biases`` (their mask values); returns how many. Their rank sets the lanes, so this
    order is the arithmetic's."""
    m = 0
    ordered = order.shape[0] > 0
    for t in range(order.shape[0] if ordered else used):
        j = order[t] if ordered else t
        if j >= used:  # hidden from every row
            continue
        if has_mask:
            if _hidden(mask, mb, mh, r, j):
                continue
            biases[m] = _value(mask, table, mb, mh, r, j)
        else:
            biases[m] = np.float32(0)
        cols[m] = j
        m += 1
    return m


@njit(inline="always")
def _attend_one(qrow: Any, kf: Any, vf: Any, n_d: int, n_dv: int, cols: Any, biases: Any,
                m: int, sc: Any, cap: Any, w: Any, block: Any, acc: Any, lanes: int, out: Any,
                b: int, r: int, h: int) -> None:  # fmt: skip
    """One query row of one head over its ``m`` visible cells ``cols`` (rows of the
    widened ``kf``, flat with row ``j`` at ``j·n_d``, and ``vf``), into ``out[b, r, h]``,
    in llama.cpp's arithmetic (see :func:`attend`). Every loop over the head dimension is
    unit-stride, by offset or by (row, column) index, never through a row view: a view
    costs two atomic reference counts, and one per score, lane and widened cell made
    them a third of a decode step's attention. LLVM vectorizes the fused products and
    the lane trees."""
    # scores: q·k (ggml's KQ product), ·scale (its softmax's), soft-capped, + mask
    for c in range(m):
        s = _vec_dot(kf, cols[c] * n_d, qrow, 0, n_d) * sc
        if cap != 0:
            s = cap * np.float32(math.tanh(s))
        w[c] = s + biases[c]
    if not _softmax_ggml(w, m, block):  # sees nothing: zeros, as ggml's (NaN stays NaN)
        nan = np.float32(0)
        for c in range(m):
            if w[c] != w[c]:
                nan = np.float32(np.nan)
        for d in range(n_dv):
            out[b, r, h, d] = nan
        return
    # weights · V (ggml's KQV product): visible cell c feeds lane c mod ``lanes`` (that
    # row of ``acc``); a lane's first term is fused onto +0 as in ggml's zeroed
    # registers (so no lane is cleared first), and lanes past the last visible cell
    # hold no term and are never touched
    live = min(m, lanes)  # lanes that hold a term
    zero = np.float32(0)
    for c in range(m):
        p = w[c]
        i, j = c % lanes, cols[c]
        if c < lanes:  # the lane's first term
            if p == 0:
                for d in range(n_dv):
                    acc[i, d] = zero
            else:
                for d in range(n_dv):
                    acc[i, d] = _ir.fmaf(vf[j, d], p, zero)
        elif p != 0:  # fma(v, 0, acc) = acc: skipped
            for d in range(n_dv):
                acc[i, d] = _ir.fmaf(vf[j, d], p, acc[i, d])
    half = lanes // 2
    while half >= 1:
        for i in range(min(half, max(live - half, 0))):
            for d in range(n_dv):
                acc[i, d] = acc[i, d] + acc[i + half, d]
        live = min(live, half)
        half //= 2
    for d in range(n_dv):
        out[b, r, h, d] = acc[0, d]


@kernel()
def attend_rows(
    q: Any, k: Any, v: Any, mask: Any, order: Any, used: int, scale: float, softcap: float,
    lanes: int, out: Any, table: Any, b: int, hk: int, r0: int, r1: int, kf: Any, vf: Any,
    cols: Any, biases: Any, seen: Any, w: Any, qrow: Any, block: Any, acc: Any,
) -> None:  # fmt: skip
    """:func:`attend` for query rows ``[r0, r1)`` of the query heads of batch ``b`` that
    share KV head ``hk``, in llama.cpp's arithmetic (see :func:`attend`). The cells any
    of these rows sees are widened to float32 once (not once per row and head), then
    each (row, head) runs :func:`_attend_one` on its own.

    The scratch is the caller's (:func:`_scratch`): ``kf`` and ``vf`` (≥ ``used`` rows
    of the head dimensions), ``cols``, ``biases``, ``seen`` and ``w`` (≥ ``used``),
    ``qrow`` (D), ``block`` (:data:`EXP_LANES`), ``acc`` (:data:`DOT_LANES`, Dv).

    A kernel of its own, called by both :func:`attend` and :func:`attend_serial`:
    inlined into each, it was two compiles of the whole body (and numba's parallel
    passes walked all of it), 13.3 and 6.1 s of a first run's CPU for SmolLM2 on a
    Zen 4; now 8.0 and 1.1, since the body compiles once for both (so both must call it
    with the same argument types: a test counts its signatures). A generated token's
    attention takes as long as inlined; a 128-row prompt's ~5% longer on two threads."""
    n_d, n_dv = q.shape[3], v.shape[3]
    group = q.shape[1] // k.shape[1]
    has_mask = mask.shape[0] > 0
    per_head_mask = has_mask and mask.shape[1] > 1
    n_mh = group if per_head_mask else 1
    kb = b if k.shape[0] > 1 else 0
    mb = b if has_mask and mask.shape[0] > 1 else 0
    # the cells some row sees, widened once
    for j in range(max(used, 1)):
        seen[j] = False
    for r in range(r0, r1):
        for g in range(n_mh):
            mh = hk * group + g if per_head_mask else 0
            m = _visible(mask, table, mb, mh, r, used, has_mask, order, cols, biases)
            for c in range(m):
                seen[cols[c]] = True
    _widen_rows(k, table, kb, hk, used, seen, kf)
    _widen_rows(v, table, kb, hk, used, seen, vf)
    kflat = kf.reshape(kf.shape[0] * n_d)  # row j at j·n_d, for the scores' offsets
    sc, cap = np.float32(scale), np.float32(softcap)
    for r in range(r0, r1):
        m = 0
        for g in range(group):
            if g == 0 or per_head_mask:
                mh = hk * group + g if per_head_mask else 0
                m = _visible(mask, table, mb, mh, r, used, has_mask, order, cols, biases)
            h = hk * group + g
            for d in range(n_d):
                qrow[d] = q[b, h, r, d]
            _attend_one(qrow, kflat, vf, n_d, n_dv, cols, biases, m, sc, cap, w, block, acc,
                        lanes, out, b, r, h)  # fmt: skip


@njit(inline="always")
def _scratch(used: int, n_d: int, n_dv: int) -> Any:
    """One task's scratch for :func:`attend_rows`: ``(kf, vf, cols, biases, seen, w,
    qrow, block, acc)``."""
    width = max(used, 1)
    return (np.empty((width, n_d), np.float32), np.empty((width, n_dv), np.float32),
            np.empty(width, np.int64), np.empty(width, np.float32), np.empty(width, np.bool_),
            np.empty(width, np.float32), np.empty(n_d, np.float32),
            np.empty(EXP_LANES, np.float32), np.empty((DOT_LANES, n_dv), np.float32))  # fmt: skip


#: Query rows per task of the parallel kernel (any split gives the same bits).
ROWS_PER_TASK = 16


@kernel(parallel=True)
def attend(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    order: Any,
    used: int,
    scale: float,
    softcap: float,
    lanes: int,
    out: Any,
    table: Any,
) -> None:
    """``out[b, r, h] = softmax_j(s_j)·v_j`` with ``s_j = q·k_j·scale`` (then
    ``softcap·tanh``) ``+ mask[b, h, r, j]``, over cache rows ``j < used``.

    q (B, H, n_q, D) float32; k (Bk, Hkv, n_kv, D) and v (Bk, Hkv, n_kv, Dv) float32, or
    uint16 holding f16 (read through ``table``); mask (Bm, Hm, ≥n_q, ≥used) float32 or
    raw f16 with 1 for a broadcast extent, or shape (0, 0, 0, 0) for none; ``order``
    int32 (n_kv,), the cells in the order their terms are summed (by position: the
    engine's unified cache holds a sequence's cells in any order), or shape (0,) for
    cache order; out (B, n_q, H, Dv). A query that sees no row gets zeros, as in ggml,
    and a masked row (-inf) is never read, so garbage in it cannot reach the result.

    The arithmetic is llama.cpp's CPU attention as llama-cpp-python runs it (no flash
    attention: ``mul_mat(k, q)``, ``soft_max_ext``, ``mul_mat(v, kq)``), operation for
    operation, so the result is ggml's to the bit: each score by ``ggml_vec_dot_f32``'s
    64 fused lanes and halving tree, ggml's softmax (:func:`_softmax_ggml`), and each
    output value by ``ggml_vec_dot_f32`` over the weights. Where ggml puts cache cell
    ``j`` in lane ``j mod 64``, here the ``c``-th *visible* cell in ``order`` takes lane
    ``c mod 64``: the same for one sequence in cells ``0…n`` (how llama.cpp fills its
    cache), and a row's bits then depend on nothing it cannot see (where its cells lie,
    other sequences' cells, how many query rows share the step). That is ``lanes`` =
    :data:`.attention.DOT_LANES` (64), which holds for any number of rows, so batching changes
    nothing. ggml itself switches the weights·V product to tinyBLAS's order for two
    query rows or more (llamafile ``sgemm``: 16 lanes over the cells, ``n_kv`` a
    multiple of 16 as llama.cpp pads it, then the 8-4-2-1 tree); ``lanes`` =
    :data:`.attention.TINYBLAS_LANES` reproduces it (the same as 64 up to 16 visible cells), for
    ``TENSORPLUG_CPU_GGML_PRODUCT_ORDER``. Fused multiply-adds are exact ``llvm.fma``
    calls and no fast-math reorders them. Tasks are (batch, KV head, run of query rows)
    on numba's threads, each with scratch of its own (:func:`attend_rows`).
    """
    n_b, n_hk, n_q = q.shape[0], k.shape[1], q.shape[2]
    runs = (n_q + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    n_tasks = n_b * n_hk * runs
    for task in prange(n_tasks):
        t = np.int64(task)  # prange's index may be unsigned: int64 as attend_serial's
        bh, run = t // runs, t % runs
        r1 = min(n_q, (run + 1) * ROWS_PER_TASK)
        scratch = _scratch(used, q.shape[3], v.shape[3])
        attend_rows(q, k, v, mask, order, used, scale, softcap, lanes, out, table,
                    bh // n_hk, bh % n_hk, run * ROWS_PER_TASK, r1, *scratch)  # fmt: skip


@kernel(nogil=True)
def attend_serial(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    order: Any,
    used: int,
    scale: float,
    softcap: float,
    lanes: int,
    out: Any,
    table: Any,
) -> None:
    """:func:`attend` on the calling thread, without a parallel region (for a short
    cache, a thread woken for its share cost more than the share)."""
    n_b, n_hk, n_q = q.shape[0], k.shape[1], q.shape[2]
    first = n_q - n_q  # 0, typed int64 as in attend: a literal 0 was a second compile
    scratch = _scratch(used, q.shape[3], v.shape[3])
    for bh in range(n_b * n_hk):
        attend_rows(q, k, v, mask, order, used, scale, softcap, lanes, out, table,
                    bh // n_hk, bh % n_hk, first, n_q, *scratch)  # fmt: skip


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


# The argument block of attend_job (int64): q, k, v, the mask its visible columns are
# read from, the mask its biases are read from, and out, each as _numba_pool.describe4
# writes it; then order, the scalars, and what the prologue finds.
_Q, _K, _V, _VISIBLE, _MASK, _OUT = (i * ARRAY4_FIELDS for i in range(6))
_ORDER, _ORDER_N, _SCALE, _SOFTCAP, _LANES, _TABLE, _RUNS, _USED = range(
    6 * ARRAY4_FIELDS, 6 * ARRAY4_FIELDS + 8
)
_JOB_FIELDS = 6 * ARRAY4_FIELDS + 8


def attend_job_block(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, mask: np.ndarray,
    order: np.ndarray, scale: float, softcap: float, lanes: int, out: np.ndarray,
    table: np.ndarray,
) -> tuple[np.ndarray, int]:  # fmt: skip
    """The argument block of :func:`attend_job` for :func:`attend`'s arguments (F16 ``k``,
    ``v`` and ``mask`` as raw ``uint16``; ``visible``: the mask as the step slices it,
    whose last visible column the prologue finds), and the job's chunk count: its
    tasks, as :func:`attend` has them. The arrays must outlive the block."""
    block = np.zeros(_JOB_FIELDS, np.int64)
    for at, a in zip((_Q, _K, _V, _VISIBLE, _MASK, _OUT), (q, k, v, visible, mask, out),
                     strict=True):  # fmt: skip
        describe4(block, at, a)
    block[_ORDER], block[_ORDER_N] = order.ctypes.data, order.shape[0]
    block[_SCALE : _SOFTCAP + 1] = np.array([scale, softcap], np.float64).view(np.int64)
    block[_LANES], block[_TABLE] = lanes, table.ctypes.data
    runs = (q.shape[2] + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    block[_RUNS] = runs
    return block, q.shape[0] * k.shape[1] * runs


def _attend_job(job: Any, lo: Any, hi: Any) -> None:
    """:func:`attend` as a job of :mod:`.pool`: the prologue finds the visible columns
    (``used``, kept in the block for the chunks), chunk ``t`` is :func:`attend`'s task
    ``t`` (a KV head's query heads over a run of rows), with the same arithmetic."""
    j = carray(address(job), _JOB_FIELDS, np.int64)
    table = carray(address(j[_TABLE]), 1 << 16, np.float32)
    if lo < 0:
        j[_USED] = visible_columns(view4(j, _VISIBLE, np.uint16), table)
        return
    q, out = view4(j, _Q, np.float32), view4(j, _OUT, np.float32)
    k, v, mask = view4(j, _K, np.uint16), view4(j, _V, np.uint16), view4(j, _MASK, np.uint16)
    order = carray(address(j[_ORDER]), j[_ORDER_N], np.int32)
    scales = j[_SCALE : _SOFTCAP + 1].view(np.float64)
    used, runs, n_hk, n_q = j[_USED], j[_RUNS], k.shape[1], q.shape[2]
    scratch = _scratch(used, q.shape[3], v.shape[3])
    for t in range(lo, hi):
        bh, run = t // runs, t % runs
        r1 = min(n_q, (run + 1) * ROWS_PER_TASK)
        attend_rows(q, k, v, mask, order, used, scales[0], scales[1], j[_LANES], out, table,
                    bh // n_hk, bh % n_hk, run * ROWS_PER_TASK, r1, *scratch)  # fmt: skip


@functools.cache
def attend_job() -> Any:
    """:func:`_attend_job` as a C function for :mod:`.pool`, made once (not compiled
    yet: :func:`._numba_cache.job_function`)."""
    job = job_function(_attend_job, "attend_job_f16")
    job.tensorplug_origin = ("attend_job",)  # how the compile-ahead process makes it
    return job

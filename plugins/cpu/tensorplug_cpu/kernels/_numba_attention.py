"""numba flash attention in llama.cpp's arithmetic, for every step size.

Each query row is computed on its own, in ggml's order of operations (:func:`attend`),
so its bits depend only on its own query and the cells it sees: batching changes no
bit, which a server needs. A task (batch, some KV heads, a run of query rows) reads the
cache where it lies (an F16 cache as raw ``uint16``, widened in registers, or F32),
takes every KV head's scores sixteen cells at a time, ggml's softmax, and each KV
head's weights·V lanes with their accumulators in registers: the inner loops are LLVM
IR (:mod:`._numba_attention_ir`): widening the cells to float32 first, as a separate
pass, would make a generated token's attention at a long context much slower.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.extending import intrinsic, overload

from . import _numba_ir as _ir
from ._numba_attention_ir import (
    CELLS,
    MAX_HEADS,
    NARROW_SCORE_LANES,
    SCORE_LANES,
    score_row,
    score_row_narrow,
    scores16,
    scores16_narrow,
    touch_cells,
    value_width,
    weighted_lanes,
)
from ._numba_cache import kernel
from ._numba_pool import address, view4
from ._numba_quant import f32_to_f16_bits
from ._numba_rows import expf, ggml_expf
from .job_blocks import (
    ATTEND_FIELDS,
    ATTEND_K,
    ATTEND_LANES,
    ATTEND_MASK,
    ATTEND_ORDER,
    ATTEND_ORDER_N,
    ATTEND_OUT,
    ATTEND_PARTS,
    ATTEND_Q,
    ATTEND_RUNS,
    ATTEND_SCALE,
    ATTEND_SOFTCAP,
    ATTEND_TABLE,
    ATTEND_UNIT,
    ATTEND_USED,
    ATTEND_V,
    ATTEND_VISIBLE,
    ROWS_PER_TASK,
)
from .job_function import job_function
from .kernel_shapes import DOT_LANES, HALF_PRODUCTS, LANES_MASK, NARROW_SCORES


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


def round_to_f16(x: Any, table: Any) -> Any:
    """float32 ``x`` rounded to f16 and back (compiled per CPU, see the overload)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(round_to_f16, inline="always")
def _half_impl(x, table):  # type: ignore[no-untyped-def]  # numba: names only
    if _ir.HAS_F16C:

        def f16c(x, table):  # type: ignore[no-untyped-def]
            return _ir.f16_rounded(x)

        return f16c

    def bits(x, table):  # type: ignore[no-untyped-def]
        return table[f32_to_f16_bits(x)]

    return bits


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
        zero, eight = ir.Constant(i64, 0), ir.Constant(i64, 8)
        v8h, v8f = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.FloatType(), 8)
        whole = builder.sdiv(n, eight)  # runs of eight

        def eights(k: Any, carried: list[Any]) -> list[Any]:
            at = builder.mul(k, eight)
            halves = builder.load(builder.bitcast(builder.gep(src, [at]), v8h.as_pointer()),
                                  align=2)  # fmt: skip
            target = builder.bitcast(builder.gep(dst, [at]), v8f.as_pointer())
            builder.store(builder.fpext(halves, v8f), target, align=4)
            return carried

        def rest(k: Any, carried: list[Any]) -> list[Any]:
            value = builder.fpext(builder.load(builder.gep(src, [k])), ir.FloatType())
            builder.store(value, builder.gep(dst, [k]))
            return carried

        _ir.carried_loop(builder, "widen8", zero, whole, 1, [], eights)
        _ir.carried_loop(builder, "widen1", builder.mul(whole, eight), n, 1, [], rest)
        return context.get_dummy_value()

    return types.void(a, i, j, r, dst, row), codegen


def _widen_rows(a: Any, table: Any, i: int, j: int, used: int, dst: Any) -> None:
    """``dst[r, :] = a[i, j, r, :]`` as float32 for each ``r < used``; compiled per dtype,
    see the overload. The loop over rows is inside: an inlined call's array arguments
    are copies whose reference counts are atomic, and one call per row made them most of
    a decode step's attention (six atomic pairs a cell for K and V)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(_widen_rows, inline="always")
def _widen_rows_impl(a, table, i, j, used, dst):  # type: ignore[no-untyped-def]  # numba: names only
    if _ir.HAS_F16C and isinstance(a, types.Array) and a.dtype == types.uint16 and a.ndim == 4:

        def f16c(a, table, i, j, used, dst):  # type: ignore[no-untyped-def]
            packed = a.strides[3] == 2
            for r in range(used):
                if packed:
                    _widen_f16_at(a, i, j, r, dst, r)
                else:
                    for d in range(a.shape[3]):
                        dst[r, d] = table[a[i, j, r, d]]

        return f16c

    def one_by_one(a, table, i, j, used, dst):  # type: ignore[no-untyped-def]
        for r in range(used):
            for d in range(a.shape[3]):
                dst[r, d] = _value(a, table, i, j, r, d)

    return one_by_one


@kernel(nogil=True)  # pool threads
def widen_f16_rows(raw: Any, out: Any, used: int, table: Any) -> None:
    """``out[b, h, j] = raw[b, h, j]`` as float32 for ``j < used``: raw f16 (``uint16``)
    K, V or mask ``(B, H, n, D)`` into a float32 scratch whose rows are unit-stride, for
    the prompt's BLAS products. numpy's f16 conversion is slow: with eight values per
    ``vcvtph2ps`` here, and :func:`visible_columns` in place of numpy's scan of the
    mask, a prompt's attention takes markedly less time a layer."""
    for b in range(raw.shape[0]):
        for h in range(raw.shape[1]):
            _widen_rows(raw, table, b, h, used, out[b, h])


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
def halving_sum(lanes: Any, n: int) -> Any:
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


@njit(inline="always")
def _softmax_ggml(w: Any, m: int, block: Any, half: bool, table: Any) -> Any:
    """Turn the scores ``w[:m]`` into softmax weights in place and return their float64
    sum's float32 reciprocal's product form, as ``ggml_compute_forward_soft_max_f32``
    with ``ggml_vec_soft_max_f32``: ``e = ggml_v_expf(w − max)`` per 16 lanes, each run of
    16 summed by the 8-4-2-1 tree in float32 and added to a float64 total, then every
    ``e`` multiplied by ``float(1/total)``. Runs are counted in visible columns (the
    hidden ones are 0 in ggml and add nothing). With ``half`` each weight is then
    rounded to f16 (read back through ``table``), as ggml converts them for the product
    with an F16 V. Returns False for a row with no finite score (left as is for the
    caller to zero)."""
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
        total += np.float64(halving_sum(block, EXP_LANES))
    if whole < m:
        for i in range(EXP_LANES):
            c = whole + i
            if c < m:
                e = ggml_expf(w[c] - best)
                w[c] = e
                block[i] = e
            else:
                block[i] = np.float32(0)
        total += np.float64(halving_sum(block, EXP_LANES))
    inv = np.float32(1.0 / total)  # NaN for a NaN score: the row comes out NaN, as ggml's
    for c in range(m):
        w[c] = w[c] * inv
    if half:
        for c in range(m):
            w[c] = round_to_f16(w[c], table)
    return True


@njit(inline="always")
def visible_cells(mask: Any, table: Any, mb: int, mh: int, r: int, used: int, has_mask: bool,
             order: Any, cols: Any, biases: Any) -> int:  # fmt: skip
    """The cells row ``r`` of mask head ``mh`` sees, in ``order`` (cell indices, all
    ``n_kv`` of them; cache order when empty), into ``cols`` (their indices) and
    ``biases`` (their mask values); returns how many. Their rank sets the lanes, so this
    order is the arithmetic's."""
    m = used - used  # 0, typed int64: a literal 0 types a callee given m once more
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


def widen_f16(bits: Any, table: Any) -> Any:
    """The f16 of ``bits`` (uint16) as float32 (compiled per CPU, see the overload)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(widen_f16, inline="always")
def _widen_f16_impl(bits, table):  # type: ignore[no-untyped-def]  # numba: names only
    if _ir.HAS_F16C:  # converted in a register: a loop of them vectorizes

        def converted(bits, table):  # type: ignore[no-untyped-def]
            return _ir.f16_widened(bits)

        return converted

    def looked_up(bits, table):  # type: ignore[no-untyped-def]
        return table[bits]

    return looked_up


def value_of(row: Any, table: Any, d: int) -> Any:
    """``row[d]`` of a 1-d cache row as float32 (compiled per dtype, see the overload)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(value_of, inline="always")
def _value_of_impl(row, table, d):  # type: ignore[no-untyped-def]  # numba: names only
    if isinstance(row, types.Array) and row.dtype == types.uint16:

        def widened(row, table, d):  # type: ignore[no-untyped-def]
            return widen_f16(row[d], table)

        return widened

    def direct(row, table, d):  # type: ignore[no-untyped-def]
        return row[d]

    return direct


def cell_value(a: Any, table: Any, h: int, j: int, d: int) -> Any:
    """``a[h, j, d]`` of 3-d cache rows as float32 (compiled per dtype, see the overload)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(cell_value, inline="always")
def _cell_value_impl(a, table, h, j, d):  # type: ignore[no-untyped-def]  # numba: names only
    if isinstance(a, types.Array) and a.dtype == types.uint16:

        def widened(a, table, h, j, d):  # type: ignore[no-untyped-def]
            return widen_f16(a[h, j, d], table)

        return widened

    def direct(a, table, h, j, d):  # type: ignore[no-untyped-def]
        return a[h, j, d]

    return direct


def cell_rows(a: Any, table: Any, b: int, used: int) -> Any:
    """Batch ``b`` of a 4-d cache ``a`` as the 3-d (KV head, cell, value) rows the inner
    loops (:mod:`._numba_attention_ir`) read: the cache itself where its rows are
    unit-stride float32, or raw f16 on a CPU with F16C (widened in registers); else the
    first ``used`` cells copied into a packed scratch, widened to float32 where there is
    no F16C (through ``table``). Compiled per dtype, see the overload."""
    raise NotImplementedError  # only ever called from compiled code


@overload(cell_rows)
def _cell_rows_impl(a, table, b, used):  # type: ignore[no-untyped-def]  # numba: names only
    in_registers = isinstance(a, types.Array) and (
        a.dtype == types.float32 or (a.dtype == types.uint16 and _ir.HAS_F16C)
    )
    if in_registers:

        def in_place(a, table, b, used):  # type: ignore[no-untyped-def]
            rows = a[b]
            if a.strides[3] == a.itemsize:
                return rows
            packed = np.empty((a.shape[1], max(used, 1), a.shape[3]), a.dtype)
            for h in range(a.shape[1]):
                for j in range(used):
                    for d in range(a.shape[3]):
                        packed[h, j, d] = rows[h, j, d]
            return packed

        return in_place

    def widened(a, table, b, used):  # type: ignore[no-untyped-def]
        packed = np.empty((a.shape[1], max(used, 1), a.shape[3]), np.float32)
        for h in range(a.shape[1]):
            _widen_rows(a, table, b, h, used, packed[h])
        return packed

    return widened


#: The weights·V chains for 1 to MAX_HEADS query heads (index: heads − 1).
_LANES_1, _LANES_2, _LANES_3, _LANES_4 = (weighted_lanes(h) for h in range(1, MAX_HEADS + 1))


@njit
def head_scores(keys: Any, values: Any, table: Any, hk0: int, hk1: int, n_g: int, qs: Any,
            cols: Any, biases: Any, m: int, sc: Any, cap: Any, w: Any, narrow: bool,
            half: bool) -> None:  # fmt: skip
    """``w[x, c]`` for the query heads ``x = (hk − hk0)·n_g + g`` of KV heads
    ``[hk0, hk1)`` (their rows in ``qs``) and the ``m`` visible cells ``cols``: q·k
    (ggml's KQ product, ``ggml_vec_dot_f32``: :func:`scores16`, then the terms past the
    last run of 64 fused on one by one; with ``half``, ``ggml_vec_dot_f16``, whose terms
    past the last run are float32 products added to a float64 sum; with ``narrow``,
    tinyBLAS's 16 lanes, :func:`scores16_narrow`), ·scale (its softmax's), soft-capped,
    + mask (``biases``). Sixteen cells at a time for every KV head, so that ggml's cache
    (each cell's heads side by side) is read as it lies, once."""
    n_d = qs.shape[1]
    width = NARROW_SCORE_LANES if narrow else SCORE_LANES
    runs = n_d // width
    whole = runs * width
    blocks = m - m % CELLS
    for c0 in range(0, blocks, CELLS):
        for hk in range(hk0, hk1):
            for g in range(n_g):
                x = (hk - hk0) * n_g + g
                if narrow:  # head sizes 64 and 256 as constants, as below
                    if runs == 4:
                        scores16_narrow(keys, hk, cols, c0, qs, x, 4, w)  # type: ignore[call-arg]  # numba
                    elif runs == 16:
                        scores16_narrow(keys, hk, cols, c0, qs, x, 16, w)  # type: ignore[call-arg]  # numba
                    else:
                        scores16_narrow(keys, hk, cols, c0, qs, x, runs, w)  # type: ignore[call-arg]  # numba
                    continue
                # the common head sizes (64, 128, 256) as constants: straight-line code that
                # LLVM schedules across the sixteen cells (a loop of one run per cell takes
                # about twice as long)
                if runs == 1:
                    scores16(keys, hk, cols, c0, qs, x, 1, w)  # type: ignore[call-arg]  # numba
                elif runs == 2:
                    scores16(keys, hk, cols, c0, qs, x, 2, w)  # type: ignore[call-arg]  # numba
                elif runs == 4:
                    scores16(keys, hk, cols, c0, qs, x, 4, w)  # type: ignore[call-arg]  # numba
                else:
                    scores16(keys, hk, cols, c0, qs, x, runs, w)  # type: ignore[call-arg]  # numba
    for c in range(blocks, m):
        for hk in range(hk0, hk1):
            for g in range(n_g):
                x = (hk - hk0) * n_g + g
                if narrow:
                    w[x, c] = score_row_narrow(keys, hk, cols[c], qs, x, runs)  # type: ignore[call-arg]  # numba
                else:
                    w[x, c] = score_row(keys, hk, cols[c], qs, x, runs)  # type: ignore[call-arg]  # numba
    for hk in range(hk0, hk1):
        for g in range(n_g):
            x = (hk - hk0) * n_g + g
            row = w[x]
            if whole == n_d and cap == 0:  # the common case, in a loop LLVM vectorizes
                for c in range(m):
                    row[c] = row[c] * sc + biases[c]
                continue
            for c in range(m):
                s = row[c]
                if half:
                    wide = np.float64(s)
                    for d in range(whole, n_d):
                        term = cell_value(keys, table, hk, cols[c], d) * qs[x, d]
                        wide += np.float64(term)
                    s = np.float32(wide)
                else:
                    for d in range(whole, n_d):
                        s = _ir.fmaf(cell_value(keys, table, hk, cols[c], d), qs[x, d], s)
                s = s * sc
                if cap != 0:
                    s = cap * np.float32(math.tanh(s))
                row[c] = s + biases[c]


@njit
def _weights_v(values: Any, table: Any, hk: int, cols: Any, w: Any, x0: int, heads: int,
               m: int, lanes: int, acc: Any) -> None:  # fmt: skip
    """``acc[x, i, :]`` for the query heads ``x0 ≤ x < x0 + heads`` of KV head ``hk`` and
    each lane ``i < min(m, lanes)``: ggml's KQV product's lane ``i``, the fused chain of
    its cells ``i, i + lanes, …`` (a lane past the last visible cell holds no term and
    is never touched). Runs of :func:`value_width` values by :func:`weighted_lanes`, up
    to four heads a chain; the values past the last run one by one, with the same
    arithmetic."""
    n_dv = acc.shape[2]
    width: int = value_width()  # type: ignore[call-arg]  # numba: typingctx
    whole = n_dv - n_dv % width
    for i in range(min(m, lanes)):
        n = (m - i + lanes - 1) // lanes  # the lane's cells
        for d0 in range(0, whole, width):
            for g0 in range(x0, x0 + heads, MAX_HEADS):
                left = x0 + heads - g0
                if left >= 4:
                    _LANES_4(values, hk, cols, w, g0, i, n, lanes, d0, acc)
                elif left == 3:
                    _LANES_3(values, hk, cols, w, g0, i, n, lanes, d0, acc)
                elif left == 2:
                    _LANES_2(values, hk, cols, w, g0, i, n, lanes, d0, acc)
                else:
                    _LANES_1(values, hk, cols, w, g0, i, n, lanes, d0, acc)
        for d in range(whole, n_dv):
            for x in range(x0, x0 + heads):
                a = np.float32(0)  # a zero weight's term is skipped, the first fused onto +0
                for t in range(n):
                    c = i + t * lanes
                    if w[x, c] != 0:
                        a = _ir.fmaf(cell_value(values, table, hk, cols[c], d), w[x, c], a)
                acc[x, i, d] = a


@njit
def _sum_lanes(acc: Any, x: int, m: int, lanes: int, out: Any, b: int, r: int, h: int) -> None:
    """``out[b, r, h] = `` the sum of head row ``x``'s lanes: the top half added onto the
    bottom until one is left (ggml's 64-lane tree, or tinyBLAS's 16), a lane that holds
    no term skipped where ggml adds its zero."""
    n_dv = acc.shape[2]
    live = min(m, lanes)  # lanes that hold a term
    half = lanes // 2
    while half >= 1:
        for i in range(min(half, max(live - half, 0))):
            for d in range(n_dv):
                acc[x, i, d] = acc[x, i, d] + acc[x, i + half, d]
        live = min(live, half)
        half //= 2
    for d in range(n_dv):
        out[b, r, h, d] = acc[x, 0, d]


@njit
def _attend_heads(q: Any, keys: Any, values: Any, table: Any, lanes: int, out: Any, b: int,
                  r: int, hk0: int, hk1: int, g0: int, n_g: int, cols: Any, biases: Any, m: int,
                  sc: Any, cap: Any, w: Any, qs: Any, block: Any, acc: Any, sees: Any,
                  fetch: bool) -> None:  # fmt: skip
    """Query row ``r`` of the query heads ``hk·group + g0 + g`` (``hk0 ≤ hk < hk1``,
    ``g < n_g``), which all see the ``m`` cells ``cols``, into ``out[b, r]``; with
    ``fetch``, V's cells ``[0, m)`` read through first (:func:`touch_cells`). ``lanes``
    as :func:`attend`'s: with :data:`.kernel_shapes.HALF_PRODUCTS` the query and the weights
    are rounded to f16 before their products."""
    group = q.shape[1] // keys.shape[0]
    half = (lanes & HALF_PRODUCTS) != 0
    narrow = (lanes & NARROW_SCORES) != 0
    v_lanes = lanes & LANES_MASK
    for hk in range(hk0, hk1):
        for g in range(n_g):
            for d in range(qs.shape[1]):
                value = q[b, hk * group + g0 + g, r, d]
                if half:
                    value = round_to_f16(value, table)
                qs[(hk - hk0) * n_g + g, d] = value
    head_scores(keys, values, table, hk0, hk1, n_g, qs, cols, biases, m, sc, cap, w, narrow, half)
    if fetch:
        touch_cells(values, hk0, hk1, m)  # type: ignore[call-arg]  # numba: typingctx
    for x in range((hk1 - hk0) * n_g):
        sees[x] = _softmax_ggml(w[x], m, block, half, table)
    for hk in range(hk0, hk1):
        x0 = (hk - hk0) * n_g
        _weights_v(values, table, hk, cols, w, x0, n_g, m, v_lanes, acc)
        for g in range(n_g):
            x, h = x0 + g, hk * group + g0 + g
            if sees[x]:
                _sum_lanes(acc, x, m, v_lanes, out, b, r, h)
                continue
            nan = np.float32(0)  # sees nothing: zeros, as ggml's (NaN stays NaN)
            for c in range(m):
                if w[x, c] != w[x, c]:
                    nan = np.float32(np.nan)
            for d in range(out.shape[3]):
                out[b, r, h, d] = nan


@kernel()
def attend_rows(
    q: Any, k: Any, v: Any, mask: Any, order: Any, used: int, scale: float, softcap: float,
    lanes: int, out: Any, table: Any, b: int, hk0: int, hk1: int, g0: int, n_g: int, r0: int,
    r1: int, cols: Any, biases: Any, w: Any, qs: Any, block: Any, acc: Any, sees: Any,
) -> None:  # fmt: skip
    """:func:`attend` for query rows ``[r0, r1)`` of batch ``b``'s query heads ``g0 ≤ g <
    g0 + n_g`` of each KV head in ``[hk0, hk1)``, in llama.cpp's arithmetic (see
    :func:`attend`). Heads
    that see the same cells (all of them, unless the mask has a head axis) are taken
    together: their cells found once, every KV head's K read cell by cell as the cache
    holds them, and each weights·V chain serving all the query heads of its KV head.

    The scratch is the caller's (:func:`_scratch`): ``cols`` and ``biases`` (≥
    ``used``), ``w`` (those query heads, ≥ ``used``), ``qs`` (those heads,
    D), ``block`` (:data:`EXP_LANES`), ``acc`` (those heads, :data:`DOT_LANES`, Dv),
    ``sees`` (those heads).

    A kernel of its own, called by both :func:`attend` and :func:`attend_serial`:
    inlined into each, it would be two compiles of the whole body (and numba's parallel
    passes would walk all of it), a large share of a first run's CPU; a kernel of its
    own, the body compiles once for both (so both must call it with the same argument
    types: a test counts its signatures). The job that runs an F16
    cache's attention at every thread count (:func:`attend_job`) inlines it instead."""
    group = q.shape[1] // k.shape[1]
    has_mask = mask.shape[0] > 0
    per_head_mask = has_mask and mask.shape[1] > 1
    kb = b if k.shape[0] > 1 else 0
    mb = b if has_mask and mask.shape[0] > 1 else 0
    keys, values = cell_rows(k, table, kb, used), cell_rows(v, table, kb, used)
    # K, then V (for a task's first row), read through once as they lie before the
    # passes that read them in the arithmetic's order: V's lanes are cells 64 apart (32
    # KB in ggml's cache at a 2000-cell context, across pages, where no hardware
    # prefetcher follows). At a long context, reading the cells through first makes a
    # generated token's attention markedly faster, far more than the reads themselves
    # cost; reading V just before its pass, not with K, is faster still; software
    # prefetches of V beside K's reads do not help.
    touch_cells(keys, hk0, hk1, used)  # type: ignore[call-arg]  # numba: typingctx
    sc, cap = np.float32(scale), np.float32(softcap)
    # 0 and 1 typed int64: a literal argument is a compile of its own for each helper
    zero = r0 - r0
    one = zero + 1
    for r in range(r0, r1):
        if per_head_mask:  # each query head sees cells of its own
            for hk in range(hk0, hk1):
                for g in range(g0, g0 + n_g):
                    m = visible_cells(mask, table, mb, hk * group + g, r, used, True, order, cols,
                                 biases)  # fmt: skip
                    _attend_heads(q, keys, values, table, lanes, out, b, r, hk, hk + one, g, one,
                                  cols, biases, m, sc, cap, w, qs, block, acc, sees,
                                  r == r0 and g == g0)  # fmt: skip
        else:
            m = visible_cells(mask, table, mb, zero, r, used, has_mask, order, cols, biases)
            _attend_heads(q, keys, values, table, lanes, out, b, r, hk0, hk1, g0, n_g, cols,
                          biases, m, sc, cap, w, qs, block, acc, sees, r == r0)  # fmt: skip


@njit(inline="always")
def _scratch(used: int, heads: int, n_d: int, n_dv: int) -> Any:
    """One task's scratch for :func:`attend_rows`: ``(cols, biases, w, qs, block, acc,
    sees)`` for ``heads`` query heads."""
    width = max(used, 1)
    return (np.empty(width, np.int64), np.empty(width, np.float32),
            np.empty((heads, width), np.float32), np.empty((heads, n_d), np.float32),
            np.empty(EXP_LANES, np.float32), np.empty((heads, DOT_LANES, n_dv), np.float32),
            np.empty(heads, np.bool_))  # fmt: skip


@njit(inline="always")
def _kv_heads_per_task(n_hk: int, threads: int) -> int:
    """KV heads one task takes: all of them on one thread (ggml's cache, whose cells
    hold their heads side by side, is then read once, as it lies), else as many as
    share the threads evenly (any split gives the same bits)."""
    parts = max(1, min(n_hk, threads))
    return (n_hk + parts - 1) // parts


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
    threads: int,
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
    :data:`.kernel_shapes.DOT_LANES` (64), which holds for any number of rows, so batching changes
    nothing. ggml itself switches the weights·V product to tinyBLAS's order for two
    query rows or more (llamafile ``sgemm``: 16 lanes over the cells, ``n_kv`` a
    multiple of 16 as llama.cpp pads it, then the 8-4-2-1 tree); ``lanes`` =
    :data:`.kernel_shapes.TINYBLAS_LANES` reproduces it (the same as 64 up to 16 visible cells), for
    ``TENSORPLUG_CPU_GGML_PRODUCT_ORDER``. ``lanes`` carries two flags beside them
    (:func:`.attention.products`): :data:`.kernel_shapes.HALF_PRODUCTS`, what an F16 cache
    makes ggml do (``vec_dot_type`` F16: the query and the softmax's weights rounded to
    f16 before their products, ``ggml_vec_dot_f16``), and
    :data:`.kernel_shapes.NARROW_SCORES`, the scores in tinyBLAS's 16 lanes (ggml's F16 K·Q
    product of two query rows or more). Fused multiply-adds are exact ``llvm.fma``
    calls and no fast-math reorders them. Tasks are (batch, KV heads, run of query rows)
    on numba's threads, each with scratch of its own (:func:`attend_rows`), the KV heads
    shared evenly by ``threads`` (:func:`_kv_heads_per_task`).
    """
    n_b, n_hk, n_q = q.shape[0], k.shape[1], q.shape[2]
    runs = (n_q + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    per_task = _kv_heads_per_task(n_hk, threads)
    parts = (n_hk + per_task - 1) // per_task
    group = q.shape[1] // n_hk
    for task in prange(n_b * parts * runs):
        t = np.int64(task)  # prange's index may be unsigned: int64 as attend_serial's
        bp, run = t // runs, t % runs
        hk0 = (bp % parts) * per_task
        r1 = min(n_q, (run + 1) * ROWS_PER_TASK)
        scratch = _scratch(used, per_task * group, q.shape[3], v.shape[3])
        attend_rows(q, k, v, mask, order, used, scale, softcap, lanes, out, table, bp // parts,
                    hk0, min(n_hk, hk0 + per_task), hk0 - hk0, group, run * ROWS_PER_TASK, r1,
                    *scratch)  # fmt: skip


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
    cache, a thread woken for its share cost more than the share), every KV head in
    one task."""
    n_b, n_hk, n_q = q.shape[0], k.shape[1], q.shape[2]
    first = n_q - n_q  # 0, typed int64 as in attend: a literal 0 would be a second compile
    scratch = _scratch(used, q.shape[1], q.shape[3], v.shape[3])
    for b in range(n_b):
        attend_rows(q, k, v, mask, order, used, scale, softcap, lanes, out, table, b, first,
                    n_hk, first, q.shape[1] // n_hk, first, n_q, *scratch)  # fmt: skip


@kernel(nogil=True, fastmath={"reassoc"})  # pool threads
def softmax_rows(s: Any, mask: Any, used: int, scale: float, row: Any) -> None:
    """A prompt's attention weights, in place: ``s[g, r, j] ← e^(s·scale + mask − max_r)``
    for ``j < used`` and ``row[g, r] ← 1/Σ_j`` (0 for a row that sees no column; its
    weights are 0), for scores ``s`` (G, N, ≥used) float32 and a float32 ``mask``
    (1 or G, ≥N, ≥used), or shape (0, 0, 0) for none; rows unit-stride (C-contiguous
    arrays let LLVM vectorize). One pass for scale, mask and maximum, one for the
    exponentials (:func:`expf`) and their sum: numpy's eight whole-block passes, with
    temporaries, would be a large share of a prompt's attention per layer."""
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


#: :func:`attend_rows` inlined, for the job: one level of numba's linking less. numba
#: links a callee's code into its caller and optimizes and compiles it to machine code
#: again, at every level; the job compiles faster inlining it than calling
#: :func:`attend_rows` (inlining :func:`_attend_heads` as well would be slower again:
#: two copies).
_attend_rows_inline = njit(inline="always")(attend_rows.py_func)


@njit(inline="always")
def attention_views(j: Any) -> Any:
    """What both attention jobs' blocks hold at the same fields
    (:func:`.job_blocks._attention_block`): ``(q, out, k, v, mask, order, scales)``,
    the cache and mask as raw f16, ``scales`` the scale and the softcap."""
    q, out = view4(j, ATTEND_Q, np.float32), view4(j, ATTEND_OUT, np.float32)
    k, v = view4(j, ATTEND_K, np.uint16), view4(j, ATTEND_V, np.uint16)
    mask = view4(j, ATTEND_MASK, np.uint16)
    order = carray(address(j[ATTEND_ORDER]), j[ATTEND_ORDER_N], np.int32)
    return q, out, k, v, mask, order, j[ATTEND_SCALE : ATTEND_SOFTCAP + 1].view(np.float64)


def _attend_job(job: Any, lo: Any, hi: Any) -> None:
    """:func:`attend` as a job of :mod:`.pool`: the prologue finds the visible columns
    (``used``, kept in the block for the chunks); chunk ``t`` takes a run of query rows
    of one batch and one part of the query heads (:func:`job_parts`), in rectangles of
    a KV head's query heads or of whole KV heads, with :func:`attend`'s arithmetic."""
    j = carray(address(job), ATTEND_FIELDS, np.int64)
    table = carray(address(j[ATTEND_TABLE]), 1 << 16, np.float32)
    if lo < 0:
        j[ATTEND_USED] = visible_columns(view4(j, ATTEND_VISIBLE, np.uint16), table)
        return
    q, out, k, v, mask, order, scales = attention_views(j)
    used, runs, n_q = j[ATTEND_USED], j[ATTEND_RUNS], q.shape[2]
    unit, parts = j[ATTEND_UNIT], j[ATTEND_PARTS]
    group = q.shape[1] // k.shape[1]
    units = q.shape[1] // unit
    heads = unit * ((units + parts - 1) // parts)  # a part's most query heads
    # unpacked: numba inlines no call that passes a tuple as *args
    cols, biases, w, qs, block, acc, sees = _scratch(used, heads, q.shape[3], v.shape[3])
    for t in range(lo, hi):
        bp, run = t // runs, t % runs
        p = bp % parts
        r0 = run * ROWS_PER_TASK
        r1 = min(n_q, r0 + ROWS_PER_TASK)
        x, x1 = unit * (p * units // parts), unit * ((p + 1) * units // parts)
        while x < x1:  # query heads x (KV head x // group) in rectangles
            hk, g = x // group, x % group
            n_hk, n_g = 1, min(group - g, x1 - x)
            if g == 0 and x1 - x >= group:
                n_hk, n_g = (x1 - x) // group, group
            lanes = j[ATTEND_LANES]
            _attend_rows_inline(q, k, v, mask, order, used, scales[0], scales[1], lanes, out,
                                table, bp // parts, hk, hk + n_hk, g, n_g, r0, r1, cols, biases,
                                w, qs, block, acc, sees)  # fmt: skip
            x += n_hk * n_g


@functools.cache
def attend_job() -> Any:
    """:func:`_attend_job` as a C function for :mod:`.pool`, made once (not compiled
    yet: :func:`.job_function.job_function`)."""
    job = job_function(_attend_job, "attend_job_f16")
    job.tensorplug_origin = ("made_job", __name__, "attend_job")  # how another process makes it
    return job

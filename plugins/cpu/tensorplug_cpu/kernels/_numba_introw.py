"""Weight rows, four at a time or one, times one row of Q8_0 activations, each as one
loop of LLVM IR: ggml's ``ggml_vec_dot_q*_q8_0`` on x86, widened to several rows.

The per-block integer dot of :func:`._numba_ir.dot_i8` returns a scalar, so every block paid
a horizontal sum of eight lanes, a scalar multiply-add and its own load of the
activation block. Here each row keeps the eight 32-bit partial sums of a block as a
float vector, scaled by ``d_w·d_x`` and added into that row's vector accumulator (the
lanes are summed once per row); the activation block, its scale and the rows' four f16
scales (one ``vcvtph2ps``) are loaded once for the four rows, and the four accumulators
are four independent chains of additions. Every block iteration also asks the cache for
the same block :data:`PREFETCH_ROWS` rows ahead: with it a mat×vec of a matrix larger
than the caches runs markedly faster, where the hardware prefetcher alone leaves the
core waiting.

Four rows at a time pays where a block costs more work than its bytes take to arrive
(nibbles to unpack, Q4_0's and Q4_K's folding). Q8_0 and Q6_K carry more bytes per
value and little unpacking, and there four rows streamed side by side read memory
slower than one row after another (with the same prefetching), and slower than ggml's
own ``vec_dot``, for matrices larger than the caches; one row at a time is faster than
both. Q4_0, Q4_K and the other 32-value types are faster four at a time. Each row's
sums are the same either way, so these two types' kernels take one row (:data:`GROUP`)
and give the bits a four-row kernel would.

Codes: Q4_1/Q5_1/Q4_0/Q5_0 feed AVX2's ``vpmaddubsw`` as unsigned values; the offset of
Q4_0/Q5_0 (8, 16) comes back as ``−offset·Σx``, an exact integer added to lane 0, and
the minimum of Q4_1/Q5_1 as ``m_w·d_x·Σx`` in a vector beside the accumulators. Q8_0's
signed codes go through ``vpsignb`` as in ggml. Scales are f16, converted by the CPU
(F16C) where it has the instruction, else read from the f16 → f32 table. Without AVX2
the same loop is written with portable widening vector arithmetic that LLVM lowers for
the host's SIMD (its speed has been measured only on AVX2 hosts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _numba_ir as _ir
from ._numba_ir import (
    I8,
    I16,
    I32,
    I64,
    array_data,
    carried_loop,
    f16x,
    llvm_fn,
    load_vec,
    splat,
    splat_lane,
    splat_scalar,
    vec_of,
)
from .kernel_shapes import INT8_ROWS

__all__ = ["GROUP", "LAYOUTS", "PREFETCH_ROWS", "rows1_dot_q6_k", "rows1_dot_q8_0",
           "rows4_dot_q4_0", "rows4_dot_q4_1", "rows4_dot_q4_k", "rows4_dot_q5_0",
           "rows4_dot_q5_1"]  # fmt: skip

_F32 = ir.FloatType()
_V8F = ir.VectorType(_F32, 8)


@dataclass(frozen=True)
class Layout:
    """Where a block keeps its parts, and how its codes become signed integers."""

    block: int  # bytes per 32 values
    qs: int  # offset of the 16 nibble bytes (or 32 int8 values for Q8_0)
    qh: int = -1  # offset of the 32 fifth bits (Q5), -1 for none
    m: int = -1  # offset of the f16 minimum (Q4_1, Q5_1), -1 for none
    offset: int = 0  # subtracted from each code to make it signed (Q4_0: 8, Q5_0: 16)
    int8: bool = False  # codes are stored as int8 (Q8_0)


LAYOUTS = {
    "q4_0": Layout(18, 2, offset=8),
    "q4_1": Layout(20, 4, m=2),
    "q5_0": Layout(22, 6, qh=2, offset=16),
    "q5_1": Layout(24, 8, qh=4, m=2),
    "q8_0": Layout(34, 2, int8=True),
}


def block_codes(builder: ir.IRBuilder, lay: Layout, row: Any, at: Any) -> tuple[Any, bool]:
    """The block's 32 codes as ``<32 x i8>``, and whether they are signed."""
    v32 = vec_of(I8, 32)
    if lay.int8:
        return load_vec(builder, row, builder.add(at, I64(lay.qs)), v32), True
    # the 16 bytes in both halves (one vbroadcasti128), the upper half's 32-bit words
    # shifted right by 4 (one vpsrlvd), one mask: low nibbles, then high ones. Splitting
    # the bytes in 128-bit halves and joining them would cost a shift, a mask and a
    # vinserti128 more per row, which slows Q4_0's kernel measurably.
    q = load_vec(builder, row, builder.add(at, I64(lay.qs)), vec_of(I8, 16))
    both = builder.shuffle_vector(q, q, ir.Constant(vec_of(I32, 32), list(range(16)) * 2))
    shift = ir.Constant(vec_of(I32, 8), [0] * 4 + [4] * 4)
    words = builder.lshr(builder.bitcast(both, vec_of(I32, 8)), shift)
    codes = builder.and_(builder.bitcast(words, v32), splat(I8, 32, 15))
    if lay.qh >= 0:  # byte j // 8 of qh holds bit j: spread the bytes, test one bit each
        four = load_vec(builder, row, builder.add(at, I64(lay.qh)), vec_of(I8, 4))
        byte_of = ir.Constant(vec_of(I32, 32), [j // 8 for j in range(32)])
        spread = builder.shuffle_vector(four, four, byte_of)
        mask = ir.Constant(v32, [1 << (j % 8) for j in range(32)])
        bit = builder.icmp_unsigned("!=", builder.and_(spread, mask), splat(I8, 32, 0))
        codes = builder.or_(codes, builder.shl(builder.zext(bit, v32), splat(I8, 32, 4)))
    if lay.offset and not _ir.HAS_AVX2:
        return builder.sub(codes, splat(I8, 32, lay.offset)), True
    return codes, False


def _partial_sums(builder: ir.IRBuilder, w: Any, signed: bool, x: Any) -> Any:
    """Eight i32 partial sums of Σ_j w_j·x_j (each over four neighbouring j)."""
    v32, v16, v8 = vec_of(I8, 32), vec_of(I16, 16), vec_of(I32, 8)
    if _ir.HAS_AVX2:
        if signed:  # |w| · (x with w's sign): vpmaddubsw wants its first operand unsigned
            sign = llvm_fn(builder, "llvm.x86.avx2.psign.b", v32, v32, v32)
            w, x = builder.call(sign, [w, w]), builder.call(sign, [x, w])
        pairs = builder.call(llvm_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, v32, v32), [w, x])
        return builder.call(llvm_fn(builder, "llvm.x86.avx2.pmadd.wd", v8, v16, v16),
                            [pairs, splat(I16, 16, 1)])  # fmt: skip
    wide = (builder.sext if signed else builder.zext)(w, vec_of(I32, 32))
    prod = builder.mul(wide, builder.sext(x, vec_of(I32, 32)))
    lanes = [ir.Constant(vec_of(I32, 8), [4 * k + q for k in range(8)]) for q in range(4)]
    quarters = [builder.shuffle_vector(prod, prod, lane) for lane in lanes]
    return builder.add(builder.add(quarters[0], quarters[1]), builder.add(quarters[2], quarters[3]))


def _hsum(builder: ir.IRBuilder, v: Any) -> Any:
    """The eight lanes of ``v`` added pairwise (a fixed order, as ggml's hsum)."""
    for width in (4, 2, 1):
        hi = builder.shuffle_vector(v, v, ir.Constant(vec_of(I32, width),
                                                      list(range(width, 2 * width))))  # fmt: skip
        lo = builder.shuffle_vector(v, v, ir.Constant(vec_of(I32, width), list(range(width))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, I32(0))


#: rows ahead that each block iteration asks the cache for (the same distance for one-row
#: and four-row kernels; any distance from 4 to 32 rows reads memory about as fast)
PREFETCH_ROWS = 8


#: rows a kernel takes at a time unless it is told otherwise
ROWS = 4
#: rows each type's kernel takes at a time (``rows{n}_dot_{type}``), by type name: the
#: dispatch table's :data:`~.kernel_shapes.INT8_ROWS` (one for the types whose bytes stream
#: faster one row after another, see the module's docstring)
GROUP = {t.name.lower(): n for t, n in INT8_ROWS.items()}


@dataclass
class _Block:
    """What a kernel body sees at one block of its row group."""

    builder: ir.IRBuilder
    rows: list[Any]  # i8* of each row's first byte
    x: Any  # i8* of the activation row's codes
    xd: Any  # float* of its block scales
    xs: Any  # i32* of its blocks' sums of codes
    table: Any  # float* of the f16 → f32 table
    b: Any  # i64 index of this block
    stride: Any  # i64 bytes from one row to the next

    def prefetch(self, at: Any, nbytes: int) -> None:
        """Ask for bytes ``at..at+nbytes`` of each row :data:`PREFETCH_ROWS` rows ahead."""
        builder = self.builder
        ahead = builder.add(builder.mul(I64(PREFETCH_ROWS), self.stride), at)
        for row in self.rows:
            _ir.prefetch_lines(builder, builder.gep(row, [ahead]), nbytes)

    def x_block(self, k: Any) -> Any:
        """Activation block ``k``'s 32 codes as ``<32 x i8>``."""
        return load_vec(self.builder, self.x, self.builder.mul(k, I64(32)), vec_of(I8, 32))


#: a kernel body: (block, the accumulators, ROWS·per_row of them) -> their new values
Body = Callable[[_Block, list[Any]], list[Any]]
#: its ending: (builder, the accumulators' final values) -> one float per row
Finish = Callable[[ir.IRBuilder, list[Any]], list[Any]]


def _rows_kernel(
    body: Body,
    finish: Finish,
    accumulators: list[ir.Constant],
    values_per_block: int,
    n_rows: int = ROWS,
) -> Any:
    """An intrinsic ``(rows, o, xq, xd, xs, table, n_act_blocks) -> n_rows floats``: rows
    ``o..o+n_rows-1`` of ``rows`` times one activation row, as one loop over the weight
    blocks that ``body`` emits the inside of."""
    per_block = values_per_block // 32  # activation blocks per weight block

    @intrinsic
    def rows_dot(typingctx: Any, rows: Any, o: Any, xr: Any, xd: Any, xs: Any, table: Any,
                 nb: Any) -> Any:  # fmt: skip
        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            stride = builder.extract_value(arr.strides, 0)
            base = builder.gep(arr.data, [builder.mul(args[1], stride)])
            row_ps = [builder.gep(base, [builder.mul(I64(i), stride)]) for i in range(n_rows)]
            xr_p, xd_p, xs_p, table_p = (
                array_data(context, builder, sig.args[i], args[i]) for i in (2, 3, 4, 5)
            )
            n = builder.sdiv(args[6], I64(per_block))

            def block(b: Any, accs: list[Any]) -> list[Any]:
                return body(_Block(builder, row_ps, xr_p, xd_p, xs_p, table_p, b, stride), accs)

            finals = carried_loop(builder, "rows_dot", I64(0), n, 1, list(accumulators), block)
            return context.make_tuple(builder, sig.return_type, finish(builder, finals))

        return types.UniTuple(types.float32, n_rows)(rows, o, xr, xd, xs, table, nb), codegen

    return rows_dot


_ZERO8 = ir.Constant(_V8F, [0.0] * 8)


def _fmuladd8(builder: ir.IRBuilder, a: Any, b: Any, c: Any) -> Any:
    return builder.call(llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F), [a, b, c])


def _fold_rows(builder: ir.IRBuilder, pairs: list[Any]) -> Any:
    """The four rows' 16 ``i16`` pair sums (``vpmaddubsw``) summed within each 128-bit
    half by two rounds of ``vphaddw`` and one ``vpmaddwd``: ``i32`` lanes
    ``[r0 r1 r2 r3 | r0 r1 r2 r3]``."""
    v16 = vec_of(I16, 16)
    hadd = llvm_fn(builder, "llvm.x86.avx2.phadd.w", v16, v16, v16)
    folded = builder.call(hadd, [builder.call(hadd, pairs[:2]), builder.call(hadd, pairs[2:])])
    return builder.call(llvm_fn(builder, "llvm.x86.avx2.pmadd.wd", vec_of(I32, 8), v16, v16),
                        [folded, splat(I16, 16, 1)])  # fmt: skip


def _block32_kernel(lay: Layout, n_rows: int = ROWS) -> Any:
    """A 32-value block type: per row, ``d_w·d_x·Σ(q − offset)·x``, and for Q4_1/Q5_1,
    beside it for all four rows in one vector, ``m_w·s_x`` (the Q8_1 activations'
    f16-rounded ``s``, as ggml's ``vec_dot_q4_1_q8_1``). With AVX2 the codes go
    into ``vpmaddubsw`` unsigned, and ``offset·Σx`` (Q4_0: 8, Q5_0: 16) comes back out
    as an exact integer.

    With AVX2, Q4_0 folds the four rows' integer sums into one vector by horizontal adds
    (:func:`_fold_rows`; a lane holds at most 8·15·127 = 15,240, so ``i16`` cannot
    overflow), takes ``8·Σx`` back out as integers and converts once: each row's block
    is one exact integer ``Σ(q − 8)·x`` times ``d_w·d_x``, as in llama.cpp's repacked
    Q4_0 kernel (which is what llama.cpp runs for Q4_0 on AVX2), and a block costs one
    ``vpmaddwd``, one conversion and one multiply-add for the four rows, not four of
    each plus four scale broadcasts, so a model's layer matrices stream from memory
    faster. The other
    types keep ggml's ``vec_dot`` order, which llama.cpp runs for them: each row keeps
    eight float partial sums (a different order of roundings moves SmolLM2's Q4_1
    logits by ~0.2 and its greedy text away from llama.cpp's).
    """
    vr = ir.VectorType(_F32, n_rows)
    v32, v16 = vec_of(I8, 32), vec_of(I16, 16)

    def folds() -> bool:  # read when compiled (tests turn AVX2 off)
        return _ir.HAS_AVX2 and lay == LAYOUTS["q4_0"] and n_rows == 4

    def body(blk: _Block, accs: list[Any]) -> list[Any]:
        folded = folds()
        builder, b = blk.builder, blk.b
        at = builder.mul(b, I64(lay.block))
        blk.prefetch(at, lay.block)
        x = blk.x_block(b)
        dx = splat_scalar(builder, builder.load(builder.gep(blk.xd, [b])), n_rows)
        scales = builder.fmul(f16x(builder, blk.rows, at, blk.table), dx)
        xsum = builder.load(builder.gep(blk.xs, [b]))
        codes = [block_codes(builder, lay, row, at) for row in blk.rows]
        fma = llvm_fn(builder, f"llvm.fmuladd.v{n_rows}f32", vr, vr, vr, vr)
        if folded:
            madd = llvm_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, v32, v32)
            halves = _fold_rows(builder, [builder.call(madd, [c, x]) for c, _ in codes])
            lo, hi = (builder.shuffle_vector(halves, halves, ir.Constant(vec_of(I32, 4), lanes))
                      for lanes in (list(range(4)), list(range(4, 8))))  # fmt: skip
            back = splat_scalar(builder, builder.mul(xsum, I32(-lay.offset)), n_rows)
            isums = builder.add(builder.add(lo, hi), back)  # exact: Σ(q − 8)·x per row
            total = builder.call(fma, [scales, builder.sitofp(isums, vr), accs[n_rows]])
            return [*accs[:n_rows], total]
        corr = None
        if lay.offset and _ir.HAS_AVX2:
            back = builder.mul(xsum, I32(-lay.offset))
            corr = builder.insert_element(ir.Constant(vec_of(I32, 8), [0] * 8), back, I32(0))
        new = []
        for i, (c, signed) in enumerate(codes):
            isums = _partial_sums(builder, c, signed, x)
            if corr is not None:
                isums = builder.add(isums, corr)
            sums = builder.sitofp(isums, _V8F)
            new.append(_fmuladd8(builder, splat_lane(builder, scales, 8, i), sums, accs[i]))
        mins = accs[n_rows]
        if lay.m >= 0:
            # Q8_1 activations: ``xs`` holds each block's ``s`` as float32 bits
            m_w = f16x(builder, blk.rows, builder.add(at, I64(lay.m)), blk.table)
            s_x = splat_scalar(builder, builder.bitcast(xsum, _F32), n_rows)
            mins = builder.call(fma, [m_w, s_x, mins])
        return [*new, mins]

    def finish(builder: ir.IRBuilder, finals: list[Any]) -> list[Any]:
        mins = finals[n_rows]
        if folds():  # the folded rows' totals
            return [builder.extract_element(mins, I32(i)) for i in range(n_rows)]
        return [builder.fadd(_hsum(builder, finals[i]), builder.extract_element(mins, I32(i)))
                for i in range(n_rows)]  # fmt: skip

    zeros = [_ZERO8] * n_rows + [ir.Constant(vr, [0.0] * n_rows)]
    return _rows_kernel(body, finish, zeros, 32, n_rows)


rows4_dot_q4_0 = _block32_kernel(LAYOUTS["q4_0"])
rows1_dot_q8_0 = _block32_kernel(LAYOUTS["q8_0"], GROUP["q8_0"])
rows4_dot_q4_1 = _block32_kernel(LAYOUTS["q4_1"])
rows4_dot_q5_0 = _block32_kernel(LAYOUTS["q5_0"])
rows4_dot_q5_1 = _block32_kernel(LAYOUTS["q5_1"])


def _q4_k_scales_mins(builder: ir.IRBuilder, row: Any, at: Any) -> tuple[Any, Any]:
    """The eight 6-bit scales and mins of the Q4_K block at ``at`` (ggml's
    ``get_scale_min_k4``) as two ``<8 x i8>``, unpacked with byte shuffles."""
    v8 = vec_of(I8, 8)
    q = load_vec(builder, row, builder.add(at, I64(4)), vec_of(I8, 16))

    def pick(idx: list[int]) -> Any:
        return builder.shuffle_vector(q, q, ir.Constant(vec_of(I32, 8), idx))

    def consts(lo: int, hi: int) -> ir.Constant:
        return ir.Constant(v8, [lo] * 4 + [hi] * 4)

    def top_bits(v: Any) -> Any:  # bits 6-7 of v as bits 4-5, in the upper four lanes
        return builder.and_(builder.shl(builder.lshr(v, splat(I8, 8, 6)), splat(I8, 8, 4)),
                            consts(0, 48))  # fmt: skip

    sc = builder.or_(builder.and_(pick([0, 1, 2, 3, 8, 9, 10, 11]), consts(63, 15)),
                     top_bits(pick([0, 1, 2, 3, 0, 1, 2, 3])))  # fmt: skip
    low = builder.lshr(pick([4, 5, 6, 7, 8, 9, 10, 11]), consts(0, 4))
    mn = builder.or_(builder.and_(low, consts(63, 15)), top_bits(pick([4, 5, 6, 7, 4, 5, 6, 7])))
    return sc, mn


def _q4_k_rows_body(blk: _Block, accs: list[Any]) -> list[Any]:
    """One Q4_K block of each row, row by row: eight sub-blocks of 32 nibbles against eight Q8_0
    activation blocks (each with its own scale, so each sub-block's sums are scaled in
    float), and ``dmin·Σ_s m_s·d_x·Σx`` beside them."""
    builder = blk.builder
    at = builder.mul(blk.b, I64(144))
    blk.prefetch(at, 144)
    first = builder.mul(blk.b, I64(8))  # the block's first activation block
    dxv = load_vec(builder, blk.xd, first, _V8F)
    dxs = builder.fmul(dxv, builder.sitofp(load_vec(builder, blk.xs, first, vec_of(I32, 8)),
                                           _V8F))  # fmt: skip
    d = f16x(builder, blk.rows, at, blk.table)
    dmin = f16x(builder, blk.rows, builder.add(at, I64(2)), blk.table)
    xs = [blk.x_block(builder.add(first, I64(s))) for s in range(8)]
    new = []
    for i, row in enumerate(blk.rows):
        scales, mins = (builder.uitofp(v, _V8F) for v in _q4_k_scales_mins(builder, row, at))
        factors = builder.fmul(builder.fmul(scales, splat_lane(builder, d, 8, i)), dxv)
        acc = accs[3 * i : 3 * i + 2]  # even and odd sub-blocks: two chains of additions
        for pair in range(4):
            q = load_vec(builder, row, builder.add(at, I64(16 + 32 * pair)), vec_of(I8, 32))
            nibbles = (builder.and_(q, splat(I8, 32, 15)), builder.lshr(q, splat(I8, 32, 4)))
            for h, nib in enumerate(nibbles):
                s = 2 * pair + h
                sums = builder.sitofp(_partial_sums(builder, nib, False, xs[s]), _V8F)
                acc[h] = _fmuladd8(builder, splat_lane(builder, factors, 8, s), sums, acc[h])
        mins_term = builder.fmul(mins, splat_lane(builder, dmin, 8, i))
        new += [*acc, _fmuladd8(builder, mins_term, dxs, accs[3 * i + 2])]
    return new


def _q4_k_rows_finish(builder: ir.IRBuilder, finals: list[Any]) -> list[Any]:
    return [builder.fsub(_hsum(builder, builder.fadd(finals[3 * i], finals[3 * i + 1])),
                         _hsum(builder, finals[3 * i + 2])) for i in range(ROWS)]  # fmt: skip


def _q4_k_folded_body(blk: _Block, accs: list[Any]) -> list[Any]:
    """:func:`_q4_k_rows_body` with AVX2's folding (see :func:`_block32_kernel`): for each
    pair of sub-blocks (the low and high nibbles of the same 32 bytes) the eight
    ``vpmaddubsw`` results of the four rows fold by three rounds of ``vphaddw`` into
    ``[r0 r1 r2 r3 (low), r0 r1 r2 r3 (high)]`` per 128-bit half (a lane holds at most
    16·15·127 = 30,480), the halves are widened and added, and one multiply-add applies
    the eight scales, transposed once per block from the rows' unpacked 6-bit ones."""
    builder = blk.builder
    v32, v16 = vec_of(I8, 32), vec_of(I16, 16)
    at = builder.mul(blk.b, I64(144))
    blk.prefetch(at, 144)
    first = builder.mul(blk.b, I64(8))
    dxv = load_vec(builder, blk.xd, first, _V8F)
    dxs = builder.fmul(dxv, builder.sitofp(load_vec(builder, blk.xs, first, vec_of(I32, 8)),
                                           _V8F))  # fmt: skip
    d = f16x(builder, blk.rows, at, blk.table)
    dmin = f16x(builder, blk.rows, builder.add(at, I64(2)), blk.table)
    d_twice = builder.shuffle_vector(d, d, ir.Constant(vec_of(I32, 8), [0, 1, 2, 3] * 2))
    xs = [blk.x_block(builder.add(first, I64(s))) for s in range(8)]
    madd = llvm_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, v32, v32)
    hadd = llvm_fn(builder, "llvm.x86.avx2.phadd.w", v16, v16, v16)
    scale_bytes, new = [], list(accs)
    for i, row in enumerate(blk.rows):
        scales, mins = _q4_k_scales_mins(builder, row, at)
        scale_bytes.append(scales)
        mins_term = builder.fmul(builder.uitofp(mins, _V8F), splat_lane(builder, dmin, 8, i))
        new[3 * i + 2] = _fmuladd8(builder, mins_term, dxs, accs[3 * i + 2])
    # the 4×8 scales, sub-block major: byte 4·s + r is row r's scale of sub-block s
    rows01 = builder.shuffle_vector(scale_bytes[0], scale_bytes[1],
                                    ir.Constant(vec_of(I32, 16), list(range(16))))  # fmt: skip
    rows23 = builder.shuffle_vector(scale_bytes[2], scale_bytes[3],
                                    ir.Constant(vec_of(I32, 16), list(range(16))))  # fmt: skip
    by_sub = builder.shuffle_vector(rows01, rows23, ir.Constant(
        vec_of(I32, 32), [8 * r + s for s in range(8) for r in range(4)]))  # fmt: skip
    for pair in range(4):
        lo_s, hi_s = 2 * pair, 2 * pair + 1
        quad = builder.shuffle_vector(by_sub, by_sub, ir.Constant(vec_of(I32, 8),
                                      list(range(8 * pair, 8 * pair + 8))))  # fmt: skip
        dx_pair = builder.shuffle_vector(dxv, dxv, ir.Constant(vec_of(I32, 8),
                                         [lo_s] * 4 + [hi_s] * 4))  # fmt: skip
        factors = builder.fmul(builder.fmul(builder.uitofp(quad, _V8F), d_twice), dx_pair)
        lows, highs = [], []
        for row in blk.rows:
            q = load_vec(builder, row, builder.add(at, I64(16 + 32 * pair)), v32)
            lows.append(builder.call(madd, [builder.and_(q, splat(I8, 32, 15)), xs[lo_s]]))
            highs.append(builder.call(madd, [builder.lshr(q, splat(I8, 32, 4)), xs[hi_s]]))
        folded = [builder.call(hadd, [builder.call(hadd, part[:2]), builder.call(hadd, part[2:])])
                  for part in (lows, highs)]  # fmt: skip
        both = builder.call(hadd, folded)  # per half: r0..r3 of the low, then of the high
        halves = [builder.sext(builder.shuffle_vector(both, both, ir.Constant(
            vec_of(I32, 8), list(range(h, h + 8)))), vec_of(I32, 8)) for h in (0, 8)]  # fmt: skip
        sums = builder.sitofp(builder.add(halves[0], halves[1]), _V8F)
        new[pair & 1] = _fmuladd8(builder, factors, sums, new[pair & 1])
    return new


def _q4_k_folded_finish(builder: ir.IRBuilder, finals: list[Any]) -> list[Any]:
    acc = builder.fadd(finals[0], finals[1])
    halves = [builder.shuffle_vector(acc, acc, ir.Constant(vec_of(I32, 4), list(lanes)))
              for lanes in (range(4), range(4, 8))]  # fmt: skip
    total = builder.fadd(halves[0], halves[1])
    return [builder.fsub(builder.extract_element(total, I32(i)), _hsum(builder, finals[3 * i + 2]))
            for i in range(ROWS)]  # fmt: skip


def _q4_k_body(blk: _Block, accs: list[Any]) -> list[Any]:
    """Q4_K's block: folded with AVX2 (chosen when compiled: tests switch AVX2 off)."""
    return (_q4_k_folded_body if _ir.HAS_AVX2 else _q4_k_rows_body)(blk, accs)


def _q4_k_finish(builder: ir.IRBuilder, finals: list[Any]) -> list[Any]:
    return (_q4_k_folded_finish if _ir.HAS_AVX2 else _q4_k_rows_finish)(builder, finals)


rows4_dot_q4_k = _rows_kernel(_q4_k_body, _q4_k_finish, [_ZERO8] * (3 * ROWS), 256)


def _widen_pair(builder: ir.IRBuilder, two: Any, ty: ir.IntType, n: int) -> Any:
    """``<2 x i8>`` (two signed scales) as ``n`` lanes of ``ty``: the first scale in the
    lower half, the second in the upper (the lanes of 16 values each)."""
    wide = builder.sext(two, vec_of(ty, 2))
    halves = ir.Constant(vec_of(I32, n), [0] * (n // 2) + [1] * (n // 2))
    return builder.shuffle_vector(wide, ir.Constant(vec_of(ty, 2), None), halves)


def _q6_k_body(blk: _Block, accs: list[Any]) -> list[Any]:
    """One Q6_K block of each row: eight runs of 32 six-bit codes (low four bits from
    ``ql``, high two from ``qh``) against eight Q8_0 activation blocks, each run with two
    int8 scales of 16 values; ``Σ(q − 32)·x`` as ``Σq·x − Σ32·x``, the second shared by
    the four rows, and the scales multiplied in by ``vpmaddwd`` in place of ones."""
    builder = blk.builder
    v32, v16, v8 = vec_of(I8, 32), vec_of(I16, 16), vec_of(I32, 8)
    at = builder.mul(blk.b, I64(210))
    blk.prefetch(at, 210)
    first = builder.mul(blk.b, I64(8))
    dxv = load_vec(builder, blk.xd, first, _V8F)
    d = f16x(builder, blk.rows, builder.add(at, I64(208)), blk.table)
    xs = [blk.x_block(builder.add(first, I64(r))) for r in range(8)]
    if _ir.HAS_AVX2:
        madd = llvm_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, v32, v32)
        wd = llvm_fn(builder, "llvm.x86.avx2.pmadd.wd", v8, v16, v16)
        offsets = [builder.call(madd, [splat(I8, 32, 32), x]) for x in xs]
    new = []
    for i, row in enumerate(blk.rows):
        factors = builder.fmul(dxv, splat_lane(builder, d, 8, i))
        acc = accs[2 * i : 2 * i + 2]
        for r in range(8):
            hb, pair = r >> 2, r & 3
            ql = load_vec(builder, row, builder.add(at, I64(64 * hb + 32 * (pair & 1))), v32)
            qh = load_vec(builder, row, builder.add(at, I64(128 + 32 * hb)), v32)
            low = builder.and_(builder.lshr(ql, splat(I8, 32, 4 * (pair >> 1))),
                               splat(I8, 32, 15))  # fmt: skip
            high = builder.and_(builder.lshr(qh, splat(I8, 32, 2 * pair)), splat(I8, 32, 3))
            codes = builder.or_(low, builder.shl(high, splat(I8, 32, 4)))
            two = load_vec(builder, row, builder.add(at, I64(192 + 2 * r)), vec_of(I8, 2))
            if _ir.HAS_AVX2:
                pairs = builder.sub(builder.call(madd, [codes, xs[r]]), offsets[r])
                scales = _widen_pair(builder, two, I16, 16)
                isums = builder.call(wd, [pairs, scales])
            else:
                signed = builder.sub(codes, splat(I8, 32, 32))
                scales = _widen_pair(builder, two, I32, 8)
                isums = builder.mul(_partial_sums(builder, signed, True, xs[r]), scales)
            sums = builder.sitofp(isums, _V8F)
            acc[r & 1] = _fmuladd8(builder, splat_lane(builder, factors, 8, r), sums, acc[r & 1])
        new += acc
    return new


def _q6_k_finish(builder: ir.IRBuilder, finals: list[Any]) -> list[Any]:
    return [_hsum(builder, builder.fadd(finals[2 * i], finals[2 * i + 1]))
            for i in range(len(finals) // 2)]  # fmt: skip


rows1_dot_q6_k = _rows_kernel(_q6_k_body, _q6_k_finish, [_ZERO8] * 2 * GROUP["q6_k"], 256,
                              GROUP["q6_k"])  # fmt: skip

"""Four weight rows at a time times one row of Q8_0 activations, each as one loop of
LLVM IR: ggml's ``ggml_vec_dot_q*_q8_0`` on x86, widened to several rows.

The per-block integer dot of :mod:`._numba_int8` returns a scalar, so every block paid
a horizontal sum of eight lanes, a scalar multiply-add and its own load of the
activation block. Here each row keeps the eight 32-bit partial sums of a block as a
float vector, scaled by ``d_w·d_x`` and added into that row's vector accumulator (the
lanes are summed once per row); the activation block, its scale and the rows' four f16
scales (one ``vcvtph2ps``) are loaded once for the four rows, and the four accumulators
are four independent chains of additions. Every block iteration also asks the cache for
the same block :data:`PREFETCH` groups of rows ahead: measured on this Zen 1 machine, a
32000×768 Q4_0 mat×vec from memory went from 3.8 to 2.6 ms (5.2 GB/s) with it, where
the hardware prefetcher alone left the core waiting.

Codes: Q4_1/Q5_1/Q4_0/Q5_0 feed AVX2's ``vpmaddubsw`` as unsigned values; the offset of
Q4_0/Q5_0 (8, 16) comes back as ``−offset·Σx``, an exact integer added to lane 0, and
the minimum of Q4_1/Q5_1 as ``m_w·d_x·Σx`` in a vector beside the accumulators. Q8_0's
signed codes go through ``vpsignb`` as in ggml. Scales are f16, converted by the CPU
(F16C) where it has the instruction, else read from the f16 → f32 table. Without AVX2
the same loop is written with portable widening vector arithmetic that LLVM lowers for
the host's SIMD (measured only on this AVX2 machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._numba_int8 import _I8, _I16, _I32, HAS_AVX2, _fn, _splat, _vec

__all__ = ["LAYOUTS", "PREFETCH", "rows4_dot_q4_0", "rows4_dot_q4_1", "rows4_dot_q5_0",
           "rows4_dot_q5_1", "rows4_dot_q8_0"]  # fmt: skip

_I64, _F32 = ir.IntType(64), ir.FloatType()
_V8F = ir.VectorType(_F32, 8)


def _host_has(feature: str) -> bool:
    try:
        return f"+{feature}" in llvm_binding.get_host_cpu_features().flatten()
    except RuntimeError:
        return False


HAS_F16C = _host_has("f16c")


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


def _data(context: Any, builder: ir.IRBuilder, aryty: Any, ary: Any) -> Any:
    return context.make_array(aryty)(context, builder, ary).data


def _load_vec(builder: ir.IRBuilder, base: Any, off: Any, ty: ir.Type) -> Any:
    return builder.load(builder.bitcast(builder.gep(base, [off]), ty.as_pointer()), align=1)


def _codes(builder: ir.IRBuilder, lay: Layout, row: Any, at: Any) -> tuple[Any, bool]:
    """The block's 32 codes as ``<32 x i8>``, and whether they are signed."""
    v32 = _vec(_I8, 32)
    if lay.int8:
        return _load_vec(builder, row, builder.add(at, _I64(lay.qs)), v32), True
    q = _load_vec(builder, row, builder.add(at, _I64(lay.qs)), _vec(_I8, 16))
    lo = builder.and_(q, _splat(_I8, 16, 15))
    hi = builder.lshr(q, _splat(_I8, 16, 4))
    codes = builder.shuffle_vector(lo, hi, ir.Constant(_vec(_I32, 32), list(range(32))))
    if lay.qh >= 0:  # byte j // 8 of qh holds bit j: spread the bytes, test one bit each
        four = _load_vec(builder, row, builder.add(at, _I64(lay.qh)), _vec(_I8, 4))
        byte_of = ir.Constant(_vec(_I32, 32), [j // 8 for j in range(32)])
        spread = builder.shuffle_vector(four, four, byte_of)
        mask = ir.Constant(v32, [1 << (j % 8) for j in range(32)])
        bit = builder.icmp_unsigned("!=", builder.and_(spread, mask), _splat(_I8, 32, 0))
        codes = builder.or_(codes, builder.shl(builder.zext(bit, v32), _splat(_I8, 32, 4)))
    if lay.offset and not HAS_AVX2:
        return builder.sub(codes, _splat(_I8, 32, lay.offset)), True
    return codes, False


def _partial_sums(builder: ir.IRBuilder, w: Any, signed: bool, x: Any) -> Any:
    """Eight i32 partial sums of Σ_j w_j·x_j (each over four neighbouring j)."""
    v32, v16, v8 = _vec(_I8, 32), _vec(_I16, 16), _vec(_I32, 8)
    if HAS_AVX2:
        if signed:  # |w| · (x with w's sign): vpmaddubsw wants its first operand unsigned
            sign = _fn(builder, "llvm.x86.avx2.psign.b", v32, v32, v32)
            w, x = builder.call(sign, [w, w]), builder.call(sign, [x, w])
        pairs = builder.call(_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, v32, v32), [w, x])
        return builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", v8, v16, v16),
                            [pairs, _splat(_I16, 16, 1)])  # fmt: skip
    wide = (builder.sext if signed else builder.zext)(w, _vec(_I32, 32))
    prod = builder.mul(wide, builder.sext(x, _vec(_I32, 32)))
    lanes = [ir.Constant(_vec(_I32, 8), [4 * k + q for k in range(8)]) for q in range(4)]
    quarters = [builder.shuffle_vector(prod, prod, lane) for lane in lanes]
    return builder.add(builder.add(quarters[0], quarters[1]), builder.add(quarters[2], quarters[3]))


def _hsum(builder: ir.IRBuilder, v: Any) -> Any:
    """The eight lanes of ``v`` added pairwise (a fixed order, as ggml's hsum)."""
    for width in (4, 2, 1):
        hi = builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, width),
                                                      list(range(width, 2 * width))))  # fmt: skip
        lo = builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, width), list(range(width))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, _I32(0))


#: groups of rows ahead that each block iteration asks the cache for
PREFETCH = 2


def _f16x(builder: ir.IRBuilder, bases: list[Any], off: Any, table: Any) -> Any:
    """The f16 at byte ``off`` of each of ``bases`` as one ``<R x float>``."""
    r = len(bases)
    bits = [builder.load(builder.bitcast(builder.gep(p, [off]), ir.IntType(16).as_pointer()),
                         align=1) for p in bases]  # fmt: skip
    if HAS_F16C:
        v = ir.Constant(ir.VectorType(ir.IntType(16), r), None)
        for i, bi in enumerate(bits):
            v = builder.insert_element(v, bi, _I32(i))
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), r)),
                             ir.VectorType(_F32, r))  # fmt: skip
    v = ir.Constant(ir.VectorType(_F32, r), None)
    for i, bi in enumerate(bits):
        v = builder.insert_element(v, builder.load(builder.gep(table, [builder.zext(bi, _I64)])),
                                   _I32(i))  # fmt: skip
    return v


def _splat_vf(builder: ir.IRBuilder, v: Any, n: int, lane: int = 0) -> Any:
    return builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, n), [lane] * n))


def _rows_dot(lay: Layout, r: int) -> Any:
    @intrinsic
    def rows_dot(typingctx: Any, rows: Any, o: Any, xr: Any, xd: Any, xs: Any, table: Any,
                 nb: Any) -> Any:  # fmt: skip
        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            stride = builder.extract_value(arr.strides, 0)
            base = builder.gep(arr.data, [builder.mul(args[1], stride)])
            row_ps = [builder.gep(base, [builder.mul(_I64(i), stride)]) for i in range(r)]
            xr_p, xd_p, xs_p, table_p = (
                _data(context, builder, sig.args[i], args[i]) for i in (2, 3, 4, 5)
            )
            n = args[6]
            fmuladd = _fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
            vr = ir.VectorType(_F32, r)
            zero = ir.Constant(_V8F, [0.0] * 8)
            entry = builder.block
            loop = builder.append_basic_block("rows_dot.loop")
            done = builder.append_basic_block("rows_dot.done")
            builder.cbranch(builder.icmp_signed(">", n, _I64(0)), loop, done)

            builder.position_at_end(loop)
            b = builder.phi(_I64)
            acc = [builder.phi(_V8F) for _ in range(r)]
            accm = builder.phi(vr)
            at = builder.mul(b, _I64(lay.block))
            x = _load_vec(builder, xr_p, builder.mul(b, _I64(32)), _vec(_I8, 32))
            dx = builder.load(builder.gep(xd_p, [b]))
            dxv = _splat_vf(builder, builder.insert_element(ir.Constant(vr, None), dx, _I32(0)), r)
            scales = builder.fmul(_f16x(builder, row_ps, at, table_p), dxv)
            xsum = builder.load(builder.gep(xs_p, [b]))
            corr = None
            if lay.offset and HAS_AVX2:
                back = builder.mul(xsum, _I32(-lay.offset))
                corr = builder.insert_element(ir.Constant(_vec(_I32, 8), [0] * 8), back, _I32(0))
            new = []
            if PREFETCH:
                pf = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), ir.IntType(8).as_pointer(),
                         _I32, _I32, _I32)  # fmt: skip
                ahead = builder.mul(_I64(r * PREFETCH), stride)
            for i in range(r):
                if PREFETCH:
                    builder.call(pf, [builder.gep(row_ps[i], [builder.add(ahead, at)]),
                                      _I32(0), _I32(3), _I32(1)])  # fmt: skip
                codes, signed = _codes(builder, lay, row_ps[i], at)
                isums = _partial_sums(builder, codes, signed, x)
                if corr is not None:
                    isums = builder.add(isums, corr)
                sums = builder.sitofp(isums, _V8F)
                new.append(builder.call(fmuladd, [_splat_vf(builder, scales, 8, i), sums, acc[i]]))
            new_m = accm
            if lay.m >= 0:
                mins = _f16x(builder, row_ps, builder.add(at, _I64(lay.m)), table_p)
                f = builder.fmul(dx, builder.sitofp(xsum, _F32))
                fv = _splat_vf(builder, builder.insert_element(ir.Constant(vr, None), f, _I32(0)),
                               r)  # fmt: skip
                new_m = builder.call(_fn(builder, f"llvm.fmuladd.v{r}f32", vr, vr, vr, vr),
                                     [mins, fv, accm])  # fmt: skip
            nxt = builder.add(b, _I64(1))
            builder.cbranch(builder.icmp_signed("<", nxt, n), loop, done)
            body_end = builder.block
            b.add_incoming(_I64(0), entry)
            b.add_incoming(nxt, body_end)
            for phi, val in zip(acc, new, strict=True):
                phi.add_incoming(zero, entry)
                phi.add_incoming(val, body_end)
            zr = ir.Constant(vr, [0.0] * r)
            accm.add_incoming(zr, entry)
            accm.add_incoming(new_m, body_end)

            builder.position_at_end(done)
            fins = []
            for val in new:
                phi = builder.phi(_V8F)
                phi.add_incoming(zero, entry)
                phi.add_incoming(val, body_end)
                fins.append(phi)
            finm = builder.phi(vr)
            finm.add_incoming(zr, entry)
            finm.add_incoming(new_m, body_end)
            outs = [_hsum(builder, phi) for phi in fins]
            res = [builder.fadd(outs[i], builder.extract_element(finm, _I32(i))) for i in range(r)]
            return context.make_tuple(builder, sig.return_type, res)

        return types.UniTuple(types.float32, r)(rows, o, xr, xd, xs, table, nb), codegen

    return rows_dot


rows4_dot_q4_0 = _rows_dot(LAYOUTS["q4_0"], 4)
rows4_dot_q8_0 = _rows_dot(LAYOUTS["q8_0"], 4)
rows4_dot_q4_1 = _rows_dot(LAYOUTS["q4_1"], 4)
rows4_dot_q5_0 = _rows_dot(LAYOUTS["q5_0"], 4)
rows4_dot_q5_1 = _rows_dot(LAYOUTS["q5_1"], 4)


def _q4_k_scales_mins(builder: ir.IRBuilder, row: Any, at: Any) -> tuple[Any, Any]:
    """The eight 6-bit scales and mins of the Q4_K block at ``at`` (ggml's
    ``get_scale_min_k4``) as two ``<8 x float>``, unpacked with byte shuffles."""
    v8 = _vec(_I8, 8)
    q = _load_vec(builder, row, builder.add(at, _I64(4)), _vec(_I8, 16))

    def pick(idx: list[int]) -> Any:
        return builder.shuffle_vector(q, q, ir.Constant(_vec(_I32, 8), idx))

    def consts(lo: int, hi: int) -> ir.Constant:
        return ir.Constant(v8, [lo] * 4 + [hi] * 4)

    def top_bits(v: Any) -> Any:  # bits 6-7 of v as bits 4-5, in the upper four lanes
        return builder.and_(builder.shl(builder.lshr(v, _splat(_I8, 8, 6)), _splat(_I8, 8, 4)),
                            consts(0, 48))  # fmt: skip

    sc = builder.or_(builder.and_(pick([0, 1, 2, 3, 8, 9, 10, 11]), consts(63, 15)),
                     top_bits(pick([0, 1, 2, 3, 0, 1, 2, 3])))  # fmt: skip
    low = builder.lshr(pick([4, 5, 6, 7, 8, 9, 10, 11]), consts(0, 4))
    mn = builder.or_(builder.and_(low, consts(63, 15)), top_bits(pick([4, 5, 6, 7, 4, 5, 6, 7])))
    return tuple(builder.uitofp(v, _V8F) for v in (sc, mn))  # type: ignore[return-value]


def _rows_dot_q4_k(r: int) -> Any:
    """``r`` Q4_K rows at a time: per 256-value block and row, eight sub-blocks of 32
    nibbles against eight Q8_0 activation blocks (each with its own scale, so each
    sub-block's sums are scaled in float), and ``dmin·Σ_s m_s·d_x·Σx`` beside them."""

    @intrinsic
    def rows_dot(typingctx: Any, rows: Any, o: Any, xr: Any, xd: Any, xs: Any, table: Any,
                 nb: Any) -> Any:  # fmt: skip
        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            stride = builder.extract_value(arr.strides, 0)
            base = builder.gep(arr.data, [builder.mul(args[1], stride)])
            row_ps = [builder.gep(base, [builder.mul(_I64(i), stride)]) for i in range(r)]
            xr_p, xd_p, xs_p, table_p = (
                _data(context, builder, sig.args[i], args[i]) for i in (2, 3, 4, 5)
            )
            n = builder.sdiv(args[6], _I64(8))  # 256-value blocks
            fmuladd = _fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
            pf = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), ir.IntType(8).as_pointer(),
                     _I32, _I32, _I32)  # fmt: skip
            ahead = builder.mul(_I64(r * PREFETCH), stride)
            zero = ir.Constant(_V8F, [0.0] * 8)
            entry = builder.block
            loop = builder.append_basic_block("rows_dot_k.loop")
            done = builder.append_basic_block("rows_dot_k.done")
            builder.cbranch(builder.icmp_signed(">", n, _I64(0)), loop, done)

            builder.position_at_end(loop)
            b = builder.phi(_I64)
            accs = [builder.phi(_V8F) for _ in range(3 * r)]  # even, odd sub-blocks; mins
            at = builder.mul(b, _I64(144))
            first = builder.mul(b, _I64(8))  # the block's first activation block
            dxv = _load_vec(builder, xd_p, first, _V8F)
            xsv = builder.sitofp(_load_vec(builder, xs_p, first, _vec(_I32, 8)), _V8F)
            dxs = builder.fmul(dxv, xsv)
            d = _f16x(builder, row_ps, at, table_p)
            dmin = _f16x(builder, row_ps, builder.add(at, _I64(2)), table_p)
            new = []
            for i in range(r):
                for off in range(0, 144, 64):
                    builder.call(pf, [builder.gep(row_ps[i], [builder.add(ahead, builder.add(
                        at, _I64(off)))]), _I32(0), _I32(3), _I32(1)])  # fmt: skip
                scales, mins = _q4_k_scales_mins(builder, row_ps[i], at)
                factors = builder.fmul(builder.fmul(scales, _splat_vf(builder, d, 8, i)), dxv)
                acc = [accs[3 * i], accs[3 * i + 1]]
                for pair in range(4):
                    q = _load_vec(builder, row_ps[i], builder.add(at, _I64(16 + 32 * pair)),
                                  _vec(_I8, 32))  # fmt: skip
                    halves = (builder.and_(q, _splat(_I8, 32, 15)),
                              builder.lshr(q, _splat(_I8, 32, 4)))  # fmt: skip
                    for h, nib in enumerate(halves):
                        s = 2 * pair + h
                        x_at = builder.mul(builder.add(first, _I64(s)), _I64(32))
                        x = _load_vec(builder, xr_p, x_at, _vec(_I8, 32))
                        sums = builder.sitofp(_partial_sums(builder, nib, False, x), _V8F)
                        acc[h] = builder.call(fmuladd, [_splat_vf(builder, factors, 8, s), sums,
                                                        acc[h]])  # fmt: skip
                mins_term = builder.fmul(mins, _splat_vf(builder, dmin, 8, i))
                new += [acc[0], acc[1], builder.call(fmuladd, [mins_term, dxs, accs[3 * i + 2]])]
            nxt = builder.add(b, _I64(1))
            builder.cbranch(builder.icmp_signed("<", nxt, n), loop, done)
            body_end = builder.block
            b.add_incoming(_I64(0), entry)
            b.add_incoming(nxt, body_end)
            for phi, val in zip(accs, new, strict=True):
                phi.add_incoming(zero, entry)
                phi.add_incoming(val, body_end)

            builder.position_at_end(done)
            fins = []
            for val in new:
                phi = builder.phi(_V8F)
                phi.add_incoming(zero, entry)
                phi.add_incoming(val, body_end)
                fins.append(phi)
            res = []
            for i in range(r):
                products = _hsum(builder, builder.fadd(fins[3 * i], fins[3 * i + 1]))
                res.append(builder.fsub(products, _hsum(builder, fins[3 * i + 2])))
            return context.make_tuple(builder, sig.return_type, res)

        return types.UniTuple(types.float32, r)(rows, o, xr, xd, xs, table, nb), codegen

    return rows_dot


rows4_dot_q4_k = _rows_dot_q4_k(4)

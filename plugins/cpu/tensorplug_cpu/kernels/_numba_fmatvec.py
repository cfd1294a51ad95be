"""Float weights (F32, F16, BF16) times a few activation rows, reading each weight once.

Through BLAS, an F16 matrix has to be widened to float32 before every product, and
numpy's conversion is slow enough that a small F16 model's generation step would be
nearly all widening, many times slower than llama.cpp's. Here each row is read in
runs of eight values, widened in registers (``vcvtph2ps`` with F16C) and multiplied into
four vector accumulators, so the product streams the weights from memory once. F32
weights take the same loop without the conversion, which reads them faster than
OpenBLAS's ``sgemv`` on one thread.

numba has no float16 type on the CPU, so the row loop is LLVM IR (:func:`_row_dot`); F16
weights arrive as their raw ``uint16`` bits. Without F16C, each half is looked up in the
f16 → f32 table. The kernels allow no fast-math: numba would hand its flags to this IR,
and LLVM then reassociated the row's tail differently in the serial and the parallel
kernel (one thread and two gave different bits).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from . import _numba_ir as _ir
from ._numba_cache import kernel
from ._numba_ir import I32, I64, carried_loop, llvm_fn
from ._numba_quant import ROW_CHUNKS, chunk_span

__all__ = ["matvec_float", "matvec_float_serial"]

_F32 = ir.FloatType()
_V8F = ir.VectorType(_F32, 8)
#: vector accumulators of a row's dot product (their additions are independent chains)
ACCUMULATORS = 4


def _eight(builder: ir.IRBuilder, ptr: Any, half: bool | str, table: Any) -> Any:
    """Eight weights from ``ptr`` as ``<8 x float>``: f16 (or ``"bf16"``) bits widened,
    or float32."""
    if half == "bf16":  # the top half of a float32
        bits = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(16), 8).as_pointer()),
                            align=2)  # fmt: skip
        wide = builder.zext(bits, ir.VectorType(I32, 8))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.VectorType(I32, 8), [16] * 8)),
                               _V8F)  # fmt: skip
    if not half:
        return builder.load(builder.bitcast(ptr, _V8F.as_pointer()), align=4)
    if _ir.HAS_F16C:
        halves = ir.VectorType(ir.HalfType(), 8)
        return builder.fpext(builder.load(builder.bitcast(ptr, halves.as_pointer()), align=2),
                             _V8F)  # fmt: skip
    v = ir.Constant(_V8F, None)
    for i in range(8):
        bits = builder.load(builder.gep(ptr, [I64(i)]), align=2)
        value = builder.load(builder.gep(table, [builder.zext(bits, I64)]))
        v = builder.insert_element(v, value, I32(i))
    return v


def _one(builder: ir.IRBuilder, ptr: Any, half: bool | str, table: Any) -> Any:
    """One weight from ``ptr`` as a float."""
    if not half:
        return builder.load(ptr)
    bits = builder.load(ptr, align=2)
    if half == "bf16":
        return builder.bitcast(builder.shl(builder.zext(bits, I32), I32(16)), _F32)
    if _ir.HAS_F16C:
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), _F32)
    return builder.load(builder.gep(table, [builder.zext(bits, I64)]))


@intrinsic
def _row_dot(typingctx: Any, w: Any, o: Any, x: Any, t: Any, table: Any) -> Any:
    """``Σ_i w[o, i]·x[t, i]`` in float32, ``w`` float32, raw f16 (``uint16``) or raw
    bf16 (``int16``: the dtype tells them apart) with unit-stride rows, ``x`` float32
    likewise: runs of 32 values into four vector sums, then runs of eight into the
    first, then one by one; the lanes summed pairwise."""
    half: bool | str = "bf16" if w.dtype == types.int16 else w.dtype == types.uint16

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        wa = context.make_array(sig.args[0])(context, builder, args[0])
        xa = context.make_array(sig.args[2])(context, builder, args[2])
        tab = context.make_array(sig.args[4])(context, builder, args[4]).data
        elem = ir.IntType(16) if half else _F32  # (bf16: "bf16", also 16 bits)
        w_row = builder.bitcast(builder.gep(builder.bitcast(wa.data, ir.IntType(8).as_pointer()),
                                            [builder.mul(args[1], builder.extract_value(
                                                wa.strides, 0))]), elem.as_pointer())  # fmt: skip
        x_row = builder.bitcast(builder.gep(builder.bitcast(xa.data, ir.IntType(8).as_pointer()),
                                            [builder.mul(args[3], builder.extract_value(
                                                xa.strides, 0))]), _F32.as_pointer())  # fmt: skip
        n = builder.extract_value(wa.shape, 1)
        fma = llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
        zero = ir.Constant(_V8F, [0.0] * 8)

        def loop(name: str, start: Any, end: Any, step: int, accs: list[Any], emit: Any) -> Any:
            return carried_loop(builder, name, start, end, step, accs, emit)

        def runs(count: int) -> Any:
            def emit(i: Any, accs: list[Any]) -> list[Any]:
                return [builder.call(fma, [
                    _eight(builder, builder.gep(w_row, [builder.add(i, I64(8 * j))]), half, tab),
                    builder.load(builder.bitcast(builder.gep(x_row, [builder.add(i, I64(8 * j))]),
                                                 _V8F.as_pointer()), align=4),
                    accs[j]]) for j in range(count)]  # fmt: skip

            return emit

        wide = ACCUMULATORS * 8
        n_wide = builder.mul(builder.sdiv(n, I64(wide)), I64(wide))
        n_eight = builder.mul(builder.sdiv(n, I64(8)), I64(8))
        accs = loop("wide", I64(0), n_wide, wide, [zero] * ACCUMULATORS, runs(ACCUMULATORS))
        (first,) = loop("eight", n_wide, n_eight, 8, [accs[0]], runs(1))
        total = builder.fadd(builder.fadd(first, accs[1]), builder.fadd(accs[2], accs[3]))

        def single(i: Any, acc: list[Any]) -> list[Any]:
            wv = _one(builder, builder.gep(w_row, [i]), half, tab)
            return [builder.fadd(acc[0], builder.fmul(wv, builder.load(builder.gep(x_row, [i]))))]

        (rest,) = loop("one", n_eight, n, 1, [ir.Constant(_F32, 0.0)], single)
        for width in (4, 2, 1):  # the lanes, pairwise
            hi = builder.shuffle_vector(
                total, total, ir.Constant(ir.VectorType(I32, width), list(range(width, 2 * width)))
            )
            lo = builder.shuffle_vector(total, total, ir.Constant(ir.VectorType(I32, width),
                                                                  list(range(width))))  # fmt: skip
            total = builder.fadd(lo, hi)
        return builder.fadd(builder.extract_element(total, I32(0)), rest)

    return types.float32(w, o, x, t, table), codegen


@kernel(parallel=True)  # no fast-math: the IR's order is the order (same bits at any -t)
def matvec_float(w: Any, x: Any, out: Any, table: Any) -> None:
    """``out[t, o] = Σ_i w[o, i]·x[t, i]`` for float32, raw f16 (``uint16``) or raw bf16
    (``int16``) ``w`` (``(n_out, n)``, unit-stride rows), the output rows shared out in
    chunks across threads."""
    n = w.shape[0]
    for c in prange(ROW_CHUNKS):
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                out[t, o] = _row_dot(w, o, x, t, table)  # type: ignore[call-arg]


@kernel(nogil=True)
def matvec_float_serial(w: Any, x: Any, out: Any, table: Any) -> None:
    """:func:`matvec_float` on the calling thread, without a parallel region."""
    for o in range(w.shape[0]):
        for t in range(x.shape[0]):
            out[t, o] = _row_dot(w, o, x, t, table)  # type: ignore[call-arg]

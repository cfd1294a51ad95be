"""LLVM IR building blocks shared by the numba kernels that write their loops as IR.

numba has no vector types, no float16 and no way to ask for one instruction, so the
kernels that need them (:mod:`._numba_introw`, :mod:`._numba_repack`,
:mod:`._numba_fmatvec`, :mod:`._numba_decode`, :mod:`._numba_kint8`) emit LLVM IR
through numba ``intrinsic`` s. What they all use is here: integer and vector types,
constant and run-time splats, declarations of LLVM intrinsics, array data pointers and
unaligned vector loads, f16 scales as float vectors, the integer dot of 32 bytes, and
:func:`carried_loop`, the loop whose accumulators live in phi nodes.

The instruction forms follow numba's compile target (the host, or what
``NUMBA_CPU_FEATURES`` names: :func:`..system.llvm_features`): ``HAS_AVX2``,
``HAS_F16C``, ``HAS_VNNI``, ``HAS_32_REGS`` and ``ON_ZEN`` are read when a kernel is compiled (never
when this module is imported), so a test may set them, in a fresh process and before
anything is compiled, to build another host's form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..system import kernel_features

#: LLVM's integer types the kernels' IR is written in
I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()


_HOST = kernel_features()
#: the instruction forms the kernels compile to, from the plugin's one feature probe
#: (decided once per process; numba's disk cache keys compiled code by the host CPU)
HAS_AVX2, HAS_F16C, HAS_VNNI = _HOST.avx2, _HOST.f16c, _HOST.vnni
#: 32 vector registers, which wide tiles of repacked products need (:mod:`._numba_repack`)
HAS_32_REGS = _HOST.regs32
#: the target is an AMD Zen core: tile heights tuned per core (:mod:`._numba_repack`)
ON_ZEN = _HOST.zen


def vec_of(ty: ir.IntType, n: int) -> ir.VectorType:
    """The type ``<n x ty>``."""
    return ir.VectorType(ty, n)


def splat(ty: ir.IntType, n: int, v: int) -> ir.Constant:
    """The constant ``<n x ty>`` of ``v`` in every lane."""
    return ir.Constant(vec_of(ty, n), [v] * n)


#: C's ``void *``
VOID_PTR = ir.IntType(8).as_pointer()


def declare(module: ir.Module, fnty: ir.FunctionType, name: str) -> ir.Function:
    """The function ``name`` of ``module``, declared with ``fnty`` where it is not yet
    (llvmlite's public IR API: numba's own helper for this is not its promise)."""
    found = module.globals.get(name)
    return found if isinstance(found, ir.Function) else ir.Function(module, fnty, name)


def llvm_fn(builder: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Type) -> ir.Function:
    """The function (an LLVM intrinsic, mostly) ``name`` returning ``ret`` from ``args``,
    declared in the module being built."""
    return declare(builder.module, ir.FunctionType(ret, args), name)


def prefetch_lines(builder: ir.IRBuilder, at: Any, nbytes: int) -> None:
    """Asks the cache (into L1, for reading) for each 64-byte line of ``nbytes`` from the
    ``i8*`` ``at``: the kernels' software prefetch, which changes no value."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    hint = llvm_fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), i8p, i32, i32, i32)
    for offset in range(0, nbytes, 64):
        where = builder.gep(at, [ir.Constant(ir.IntType(64), offset)])
        builder.call(hint, [where, i32(0), i32(3), i32(1)])  # read, keep close, data


#: the stack alignment a function holding a tile asks for in its prologue (a zmm's width)
STACK_ALIGN = 64


def align_stack(builder: ir.IRBuilder) -> None:
    """Has the function being built align its stack pointer to :data:`STACK_ALIGN` on
    entry (LLVM's ``alignstack``), so that no vector it spills straddles two cache lines.

    The x86-64 ABI promises 16 bytes, and LLVM spills a 256- or 512-bit register to a
    slot that far aligned with an unaligned move: where a slot lies on a line boundary
    depends on the stack pointer the function was entered with, which differs between
    threads. A repacked Q5_K tile of eight activation rows spills a dozen vectors a
    block; in a two-thread 128-row product (TBB) a worker thread can enter with its
    stack 32 bytes off the caller's and stall on the store and reload of one slot that
    straddles a line (``perf`` puts a large share of its samples on the few
    instructions after that one store, none in the caller), so the caller waits and two
    threads fall well short of twice one thread's speed; aligned, they reach it, and a
    Q5_K model's prompt runs faster. It costs a frame pointer and an ``and`` a call.
    (llvmlite writes a function's attributes only where it has a named one: ``nounwind``,
    true of every kernel, which returns errors rather than unwinding.)"""
    attrs = builder.function.attributes
    attrs.alignstack = max(attrs.alignstack, STACK_ALIGN)
    attrs.add("nounwind")


def carried_loop(
    builder: ir.IRBuilder,
    name: str,
    start: Any,
    end: Any,
    step: int,
    values: list[Any],
    emit: Callable[[Any, list[Any]], list[Any]],
) -> list[Any]:
    """``for i in range(start, end, step): values = emit(i, values)`` as LLVM IR (``i``
    an ``i64``), the values carried from one iteration to the next in phi nodes; returns
    their final values, ``values`` as given when the range is empty. The builder is left
    after the loop."""
    i64 = ir.IntType(64)
    before = builder.block
    body = builder.append_basic_block(f"{name}.body")
    after = builder.append_basic_block(f"{name}.after")
    builder.cbranch(builder.icmp_signed("<", start, end), body, after)
    builder.position_at_end(body)
    i = builder.phi(i64)
    phis = [builder.phi(v.type) for v in values]
    new = emit(i, phis)
    nxt = builder.add(i, ir.Constant(i64, step))
    builder.cbranch(builder.icmp_signed("<", nxt, end), body, after)
    last = builder.block
    i.add_incoming(start, before)
    i.add_incoming(nxt, last)
    for phi, v, n in zip(phis, values, new, strict=True):
        phi.add_incoming(v, before)
        phi.add_incoming(n, last)
    builder.position_at_end(after)
    finals = []
    for v, n in zip(values, new, strict=True):
        final = builder.phi(v.type)
        final.add_incoming(v, before)
        final.add_incoming(n, last)
        finals.append(final)
    return finals


def array_data(context: Any, builder: ir.IRBuilder, aryty: Any, ary: Any) -> Any:
    """The data pointer of array ``ary`` (numba type ``aryty``)."""
    return context.make_array(aryty)(context, builder, ary).data


def load_array(builder: ir.IRBuilder, context: Any, aryty: Any, ary: Any, off: Any, n: int) -> Any:
    """``n`` bytes of array ``ary`` from element ``off``, as an ``<n x i8>`` vector."""
    data = context.make_array(aryty)(context, builder, ary).data
    ptr = builder.bitcast(builder.gep(data, [off]), vec_of(I8, n).as_pointer())
    return builder.load(ptr, align=1)


def load_vec(builder: ir.IRBuilder, base: Any, off: Any, ty: ir.Type) -> Any:
    """A ``ty`` from element ``off`` of pointer ``base``, unaligned."""
    return builder.load(builder.bitcast(builder.gep(base, [off]), ty.as_pointer()), align=1)


def splat_lane(builder: ir.IRBuilder, v: Any, n: int, lane: int = 0) -> Any:
    """Lane ``lane`` of vector ``v`` in all ``n`` lanes."""
    return builder.shuffle_vector(v, v, ir.Constant(vec_of(I32, n), [lane] * n))


def splat_scalar(builder: ir.IRBuilder, v: Any, n: int) -> Any:
    """Scalar ``v`` in all ``n`` lanes."""
    first = builder.insert_element(ir.Constant(ir.VectorType(v.type, n), None), v, I32(0))
    return splat_lane(builder, first, n)


def runtime_splat(builder: ir.IRBuilder, value: Any, n: int) -> Any:
    """An ``<n x i8>`` vector of a runtime integer (a shift amount)."""
    return splat_scalar(builder, builder.trunc(value, I8), n)


def f16x(builder: ir.IRBuilder, bases: list[Any], off: Any, table: Any) -> Any:
    """The f16 at byte ``off`` of each of ``bases`` as one ``<R x float>``: converted by
    the CPU (F16C) where it can, else looked up in the f16 → f32 ``table``."""
    r = len(bases)
    bits = [builder.load(builder.bitcast(builder.gep(p, [off]), ir.IntType(16).as_pointer()),
                         align=1) for p in bases]  # fmt: skip
    if HAS_F16C:
        v = ir.Constant(ir.VectorType(ir.IntType(16), r), None)
        for i, bi in enumerate(bits):
            v = builder.insert_element(v, bi, I32(i))
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), r)),
                             ir.VectorType(_F32, r))  # fmt: skip
    v = ir.Constant(ir.VectorType(_F32, r), None)
    for i, bi in enumerate(bits):
        v = builder.insert_element(v, builder.load(builder.gep(table, [builder.zext(bi, I64)])),
                                   I32(i))  # fmt: skip
    return v


def dot_i8(builder: ir.IRBuilder, u: Any, s: Any) -> Any:
    """Σ u_j·s_j over 32 lanes, ``u`` unsigned (< 128 on the portable path), ``s`` signed."""
    if HAS_AVX2:
        v32, v16, v8 = vec_of(I8, 32), vec_of(I16, 16), vec_of(I32, 8)
        pairs = builder.call(llvm_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, v32, v32), [u, s])
        quads = builder.call(
            llvm_fn(builder, "llvm.x86.avx2.pmadd.wd", v8, v16, v16), [pairs, splat(I16, 16, 1)]
        )
        return builder.call(llvm_fn(builder, "llvm.vector.reduce.add.v8i32", I32, v8), [quads])
    wide = builder.mul(builder.zext(u, vec_of(I16, 32)), builder.sext(s, vec_of(I16, 32)))
    total = builder.sext(wide, vec_of(I32, 32))
    return builder.call(
        llvm_fn(builder, "llvm.vector.reduce.add.v32i32", I32, vec_of(I32, 32)), [total]
    )


@intrinsic
def f32_bits(typingctx: Any, f: Any) -> Any:
    """The bits of float32 ``f`` as an int32 (a bit cast: no array, no allocation)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.bitcast(args[0], I32)

    return types.int32(types.float32), codegen


@intrinsic
def f32_from_bits(typingctx: Any, bits: Any) -> Any:
    """The float32 whose bits are the int32 ``bits``."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def _fma_f32(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """``llvm.fma.f32`` (see :func:`fmaf`)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        f32 = ir.FloatType()
        return builder.call(llvm_fn(builder, "llvm.fma.f32", f32, f32, f32, f32), list(args))

    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(inline="always")
def fmaf(a: Any, b: Any, c: Any) -> Any:
    """``a·b + c`` for float32 operands, rounded once (``llvm.fma.f32``: one ``vfmadd``
    where the CPU has FMA, libm's exact ``fmaf`` where not), as ggml's SIMD code and
    GCC's contracted expressions compute; a loop of them still vectorizes."""
    return _fma_f32(a, b, c)  # type: ignore[call-arg]  # numba supplies typingctx


@intrinsic
def f16_widened(typingctx: Any, bits: Any) -> Any:
    """The f16 whose bits are the uint16 ``bits`` as float32: a ``bitcast`` to half then
    ``fpext``, one ``vcvtph2ps`` with F16C (a loop of them vectorizes, where a lookup in
    the f16 table is a gather). Exact, so the same value as the table's. Only where
    :data:`HAS_F16C`, as :func:`f16_rounded`."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def f16_rounded(typingctx: Any, f: Any) -> Any:
    """float32 ``f`` rounded to f16 (to nearest even) and back: ``fptrunc`` to half then
    ``fpext``, one ``vcvtps2ph``/``vcvtph2ps`` pair with F16C, as ggml's
    ``GGML_CPU_FP32_TO_FP16`` rounds (a loop of them vectorizes). Only where
    :data:`HAS_F16C`: without it LLVM would call a runtime function numba does not link."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.float32), codegen

"""Integer dot products for the 32-block weight types, as ggml computes them.

ggml multiplies a quantized matrix by a vector by quantizing the vector too — 32-value
blocks of int8 with an f16 scale (Q8_0, "the vec_dot type") — and summing products of
8-bit integers per block, scaling once per block. That reads the weights as bytes and
does 32 multiply-adds in two instructions on AVX2 (``vpmaddubsw`` then ``vpmaddwd``),
where decoding to float32 first costs a conversion and a float FMA per weight: on one
core of the 2-core dev machine, a 4096×4096 Q4_0 product took 5.5 ms through float32
and 1.8 ms this way.

The per-block integer dot is a numba ``intrinsic`` emitting LLVM vector IR: AVX2's
``pmaddubsw``/``pmaddwd`` where the host has AVX2, a portable widening multiply and
vector reduction elsewhere (LLVM lowers it for the host's own SIMD). It reads one row
of blocks through the row's data pointer, so rows must hold their blocks contiguously
(the caller checks; other layouts take the float32 kernels).

Numbers: the activations are rounded as ggml's x86 path rounds them (``d = amax/127``
stored as f16, ``q = round-half-even(x · 127/amax)``), so results follow llama.cpp's
rather than the exact float32 product — within ~1e-3 relative, and the same rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._numba_cache import kernel
from ._numba_quant import _f16

_CHUNKS = 64
_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


def _host_has_avx2() -> bool:
    try:
        return "+avx2" in llvm_binding.get_host_cpu_features().flatten()
    except RuntimeError:  # features unknown on this host: take the portable IR
        return False


#: decided once per process; numba's disk cache keys compiled code by the host CPU
HAS_AVX2 = _host_has_avx2()


def _vec(ty: ir.IntType, n: int) -> ir.VectorType:
    return ir.VectorType(ty, n)


def _splat(ty: ir.IntType, n: int, v: int) -> ir.Constant:
    return ir.Constant(_vec(ty, n), [v] * n)


def _fn(builder: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Type) -> ir.Function:
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


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


def _load(builder: ir.IRBuilder, context: Any, aryty: Any, ary: Any, off: Any, n: int) -> Any:
    """``n`` bytes of array ``ary`` from element ``off``, as an ``<n x i8>`` vector."""
    data = context.make_array(aryty)(context, builder, ary).data
    ptr = builder.bitcast(builder.gep(data, [off]), _vec(_I8, n).as_pointer())
    return builder.load(ptr, align=1)


def _dot_i8(builder: ir.IRBuilder, u: Any, s: Any) -> Any:
    """Σ u_j·s_j over 32 lanes, ``u`` unsigned (< 128 on the portable path), ``s`` signed."""
    if HAS_AVX2:
        v32, v16, v8 = _vec(_I8, 32), _vec(_I16, 16), _vec(_I32, 8)
        pairs = builder.call(_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, v32, v32), [u, s])
        quads = builder.call(
            _fn(builder, "llvm.x86.avx2.pmadd.wd", v8, v16, v16), [pairs, _splat(_I16, 16, 1)]
        )
        return builder.call(_fn(builder, "llvm.vector.reduce.add.v8i32", _I32, v8), [quads])
    wide = builder.mul(builder.zext(u, _vec(_I16, 32)), builder.sext(s, _vec(_I16, 32)))
    total = builder.sext(wide, _vec(_I32, 32))
    return builder.call(
        _fn(builder, "llvm.vector.reduce.add.v32i32", _I32, _vec(_I32, 32)), [total]
    )


@intrinsic
def _dot_q4(typingctx: Any, w: Any, wo: Any, x: Any, xo: Any) -> Any:
    """Σ_j nibble_j · x_j over one block: ``w[wo:wo+16]`` packs 32 nibbles (low halves are
    elements 0-15), ``x[xo:xo+32]`` int8. The -8 offset is the caller's (Σx per block)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        q = _load(builder, context, sig.args[0], args[0], args[1], 16)
        lo = builder.and_(q, _splat(_I8, 16, 15))
        hi = builder.lshr(q, _splat(_I8, 16, 4))
        order = ir.Constant(_vec(_I32, 32), list(range(32)))
        nibbles = builder.shuffle_vector(lo, hi, order)
        return _dot_i8(builder, nibbles, _load(builder, context, sig.args[2], args[2], args[3], 32))

    return types.int32(w, wo, x, xo), codegen


@intrinsic
def _dot_q5(typingctx: Any, w: Any, wo: Any, x: Any, xo: Any) -> Any:
    """Σ_j (nibble_j | bit_j << 4) · x_j over one Q5 block whose ``qh`` (a little-endian
    u32 of fifth bits) starts at ``w[wo]`` and whose 16 nibble bytes follow it."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        # byte j // 8 of qh holds bit j: spread each byte over 8 lanes, test one bit each
        four = _load(builder, context, sig.args[0], args[0], args[1], 4)
        order = ir.Constant(_vec(_I32, 32), [j // 8 for j in range(32)])
        spread = builder.shuffle_vector(four, four, order)
        mask = ir.Constant(_vec(_I8, 32), [1 << (j % 8) for j in range(32)])
        set_ = builder.icmp_unsigned("!=", builder.and_(spread, mask), _splat(_I8, 32, 0))
        high = builder.shl(builder.zext(set_, _vec(_I8, 32)), _splat(_I8, 32, 4))
        qs_at = builder.add(args[1], ir.Constant(args[1].type, 4))
        q = _load(builder, context, sig.args[0], args[0], qs_at, 16)
        lo = builder.and_(q, _splat(_I8, 16, 15))
        hi = builder.lshr(q, _splat(_I8, 16, 4))
        nibbles = builder.shuffle_vector(lo, hi, ir.Constant(_vec(_I32, 32), list(range(32))))
        codes = builder.or_(nibbles, high)
        return _dot_i8(builder, codes, _load(builder, context, sig.args[2], args[2], args[3], 32))

    return types.int32(w, wo, x, xo), codegen


@intrinsic
def f32_bits(typingctx: Any, f: Any) -> Any:
    """The bits of float32 ``f`` as an int32 (a bit cast: no array, no allocation)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.bitcast(args[0], _I32)

    return types.int32(types.float32), codegen


@intrinsic
def f32_from_bits(typingctx: Any, bits: Any) -> Any:
    """The float32 whose bits are the int32 ``bits``."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


# the mat×vec kernels (fast-math) call these two, which must round as ggml: kernel()'s
# fastmath=False keeps numba from handing them the callers' flags
@kernel()
def _f32_to_f16_bits(f: Any) -> Any:
    """IEEE f16 bits of ``f`` rounded to nearest even (``GGML_FP32_TO_FP16``)."""
    a = np.int64(f32_bits(np.float32(f))) & 0xFFFFFFFF  # type: ignore[call-arg]
    sign = (a >> 16) & 0x8000
    a &= 0x7FFFFFFF
    if a >= 0x47800000:  # >= 65520 rounds to inf; NaN stays NaN
        r = 0x7E00 if a > 0x7F800000 else 0x7C00
    elif a < 0x38800000:  # subnormal f16: let float addition round
        shifted = f32_from_bits(np.int32(a)) + np.float32(0.5)  # type: ignore[call-arg]
        r = np.int64(f32_bits(shifted)) - 0x3F000000  # type: ignore[call-arg]
    else:
        r = (a + 0xC8000FFF + ((a >> 13) & 1)) >> 13
    return (r | sign) & 0xFFFF


@kernel()  # see _f32_to_f16_bits
def quantize_q8_0(x: Any, xq: Any, xd: Any, xs: Any, table: Any) -> None:
    """Rows of ``x`` (T, n) float32 as ggml's Q8_0: int8 ``xq`` (T, n), the f16-rounded
    scales ``xd`` (T, n/32) and each block's sum of codes ``xs`` (T, n/32)."""
    for t in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            amax = np.float32(0)
            for j in range(32):
                amax = max(amax, abs(x[t, 32 * b + j]))
            inv = np.float32(127) / amax if amax != 0 else np.float32(0)
            total = 0
            for j in range(32):
                q = np.int32(np.rint(x[t, 32 * b + j] * inv))
                xq[t, 32 * b + j] = q
                total += q
            xs[t, b] = total
            xd[t, b] = table[_f32_to_f16_bits(amax / np.float32(127))]


# -- one row of weights times one row of quantized activations, per type --------------------
# (the driver, for every type, is :func:`._numba_kint8.matvec_int8`)


@njit(inline="always")
def row_q4_0(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_w·d_x·(Σ_j nibble·x − 8·Σx)`` over a row of 18-byte blocks."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q4(row, 18 * b + 2, xr, 32 * b) - 8 * xs[b]  # type: ignore[call-arg]
        total += _f16(row, 18 * b, table) * xd[b] * np.float32(isum)
    return total


@njit(inline="always")
def row_q4_1(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_x·(d_w·Σ_j nibble·x + m_w·Σx)`` over a row of 20-byte blocks."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q4(row, 20 * b + 4, xr, 32 * b)  # type: ignore[call-arg]
        dm = _f16(row, 20 * b, table) * np.float32(isum)
        total += xd[b] * (dm + _f16(row, 20 * b + 2, table) * np.float32(xs[b]))
    return total


@njit(inline="always")
def row_q5_0(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_w·d_x·(Σ_j q5·x − 16·Σx)`` over a row of 22-byte blocks."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q5(row, 22 * b + 2, xr, 32 * b) - 16 * xs[b]  # type: ignore[call-arg]
        total += _f16(row, 22 * b, table) * xd[b] * np.float32(isum)
    return total


@njit(inline="always")
def row_q5_1(row: Any, xr: Any, xd: Any, xs: Any, table: Any) -> Any:
    """``Σ_b d_x·(d_w·Σ_j q5·x + m_w·Σx)`` over a row of 24-byte blocks."""
    total = np.float32(0)
    for b in range(xd.size):
        isum: int = _dot_q5(row, 24 * b + 4, xr, 32 * b)  # type: ignore[call-arg]
        dm = _f16(row, 24 * b, table) * np.float32(isum)
        total += xd[b] * (dm + _f16(row, 24 * b + 2, table) * np.float32(xs[b]))
    return total

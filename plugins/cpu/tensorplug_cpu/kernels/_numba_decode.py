"""Decoding whole rows of Q4_0, Q4_1, Q8_0 and Q4_K blocks to float32, as vectors.

A prompt multiplies quantized weights by decoding them a chunk at a time and calling
BLAS (:mod:`.matmul`). numba's scalar decoding loop (:mod:`._numba_quant`) is not
vectorized by LLVM (a block's 16 nibble bytes become 32 floats in two halves) and
cost 0.5 ns a weight: 29 ms of a 100M Q4_0 model's 206 ms 128-token prompt on one
core of the dev machine. Here each block is one load of its codes, integer unpacking,
one conversion and one multiply by its scale, as ``<16 x float>`` or ``<32 x float>``
vectors (AVX2: ``vpmovzxbd``, ``vcvtdq2ps``, ``vmulps``); a Q4_K sub-block of 32
nibbles likewise, its scale and minimum unpacked in scalar code.

The arithmetic is the scalar kernels' (``d·(q − 8)``, ``d·q + m``, ``d·q``,
``(d·sc)·q − dmin·m``: exact integers converted, then float32 multiplies, additions and
subtractions, nothing fused), so the weights are bit-identical to
:mod:`tensorplug.quants` and ggml.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ._numba_cache import kernel
from ._numba_int8 import _I8, _I32, _splat, _vec
from ._numba_introw import _data, _load_vec, _splat_scalar
from ._numba_kquant import _scale_min_k4

__all__ = ["dequantize_q4_k_rows", "dequantize_rows32"]

_F32 = ir.FloatType()


def _store_scaled(
    builder: ir.IRBuilder, codes: Any, d: Any, dst: Any, at: Any, m: Any = None
) -> None:
    """``dst[at:at+n] = d·codes`` (``+ m`` if given) for ``<n x i32>`` codes."""
    n = codes.type.count
    vf = ir.VectorType(_F32, n)
    values = builder.fmul(builder.sitofp(codes, vf), _splat_scalar(builder, d, n))
    if m is not None:  # only then: adding 0 would turn a −0 into +0
        values = builder.fadd(values, _splat_scalar(builder, m, n))
    builder.store(values, builder.bitcast(builder.gep(dst, [at]), vf.as_pointer()), align=4)


def _nibble_codegen(offset: int, with_min: bool) -> Any:
    """The body of a 16-byte nibble block's decoder: ``d·(q − offset)`` (``+ m``)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        s, t = (_data(context, builder, sig.args[i], args[i]) for i in (0, 2))
        q = _load_vec(builder, s, args[1], _vec(_I8, 16))
        for half, nibbles in ((0, builder.and_(q, _splat(_I8, 16, 15))),
                              (16, builder.lshr(q, _splat(_I8, 16, 4)))):  # fmt: skip
            codes = builder.sub(builder.zext(nibbles, _vec(_I32, 16)), _splat(_I32, 16, offset))
            at = builder.add(args[3], ir.Constant(ir.IntType(64), half))
            _store_scaled(builder, codes, args[4], t, at, args[5] if with_min else None)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _q4_0_block(typingctx: Any, src: Any, at: Any, dst: Any, o: Any, d: Any) -> Any:
    """``dst[o:o+32] = d·(q − 8)`` for the 16 nibble bytes at ``src[at:at+16]``: low
    nibbles are values 0-15, high nibbles 16-31."""
    return types.void(src, types.int64, dst, types.int64, types.float32), _nibble_codegen(
        8, False)  # fmt: skip


@intrinsic
def _q4_1_block(typingctx: Any, src: Any, at: Any, dst: Any, o: Any, d: Any, m: Any) -> Any:
    """``dst[o:o+32] = d·q + m`` for the 16 nibble bytes at ``src[at:at+16]``."""
    sig = types.void(src, types.int64, dst, types.int64, types.float32, types.float32)
    return sig, _nibble_codegen(0, True)


@intrinsic
def _q8_0_block(typingctx: Any, src: Any, at: Any, dst: Any, o: Any, d: Any) -> Any:
    """``dst[o:o+32] = d·q`` for the 32 int8 codes at ``src[at:at+32]``."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        s, t = (_data(context, builder, sig.args[i], args[i]) for i in (0, 2))
        q = _load_vec(builder, s, args[1], _vec(_I8, 32))
        _store_scaled(builder, builder.sext(q, _vec(_I32, 32)), args[4], t, args[3])
        return context.get_dummy_value()

    return types.void(src, types.int64, dst, types.int64, types.float32), codegen


@intrinsic
def _nibbles32(typingctx: Any, src: Any, at: Any, shift: Any, dst: Any, o: Any, d: Any,
               m: Any) -> Any:  # fmt: skip
    """``dst[o:o+32] = d·q − m`` for ``q = (src[at:at+32] >> shift) & 15``."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        s, t = (_data(context, builder, sig.args[i], args[i]) for i in (0, 3))
        q = _load_vec(builder, s, args[1], _vec(_I8, 32))
        by = _splat_scalar(builder, builder.trunc(args[2], _I8), 32)
        nibbles = builder.and_(builder.lshr(q, by), _splat(_I8, 32, 15))
        vf = ir.VectorType(_F32, 32)
        scaled = builder.fmul(_splat_scalar(builder, args[5], 32), builder.uitofp(nibbles, vf))
        values = builder.fsub(scaled, _splat_scalar(builder, args[6], 32))
        where = builder.bitcast(builder.gep(t, [args[4]]), vf.as_pointer())
        builder.store(values, where, align=4)
        return context.get_dummy_value()

    sig = types.void(src, types.int64, types.int64, dst, types.int64, types.float32,
                     types.float32)  # fmt: skip
    return sig, codegen


@njit(inline="always")
def _scale(row: Any, at: int, table: Any) -> Any:
    return table[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)]


# ggml type ids (tensorplug.types.Type values) of the 32-value blocks decoded here
Q4_0, Q4_1, Q8_0 = 2, 3, 8


@kernel(nogil=True)
def dequantize_rows32(rows: Any, out: Any, table: Any, kind: int) -> None:
    """Byte rows of Q4_0, Q4_1 or Q8_0 blocks (ggml type id ``kind``) ``(n, nblocks·size)``
    into float32 ``out (n, nblocks·32)`` (both C-contiguous)."""
    size = 18 if kind == Q4_0 else 20 if kind == Q4_1 else 34
    for r in range(rows.shape[0]):
        src, dst = rows[r], out[r]
        for b in range(dst.size // 32):
            at, o = size * b, 32 * b
            d = _scale(src, at, table)
            if kind == Q4_0:
                _q4_0_block(src, at + 2, dst, o, d)  # type: ignore[call-arg]
            elif kind == Q4_1:
                _q4_1_block(src, at + 4, dst, o, d, _scale(src, at + 2, table))  # type: ignore[call-arg]
            else:
                _q8_0_block(src, at + 2, dst, o, d)  # type: ignore[call-arg]


@kernel(nogil=True)
def dequantize_q4_k_rows(rows: Any, out: Any, table: Any) -> None:
    """Byte rows of Q4_K blocks ``(n, nblocks·144)`` into float32 ``out (n, nblocks·256)``
    (both C-contiguous): sub-block ``s`` is the low (even ``s``) or high nibbles of the
    32 bytes at ``16 + 32·(s // 2)``, times ``d·sc_s``, minus ``dmin·m_s``."""
    for r in range(rows.shape[0]):
        src, dst = rows[r], out[r]
        for b in range(dst.size // 256):
            blk = src[144 * b : 144 * (b + 1)]
            d, dmin = _scale(blk, 0, table), _scale(blk, 2, table)
            for s in range(8):
                sc, mn = _scale_min_k4(blk, s)
                d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
                _nibbles32(blk, 16 + 32 * (s >> 1), 4 * (s & 1), dst, 256 * b + 32 * s,
                           d1, m1)  # type: ignore[call-arg]  # fmt: skip

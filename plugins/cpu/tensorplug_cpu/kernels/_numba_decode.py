"""Decoding whole rows of quantized blocks to float32, as vectors: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q4_K, Q5_K and Q6_K.

A prompt multiplies quantized weights by decoding them a chunk at a time and calling BLAS
(:mod:`.matmul`). numba's scalar decoding loop (:mod:`._numba_quant`) is not vectorized
by LLVM (a block's 16 nibble bytes become 32 floats in two halves), and its decoding is a
large share of a small Q4_0 model's prompt. Here each block is one load of its codes,
integer unpacking, one conversion and one multiply by its scale, as ``<16 x float>`` or
``<32 x float>`` vectors (AVX2: ``vpmovzxbd``, ``vcvtdq2ps``, ``vmulps``); a K-quant
sub-block (32 or 16 values) likewise, its scale and minimum unpacked in scalar code. Q5_0
and Q6_K are here too: a Q4_K_M model has most of its layers Q5_0, its ``attn_v`` and
half its ``ffn_down`` Q6_K, and through the scalar loops its Q6_K products take more than
twice as long as its Q4_K ones of the same shape.

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
from ._numba_introw import LAYOUTS, Layout, block_codes
from ._numba_ir import I8, I32, array_data, load_vec, runtime_splat, splat, splat_scalar, vec_of
from ._numba_kquant import scale_min_k4
from ._numba_quant import as_int8
from .job_blocks import TYPES32

__all__ = ["dequantize_q4_k_rows", "dequantize_q5_k_rows", "dequantize_q6_k_rows",
           "dequantize_rows32"]  # fmt: skip

_F32 = ir.FloatType()


def _store_scaled(
    builder: ir.IRBuilder, codes: Any, d: Any, dst: Any, at: Any, m: Any = None
) -> None:
    """``dst[at:at+n] = d·codes`` (``+ m`` if given) for ``<n x i32>`` codes."""
    n = codes.type.count
    vf = ir.VectorType(_F32, n)
    values = builder.fmul(builder.sitofp(codes, vf), splat_scalar(builder, d, n))
    if m is not None:  # only then: adding 0 would turn a −0 into +0
        values = builder.fadd(values, splat_scalar(builder, m, n))
    builder.store(values, builder.bitcast(builder.gep(dst, [at]), vf.as_pointer()), align=4)


def _block32_codegen(lay: Layout) -> Any:
    """The body of a 32-value block's decoder: ``d·(q − offset)``, ``+ m`` where the
    type has a minimum; the codes are unpacked as the integer kernels unpack them."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        s, t = (array_data(context, builder, sig.args[i], args[i]) for i in (0, 2))
        codes, signed = block_codes(builder, lay, s, args[1])
        wide = (builder.sext if signed else builder.zext)(codes, vec_of(I32, 32))
        if lay.offset and not signed:  # signed codes come with the offset taken off
            wide = builder.sub(wide, splat(I32, 32, lay.offset))
        _store_scaled(builder, wide, args[4], t, args[3], args[5] if lay.m >= 0 else None)
        return context.get_dummy_value()

    return codegen


def _block32(lay: Layout) -> Any:
    """An intrinsic ``(src, at, dst, o, d, m)``: ``dst[o:o+32]`` = the 32 values of the
    block whose first byte is ``src[at]``, scale ``d`` (and minimum ``m``) given."""

    @intrinsic
    def decode(typingctx: Any, src: Any, at: Any, dst: Any, o: Any, d: Any, m: Any) -> Any:
        sig = types.void(src, types.int64, dst, types.int64, types.float32, types.float32)
        return sig, _block32_codegen(lay)

    return decode


_q4_0_block, _q4_1_block, _q5_0_block, _q5_1_block, _q8_0_block = (
    _block32(LAYOUTS[name]) for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
)


def _bits(builder: ir.IRBuilder, src: Any, at: Any, shift: Any, n: int, mask: int) -> Any:
    """``(src[at:at+n] >> shift) & mask`` as ``<n x i8>``: ``src`` a byte pointer, ``shift``
    a runtime integer."""
    q = load_vec(builder, src, at, vec_of(I8, n))
    return builder.and_(builder.lshr(q, runtime_splat(builder, shift, n)), splat(I8, n, mask))


@intrinsic
def _nibbles32(typingctx: Any, src: Any, at: Any, shift: Any, dst: Any, o: Any, d: Any,
               m: Any) -> Any:  # fmt: skip
    """``dst[o:o+32] = d·q − m`` for ``q = (src[at:at+32] >> shift) & 15``."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        s, t = (array_data(context, builder, sig.args[i], args[i]) for i in (0, 3))
        nibbles = _bits(builder, s, args[1], args[2], 32, 15)
        vf = ir.VectorType(_F32, 32)
        scaled = builder.fmul(splat_scalar(builder, args[5], 32), builder.uitofp(nibbles, vf))
        values = builder.fsub(scaled, splat_scalar(builder, args[6], 32))
        where = builder.bitcast(builder.gep(t, [args[4]]), vf.as_pointer())
        builder.store(values, where, align=4)
        return context.get_dummy_value()

    sig = types.void(src, types.int64, types.int64, dst, types.int64, types.float32,
                     types.float32)  # fmt: skip
    return sig, codegen


@njit(inline="always")
def _scale(row: Any, at: int, table: Any) -> Any:
    return table[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)]


#: the 32-value block types decoded here (:data:`.job_blocks.TYPES32`), and their ids
#: (which the driver branches on)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = (int(t) for t in TYPES32)
#: bytes per block, by type id (a constant array numba compiles in)
_BLOCK_BYTES = np.zeros(max(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) + 1, np.int64)
for _t in TYPES32:
    _BLOCK_BYTES[int(_t)] = _t.type_size


@kernel(nogil=True)
def dequantize_rows32(rows: Any, out: Any, table: Any, kind: int) -> None:
    """Byte rows of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 blocks (ggml type id ``kind``)
    ``(n, nblocks·size)`` into float32 ``out (n, nblocks·32)`` (both C-contiguous)."""
    size = _BLOCK_BYTES[kind]
    for r in range(rows.shape[0]):
        src, dst = rows[r], out[r]
        for b in range(dst.size // 32):
            at, o = size * b, 32 * b
            d, m = _scale(src, at, table), np.float32(0)
            if kind in (Q4_1, Q5_1):
                m = _scale(src, at + 2, table)
            if kind == Q4_0:
                _q4_0_block(src, at, dst, o, d, m)  # type: ignore[call-arg]
            elif kind == Q4_1:
                _q4_1_block(src, at, dst, o, d, m)  # type: ignore[call-arg]
            elif kind == Q5_0:
                _q5_0_block(src, at, dst, o, d, m)  # type: ignore[call-arg]
            elif kind == Q5_1:
                _q5_1_block(src, at, dst, o, d, m)  # type: ignore[call-arg]
            else:
                _q8_0_block(src, at, dst, o, d, m)  # type: ignore[call-arg]


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
                sc, mn = scale_min_k4(blk, s)
                d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
                _nibbles32(blk, 16 + 32 * (s >> 1), 4 * (s & 1), dst, 256 * b + 32 * s,
                           d1, m1)  # type: ignore[call-arg]  # fmt: skip


@intrinsic
def _nibbles32_high(typingctx: Any, src: Any, at: Any, shift: Any, high_at: Any, bit: Any,
                    dst: Any, o: Any, d: Any, m: Any) -> Any:  # fmt: skip
    """``dst[o:o+32] = d·q − m`` for ``q = ((src[at:at+32] >> shift) & 15) | h << 4``,
    ``h`` bit ``bit`` of ``src[high_at:high_at+32]`` (a Q5_K sub-block)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        s, t = (array_data(context, builder, sig.args[i], args[i]) for i in (0, 5))
        nibbles = _bits(builder, s, args[1], args[2], 32, 15)
        high = _bits(builder, s, args[3], args[4], 32, 1)
        codes = builder.or_(nibbles, builder.shl(high, splat(I8, 32, 4)))
        vf = ir.VectorType(_F32, 32)
        scaled = builder.fmul(splat_scalar(builder, args[7], 32), builder.uitofp(codes, vf))
        values = builder.fsub(scaled, splat_scalar(builder, args[8], 32))
        builder.store(values, builder.bitcast(builder.gep(t, [args[6]]), vf.as_pointer()),
                      align=4)  # fmt: skip
        return context.get_dummy_value()

    sig = types.void(src, types.int64, types.int64, types.int64, types.int64, dst, types.int64,
                     types.float32, types.float32)  # fmt: skip
    return sig, codegen


@intrinsic
def _q6_k_run(typingctx: Any, src: Any, low_at: Any, low_shift: Any, high_at: Any,
              high_shift: Any, dst: Any, o: Any, d: Any) -> Any:  # fmt: skip
    """``dst[o:o+16] = d·(q − 32)`` for the 16 six-bit codes of a Q6_K sub-block:
    ``q = ((src[low_at+i] >> low_shift) & 15) | ((src[high_at+i] >> high_shift) & 3) << 4``."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        s, t = (array_data(context, builder, sig.args[i], args[i]) for i in (0, 5))
        low = _bits(builder, s, args[1], args[2], 16, 15)
        high = _bits(builder, s, args[3], args[4], 16, 3)
        codes = builder.or_(low, builder.shl(high, splat(I8, 16, 4)))
        wide = builder.sub(builder.zext(codes, vec_of(I32, 16)), splat(I32, 16, 32))
        _store_scaled(builder, wide, args[7], t, args[6])
        return context.get_dummy_value()

    sig = types.void(src, types.int64, types.int64, types.int64, types.int64, dst, types.int64,
                     types.float32)  # fmt: skip
    return sig, codegen


@kernel(nogil=True)
def dequantize_q5_k_rows(rows: Any, out: Any, table: Any) -> None:
    """Byte rows of Q5_K blocks ``(n, nblocks·176)`` into float32 ``out (n, nblocks·256)``:
    Q4_K's sub-blocks (nibbles from byte 48) with a fifth bit, bit ``s`` of the 32 bytes
    at 16, for sub-block ``s``."""
    for r in range(rows.shape[0]):
        src, dst = rows[r], out[r]
        for b in range(dst.size // 256):
            blk = src[176 * b : 176 * (b + 1)]
            d, dmin = _scale(blk, 0, table), _scale(blk, 2, table)
            for s in range(8):
                sc, mn = scale_min_k4(blk, s)
                d1, m1 = d * np.float32(sc), dmin * np.float32(mn)
                _nibbles32_high(blk, 48 + 32 * (s >> 1), 4 * (s & 1), 16, s, dst,
                                256 * b + 32 * s, d1, m1)  # type: ignore[call-arg]  # fmt: skip


@kernel(nogil=True)
def dequantize_q6_k_rows(rows: Any, out: Any, table: Any) -> None:
    """Byte rows of Q6_K blocks ``(n, nblocks·210)`` into float32 ``out (n, nblocks·256)``:
    sixteen sub-blocks of 16 values, each times ``d`` (at byte 208) by its int8 scale
    (byte 192 + s); low four bits from the 128 bytes at 0, high two from the 64 at 128."""
    for r in range(rows.shape[0]):
        src, dst = rows[r], out[r]
        for b in range(dst.size // 256):
            blk = src[210 * b : 210 * (b + 1)]
            d = _scale(blk, 208, table)
            for s in range(16):
                dl = d * np.float32(as_int8(blk[192 + s]))
                half, pair, l0 = s >> 3, (s >> 1) & 3, (s & 1) * 16
                _q6_k_run(blk, 64 * half + 32 * (pair & 1) + l0, 4 * (pair >> 1),
                          128 + 32 * half + l0, 2 * pair, dst, 256 * b + 16 * s,
                          dl)  # type: ignore[call-arg]  # fmt: skip

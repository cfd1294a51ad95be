"""Vectorised numpy codecs for ggml's float and block-quantized element types.

These functions produce and consume the exact bytes ggml keeps in memory and GGUF keeps
on disk, bit for bit the same as ``gguf.quants`` (itself a port of the reference C code
in ``ggml-quants.c``), so a tensor quantized here and one quantized by llama.cpp's
tooling are interchangeable. ``gguf`` is deliberately not imported: its import would be
a large share of every launch and the core package must stay light, so the rounding
rules are re-implemented here on plain numpy and checked against ``gguf`` by the
test-suite.

Layouts (``ggml-common.h``); every field is little-endian, ``d`` and ``m`` are f16:

========  ===========================  ==============================================
type      block of 32 elements         element ``j``
========  ===========================  ==============================================
Q8_0      ``d, qs[32] (int8)``         ``d * qs[j]``
Q4_0      ``d, qs[16]``                ``d * (nibble_j - 8)``
Q4_1      ``d, m, qs[16]``             ``d * nibble_j + m``
Q5_0      ``d, qh[4], qs[16]``         ``d * ((nibble_j | bit_j << 4) - 16)``
Q5_1      ``d, m, qh[4], qs[16]``      ``d * (nibble_j | bit_j << 4) + m``
========  ===========================  ==============================================

``nibble_j`` is the low nibble of ``qs[j]`` for ``j < 16`` and the high nibble of
``qs[j - 16]`` otherwise; ``bit_j`` is bit ``j`` of ``qh`` read as a little-endian u32.

Speed: these are the hot paths of ``get_rows`` and quantized ``mul_mat`` on the CPU
backend. Everything is whole-array numpy; the only Python loop walks cache-sized chunks
of 8192 blocks, so that each numpy pass reads a chunk still in cache instead of streaming
every intermediate through main memory. Within a chunk the blocks are transposed to a
"slot-major" layout (see below) so that per-block work runs as long contiguous loops;
on a 32-element block numpy's per-call overhead would otherwise dominate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np

from .errors import ShapeError, TypeMismatchError
from .iquants import IQ4_DEQUANTIZE, IQ4_QUANTIZE, IQ4_TYPES
from .kquants import K_DEQUANTIZE, K_QUANTIZE, K_TYPES
from .types import Type, row_size

__all__ = [
    "SUPPORTED_TYPES",
    "bf16_to_f32",
    "dequantize",
    "dequantize_blocks",
    "f32_to_bf16",
    "quantize",
]

# Explicit little-endian dtypes: GGUF and ggml's CPU layout are little-endian; on a
# little-endian host these are identical to the native dtypes and cost nothing.
_F32 = np.dtype("<f4")
_F16 = np.dtype("<f2")
_U16 = np.dtype("<u2")
_U32 = np.dtype("<u4")

# Blocks per chunk. 8192 blocks of 32 elements make a 1 MiB float32 chunk: large enough
# that numpy's per-call overhead is amortised, small enough that the temporaries a kernel
# creates stay in cache (chunks several times smaller or larger are slower).
_CHUNK_BLOCKS = 8192

_FLOAT_TYPES = (Type.F32, Type.F16, Type.BF16)
_QUANT_TYPES = (Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, *K_TYPES, *IQ4_TYPES)
SUPPORTED_TYPES: tuple[Type, ...] = _FLOAT_TYPES + _QUANT_TYPES
"""Every type :func:`quantize` and :func:`dequantize` can encode and decode."""


# ---------------------------------------------------------------------------------------
# argument checking
# ---------------------------------------------------------------------------------------


def _check_type(t: Type | str | int) -> Type:
    t = Type.parse(t)
    if t not in SUPPORTED_TYPES:
        names = ", ".join(s.name for s in SUPPORTED_TYPES)
        raise TypeMismatchError(
            f"tensorplug.quants has no codec for {t.name}; supported types are {names} "
            f"(integer tensors need no conversion: view their bytes with numpy directly)"
        )
    return t


def _as_bytes(data: np.ndarray, what: str) -> np.ndarray:
    data = np.asarray(data)
    if data.dtype == np.uint8:
        return data
    if data.dtype == np.int8:
        return data.view(np.uint8)
    raise TypeMismatchError(
        f"{what} expects the raw bytes as a uint8 array, got dtype {data.dtype}; "
        f"pass arr.view(np.uint8) of the stored data"
    )


def _as_float_values(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype.kind not in "biuf":
        raise TypeMismatchError(
            f"quantize expects real numbers, got dtype {values.dtype}; convert with "
            f".astype(np.float32) first if the values are meaningful as floats"
        )
    if values.ndim == 0:
        raise ShapeError("quantize needs at least one axis: the last axis is the row")
    return values


def _no_copy_reshape(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` reshaped as a view, or ``None`` when that would need a copy."""
    try:
        return a.reshape(shape, copy=False)  # type: ignore[call-overload]  # numpy >= 2.1
    except ValueError:
        return None
    except TypeError:  # older numpy: no ``copy`` keyword
        v = a.view()
        try:
            v.shape = shape
        except AttributeError:
            return None
        return v


# ---------------------------------------------------------------------------------------
# BF16
# ---------------------------------------------------------------------------------------


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """Widen raw bf16 bits (``uint16``) to float32; exact, bf16 is the top half of f32."""
    u16 = np.asarray(u16)
    if u16.dtype not in (np.uint16, np.int16):
        raise TypeMismatchError(
            f"bf16_to_f32 expects the raw bf16 bits as uint16, got dtype {u16.dtype}; "
            f"pass bytes.view('<u2')"
        )
    out = u16.astype(np.uint32)
    out <<= np.uint32(16)
    return out.view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 bits (``uint16``) the way ggml does.

    ``ggml_compute_fp32_to_bf16``: round to nearest, ties to even, on the raw bits; a NaN
    keeps its sign and top payload bits and is forced quiet, so it cannot round into
    infinity. Other dtypes are converted to float32 first, as ggml would see them.
    """
    with np.errstate(over="ignore"):  # f64 beyond the f32 range becomes inf, like a C cast
        bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    # For every non-NaN input the sum below stays under 2**32 (the largest is
    # 0xff800000 + 0x8000), so uint32 arithmetic is exact; NaNs are replaced afterwards.
    rounded = bits >> np.uint32(16)
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += bits
    rounded >>= np.uint32(16)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if is_nan.any():
        rounded[is_nan] = (bits[is_nan] >> np.uint32(16)) | np.uint32(0x0040)
    return rounded.astype(np.uint16)


# ---------------------------------------------------------------------------------------
# scratch memory
#
# A kernel's temporaries are up to 1 MiB each. Allocated afresh per chunk they come from
# mmap and every chunk pays their page faults again, which can cost more than the
# arithmetic itself, depending on the allocator's state.
# Each thread therefore keeps one set of scratch buffers (a few MiB, bounded by the chunk
# size) and the kernels write into them with ``out=``. Nothing returned to a caller is
# ever a view of scratch memory.
# ---------------------------------------------------------------------------------------


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type | np.dtype) -> np.ndarray:
        """An uninitialised array ``shape``/``dtype`` over the thread's buffer ``name``."""
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dt.itemsize
        buf = self.buffers.get(name)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(nbytes, np.uint8)
            self.buffers[name] = buf
        return buf[:nbytes].view(dt).reshape(shape)


_scratch = _Scratch()


# ---------------------------------------------------------------------------------------
# slot layout
#
# numpy pays a fixed cost per inner-loop call, and a 32-element block is too short to
# amortise it: reducing or scaling blocks row by row would spend most of its time in call
# overhead. The kernels therefore transpose each chunk of ``m`` blocks into "slot-major"
# order, ``X[k, 4*c + p] = block_c[4*k + p]`` (8 slots of 4 consecutive elements), so that
# every per-block operation becomes a handful of long contiguous loops over the chunk.
# The transposes move 16-byte (or, for packed bytes, 4-byte) units, which is several times
# cheaper than moving single floats, and they only move bits, so values are untouched.
#
# In slot order element ``j`` of a block lives in slot ``j // 4`` at lane ``j % 4``, so the
# two nibbles of packed byte ``j`` (elements ``j`` and ``j + 16``) are slots ``k`` and
# ``k + 4`` of the same lane: packing and unpacking stay elementwise.
# ---------------------------------------------------------------------------------------


def _slots_from_floats(x: np.ndarray) -> np.ndarray:
    """(m, 32) float32 blocks -> (8, 4*m) float32 in slot order (scratch ``xs``)."""
    m = x.shape[0]
    xs = _scratch.get("xs", (8, 4 * m), np.float32)
    np.copyto(xs.view(np.complex128), x.view(np.complex128).T)
    return xs


def _floats_from_slots(y: np.ndarray, out: np.ndarray) -> None:
    """Store (8, 4*m) float32 slots into the (m, 32) float32 blocks ``out``."""
    np.copyto(out.view(np.complex128), y.view(np.complex128).T)


def _slots_from_bytes(field: np.ndarray) -> np.ndarray:
    """(m, 4*s) bytes of a block field -> (s, 4*m) uint8, byte ``4*k + p`` at ``[k, 4*c + p]``.

    ``field`` may be a strided view; only its last axis must be contiguous.
    """
    words = field.view(np.uint32)
    slots = _scratch.get("byte_slots", words.shape[::-1], np.uint32)
    np.copyto(slots, words.T)
    return slots.view(np.uint8)


def _bytes_from_slots(q: np.ndarray, field: np.ndarray) -> None:
    """Inverse of :func:`_slots_from_bytes`: store (s, 4*m) uint8 into ``field`` (m, 4*s)."""
    np.copyto(field.view(np.uint32), q.view(np.uint32).T)


def _f16_column(b: np.ndarray, offset: int) -> np.ndarray:
    """The f16 at byte ``offset`` of every block, as float32 of shape (m,)."""
    return b[:, offset : offset + 2].view(_F16)[:, 0].astype(np.float32)


def _store_f16(b: np.ndarray, offset: int, values: np.ndarray) -> None:
    b[:, offset : offset + 2].view(_U16)[:, 0] = values.astype(_F16).view(_U16)


def _lanes(v: np.ndarray, name: str) -> np.ndarray:
    """Per-block values (m,) repeated for the 4 lanes of a slot row: (4*m,), scratch."""
    lanes = _scratch.get(name, (v.shape[0], 4), v.dtype)
    for p in range(4):  # 4 long strided copies; broadcasting would loop per block
        lanes[:, p] = v
    return lanes.reshape(-1)


# numpy 2's minimum/maximum against a scalar miss the SIMD path (many times slower than
# against an array), so the caps are rows of constants broadcast over the 8 slots.
_CAP15 = np.full(4 * _CHUNK_BLOCKS, 15, np.uint8)
_CAP31 = np.full(4 * _CHUNK_BLOCKS, 31, np.uint8)


def _block_max_min(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max and min of each block from its slot-order values; NaN propagates."""
    m = xs.shape[1] // 4
    lanes_max = np.max(xs, axis=0, out=_scratch.get("lanes_max", (4 * m,), np.float32))
    lanes_min = np.min(xs, axis=0, out=_scratch.get("lanes_min", (4 * m,), np.float32))
    lanes_max = lanes_max.reshape(m, 4)
    lanes_min = lanes_min.reshape(m, 4)
    mx = np.maximum(
        np.maximum(lanes_max[:, 0], lanes_max[:, 1]),
        np.maximum(lanes_max[:, 2], lanes_max[:, 3]),
    )
    mn = np.minimum(
        np.minimum(lanes_min[:, 0], lanes_min[:, 1]),
        np.minimum(lanes_min[:, 2], lanes_min[:, 3]),
    )
    return mx, mn


def _signed_absmax(x: np.ndarray, mx: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The element of largest magnitude of each block, keeping its sign.

    The reference takes the *first* element with the largest ``|x|``. The block max and
    min already decide it unless ``max == -min`` (a tie between ``v`` and ``-v``, which
    includes all-zero blocks, where the sign of the zero matters for ``d``) or the block
    holds a NaN; those rare blocks are settled with an argmax over their original rows.
    """
    neg_mn = -mn
    v = np.where(neg_mn > mx, mn, mx)
    ambiguous = (neg_mn == mx) | np.isnan(mx)
    if ambiguous.any():
        rows = np.flatnonzero(ambiguous)
        sub = x[rows]
        v[rows] = sub[np.arange(rows.size), np.abs(sub).argmax(axis=-1)]
    return v


def _inverse(d: np.ndarray) -> np.ndarray:
    """``1 / d`` with 0 where ``d == 0``, as the reference computes ``id``."""
    inv = np.float32(1) / d
    inv[d == 0] = 0
    return inv


def _scaled(xs: np.ndarray, d: np.ndarray, offset: np.ndarray | None) -> np.ndarray:
    """``(xs - offset) * (1 / d)`` per block, in scratch ``t``: the reference's ``x * id``."""
    t = _scratch.get("t", xs.shape, np.float32)
    if offset is None:
        np.multiply(xs, _lanes(_inverse(d), "lanes_a"), out=t)
    else:
        np.subtract(xs, _lanes(offset, "lanes_a"), out=t)
        t *= _lanes(_inverse(d), "lanes_b")
    return t


def _codes(t: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Truncate non-negative floats to uint8 codes, capped; scratch ``q``.

    This is the reference's ``MIN(cap, (int8_t)(v))``: the float to uint8 cast is the
    same one ``gguf`` performs, so even the out-of-range values of degenerate blocks
    (NaN, inf from a subnormal scale) give the same bytes. Capping before the cast would
    not: an infinite value casts to 0, not to the cap.
    """
    q = _scratch.get("q", t.shape, np.uint8)
    np.copyto(q, t, casting="unsafe")
    np.minimum(q, cap[: q.shape[-1]], out=q)
    return q


def _round_away(t: np.ndarray) -> np.ndarray:
    """``roundf`` of ``t`` (half away from zero; numpy's ``rint`` is half to even).

    Returns scratch ``r``; ``t`` is overwritten.
    """
    r = np.trunc(t, out=_scratch.get("r", t.shape, np.float32))
    t -= r  # the fraction; exact, a float minus its own integer part
    t += t  # |2 * frac| >= 1 exactly when |frac| >= 0.5
    np.trunc(t, out=t)
    r += t
    return r


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(8, 4*m) 4-bit codes in slot order -> (4, 4*m) bytes ``q[j] | q[j + 16] << 4``."""
    qs = _scratch.get("qs", (4, q.shape[1]), np.uint8)
    np.multiply(q[4:], np.uint8(16), out=qs)  # uint8 shift-by-scalar is slow; this is not
    qs |= q[:4]
    return qs


def _unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """(4, 4*m) packed bytes in slot order -> (8, 4*m) 4-bit codes, scratch ``q``."""
    q = _scratch.get("q", (8, qs.shape[1]), np.uint8)
    np.bitwise_and(qs, np.uint8(0x0F), out=q[:4])
    np.right_shift(qs, np.uint8(4), out=q[4:])
    return q


# Bit tricks on uint32 words: a word of 4 bytes holding 0/1 (one per lane) gathers into a
# nibble with one multiply (the shifted copies occupy disjoint bits, so no carries), and a
# nibble spreads back into 4 bytes the same way.
_GATHER_LANES = np.uint32(0x01020408)  # lane p (bit 8p) -> bit 24 + p
_SPREAD_LANES = np.uint32(0x00204081)  # bit p -> bit 8p (plus stray bits, masked off)
_LANE_BITS = np.uint32(0x01010101)
_NIBBLE_WEIGHTS = np.array([1, 16, 256, 4096], np.uint32).reshape(1, 4, 1)


def _pack_5bit(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(8, 4*m) 5-bit codes -> (``qh`` words (m,), packed low nibbles (4, 4*m)).

    Bit ``j`` of ``qh`` is the fifth bit of code ``j``. ``q`` is overwritten.
    """
    bits = _scratch.get("bits", q.shape, np.uint8)
    np.right_shift(q, np.uint8(4), out=bits)
    words = bits.view(_U32)  # (8, m): the 0/1 fifth bits of slot k, one byte per lane
    words *= _GATHER_LANES
    words >>= np.uint32(24)  # (8, m): element 4k + p's fifth bit at bit p
    halves = words.reshape(2, 4, -1)
    halves *= _NIBBLE_WEIGHTS
    qh = halves.sum(axis=1, dtype=np.uint32)
    qh[1] <<= np.uint32(16)
    q[:4] &= np.uint8(0x0F)  # the fifth bit of q[4:] is dropped by the uint8 multiply
    return qh[0] | qh[1], _pack_nibbles(q)


def _unpack_fifth_bits(qh: np.ndarray) -> np.ndarray:
    """(m, 4) ``qh`` bytes -> (8, 4*m) uint8 in slot order: 16 where the fifth bit is set."""
    nibbles = _scratch.get("bits", (4, 2, qh.shape[0]), _U32)  # byte i: slots 2i, 2i+1
    np.bitwise_and(qh.T, np.uint8(0x0F), out=nibbles[:, 0])
    np.right_shift(qh.T, np.uint8(4), out=nibbles[:, 1])
    words = nibbles.reshape(8, -1)
    words *= _SPREAD_LANES
    words &= _LANE_BITS
    words <<= np.uint32(4)
    return words.view(np.uint8)


def _to_floats(q: np.ndarray) -> np.ndarray:
    """Codes (8, 4*m) of any integer dtype as float32, scratch ``y``."""
    y = _scratch.get("y", q.shape, np.float32)
    np.copyto(y, q)
    return y


# ---------------------------------------------------------------------------------------
# quantize kernels: x (m, 32) contiguous float32 -> out (m, type_size) contiguous uint8
#
# Each follows its reference (``quantize_row_*_ref``) operation for operation in float32,
# which is what makes the bytes identical rather than merely close.
# ---------------------------------------------------------------------------------------


def _quant_q8_0(x: np.ndarray, out: np.ndarray) -> None:
    xs = _slots_from_floats(x)
    mx, mn = _block_max_min(xs)
    amax = np.abs(np.maximum(mx, -mn))  # abs() also settles -0.0 and NaN signs like |x|
    d = amax / np.float32(127)
    r = _round_away(_scaled(xs, d, None))
    q = _scratch.get("q", r.shape, np.int8)
    np.copyto(q, r, casting="unsafe")
    _store_f16(out, 0, d)
    _bytes_from_slots(q.view(np.uint8), out[:, 2:34])


def _quant_q4_0(x: np.ndarray, out: np.ndarray) -> None:
    xs = _slots_from_floats(x)
    mx, mn = _block_max_min(xs)
    d = _signed_absmax(x, mx, mn) / np.float32(-8)
    t = _scaled(xs, d, None)
    t += np.float32(8.5)
    q = _codes(t, _CAP15)
    _store_f16(out, 0, d)
    _bytes_from_slots(_pack_nibbles(q), out[:, 2:18])


def _quant_q4_1(x: np.ndarray, out: np.ndarray) -> None:
    xs = _slots_from_floats(x)
    mx, mn = _block_max_min(xs)
    d = (mx - mn) / np.float32(15)
    t = _scaled(xs, d, mn)
    t += np.float32(0.5)
    q = _codes(t, _CAP15)
    _store_f16(out, 0, d)
    _store_f16(out, 2, mn)
    _bytes_from_slots(_pack_nibbles(q), out[:, 4:20])


def _quant_q5_0(x: np.ndarray, out: np.ndarray) -> None:
    xs = _slots_from_floats(x)
    mx, mn = _block_max_min(xs)
    d = _signed_absmax(x, mx, mn) / np.float32(-16)
    t = _scaled(xs, d, None)
    t += np.float32(16.5)
    qh, qs = _pack_5bit(_codes(t, _CAP31))
    _store_f16(out, 0, d)
    out[:, 2:6].view(_U32)[:, 0] = qh
    _bytes_from_slots(qs, out[:, 6:22])


def _quant_q5_1(x: np.ndarray, out: np.ndarray) -> None:
    xs = _slots_from_floats(x)
    mx, mn = _block_max_min(xs)
    d = (mx - mn) / np.float32(31)
    t = _scaled(xs, d, mn)
    t += np.float32(0.5)
    qh, qs = _pack_5bit(_codes(t, _CAP31))
    _store_f16(out, 0, d)
    _store_f16(out, 2, mn)
    out[:, 4:8].view(_U32)[:, 0] = qh
    _bytes_from_slots(qs, out[:, 8:24])


# ---------------------------------------------------------------------------------------
# dequantize kernels: b (m, type_size) uint8, last axis contiguous -> out (m, 32) float32
#
# Each value is computed with the reference's float32 operations in the same order
# (``d * q``, then ``+ m``), so results are bit-identical, not merely close.
# ---------------------------------------------------------------------------------------


def _dequant_q8_0(b: np.ndarray, out: np.ndarray) -> None:
    # Nothing to unpack, so the two transposes of the slot layout would cost more than
    # the per-block overhead they save; work on rows directly.
    np.copyto(out, b[:, 2:].view(np.int8))
    out *= _f16_column(b, 0)[:, None]


def _dequant_q4_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _unpack_nibbles(_slots_from_bytes(b[:, 2:18])).view(np.int8)
    q -= np.int8(8)
    y = _to_floats(q)
    y *= _lanes(_f16_column(b, 0), "lanes_a")
    _floats_from_slots(y, out)


def _dequant_q4_1(b: np.ndarray, out: np.ndarray) -> None:
    y = _to_floats(_unpack_nibbles(_slots_from_bytes(b[:, 4:20])))
    y *= _lanes(_f16_column(b, 0), "lanes_a")
    y += _lanes(_f16_column(b, 2), "lanes_b")
    _floats_from_slots(y, out)


def _dequant_q5_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _unpack_nibbles(_slots_from_bytes(b[:, 6:22]))
    q |= _unpack_fifth_bits(b[:, 2:6])
    q = q.view(np.int8)
    q -= np.int8(16)
    y = _to_floats(q)
    y *= _lanes(_f16_column(b, 0), "lanes_a")
    _floats_from_slots(y, out)


def _dequant_q5_1(b: np.ndarray, out: np.ndarray) -> None:
    q = _unpack_nibbles(_slots_from_bytes(b[:, 8:24]))
    q |= _unpack_fifth_bits(b[:, 4:8])
    y = _to_floats(q)
    y *= _lanes(_f16_column(b, 0), "lanes_a")
    y += _lanes(_f16_column(b, 2), "lanes_b")
    _floats_from_slots(y, out)


_Kernel = Callable[[np.ndarray, np.ndarray], None]

_QUANTIZE: dict[Type, _Kernel] = {
    Type.Q8_0: _quant_q8_0,
    Type.Q4_0: _quant_q4_0,
    Type.Q4_1: _quant_q4_1,
    Type.Q5_0: _quant_q5_0,
    Type.Q5_1: _quant_q5_1,
    **K_QUANTIZE,
    **IQ4_QUANTIZE,
}

_DEQUANTIZE: dict[Type, _Kernel] = {
    Type.Q8_0: _dequant_q8_0,
    Type.Q4_0: _dequant_q4_0,
    Type.Q4_1: _dequant_q4_1,
    Type.Q5_0: _dequant_q5_0,
    Type.Q5_1: _dequant_q5_1,
    **K_DEQUANTIZE,
    **IQ4_DEQUANTIZE,
}


def _pieces(src: np.ndarray, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """Split ``src`` (..., width) into 2-D pieces of at most ``_CHUNK_BLOCKS`` rows.

    Yields ``(first_row, piece)`` in C order of the rows. Leading axes are merged when
    that needs no copy, so a strided view of whole rows is read in place; when they
    cannot be merged, pieces are gathered along the first axis into scratch memory, one
    piece at a time, never copying the whole input.
    """
    width = src.shape[-1]
    flat = _no_copy_reshape(src, (-1, width))
    if flat is not None:
        for i in range(0, flat.shape[0], _CHUNK_BLOCKS):
            yield start + i, flat[i : i + _CHUNK_BLOCKS]
        return
    # only arrays of 3 or more axes can fail to merge
    per = int(np.prod(src.shape[1:-1]))
    if per >= _CHUNK_BLOCKS:
        for i in range(src.shape[0]):
            yield from _pieces(src[i], start + i * per)
    else:
        step = _CHUNK_BLOCKS // per
        for i in range(0, src.shape[0], step):
            part = src[i : i + step]
            gathered = _scratch.get("gathered", part.shape, src.dtype)
            np.copyto(gathered, part)
            yield start + i * per, gathered.reshape(-1, width)


def _run(kernel: _Kernel, src: np.ndarray, out: np.ndarray, as_float32: bool) -> None:
    """Apply ``kernel`` piece by piece; ``out`` is contiguous with one row per src row."""
    out2 = out.reshape(-1, out.shape[-1])
    if out2.shape[0] == 0:
        return
    # Degenerate blocks (inf, NaN, f16 overflow of a huge scale) legitimately produce
    # the same NaN/inf/overflow results as the reference; numpy's warnings are noise.
    with np.errstate(all="ignore"):
        for i, piece in _pieces(src):
            if as_float32 and not (piece.dtype == np.float32 and piece.flags.c_contiguous):
                converted = _scratch.get("converted", piece.shape, np.float32)
                np.copyto(converted, piece, casting="unsafe")
                piece = converted
            elif not as_float32 and piece.strides[-1] != piece.itemsize:
                converted = _scratch.get("converted", piece.shape, piece.dtype)
                np.copyto(converted, piece)
                piece = converted
            kernel(piece, out2[i : i + piece.shape[0]])


# ---------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------


def quantize(values: np.ndarray, t: Type) -> np.ndarray:
    """Encode rows of real numbers as the bytes ggml stores for type ``t``.

    ``values`` has shape ``(..., n)``; each last-axis row is encoded on its own and the
    result is a new uint8 array of shape ``(..., row_size(t, n))``, byte-identical to
    ``gguf.quants.quantize`` and llama.cpp (K-quants and IQ4: ggml's quantizers without an
    importance matrix), ready
    to be written into a buffer or a GGUF file. Quantized types need ``n`` to be a
    multiple of their block size (32; 256 for the K-quants and IQ4_XS).
    F32/F16/BF16 are accepted too and return their bytes, so that callers have one entry
    point for every float or quantized type a tensor can be stored in.
    """
    t = _check_type(t)
    values = _as_float_values(values)
    n = values.shape[-1]
    row_size(t, n)  # raises when a row is not a whole number of blocks
    if t in _FLOAT_TYPES:
        # out-of-range values become inf, as in ggml; numpy's overflow warning is noise
        with np.errstate(over="ignore"):
            if t == Type.F32:
                return np.array(values, dtype=_F32, order="C").view(np.uint8)
            if t == Type.F16:
                # straight from the input dtype, like gguf: no double rounding through f32
                return np.array(values, dtype=_F16, order="C").view(np.uint8)
        return np.array(f32_to_bf16(values), dtype=_U16, order="C").view(np.uint8)

    lead = values.shape[:-1]
    nblocks = n // t.block_size
    out = np.empty((*lead, nblocks, t.type_size), np.uint8)
    blocks = values.reshape((*lead, nblocks, t.block_size))  # splitting never copies
    _run(_QUANTIZE[t], blocks, out, as_float32=True)
    return out.reshape((*lead, nblocks * t.type_size))


def dequantize_blocks(blocks: np.ndarray, t: Type, *, out: np.ndarray | None = None) -> np.ndarray:
    """Decode blocks ``(..., nblocks, type_size)`` to float32 ``(..., nblocks * block_size)``.

    Meant for the CPU backend, which hands over strided numpy views of a tensor's
    storage (selected rows, a range of blocks): the input is read in place and never
    copied as a whole (a view whose rows cannot be merged is gathered one cache-sized
    piece at a time). For F32/F16/BF16 a "block" is one element, so
    ``(..., n, itemsize)`` decodes to ``(..., n)``.

    ``out``, a C-contiguous float32 array of the result's shape, receives the values
    instead of a new array; reusing one saves the page faults of a fresh allocation,
    which on a 64 MiB result cost about as much as the decoding itself.
    """
    t = _check_type(t)
    blocks = _as_bytes(blocks, "dequantize_blocks")
    if blocks.ndim < 2 or blocks.shape[-1] != t.type_size:
        raise ShapeError(
            f"dequantize_blocks expects {t.name} blocks shaped (..., nblocks, {t.type_size}), "
            f"got {blocks.shape}; reshape the row bytes to (..., -1, {t.type_size})"
        )
    lead = blocks.shape[:-2]
    nblocks = blocks.shape[-2]
    shape = (*lead, nblocks * t.block_size)
    result = _output(out, shape)
    if t in _FLOAT_TYPES:
        _decode_floats(blocks, t, result.reshape((*lead, nblocks, 1)))
    else:
        _run(
            _DEQUANTIZE[t],
            blocks,
            result.reshape((*lead, nblocks, t.block_size)),
            as_float32=False,
        )
    return result


def dequantize(
    data: np.ndarray, t: Type, n: int | None = None, *, out: np.ndarray | None = None
) -> np.ndarray:
    """Decode stored rows of type ``t`` to float32.

    ``data`` is uint8 of shape ``(..., row_bytes)``; the result has shape ``(..., n)``
    with ``n = row_bytes / type_size * block_size``. Passing ``n`` checks that the byte
    rows really hold ``n`` elements, catching a wrong row length before it silently
    decodes garbage. The result is a new array unless ``out`` is given (see
    :func:`dequantize_blocks`); it never aliases ``data``, even for F32.
    """
    t = _check_type(t)
    data = _as_bytes(data, "dequantize")
    if data.ndim == 0:
        raise ShapeError("dequantize needs at least one axis: the last axis is the row")
    row_bytes = data.shape[-1]
    ts = t.type_size
    if row_bytes % ts:
        raise ShapeError(
            f"a {t.name} row is made of {ts}-byte blocks, but the rows given are "
            f"{row_bytes} bytes long; pass whole rows (the last axis must be a multiple "
            f"of {ts})"
        )
    nblocks = row_bytes // ts
    if n is not None and n != nblocks * t.block_size:
        raise ShapeError(
            f"{row_bytes} bytes of {t.name} hold {nblocks * t.block_size} elements, not {n}; "
            f"check the row length, or pass row_size({t.name}, {n}) bytes per row"
        )
    blocks = data.reshape((*data.shape[:-1], nblocks, ts))  # splitting an axis never copies
    return dequantize_blocks(blocks, t, out=out)


def _output(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if out is None:
        return np.empty(shape, np.float32)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        got = getattr(out, "dtype", type(out).__name__)
        raise TypeMismatchError(f"out must be a float32 numpy array, got {got}")
    if out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ShapeError(
            f"out must be a writable C-contiguous float32 array of shape {shape}, got shape "
            f"{out.shape} (contiguous={out.flags.c_contiguous}, "
            f"writeable={out.flags.writeable}); pass out=None to get a new array"
        )
    return out


def _decode_floats(b: np.ndarray, t: Type, out: np.ndarray) -> None:
    """Decode (..., n, itemsize) bytes of a float type into float32 ``out`` (..., n, 1)."""
    if b.strides[-1] != 1:
        b = np.ascontiguousarray(b)
    if t == Type.F32:
        out[...] = b.view(_F32)
    elif t == Type.F16:
        out[...] = b.view(_F16)
    else:
        words = b.view(_U16).astype(np.uint32)
        words <<= np.uint32(16)
        out[...] = words.view(np.float32)

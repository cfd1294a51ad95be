"""numba encoders of ggml's 32-value blocks: a quantized KV cache's new rows.

A step writes each block's new K and V rows into the cache (set_rows), quantized as
ggml's ``from_float`` quantizes them: for Q8_0 x86's ``quantize_row_q8_0`` (the scale
``amax/127`` in f16, codes ``x·127/amax`` rounded half to even), for Q4_0, Q4_1, Q5_0
and Q5_1 the reference quantizers (``quantize_row_q4_0_ref``...: the scale from the
block's value of largest magnitude, or its range, codes truncated after adding a
half), for IQ4_NL ``quantize_row_iq4_nl_ref`` (one pass: each value's nearest of the
sixteen levels at the scale ``max/−127``, then the scale refitted by least squares with
weights ``x²``). numpy's codec (:func:`tensorplug.quants.quantize`) spends a hundred
microseconds of calls on one generation step's row; here a row is a few.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from ._numba_cache import kernel
from ._numba_quant import f32_to_f16_bits, largest_magnitude, nearest_int

#: ggml's type ids of the types encoded here
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL = 2, 3, 6, 7, 8, 20
#: IQ4_NL's sixteen levels (ggml's ``kvalues_iq4nl``)
_IQ4_NL_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32
)


@njit(inline="always")
def _put_f16(row: Any, at: int, f: Any) -> None:
    """The f16 of ``f`` (nearest even), little-endian at ``row[at:at + 2]``."""
    bits = f32_to_f16_bits(np.float32(f))
    row[at] = np.uint8(bits & 0xFF)
    row[at + 1] = np.uint8((bits >> 8) & 0xFF)


@njit(inline="always")
def _signed_largest(x: Any, k: int, start: int) -> Any:
    """The value of largest magnitude in ``x[k, start:start + 32]`` (the first of ties)."""
    amax, big = np.float32(0), np.float32(0)
    for j in range(start, start + 32):
        if amax < abs(x[k, j]):
            amax, big = abs(x[k, j]), x[k, j]
    return big


@njit(inline="always")
def _range(x: Any, k: int, start: int) -> tuple[Any, Any]:
    lo, hi = np.float32(np.inf), np.float32(-np.inf)
    for j in range(start, start + 32):
        lo = min(lo, x[k, j])
        hi = max(hi, x[k, j])
    return lo, hi


@njit(inline="always")
def _q8_0(x: Any, k: int, start: int, row: Any, at: int) -> None:
    amax = largest_magnitude(x, k, start, 32)
    _put_f16(row, at, amax / np.float32(127))
    inv = np.float32(127) / amax if amax != 0 else np.float32(0)
    for j in range(32):
        row[at + 2 + j] = np.uint8(nearest_int(x[k, start + j] * inv) & 0xFF)


@njit(inline="always")
def _truncated(v: Any) -> Any:
    """C's ``(int8_t)v`` of a float32 in int8's range: toward zero."""
    return np.int32(v)


@njit(inline="always")
def _scales(x: Any, k: int, start: int, row: Any, at: int, offset: bool,
            top: int) -> tuple[Any, Any, int]:  # fmt: skip
    """A Q4/Q5 block's scale written at ``row[at]``, ``top`` its largest code: with
    ``offset`` ``d = (max − min)/top`` and the minimum ``m`` after it, else ``d`` the
    value of largest magnitude over ``−(top + 1)/2``. Returns ``(m, 1/d, bytes written)``
    (``1/d`` 0 for a block of zeros)."""
    lo = np.float32(0)
    if offset:
        lo, hi = _range(x, k, start)
        d = (hi - lo) / np.float32(top)
    else:
        d = _signed_largest(x, k, start) / np.float32(-((top + 1) // 2))
    _put_f16(row, at, d)
    if offset:
        _put_f16(row, at + 2, lo)
    return lo, np.float32(1) / d if d != 0 else np.float32(0), 4 if offset else 2


@njit(inline="always")
def _q4(x: Any, k: int, start: int, row: Any, at: int, offset: bool) -> None:
    """Q4_0 (``offset`` False: ``d = max/−8``, codes ``min(15, x/d + 8.5)``) or Q4_1
    (``d = (max − min)/15`` and ``m = min``, codes ``min(15, (x − min)/d + 0.5)``)."""
    lo, inv, head = _scales(x, k, start, row, at, offset, 15)
    add = np.float32(0.5) if offset else np.float32(8.5)
    for j in range(16):
        a = min(15, _truncated((x[k, start + j] - lo) * inv + add))
        b = min(15, _truncated((x[k, start + 16 + j] - lo) * inv + add))
        row[at + head + j] = np.uint8(a | (b << 4))


@njit(inline="always")
def _q5(x: Any, k: int, start: int, row: Any, at: int, offset: bool) -> None:
    """Q5_0 (``d = max/−16``, codes ``min(31, x/d + 16.5)``) or Q5_1 (``d = (max −
    min)/31``, ``m = min``, codes ``(x − min)/d + 0.5``): low nibbles in ``qs``, the
    fifth bits in the 32-bit ``qh``."""
    lo, inv, head = _scales(x, k, start, row, at, offset, 31)
    qh = np.uint32(0)
    for j in range(16):
        if offset:
            a = _truncated((x[k, start + j] - lo) * inv + np.float32(0.5))
            b = _truncated((x[k, start + 16 + j] - lo) * inv + np.float32(0.5))
        else:
            a = min(31, _truncated(x[k, start + j] * inv + np.float32(16.5)))
            b = min(31, _truncated(x[k, start + 16 + j] * inv + np.float32(16.5)))
        row[at + head + 4 + j] = np.uint8((a & 0x0F) | ((b & 0x0F) << 4))
        qh |= np.uint32((a & 0x10) >> 4) << np.uint32(j)
        qh |= np.uint32((b & 0x10) >> 4) << np.uint32(j + 16)
    for i in range(4):
        row[at + head + i] = np.uint8((qh >> np.uint32(8 * i)) & np.uint32(0xFF))


@njit(inline="always")
def _nearest_level(x: Any) -> int:
    """ggml's ``best_index_int8`` over IQ4_NL's levels: a binary search, then the nearer
    of the two levels around ``x`` (the upper one on a tie)."""
    values = _IQ4_NL_VALUES
    if x <= values[0]:
        return 0
    if x >= values[15]:
        return 15
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid
    return hi - 1 if x - values[hi - 1] < values[hi] - x else hi


@njit(inline="always")
def _iq4_nl(x: Any, k: int, start: int, row: Any, at: int) -> None:
    """IQ4_NL as ``quantize_row_iq4_nl_ref`` (``ntry = −1``; ggml's base library, built
    without fused multiply-adds): levels at the scale ``max/−127``, the scale refitted
    to ``Σw·q·x / Σw·q²`` with ``w = x²``."""
    amax, big = np.float32(0), np.float32(0)
    for j in range(32):
        if abs(x[k, start + j]) > amax:
            amax, big = abs(x[k, start + j]), x[k, start + j]
    if amax < np.float32(1e-15):  # a block of zeros: scale 0, any levels
        _put_f16(row, at, np.float32(0))
        for j in range(16):
            row[at + 2 + j] = np.uint8(0)
        return
    d = big / np.float32(-127)
    inv = np.float32(1) / d
    sum_qx, sum_q2 = np.float32(0), np.float32(0)
    for j in range(32):
        v = x[k, start + j]
        level = _nearest_level(inv * v)
        q = _IQ4_NL_VALUES[level]
        wq = (v * v) * q
        sum_qx = sum_qx + wq * v
        sum_q2 = sum_q2 + wq * q
        if j < 16:
            row[at + 2 + j] = np.uint8(level)
        else:
            row[at + 2 + j - 16] = np.uint8(row[at + 2 + j - 16] | (level << 4))
    _put_f16(row, at, sum_qx / sum_q2 if sum_q2 > 0 else np.float32(0))


@kernel(nogil=True)
def set_rows_blocks(table: Any, values: Any, idx: Any, kind: int) -> int:
    """``table[idx[r]] = encode(values[r])``: float32 ``values`` (k, n), ``n`` a multiple
    of 32, into raw rows ``table`` (rows, bytes) of type id ``kind`` (Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0 or IQ4_NL). Every index is checked before anything is written; returns the
    position of the first bad one (the table untouched), or -1."""
    for r in range(idx.size):
        if idx[r] < 0 or idx[r] >= table.shape[0]:
            return r
    size = 34
    if kind == Q4_0:
        size = 18
    elif kind == Q4_1:
        size = 20
    elif kind == Q5_0:
        size = 22
    elif kind == Q5_1:
        size = 24
    elif kind == IQ4_NL:
        size = 18
    for r in range(idx.size):
        row = table[idx[r]]
        for b in range(values.shape[1] // 32):
            at, start = b * size, b * 32
            if kind == Q8_0:
                _q8_0(values, r, start, row, at)
            elif kind == IQ4_NL:
                _iq4_nl(values, r, start, row, at)
            elif kind in (Q4_0, Q4_1):
                _q4(values, r, start, row, at, kind == Q4_1)
            else:
                _q5(values, r, start, row, at, kind == Q5_1)
    return -1

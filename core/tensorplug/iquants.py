"""ggml's 4-bit non-linear quants: IQ4_NL and IQ4_XS.

After the K-quants these are the types people download most (``IQ4_XS`` files, and
``IQ4_NL`` tensors inside other mixes). Both store 4-bit indices into one fixed table
of 16 values, spaced more finely near zero than a uniform grid, so that a weight
distribution shaped like a bell loses less to rounding than with Q4_0:

``kvalues_iq4nl = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]``

Layouts (``ggml-common.h``; ``d`` is f16, every field little-endian):

======  =====  ======  ===============================================================
type    block  bytes   fields, in order
======  =====  ======  ===============================================================
IQ4_NL  32     18      d, qs[16]: element ``j`` is ``d * kvalues[nibble_j]``
IQ4_XS  256    136     d, scales_h (u16), scales_l[4], qs[128]: eight 32-element
                       blocks, block ``ib`` scaled by ``d * (ls_ib - 32)`` where the
                       6-bit ``ls_ib`` is nibble ``ib`` of ``scales_l`` with bits
                       ``2*ib, 2*ib+1`` of ``scales_h`` above it
======  =====  ======  ===============================================================

``nibble_j`` of a 32-element block is the low nibble of ``qs[j]`` for ``j < 16`` and the
high nibble of ``qs[j - 16]`` otherwise (Q4_0's order).

Decoding is bit for bit ``gguf.quants`` (``d * value`` in float32). Encoding follows
``quantize_iq4_nl`` / ``quantize_iq4_xs`` of ``ggml-quants.c`` without an importance
matrix, i.e. what ``ggml_quantize_chunk`` and so llama.cpp's ``llama-quantize`` write:
a search over 15 candidate scales per 32-element block, comparing float sums, so the
sums are accumulated sequentially in float32 in ggml's order. ``gguf.quants`` has no
encoder for these types; the tests hold this one to bytes ggml wrote.

(ggml's CPU backend quantizes with a second, quicker IQ4_NL encoder when it copies
float rows into an IQ4_NL tensor, ``quantize_row_iq4_nl_ref``, which skips the search;
tensorplug has one encoder per type, the one model files are written with.)
"""

from __future__ import annotations

import numpy as np

from .types import Type

__all__ = ["IQ4_DEQUANTIZE", "IQ4_QUANTIZE", "IQ4_TYPES", "KVALUES_IQ4NL"]

IQ4_TYPES = (Type.IQ4_NL, Type.IQ4_XS)

KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8
)
"""ggml's ``kvalues_iq4nl``: the 16 levels a 4-bit IQ4 code indexes."""

_F32 = np.float32
_LEVELS = KVALUES_IQ4NL.astype(_F32)
_GROUP_MAX_EPS = _F32(1e-15)
_NTRY = 7  # quantize_iq4_nl / quantize_iq4_xs search itry = -7..7 around -127/max


def _seq_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in ggml's loop order (sequential float32 adds)."""
    return np.add.accumulate(a, axis=-1, dtype=_F32)[..., -1]


def _nearest_int(a: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: adds 1.5·2^23 and reads the mantissa (ties to even)."""
    bits = (a.astype(_F32) + _F32(12582912.0)).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def _best_index(x: np.ndarray) -> np.ndarray:
    """``best_index_int8(16, kvalues, x)``: the index of the nearest level, the upper one
    unless the lower is strictly nearer (ggml's binary search; NaN gives 15)."""
    upper = np.clip(np.searchsorted(_LEVELS, x, side="right"), 1, 15)
    nearer_lower = (x - _LEVELS[upper - 1]) < (_LEVELS[upper] - x)
    idx = np.where(nearer_lower, upper - 1, upper)
    idx = np.where(x <= _LEVELS[0], 0, idx)
    return np.where(x >= _LEVELS[15], 15, idx).astype(np.uint8)


def _fit(x: np.ndarray, w: np.ndarray, inv_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``sumqx`` and ``sumq2`` of groups ``x`` (g, 32) coded against ``inv_scale`` (g,)."""
    q = _LEVELS[_best_index(inv_scale[:, None] * x)]
    wq = w * q
    return _seq_sum(wq * x), _seq_sum(wq * q)


def _block_scales(x: np.ndarray) -> np.ndarray:
    """The scale ``quantize_row_iq4_nl_impl`` picks for each 32-element group (g, 32):
    the weighted least-squares scale of the best of 15 candidate codings (0 for a group
    whose largest magnitude is below 1e-15)."""
    w = x * x
    idx = np.argmax(np.abs(x), axis=1)  # the first of equal magnitudes, as ggml keeps
    mx = np.take_along_axis(x, idx[:, None], axis=1)[:, 0]
    zero = np.abs(mx) < _GROUP_MAX_EPS
    sumqx, sumq2 = _fit(x, w, _F32(1) / (-mx / _LEVELS[0]))
    d = np.where(sumq2 > 0, sumqx / sumq2, _F32(0)).astype(_F32)
    best = d * sumqx
    for itry in range(-_NTRY, _NTRY + 1):
        sumqx, sumq2 = _fit(x, w, (_F32(itry + int(KVALUES_IQ4NL[0])) / mx).astype(_F32))
        take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(take, sumqx / sumq2, d).astype(_F32)
        best = np.where(take, d * sumqx, best).astype(_F32)
    return np.where(zero, _F32(0), d).astype(_F32)


def _inverse_or_zero(a: np.ndarray) -> np.ndarray:
    """ggml's ``a ? 1/a : 0``."""
    return np.where(a != 0, _F32(1) / np.where(a != 0, a, _F32(1)), _F32(0)).astype(_F32)


def _pack_codes(codes: np.ndarray) -> np.ndarray:
    """(n, 32k) codes → (n, 16k) bytes: element ``j`` of each 32-block in the low nibble
    of byte ``j``, element ``j + 16`` in its high nibble."""
    c = codes.reshape(codes.shape[0], -1, 2, 16)
    return (c[:, :, 0] | c[:, :, 1] << 4).reshape(codes.shape[0], -1)


def _unpack_levels(qs: np.ndarray) -> np.ndarray:
    """(n, 16k) bytes → (n, 32k) float32 levels, the inverse of :func:`_pack_codes`."""
    nibbles = np.stack([qs & 0x0F, qs >> 4], axis=-2)  # (n, 16k) → (n, 2, 16k)
    codes = nibbles.reshape(qs.shape[0], 2, -1, 16).transpose(0, 2, 1, 3)
    return _LEVELS[codes.reshape(qs.shape[0], -1)]


def _half(b: np.ndarray, at: int) -> np.ndarray:
    return b[:, at : at + 2].copy().view("<f2").astype(_F32)  # (n, 1)


# -- encoders: x (n, block) float32 -> out (n, type_size) uint8 ----------------------------


def _quant_iq4_nl(x: np.ndarray, out: np.ndarray) -> None:
    scale = _block_scales(x)
    codes = _best_index(_inverse_or_zero(scale)[:, None] * x)
    out[:, 0:2] = scale.astype("<f2").reshape(-1, 1).view(np.uint8)
    out[:, 2:18] = _pack_codes(codes)


def _quant_iq4_xs(x: np.ndarray, out: np.ndarray) -> None:
    n = x.shape[0]
    scales = _block_scales(x.reshape(-1, 32)).reshape(n, 8)
    idx = np.argmax(np.abs(scales), axis=1)
    max_scale = np.take_along_axis(scales, idx[:, None], axis=1)[:, 0]
    d = (-max_scale / _F32(32)).astype(_F32)
    ls = np.clip(_nearest_int(_inverse_or_zero(d)[:, None] * scales), -32, 31)
    dl = (d[:, None] * ls.astype(_F32)).astype(_F32)
    codes = _best_index(_inverse_or_zero(dl)[..., None] * x.reshape(n, 8, 32))
    ls = (ls + 32).astype(np.uint16)
    low = (ls & 0xF).astype(np.uint8)
    scales_h = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
    out[:, 0:2] = d.astype("<f2").reshape(-1, 1).view(np.uint8)
    out[:, 2:4] = scales_h.astype("<u2").reshape(-1, 1).view(np.uint8)
    out[:, 4:8] = low[:, 0::2] | low[:, 1::2] << 4
    out[:, 8:136] = _pack_codes(codes.reshape(n, 256))


# -- decoders: b (n, type_size) uint8 -> out (n, block) float32 ----------------------------


def _dequant_iq4_nl(b: np.ndarray, out: np.ndarray) -> None:
    out[...] = _half(b, 0) * _unpack_levels(b[:, 2:18])


def _dequant_iq4_xs(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    scales_h = b[:, 2:4].copy().view("<u2").astype(np.uint16)  # (n, 1)
    low = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=-1).reshape(n, 8)
    high = (scales_h >> (2 * np.arange(8, dtype=np.uint16))) & 3
    ls = (low.astype(np.int16) | high.astype(np.int16) << 4) - 32
    dl = _half(b, 0) * ls.astype(_F32)  # (n, 8)
    levels = _unpack_levels(b[:, 8:136]).reshape(n, 8, 32)
    out[...] = (dl[..., None] * levels).reshape(out.shape)


IQ4_QUANTIZE = {Type.IQ4_NL: _quant_iq4_nl, Type.IQ4_XS: _quant_iq4_xs}
IQ4_DEQUANTIZE = {Type.IQ4_NL: _dequant_iq4_nl, Type.IQ4_XS: _dequant_iq4_xs}

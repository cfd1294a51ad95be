"""ggml's K-quants: 256-element super-blocks with quantized per-sub-block scales.

Most GGUF files people download (``Q4_K_M``, ``Q5_K_M``, ``Q6_K``...) store their
weights in these types. The codecs here produce and read the bytes ggml does:

* decoding is bit for bit ``gguf.quants`` (and ``dequantize_row_q*_K`` in
  ``ggml-quants.c``), including the order of every float operation;
* encoding follows ggml's reference quantizers (``quantize_row_q*_K_ref``, the path
  llama.cpp takes without an importance matrix), whose search over candidate scales
  decides which codes a block gets. The search compares sums, so the sums here are
  accumulated sequentially in float32 in ggml's order (``np.add.accumulate``), never
  pairwise as ``np.sum`` would, or a near-tie would tip the other way.
  ``gguf.quants`` has no K-quant encoder; the tests compare with bytes ggml wrote.

Layouts (``ggml-common.h``; ``d`` and ``dmin`` are f16):

=====  =====  ================================================================
type   bytes  fields, in order
=====  =====  ================================================================
Q2_K   84     scales[16] (4-bit scale | 4-bit min), qs[64] (2-bit), d, dmin
Q3_K   110    hmask[32] (third bits), qs[64] (low 2 bits), scales[12] (6-bit), d
Q4_K   144    d, dmin, scales[12] (6-bit scales and mins), qs[128] (4-bit)
Q5_K   176    d, dmin, scales[12], qh[32] (fifth bits), qs[128]
Q6_K   210    ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d
=====  =====  ================================================================

ggml's Q8_K, the activation type of its K-quant dot products, is not a storage type
and is not here. Every function works on a chunk of blocks at once: encoders take
``(nblocks, 256)`` float32 and fill ``(nblocks, type_size)`` bytes, decoders the
reverse (:mod:`tensorplug.quants` calls them chunk by chunk).
"""

from __future__ import annotations

import numpy as np

from .types import Type

__all__ = ["K_DEQUANTIZE", "K_QUANTIZE", "K_TYPES", "QK_K"]

QK_K = 256
K_TYPES = (Type.Q2_K, Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K)

_F32 = np.float32
_GROUP_MAX_EPS = _F32(1e-15)


# -- helpers: ggml's float steps, vectorised over blocks ---------------------------------


def _seq_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in ggml's loop order (sequential float32 adds)."""
    return np.add.accumulate(a, axis=-1, dtype=_F32)[..., -1]


def _nearest(a: np.ndarray) -> np.ndarray:
    """``nearest_int``: round half to even (ggml adds 1.5·2^23), as int32."""
    return np.rint(a).astype(np.int32)


def _first_max_abs(a: np.ndarray) -> np.ndarray:
    """The signed value of largest magnitude along the last axis, the first on ties
    (ggml keeps the first: it replaces only on a strictly larger magnitude)."""
    idx = np.argmax(np.abs(a), axis=-1)
    return np.take_along_axis(a, idx[..., None], axis=-1)[..., 0]


def _running_max(a: np.ndarray) -> np.ndarray:
    """ggml's ``max = 0; if (v > max) max = v`` over the last axis: never below +0
    (a -0.0 min must not become a -0.0 ``dmin``)."""
    m = a.max(axis=-1)
    return np.where(m > 0, m, _F32(0)).astype(_F32)


def _recip(a: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (_F32(1) / a).astype(_F32)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (a / b).astype(_F32)


def _pack_2bit(codes: np.ndarray) -> np.ndarray:
    """(n, 256) codes 0..3 → (n, 64): byte ``l`` of each 128-half holds elements
    ``l``, ``l+32``, ``l+64``, ``l+96`` in bits 0-1, 2-3, 4-5, 6-7."""
    c = codes.astype(np.uint8).reshape(-1, 2, 4, 32)
    return (c[:, :, 0] | c[:, :, 1] << 2 | c[:, :, 2] << 4 | c[:, :, 3] << 6).reshape(-1, 64)


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & np.uint8(3)).reshape(-1, QK_K)


def _high_bits(codes: np.ndarray, nbits: int) -> np.ndarray:
    """Bit ``nbits`` of every code as a mask array: element ``j`` sets bit ``j // 32``
    of byte ``j % 32`` (Q3_K's hmask, Q5_K's qh)."""
    bits = (codes.astype(np.uint8) >> nbits) & np.uint8(1)
    weights = (np.uint8(1) << np.arange(8, dtype=np.uint8)).reshape(1, 8, 1)
    return (bits.reshape(-1, 8, 32) * weights).sum(axis=1, dtype=np.uint8)


def _unpack_high_bits(mask: np.ndarray) -> np.ndarray:
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    return ((mask.reshape(-1, 1, 32) >> shifts) & np.uint8(1)).reshape(-1, QK_K)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins (n, 8) → the 12 bytes ``get_scale_min_k4`` reads."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    out = np.empty((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | (ls[:, 4:] >> 4) << 6
    out[:, 4:8] = lm[:, :4] | (lm[:, 4:] >> 4) << 6
    out[:, 8:12] = (ls[:, 4:] & 0xF) | (lm[:, 4:] & 0xF) << 4
    return out


def _unpack_scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=1)
    return sc, mn


# -- ggml's scale searches ---------------------------------------------------------------


def _make_qkx2_quants(
    x: np.ndarray,
    w: np.ndarray,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants`` over groups ``x`` (g, n) with weights ``w``: the codes, the
    scale and the (positive) min of each group, found by trying ``nstep + 1`` scales
    around ``nmax / (max - min)`` and keeping the least weighted error."""
    nm = _F32(nmax)
    mn = np.minimum(x.min(axis=1), _F32(0))
    mx = x.max(axis=1)
    sum_w = _seq_sum(w)
    sum_x = _seq_sum(w * x)
    span = (mx - mn).astype(_F32)
    flat = span == 0
    iscale = _div(nm, span)
    scale = _recip(iscale)

    def codes(isc: np.ndarray) -> np.ndarray:
        # against the current min: a better fit moves it, and later steps use it
        return np.clip(_nearest(isc[:, None] * (x - mn[:, None])), 0, nmax)

    def error(sc: np.ndarray, m: np.ndarray, lv: np.ndarray) -> np.ndarray:
        diff = sc[:, None] * lv.astype(_F32) + m[:, None] - x
        return _seq_sum(w * (np.abs(diff) if use_mad else diff * diff))

    levels = codes(iscale)
    best = error(scale, mn, levels)
    for step in range(nstep + 1):
        isc = _div(_F32(rmin) + _F32(rdelta) * _F32(step) + nm, mx - mn)  # min as it now is
        aux = codes(isc)
        lf = aux.astype(_F32)
        sum_l = _seq_sum(w * lf)
        sum_l2 = _seq_sum(w * lf * lf)
        sum_xl = _seq_sum(w * lf * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = (det > 0) & ~flat
        this_scale = _div(sum_w * sum_xl - sum_x * sum_l, det)
        this_min = _div(sum_l2 * sum_x - sum_l * sum_xl, det)
        positive = this_min > 0
        this_min = np.where(positive, _F32(0), this_min)
        this_scale = np.where(positive, _div(sum_xl, sum_l2), this_scale)
        cur = error(this_scale, this_min, aux)
        take = ok & (cur < best)
        levels = np.where(take[:, None], aux, levels)
        best = np.where(take, cur, best)
        scale = np.where(take, this_scale, scale)
        mn = np.where(take, this_min, mn)
    levels = np.where(flat[:, None], 0, levels)
    scale = np.where(flat, _F32(0), scale)
    return levels, scale.astype(_F32), (-mn).astype(_F32)


def _make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants`` with ``rmse_type = 1`` (weights x²) over groups (g, n): codes
    offset by ``nmax`` and the scale, searched over 18 scales around ``nmax / max``."""
    mx = _first_max_abs(x)
    zero = np.abs(mx) < _GROUP_MAX_EPS
    w = x * x

    def attempt(isc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lv = np.clip(_nearest(isc[:, None] * x), -nmax, nmax - 1)
        lf = lv.astype(_F32)
        return lv, _seq_sum(w * x * lf), _seq_sum(w * lf * lf)

    iscale = _div(_F32(-nmax), mx)
    levels, sumlx, suml2 = attempt(iscale)
    scale = np.where(suml2 != 0, _div(sumlx, suml2), _F32(0))
    best = scale * sumlx
    for step in (*range(-9, 0), *range(1, 10)):
        isc = _div(-(_F32(nmax) + _F32(0.1) * _F32(step)), mx)
        lv, slx, sl2 = attempt(isc)
        take = (sl2 > 0) & (slx * slx > best * sl2)
        levels = np.where(take[:, None], lv, levels)
        scale = np.where(take, _div(slx, sl2), scale)
        best = np.where(take, scale * slx, best)
    levels = np.where(zero[:, None], 0, levels + nmax)
    return levels, np.where(zero, _F32(0), scale).astype(_F32)


def _make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants`` with ``do_rmse``: codes from ``nmax / max``, then up to five
    passes that move one code at a time while the weighted fit improves."""
    mx = _first_max_abs(x)
    zero = np.abs(mx) < _GROUP_MAX_EPS
    iscale = _div(_F32(-nmax), mx)
    levels = np.clip(_nearest(iscale[:, None] * x), -nmax, nmax - 1)
    w = x * x
    lf = levels.astype(_F32)
    sumlx = _seq_sum(w * x * lf)
    suml2 = _seq_sum(w * lf * lf)
    active = ~zero
    for _ in range(5):
        changed = np.zeros(x.shape[0], bool)
        for i in range(x.shape[1]):
            xi, wi, li = x[:, i], w[:, i], levels[:, i].astype(_F32)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new = np.clip(_nearest(_div(xi * sl2, slx)), -nmax, nmax - 1)
            nf = new.astype(_F32)
            slx2 = slx + wi * xi * nf
            sl22 = sl2 + wi * nf * nf
            take = (
                active
                & (slx > 0)
                & (new != levels[:, i])
                & (sl22 > 0)
                & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            )
            levels[:, i] = np.where(take, new, levels[:, i])
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
            changed |= take
        active &= changed
        if not active.any():
            break
    scale = np.where(suml2 > 0, _div(sumlx, suml2), _F32(0))
    levels = np.where(zero[:, None], 0, levels + nmax)
    return levels, np.where(zero, _F32(0), scale).astype(_F32)


def _requantize(
    x: np.ndarray, d: np.ndarray, dm: np.ndarray | None, lo: int, hi: int, levels: np.ndarray
) -> np.ndarray:
    """Codes for sub-blocks ``x`` (n, s, e) against their final stored scales ``d``
    (and mins ``dm``); sub-blocks whose scale is zero keep the search's ``levels``."""
    target = x if dm is None else x + dm[..., None]
    fresh = np.clip(_nearest(_div(target, d[..., None])), lo, hi)
    return np.where((d != 0)[..., None], fresh, levels)


# -- encoders ----------------------------------------------------------------------------


def _quant_q2_k(x: np.ndarray, out: np.ndarray) -> None:
    n = x.shape[0]
    groups = x.reshape(-1, 16)
    levels, scales, mins = _make_qkx2_quants(groups, np.abs(groups), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(n, 16), mins.reshape(n, 16)
    max_scale, max_min = _running_max(scales), _running_max(mins)
    q4 = _F32(15)
    has_scale, has_min = max_scale > 0, max_min > 0
    ls = np.where(has_scale[:, None], _nearest(_div(q4, max_scale)[:, None] * scales), 0)
    lm = np.where(has_min[:, None], _nearest(_div(q4, max_min)[:, None] * mins), 0)
    packed = (ls & 0xFF).astype(np.uint8) | ((lm << 4) & 0xFF).astype(np.uint8)
    d16 = np.where(has_scale, _div(max_scale, q4), _F32(0)).astype(np.float16)
    dmin16 = np.where(has_min, _div(max_min, q4), _F32(0)).astype(np.float16)
    d = d16.astype(_F32)[:, None] * (packed & 0xF).astype(_F32)
    dm = dmin16.astype(_F32)[:, None] * (packed >> 4).astype(_F32)
    codes = _requantize(x.reshape(n, 16, 16), d, dm, 0, 3, levels.reshape(n, 16, 16))
    out[:, 0:16] = packed
    out[:, 16:80] = _pack_2bit(codes.reshape(n, QK_K))
    out[:, 80:82] = d16.reshape(n, 1).view(np.uint8)
    out[:, 82:84] = dmin16.reshape(n, 1).view(np.uint8)


def _quant_q3_k(x: np.ndarray, out: np.ndarray) -> None:
    n = x.shape[0]
    levels, scales = _make_q3_quants(x.reshape(-1, 16), 4)
    scales = scales.reshape(n, 16)
    max_scale = _first_max_abs(scales)
    has = max_scale != 0
    iscale = _div(_F32(-32), max_scale)
    ls = np.where(has[:, None], np.clip(_nearest(iscale[:, None] * scales), -32, 31) + 32, 0)
    ls = ls.astype(np.uint8)
    packed = np.zeros((n, 12), np.uint8)
    if has.any():
        packed[:, 0:8] = (ls[:, 0:8] & 0xF) | (ls[:, 8:16] & 0xF) << 4
        high = (ls >> 4).reshape(n, 4, 4)  # [j // 4, j % 4]
        packed[:, 8:12] = high[:, 0] | high[:, 1] << 2 | high[:, 2] << 4 | high[:, 3] << 6
    packed = np.where(has[:, None], packed, 0).astype(np.uint8)
    d16 = np.where(has, _recip(iscale), _F32(0)).astype(np.float16)
    sc = ls.astype(np.int32) - 32
    d = d16.astype(_F32)[:, None] * sc.astype(_F32)
    codes = _requantize(x.reshape(n, 16, 16), d, None, -4, 3, levels.reshape(n, 16, 16) - 4)
    codes = (codes.reshape(n, QK_K) + 4).astype(np.uint8)
    out[:, 0:32] = _high_bits(codes, 2)
    out[:, 32:96] = _pack_2bit(codes & 3)
    out[:, 96:108] = packed
    out[:, 108:110] = d16.reshape(n, 1).view(np.uint8)


def _quant_q45_k(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, ...]:
    """What Q4_K and Q5_K share: the scale search per 32-element sub-block, the packed
    6-bit scales and mins, ``d``/``dmin`` and the final codes."""
    n = x.shape[0]
    groups = x.reshape(-1, 32)
    av_x = np.sqrt(_div(_seq_sum(groups * groups), _F32(32)))
    weights = av_x[:, None] + np.abs(groups)
    levels, scales, mins = _make_qkx2_quants(groups, weights, nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale, max_min = _running_max(scales), _running_max(mins)
    inv_scale = np.where(max_scale > 0, _div(_F32(63), max_scale), _F32(0))
    inv_min = np.where(max_min > 0, _div(_F32(63), max_min), _F32(0))
    ls = np.minimum(_nearest(inv_scale[:, None] * scales) & 0xFF, 63)
    lm = np.minimum(_nearest(inv_min[:, None] * mins) & 0xFF, 63)
    d16 = _div(max_scale, _F32(63)).astype(np.float16)
    dmin16 = _div(max_min, _F32(63)).astype(np.float16)
    d = d16.astype(_F32)[:, None] * ls.astype(_F32)
    dm = dmin16.astype(_F32)[:, None] * lm.astype(_F32)
    codes = _requantize(x.reshape(n, 8, 32), d, dm, 0, nmax, levels.reshape(n, 8, 32))
    return _pack_scale_min_k4(ls, lm), d16, dmin16, codes.reshape(n, QK_K).astype(np.uint8)


def _pack_nibble_pairs(codes: np.ndarray) -> np.ndarray:
    """(n, 256) codes → (n, 128): byte ``l`` of each 64-chunk holds element ``l`` in the
    low nibble and element ``l + 32`` in the high one."""
    c = (codes & 0xF).reshape(-1, 4, 2, 32)
    return (c[:, :, 0] | c[:, :, 1] << 4).reshape(-1, 128)


def _unpack_nibble_pairs(qs: np.ndarray) -> np.ndarray:
    shifts = np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return ((qs.reshape(-1, 4, 1, 32) >> shifts) & np.uint8(0xF)).reshape(-1, QK_K)


def _quant_q4_k(x: np.ndarray, out: np.ndarray) -> None:
    scales, d16, dmin16, codes = _quant_q45_k(x, 15, -1.0, 20)
    n = x.shape[0]
    out[:, 0:2] = d16.reshape(n, 1).view(np.uint8)
    out[:, 2:4] = dmin16.reshape(n, 1).view(np.uint8)
    out[:, 4:16] = scales
    out[:, 16:144] = _pack_nibble_pairs(codes)


def _quant_q5_k(x: np.ndarray, out: np.ndarray) -> None:
    scales, d16, dmin16, codes = _quant_q45_k(x, 31, -0.5, 15)
    n = x.shape[0]
    out[:, 0:2] = d16.reshape(n, 1).view(np.uint8)
    out[:, 2:4] = dmin16.reshape(n, 1).view(np.uint8)
    out[:, 4:16] = scales
    out[:, 16:48] = _high_bits(codes, 4)
    out[:, 48:176] = _pack_nibble_pairs(codes)


def _quant_q6_k(x: np.ndarray, out: np.ndarray) -> None:
    n = x.shape[0]
    levels, scales = _make_qx_quants(x.reshape(-1, 16), 32)
    scales = scales.reshape(n, 16)
    max_scale = _first_max_abs(scales)
    zero = np.abs(max_scale) < _GROUP_MAX_EPS
    iscale = _div(_F32(-128), max_scale)
    d16 = np.where(zero, _F32(0), _recip(iscale)).astype(np.float16)
    sc = np.where(zero[:, None], 0, np.minimum(127, _nearest(iscale[:, None] * scales)))
    sc8 = sc.astype(np.int8)
    d = d16.astype(_F32)[:, None] * sc8.astype(_F32)
    codes = _requantize(x.reshape(n, 16, 16), d, None, -32, 31, levels.reshape(n, 16, 16) - 32)
    codes = np.where(zero[:, None], 0, codes.reshape(n, QK_K) + 32).astype(np.uint8)
    c = codes.reshape(n, 2, 4, 32)  # [half, quarter, l]
    ql = np.concatenate([c[:, :, 0] & 0xF | (c[:, :, 2] & 0xF) << 4,
                         c[:, :, 1] & 0xF | (c[:, :, 3] & 0xF) << 4], axis=2)  # fmt: skip
    qh = c[:, :, 0] >> 4 | (c[:, :, 1] >> 4) << 2 | (c[:, :, 2] >> 4) << 4 | (c[:, :, 3] >> 4) << 6
    out[:, 0:128] = ql.reshape(n, 128)
    out[:, 128:192] = qh.reshape(n, 64)
    out[:, 192:208] = sc8.view(np.uint8)
    out[:, 208:210] = d16.reshape(n, 1).view(np.uint8)


# -- decoders ----------------------------------------------------------------------------


def _half(b: np.ndarray, at: int) -> np.ndarray:
    return b[:, at : at + 2].copy().view("<f2").astype(_F32)  # (n, 1)


def _dequant_q2_k(b: np.ndarray, out: np.ndarray) -> None:
    scales = b[:, 0:16]
    dl = _half(b, 80) * (scales & 0xF).astype(_F32)
    ml = _half(b, 82) * (scales >> 4).astype(_F32)
    q = _unpack_2bit(b[:, 16:80]).reshape(-1, 16, 16).astype(_F32)
    out[...] = (dl[..., None] * q - ml[..., None]).reshape(out.shape)


def _dequant_q3_k(b: np.ndarray, out: np.ndarray) -> None:
    raw = b[:, 96:108]
    low = np.concatenate([raw[:, 0:8] & 0xF, raw[:, 0:8] >> 4], axis=1)
    high = (raw[:, 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3  # [j % 4, j // 4]
    sc = (low | high.transpose(0, 2, 1).reshape(-1, 16) << 4).astype(np.int8) - np.int8(32)
    dl = _half(b, 108) * sc.astype(_F32)
    lo = _unpack_2bit(b[:, 32:96]).astype(np.int8)
    hi = _unpack_high_bits(b[:, 0:32]) ^ np.uint8(1)
    q = (lo - (hi << 2).astype(np.int8)).astype(_F32).reshape(-1, 16, 16)
    out[...] = (dl[..., None] * q).reshape(out.shape)


def _dequant_q45_k(b: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    sc, mn = _unpack_scale_min_k4(b[:, 4:16])
    d = _half(b, 0) * sc.astype(_F32)
    dm = _half(b, 2) * mn.astype(_F32)
    out[...] = (d[..., None] * q.reshape(-1, 8, 32).astype(_F32) - dm[..., None]).reshape(out.shape)


def _dequant_q4_k(b: np.ndarray, out: np.ndarray) -> None:
    _dequant_q45_k(b, _unpack_nibble_pairs(b[:, 16:144]), out)


def _dequant_q5_k(b: np.ndarray, out: np.ndarray) -> None:
    q = _unpack_nibble_pairs(b[:, 48:176]) | _unpack_high_bits(b[:, 16:48]) << 4
    _dequant_q45_k(b, q, out)


def _dequant_q6_k(b: np.ndarray, out: np.ndarray) -> None:
    nibbles = b[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (nibbles & 0xF).reshape(-1, 2, 4, 32)  # [half, quarter, l]
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = ((ql | (qh & 3) << 4).astype(np.int8) - np.int8(32)).reshape(-1, 16, 16)
    d = _half(b, 208) * b[:, 192:208].view(np.int8).astype(_F32)
    out[...] = (d[..., None] * q.astype(_F32)).reshape(out.shape)


K_QUANTIZE = {
    Type.Q2_K: _quant_q2_k,
    Type.Q3_K: _quant_q3_k,
    Type.Q4_K: _quant_q4_k,
    Type.Q5_K: _quant_q5_k,
    Type.Q6_K: _quant_q6_k,
}

K_DEQUANTIZE = {
    Type.Q2_K: _dequant_q2_k,
    Type.Q3_K: _dequant_q3_k,
    Type.Q4_K: _dequant_q4_k,
    Type.Q5_K: _dequant_q5_k,
    Type.Q6_K: _dequant_q6_k,
}

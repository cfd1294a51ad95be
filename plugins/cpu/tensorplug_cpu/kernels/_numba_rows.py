"""numba row kernels for the small per-token ops a generation step runs many times.

A generation step normalises a handful of 576- to 2048-wide rows per block: numpy
spends many times the arithmetic's few microseconds on call overhead (eight calls per
``rms_norm``). Arithmetic follows ggml's: the sum of float32 squares accumulated in
float64, the mean rounded to float32, ``1/sqrtf(mean + eps)`` in float32 (no fast-math).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from . import _numba_ir as _ir
from ._numba_cache import kernel
from ._numba_ir import f32_from_bits
from ._numba_quant import f32_to_f16_bits
from .job_blocks import SWIGLU


@kernel(nogil=True)  # a prompt's rows run in chunks on the worker pool
def rms_norm_rows(x: Any, out: Any, eps: float) -> None:
    """``out[r] = x[r] / sqrt(mean(x[r]²) + eps)`` for 2-d float32 ``x`` and ``out``."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        acc = 0.0
        for i in range(n):
            v = x[r, i]
            acc += np.float64(v * v)
        mean = np.float32(acc / n)
        scale = np.float32(1) / np.float32(math.sqrt(mean + np.float32(eps)))
        for i in range(n):
            out[r, i] = x[r, i] * scale


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 in two parts
_EXP_MAX, _EXP_MIN = np.float32(88.72284), np.float32(-87.33654)  # ln FLT_MAX, ln FLT_MIN
#: e^r − 1 − r ≈ r²·P(r) on |r| <= ln(2)/2 (Cephes' expf coefficients)
_P = [np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                              4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)]  # fmt: skip
_P0, _P1, _P2, _P3, _P4, _P5 = _P


@njit(inline="always")
def _pow2(k: Any) -> Any:
    """2^k for an integer-valued float32 ``k`` in [−126, 127]."""
    return f32_from_bits((np.int32(k) + np.int32(127)) << np.int32(23))  # type: ignore[call-arg]


@njit(inline="always")
def expf(x: Any) -> Any:
    """e^x for float32 ``x`` with no libm call and no branch, so a loop over it
    vectorizes (LLVM cannot vectorize ``math.exp``: a call per element would be most of
    a generation step's SwiGLU). ``x = n·ln 2 + r``, ``e^r`` by a degree-7
    polynomial, ``2^n`` built in the exponent bits of two factors (so ``2^128`` and
    ``2^-126`` need no special case). Within 3 ulp of numpy's ``exp`` where float32's
    result is normal (x in [−87.3, 88.7]); +inf above, 0 below (where it is subnormal,
    under 1.2e-38); NaN gives NaN."""
    n = np.floor(x * _LOG2E + np.float32(0.5))
    n = n if n > np.float32(-127) else np.float32(-127)  # selects, not min/max: no branch
    n = n if n < np.float32(128) else np.float32(128)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    half = np.floor(n * np.float32(0.5))
    y = ((p * (r * r) + r) + np.float32(1)) * _pow2(half) * _pow2(n - half)
    y = np.float32(np.inf) if x > _EXP_MAX else y  # NaN compares false: it stays NaN
    return np.float32(0) if x < _EXP_MIN else y


#: ggml's vector ``ggml_v_expf`` (``ggml-cpu/vec.h``): rounding constant 1.5·2^23,
#: log2(e), ln 2 in two parts, and the polynomial's coefficients, highest first
_VX_ROUND = np.float32(float.fromhex("0x1.8p23"))
_VX_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_VX_LN2_HI, _VX_LN2_LO = (np.float32(float.fromhex(h)) for h in ("0x1.62e4p-1", "0x1.7f7d1cp-20"))
_VX_C = [np.float32(float.fromhex(h)) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5",
                                                 "0x1.555e66p-3", "0x1.fffdb6p-2",
                                                 "0x1.ffffecp-1")]  # fmt: skip
_VX_C0, _VX_C1, _VX_C2, _VX_C3, _VX_C4 = _VX_C
_VX_LIMIT = np.float32(192)


@njit(inline="always")
def ggml_expf(x: Any) -> Any:
    """e^x for float32 ``x`` bit for bit as ggml's SIMD ``ggml_v_expf`` (AVX-512 and
    AVX2 alike), which ggml's CPU uses for softmax and SiLU on every full vector of
    lanes: ``n = round(x·log2 e)`` by the 1.5·2^23 trick, ``b = x − n·ln2`` in two fused
    steps, a fused degree-5 polynomial ``j``, and ``j·2^n`` (``vscalefps``, here two exact
    power-of-two factors and one rounding); ``|n| > 192`` gives 0 or +inf. Every step
    is a float32 operation in ggml's order (``fmaf`` fused where ggml fuses): the
    caller must not be compiled with fast-math, which would reorder them. No branch
    and no call where the CPU has FMA: a loop of it vectorizes. Differs from
    :func:`expf` (Cephes' polynomial) by up to a few ulp, enough to tip an 8-bit
    rounding of the activations downstream."""
    z = _ir.fmaf(x, _VX_LOG2E, _VX_ROUND)
    n = z - _VX_ROUND
    b = _ir.fmaf(-n, _VX_LN2_LO, _ir.fmaf(-n, _VX_LN2_HI, x))
    u = b * b
    j = _ir.fmaf(
        _ir.fmaf(_ir.fmaf(_VX_C0, b, _VX_C1), u, _ir.fmaf(_VX_C2, b, _VX_C3)),
        u,
        _ir.fmaf(_VX_C4, b, np.float32(1)),
    )
    nc = n if n > -_VX_LIMIT else -_VX_LIMIT  # selects (NaN → −192): no branch, no poison
    nc = nc if nc < _VX_LIMIT else _VX_LIMIT
    half = np.floor(nc * np.float32(0.5))
    res = j * _pow2(half) * _pow2(nc - half)
    huge = np.float32(np.inf) if n > np.float32(0) else np.float32(0)
    return huge if abs(n) > _VX_LIMIT else res


#: ``glu_rows`` kinds: SWIGLU, GEGLU (:mod:`.job_blocks`)


@kernel(nogil=True)
def glu_rows(x: Any, g: Any, out: Any, kind: int, gelu_table: Any) -> None:
    """``out = act(x)·g`` over 2-d float32 rows (views of any strides), in float32 as
    ggml: silu as ``x/(1 + e^-x)`` (with :func:`ggml_expf`, ggml's own vector ``expf``
    for SIMD lanes, bit for bit); gelu as ggml's CPU looks it up, in ``gelu_table``
    (:func:`.gelu_table.gelu_f16_table`; SwiGLU is given :data:`.gelu_table.NO_TABLE`)
    at x's f16 bits, with its clamps (0 for x <= -10, whatever g is; x for x >= 10)."""
    one = np.float32(1)
    if kind == SWIGLU:  # a loop of its own, with no branch or call: it vectorizes
        for r in range(x.shape[0]):
            for i in range(x.shape[1]):
                v = x[r, i]
                out[r, i] = v / (one + ggml_expf(-v)) * g[r, i]
        return
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            v = x[r, i]
            if v <= np.float32(-10):
                out[r, i] = np.float32(0)
            else:
                a = v if v >= np.float32(10) else gelu_table[_f16_bits(v)]
                out[r, i] = a * g[r, i]


@kernel(nogil=True)
def rope_rows(
    x: Any, out: Any, pos: Any, freq_factors: Any, ramp: Any, keep: Any, neox: bool,
    n_dims: int, theta_scale: Any, freq_scale: Any, mscale: Any,
) -> None:  # fmt: skip
    """ggml's ``rope_f32`` over ``(n_tokens, n_head, head_dim)`` float32 views, in the
    order of the numpy kernel's float32 operations: ``θ_i = pos·scale^i`` by repeated
    multiplication, divided by the frequency factors (if any), YaRN's ramp mix (if
    ``ramp`` is not empty) or ``·freq_scale``, then the rotation of each head's pairs;
    dimensions past ``n_dims`` are copied. ``out`` may alias ``x``. Products are fused
    where the GCC build of ggml fuses them (checked against llama.cpp's roped Q and K:
    unfused, 15% of the values are an ulp off from the second position on)."""
    half = n_dims // 2
    cos = np.empty(half, np.float32)
    sin = np.empty(half, np.float32)
    for t in range(x.shape[0]):
        theta = np.float32(pos[t])
        for i in range(half):
            if i > 0:
                theta = theta * theta_scale
            th = theta
            if freq_factors.size:
                th = th / freq_factors[i]
            if ramp.size:
                extrap = th * ramp[i]
                th = _ir.fmaf(th * freq_scale, keep[i], extrap)  # fused, as GCC builds ggml
            else:
                th = th * freq_scale
            cos[i] = np.float32(math.cos(th)) * mscale
            sin[i] = np.float32(math.sin(th)) * mscale
        for h in range(x.shape[1]):
            for i in range(half):
                j0, j1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
                x0, x1 = x[t, h, j0], x[t, h, j1]
                # ggml's x0·cos − x1·sin and x0·sin + x1·cos as GCC contracts them
                # (-ffp-contract=fast): the first product fused, the second rounded
                out[t, h, j0] = _ir.fmaf(x0, cos[i], -(x1 * sin[i]))
                out[t, h, j1] = _ir.fmaf(x0, sin[i], x1 * cos[i])
            for j in range(n_dims, x.shape[2]):
                out[t, h, j] = x[t, h, j]


def _stored(table: Any, v: Any) -> Any:
    """``v`` as ``table`` stores it (compiled per dtype, see the overload below)."""
    raise NotImplementedError  # only ever called from compiled code


@intrinsic
def _f16_bits_f16c(typingctx: Any, f: Any) -> Any:
    """The f16 bits of float32 ``f`` by the CPU's conversion (F16C's ``vcvtps2ph``,
    IEEE round to nearest even, as numpy): no branch, so a loop of it vectorizes."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


def _f16_bits(v: Any) -> Any:
    """The f16 bits of float32 ``v``, rounded to nearest even (compiled below)."""
    raise NotImplementedError  # only ever called from compiled code


@overload(_f16_bits, inline="always")
def _f16_bits_impl(v):  # type: ignore[no-untyped-def]  # numba: names only
    if _ir.HAS_F16C:
        return lambda v: _f16_bits_f16c(v)
    return lambda v: f32_to_f16_bits(v)  # the same rounding, in integers


@overload(_stored, inline="always")
def _stored_impl(table, v):  # type: ignore[no-untyped-def]  # numba: names only
    if isinstance(table, types.Array) and table.dtype == types.uint16:
        if _ir.HAS_F16C:
            return lambda table, v: _f16_bits_f16c(v)
        return lambda table, v: f32_to_f16_bits(v)  # the same rounding, in integers
    return lambda table, v: v


@kernel()
def set_rows(table: Any, values: Any, idx: Any) -> int:
    """``table[idx[k]] = values[k]`` for float32 ``values`` (k, n) and a float32 or raw
    f16 (``uint16``) ``table``: a KV cache's new rows (for a generation step's one row,
    numpy's fancy indexing and bounds checks cost several microseconds). Every index is checked
    before anything is written; returns the position of the first bad one (the table
    untouched), or -1."""
    for k in range(idx.size):
        if idx[k] < 0 or idx[k] >= table.shape[0]:
            return k
    for k in range(idx.size):
        row = idx[k]
        for i in range(values.shape[1]):
            table[row, i] = _stored(table, values[k, i])
    return -1


@kernel(nogil=True)
def hadamard_rows(x: Any, out: Any, n: int) -> None:
    """Each run of ``n`` values of 2-d float32 ``x``'s rows times ``H_n/√n`` into
    ``out`` (C-contiguous, ``x``'s shape): ggml's fast Walsh–Hadamard transform, each
    value times ``1/sqrtf(n)`` first, then the butterflies ``(u + v, u − v)`` over spans
    1, 2, 4… n/2 (every output the same chain of float32 additions as ggml's, whatever
    order its vectors take them in)."""
    scale = np.float32(1) / np.float32(math.sqrt(np.float32(n)))
    width = x.shape[1]
    for r in range(x.shape[0]):
        for j in range(width):
            out[r, j] = x[r, j] * scale
        for c in range(0, width, n):
            span = 1
            while span < n:
                for i in range(c, c + n, 2 * span):
                    for j in range(i, i + span):
                        u, v = out[r, j], out[r, j + span]
                        out[r, j] = u + v
                        out[r, j + span] = u - v
                span *= 2

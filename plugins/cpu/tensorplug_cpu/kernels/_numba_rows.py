"""numba row kernels for the small per-token ops a generation step runs many times.

A generation step normalises a handful of 576- to 2048-wide rows per block: numpy
spends ~40 µs of call overhead on a few microseconds of arithmetic (eight calls per
``rms_norm``). Arithmetic follows ggml's: the sum of float32 squares accumulated in
float64, the mean rounded to float32, ``1/sqrtf(mean + eps)`` in float32 (no fast-math).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit


@njit(cache=True)
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


#: ``glu_rows`` kinds
SWIGLU, GEGLU = 0, 1
_SQRT_2_OVER_PI = np.float32(math.sqrt(2.0 / math.pi))
_GELU_COEF_A = np.float32(0.044715)


@njit(cache=True)
def glu_rows(x: Any, g: Any, out: Any, kind: int) -> None:
    """``out = act(x)·g`` over 2-d float32 rows (views of any strides), in float32 as
    ggml: silu as ``x/(1 + e^-x)``; gelu's tanh form with its clamps (0 for x <= -10,
    whatever g is; x for x >= 10)."""
    one, half = np.float32(1), np.float32(0.5)
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            v = x[r, i]
            if kind == SWIGLU:
                a = v / (one + np.float32(math.exp(-v)))
                out[r, i] = a * g[r, i]
            elif v <= np.float32(-10):
                out[r, i] = np.float32(0)
            else:
                if v >= np.float32(10):
                    a = v
                else:
                    inner = _SQRT_2_OVER_PI * v * (one + _GELU_COEF_A * v * v)
                    a = half * v * (one + np.float32(math.tanh(inner)))
                out[r, i] = a * g[r, i]


@njit(cache=True)
def rope_rows(
    x: Any, out: Any, pos: Any, freq_factors: Any, ramp: Any, keep: Any, neox: bool,
    n_dims: int, theta_scale: Any, freq_scale: Any, mscale: Any,
) -> None:  # fmt: skip
    """ggml's ``rope_f32`` over ``(n_tokens, n_head, head_dim)`` float32 views, in the
    order of the numpy kernel's float32 operations: ``θ_i = pos·scale^i`` by repeated
    multiplication, divided by the frequency factors (if any), YaRN's ramp mix (if
    ``ramp`` is not empty) or ``·freq_scale``, then the rotation of each head's pairs;
    dimensions past ``n_dims`` are copied. ``out`` may alias ``x``."""
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
                th = (th * freq_scale) * keep[i] + extrap
            else:
                th = th * freq_scale
            cos[i] = np.float32(math.cos(th)) * mscale
            sin[i] = np.float32(math.sin(th)) * mscale
        for h in range(x.shape[1]):
            for i in range(half):
                j0, j1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
                x0, x1 = x[t, h, j0], x[t, h, j1]
                out[t, h, j0] = x0 * cos[i] - x1 * sin[i]
                out[t, h, j1] = x0 * sin[i] + x1 * cos[i]
            for j in range(n_dims, x.shape[2]):
                out[t, h, j] = x[t, h, j]

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

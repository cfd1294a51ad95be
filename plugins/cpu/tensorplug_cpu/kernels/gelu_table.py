"""GELU as ggml's CPU computes it: a lookup in a table of 65536 f16 values.

ggml's CPU builds (``GGML_GELU_FP16``, on by default) do not evaluate the tanh form for
each element of ``gelu`` and ``geglu``: the input is rounded to f16 and its bits index
``ggml_table_gelu_f16``, the tanh form of every f16 value rounded to f16 (built once by
``ggml_cpu_init``); inputs <= -10 give 0 and inputs >= 10 themselves. The result is
within an f16 rounding (2^-11 relative) of the formula, and that much is what separated
Gemma 3's GeGLU from llama.cpp's: 3.6e-4 of the largest value at the first FFN of
Gemma 3 270M, which its later 8-bit activation rounding grew to a 1.9 logit difference.

The table here is built the way ``ggml_cpu_init`` builds it, in float32 as GCC compiles
``ggml_gelu_f32`` (``1 + 0.044715·x·x`` fused into one multiply-add) with a correctly
rounded ``tanhf``; it equals the table of llama-cpp-python 0.3.36's ggml in all 65536
entries (``tests/cpu/test_cpu_gelu_table.py`` holds it to that table's recorded digest).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tensorplug.opcodes import GluOp

__all__ = ["NO_TABLE", "gelu_f16_table", "gelu_table_into", "glu_table"]

_SQRT_2_OVER_PI = np.float32(math.sqrt(2.0 / math.pi))
_GELU_COEF_A = np.float32(0.044715)


def _build_table() -> np.ndarray:
    """``f16(gelu(x))`` as float32 for every f16 bit pattern ``x`` (index = the bits)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    one, half = np.float32(1), np.float32(0.5)
    with np.errstate(all="ignore"):  # inf and NaN patterns: never looked up (clamped)
        # fmaf(0.044715·x, x, 1): the float64 product is exact, its sum rounded once more
        inner = ((_GELU_COEF_A * x).astype(np.float64) * x + 1.0).astype(np.float32)
        arg = _SQRT_2_OVER_PI * x * inner
        t = np.tanh(arg.astype(np.float64)).astype(np.float32)  # tanhf, correctly rounded
        gelu = half * x * (one + t)
        return gelu.astype(np.float16).astype(np.float32)


@functools.cache
def gelu_f16_table() -> np.ndarray:
    """``ggml_table_gelu_f16`` widened to float32, indexed by an f16 value's bits (read
    only). Built when first asked for, by a model with GELU: built with the module, it
    would cost every launch its building time, with GELU or without."""
    table = _build_table()
    table.flags.writeable = False
    return table


#: What the gated-activation kernels are given for the table when they compute no GELU
#: (SwiGLU): an array of the table's type (one entry, read only), so that they compile
#: once for both.
NO_TABLE = np.zeros(1, np.float32)
NO_TABLE.flags.writeable = False


def glu_table(fn: GluOp) -> np.ndarray:
    """The table the gated-activation kernels are given for ``fn``: GeGLU's is ggml's
    (:func:`gelu_f16_table`), any other's :data:`NO_TABLE`."""
    return gelu_f16_table() if fn is GluOp.GEGLU else NO_TABLE


def gelu_table_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``out = gelu(x)`` by ggml's table (``ggml_vec_gelu_f32``): 0 for x <= -10, x for
    x >= 10, else the entry of x's f16 bits (round to nearest even, as F16C). ``out``
    may alias ``x`` or ``tmp`` (unused: the signature of the other activations)."""
    del tmp
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
        low, high = x <= -10, x >= 10
        big = x[high] if high.any() else None
    np.take(gelu_f16_table(), bits, out=out)
    out[low] = 0
    if big is not None:
        out[high] = big

"""The activations as numpy loops over float32 arrays, with ggml's arithmetic.

A leaf of the kernels: the unary and gated-unit builders (:mod:`.elementwise`) and the
numpy provider's gated units (:mod:`.numpy_kernels`) both run them, so they live below
both. Each takes ``(x, tmp, out)``: a scratch ``tmp`` for the functions that need one
(:data:`NEEDS_TMP`), and ``out`` may alias ``x``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tensorplug.opcodes import GluOp, UnaryOp

from .gelu_table import gelu_table_into

__all__ = ["GLU_ACTIVATIONS", "NEEDS_TMP", "UNARY_FNS", "UnaryFn", "one_plus_erf"]


def _silu_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``x / (1 + e^-x)`` as ggml writes it (so silu(-inf) is NaN, as in ggml); ``out``
    may alias ``x`` or ``tmp``."""
    np.negative(x, out=tmp)
    with np.errstate(over="ignore"):
        np.exp(tmp, out=tmp)
    tmp += 1
    with np.errstate(invalid="ignore"):
        np.divide(x, tmp, out=out)


def _sigmoid_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    np.negative(x, out=tmp)
    np.exp(tmp, out=tmp)
    tmp += 1
    np.divide(1, tmp, out=out)


def _gelu_quick_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``x·σ(1.702·x)`` = ``x / (1 + exp(-1.702·x))``, ggml's ``ggml_gelu_quick_f32``."""
    with np.errstate(over="ignore"):
        np.multiply(x, np.float32(-1.702), out=tmp)
        np.exp(tmp, out=tmp)
    tmp += 1
    np.divide(x, tmp, out=out)


#: Coefficients of Numerical Recipes' erfc (fractional error below 1.2e-7 everywhere).
_ERFC_C = tuple(np.float32(c) for c in (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
))  # fmt: skip


def one_plus_erf(x: np.ndarray) -> np.ndarray:
    """``1 + erf(x)`` in float32 without cancellation: ``erfc(-x)`` for x < 0 and
    ``2 - erfc(x)`` for x >= 0, erfc from a rational fit (numpy has no erf). The GPU
    kernels compute the same expression (``tp_one_plus_erf``)."""
    z = np.abs(x).astype(np.float32)
    t = np.float32(1) / (np.float32(1) + np.float32(0.5) * z)
    poly = _ERFC_C[-1]
    for c in reversed(_ERFC_C[1:-1]):
        poly = c + t * poly
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        erfc = t * np.exp(-z * z + _ERFC_C[0] + t * poly)
    return np.where(x < 0, erfc, np.float32(2) - erfc).astype(np.float32)


def _gelu_erf_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """``0.5·x·(1 + erf(x/√2))``, ggml's ``ggml_gelu_erf``."""
    tmp[...] = one_plus_erf(x * np.float32(1 / math.sqrt(2)))
    tmp *= 0.5
    with np.errstate(invalid="ignore"):
        np.multiply(tmp, x, out=out)


def _relu_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    # fmax ignores NaN, giving 0 for NaN like ggml's ``x > 0 ? x : 0``
    np.fmax(x, 0, out=out)


UnaryFn = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _direct(fn: np.ufunc) -> UnaryFn:
    def run(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
        fn(x, out=out)

    return run


#: Unary functions on float32 arrays: ``fn(x, tmp, out)`` with a scratch ``tmp``.
UNARY_FNS: dict[UnaryOp, UnaryFn] = {
    UnaryOp.ABS: _direct(np.abs),
    UnaryOp.NEG: _direct(np.negative),
    UnaryOp.RELU: _relu_into,
    UnaryOp.GELU: gelu_table_into,  # ggml's f16 table, as its CPU computes gelu
    UnaryOp.SILU: _silu_into,
    UnaryOp.EXP: _direct(np.exp),
    UnaryOp.TANH: _direct(np.tanh),
    UnaryOp.SIGMOID: _sigmoid_into,
    UnaryOp.GELU_QUICK: _gelu_quick_into,
    UnaryOp.GELU_ERF: _gelu_erf_into,
}
NEEDS_TMP = {UnaryOp.GELU, UnaryOp.SILU, UnaryOp.SIGMOID, UnaryOp.GELU_QUICK, UnaryOp.GELU_ERF}

#: The activation of each gated unit (:class:`~tensorplug.GluOp`).
GLU_ACTIVATIONS: dict[GluOp, UnaryFn] = {
    GluOp.SWIGLU: _silu_into,
    GluOp.REGLU: _relu_into,
    GluOp.GEGLU: gelu_table_into,
    GluOp.GEGLU_ERF: _gelu_erf_into,
    GluOp.GEGLU_QUICK: _gelu_quick_into,
}

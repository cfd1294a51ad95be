"""ggml's Q8_1 activation blocks in numpy: the independent formula the 8-bit integer
matrix-vector kernels (k_quantize_q8_1 + k_mvq_*) are held to.

Per 32-value block of a row: ``d = amax / 127`` in float32, codes ``x / d`` (float32
quotient) rounded half away from zero (0 for an all-zero block), ``s = d * sum(codes)``
in float32. The product the kernels compute is then exactly the dequantized weights
times ``d * codes``, up to float32 rounding of the scales and sums.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.quants import dequantize, quantize

__all__ = [
    "Product",
    "cuda_product",
    "error_bound",
    "f16_product",
    "q8_1_reference",
    "q8_1_values",
]


def q8_1_reference(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``b``'s rows as Q8_1 blocks: (d, s, codes); d and s float32 of shape
    ``(..., K / 32)``, codes int8 of shape ``(..., K / 32, 32)``."""
    x = np.ascontiguousarray(b, np.float32).reshape(*b.shape[:-1], -1, 32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (x / d).astype(np.float64)  # the float32 quotient, as the kernel's
    codes = np.where(amax > 0, np.sign(v) * np.floor(np.abs(v) + 0.5), 0).astype(np.int8)
    s = (d[..., 0] * codes.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float32)
    return d[..., 0], s, codes


def q8_1_values(b: np.ndarray) -> np.ndarray:
    """``b`` as the kernels see it after quantization: ``d * code``, float64."""
    d, _, codes = q8_1_reference(b)
    return (codes.astype(np.float64) * d[..., None].astype(np.float64)).reshape(b.shape)


def f16_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` as ggml-cuda's cuBLAS path computes it for F16 and quantized weights:
    both operands rounded to F16, summed in F32, the result rounded to F16."""
    w16, x16 = w.astype(np.float16).astype(np.float32), x.astype(np.float16).astype(np.float32)
    return (x16 @ w16.T).astype(np.float16).astype(np.float32)


def cuda_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` for dequantized weights ``w`` as the CUDA backend computes it: up to 8
    tokens with Q8_1 activations (integer dot products), more on cuBLAS's F16 operands."""
    return q8_1_values(x) @ w.T if x.shape[0] <= 8 else f16_product(x, w)


def error_bound(xb: np.ndarray, wa: np.ndarray) -> np.ndarray:
    """Allowed |got - xb @ wa.T|: float32 rounding of sums of |x||w| (a wrong code or
    scale anywhere in a row is orders of magnitude more)."""
    return 1e-5 * (np.abs(xb) @ np.abs(wa).T) + 1e-30


class Product:
    """y = mul_mat(w, x) for random quantized weights and ``tokens`` tokens, allocated
    on ``backend``; ``new_input`` sets a fresh x, ``check`` holds y to the formula."""

    def __init__(
        self, backend: Any, wtype: Type, tokens: int, k: int = 512, n_out: int = 9
    ) -> None:
        rng = np.random.default_rng(tokens * k + n_out)
        self.wtype, self.rng = wtype, rng
        self.stored = quantize(rng.standard_normal((n_out, k)).astype(np.float32), wtype)
        self.w = tp.new_tensor(wtype, (n_out, k), "w")
        self.x = tp.new_tensor("f32", (tokens, k), "x")
        self.y = ops.mul_mat(self.w, self.x)
        self.graph = tp.Graph(self.y)
        self.buffer = tp.alloc_tensors([self.w, self.x, self.y], backend.buffer_type())
        tp.set_array(self.w, self.stored)

    def new_input(self) -> np.ndarray:
        x = self.rng.standard_normal(self.x.shape).astype(np.float32)
        tp.set_array(self.x, x)
        return x

    def check(self, x: np.ndarray) -> None:
        wa = dequantize(self.stored, self.wtype).reshape(self.w.shape).astype(np.float64)
        xb = q8_1_values(x)
        assert np.all(np.abs(tp.get_array(self.y) - xb @ wa.T) <= error_bound(xb, wa))

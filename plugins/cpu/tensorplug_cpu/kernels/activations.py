"""The activations as ggml rounds them before it multiplies them by each weight type.

ggml's CPU never multiplies a quantized (or half-precision) weight by a float32
activation: it first converts the activation row to the weight type's ``vec_dot_type``
and multiplies the two encodings. To give llama.cpp's numbers, every path of
:mod:`.dispatch` rounds the activations the same way, type by type
(:data:`VEC_DOT`, :func:`vec_dot_type`):

* **Q8_0** (Q4_0, Q5_0, Q8_0, IQ4_NL): 32-value blocks, ``d = amax/127`` stored as f16,
  codes ``round-half-even(x · 127/amax)`` (x86's ``_mm256_round_ps``).
* **Q8_1** (Q4_1, Q5_1): Q8_0's codes and scale, plus ``s = f16(d · Σcode)`` with
  ``d`` the float32 scale: the weights' offset ``m`` is multiplied by ``s``, so the
  offset's share of a product carries ``s``'s f16 rounding.
* **Q8_K** (the K-quants, IQ4_XS): 256-value super-blocks, ``iscale = −127/max`` where
  ``max`` is the (signed) value of largest magnitude, codes ``min(127,
  nearest_int(iscale·x))``, ``d = 1/iscale`` kept in float32 (``quantize_row_q8_K_ref``,
  which x86 runs).
* **F16** (F16 weights) and **BF16** (BF16 weights): each value rounded to nearest even.

The integer kernels quantize in numba (:mod:`._numba_quant`); the paths that decode
weights to float32 (BLAS, the float-fused kernels) multiply by :func:`round_rows`'s
values ``d·code`` instead, and add :func:`q8_1_offset_correction` for Q8_1 (its ``s``
is not ``d·Σcode`` in float): the same sums, only the float order differs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tensorplug.quants import bf16_to_f32, f32_to_bf16
from tensorplug.types import Type

__all__ = [
    "BF16",
    "F16",
    "NONE",
    "Q8_0",
    "Q8_1",
    "Q8_K",
    "VEC_DOT",
    "q8_1_offset_correction",
    "round_rows",
    "vec_dot_type",
]

Q8_0, Q8_1, Q8_K, F16, BF16, NONE = "Q8_0", "Q8_1", "Q8_K", "F16", "BF16", "F32"

#: the weight types whose ``vec_dot_type`` is not the rule of :func:`vec_dot_type`
VEC_DOT: Mapping[Type, str] = {
    Type.F32: NONE, Type.F16: F16, Type.BF16: BF16, Type.Q4_1: Q8_1, Type.Q5_1: Q8_1,
}  # fmt: skip


def vec_dot_type(t: Type) -> str:
    """What ggml's x86 CPU rounds activations to before multiplying them by ``t``
    weights: :data:`VEC_DOT`'s entry, else Q8_K for 256-value super-blocks, else Q8_0."""
    if t in VEC_DOT:
        return VEC_DOT[t]
    return Q8_K if t.block_size == 256 else Q8_0


def _q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes as float32 ``(..., n/32, 32)``, f16-rounded scales ``(..., n/32, 1)``)."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    codes = np.rint(blocks * inv)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    return codes, d


def _q8_k(x: np.ndarray) -> np.ndarray:
    """Q8_K's ``d·code`` (float32) of rows ``x`` (``n`` a multiple of 256)."""
    blocks = x.reshape(*x.shape[:-1], -1, 256)
    first = np.abs(blocks).argmax(axis=-1)[..., None]  # the first of the largest, as ggml
    big = np.take_along_axis(blocks, first, axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(big != 0, np.float32(-127) / big, np.float32(0)).astype(np.float32)
        d = np.where(big != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    codes = np.minimum(np.rint(blocks * iscale), np.float32(127))
    return (codes * d).reshape(x.shape)


def round_rows(x: np.ndarray, t: Type, out: np.ndarray | None = None) -> np.ndarray:
    """``x`` (float32, rows on the last axis) as ggml sees it once rounded for ``t``
    weights: ``d·code`` for the Q8 types, the half-precision value for F16 and BF16,
    ``x`` itself for F32. Written into ``out`` when given; returns it."""
    kind = vec_dot_type(t)
    x = np.asarray(x, np.float32)
    if kind == NONE:
        values = x
    elif kind == F16:
        values = x.astype(np.float16).astype(np.float32)
    elif kind == BF16:
        values = bf16_to_f32(f32_to_bf16(x))
    elif kind == Q8_K:
        values = _q8_k(x)
    else:
        codes, d = _q8_0(x)
        values = (codes * d).reshape(x.shape)
    if out is None:
        return np.array(values, np.float32, copy=True)
    np.copyto(out, values)
    return out


def q8_1_offset_correction(x: np.ndarray) -> np.ndarray:
    """Per 32-value block of rows ``x``: ``s − d·Σcode`` (float32 ``(..., n/32)``), what
    Q8_1's f16-rounded ``s`` adds to each block's offset term beyond :func:`round_rows`'s
    values. ``Σ_b m_w[o, b]·correction[t, b]`` completes a product of Q4_1/Q5_1 weights
    computed from the decoded weights and :func:`round_rows`."""
    codes, d = _q8_0(np.asarray(x, np.float32))
    d32 = np.abs(x.reshape(codes.shape)).max(axis=-1) / np.float32(127)
    total = codes.sum(axis=-1, dtype=np.float32)  # exact: |Σ| <= 32·127
    s = (d32 * total).astype(np.float16).astype(np.float32)
    return (s - d[..., 0] * total).astype(np.float32)

"""Shared helpers for the CPU backend tests (no tests here).

``place`` puts every tensor of a graph into one host buffer with ``alloc_tensors``
(views get their base's memory), standing in for the graph allocator; ``nmse`` is the
conformance error measure of DESIGN.md. References in the tests are float64 numpy
written from the op contracts, never calls into the backend's kernels.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

import tensorplug as tp

if TYPE_CHECKING:
    from tensorplug_cpu.backend import CpuBackend

__all__ = [
    "throwaway_cache_env",
    "backend_for",
    "compute",
    "ggml_activations",
    "ggml_gelu",
    "ggml_product",
    "int8_path",
    "nmse",
    "place",
    "q8_activations",
    "q8_k_activations",
    "q8_k_blocks",
]


def backend_for(jit: bool = True) -> CpuBackend:
    """A fresh CPU backend straight from the plugin (no registry involved)."""
    from tensorplug_cpu.device import create_reg

    # the CPU device's init_backend makes a CpuBackend (typed as any backend)
    return cast("CpuBackend", create_reg().device(0).init_backend(None if jit else "jit=0"))


def place(graph: tp.Graph, extra: Iterable[tp.Tensor] = ()) -> tp.Buffer:
    """Allocate every tensor of ``graph`` (and ``extra``) in one new host buffer."""
    buf = tp.alloc_tensors([*graph.leafs, *graph.nodes, *extra], tp.host_buffer_type())
    assert buf is not None, "every tensor of the graph already has memory"
    buf.clear(0xAB)  # garbage, so that a kernel that skips work is caught
    return buf


def compute(
    out: tp.Tensor | list[tp.Tensor],
    inputs: dict[tp.Tensor, np.ndarray],
    backend: tp.Backend | None = None,
) -> tp.Graph:
    """Build, place, fill and compute the graph of ``out``; return the graph."""
    g = tp.Graph(out)
    place(g, inputs)
    for t, values in inputs.items():
        tp.set_array(t, values)
    (backend or backend_for()).graph_compute(g)
    return g


def nmse(actual: np.ndarray, expected: np.ndarray) -> float:
    """Σ(a − b)² / Σb², the conformance error; NaN anywhere fails."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    assert not np.isnan(a).any(), "result has NaN"
    return float(((a - b) ** 2).sum() / max((b**2).sum(), 1e-300))


def q8_activations(b: np.ndarray) -> np.ndarray:
    """``b`` (float32 rows) as ggml's x86 CPU path rounds it to Q8_0 (and Q8_1, whose
    codes are the same) before an integer dot product with 32-block weights: 32-value
    blocks, ``d = f16(amax/127)``, codes ``rint(x·(127/amax))`` in float32; returned as
    the float64 values ``d·code``."""
    codes, d, _ = q8_0_blocks(b)
    return (codes * d.astype(np.float16).astype(np.float64)).reshape(b.shape)


def q8_0_blocks(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes float64 ``(..., n/32, 32)``, float32 scales ``amax/127`` ``(..., n/32, 1)``,
    the float32 rows)."""
    x = np.ascontiguousarray(b, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    codes = np.rint(blocks * inv).astype(np.float64)
    return codes, (amax / np.float32(127)).astype(np.float32), x


def q8_k_blocks(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``b`` as ggml's ``quantize_row_q8_K_ref`` rounds it for the K-quants: 256-value
    super-blocks, ``iscale = −127/max`` (float32, ``max`` the first value of largest
    magnitude, its sign kept), codes ``min(127, rint(iscale·x))``, ``d = 1/iscale`` in
    float32. Returns the codes (int64 ``(..., n/256, 256)``) and the float32 ``d``
    (``(..., n/256, 1)``)."""
    x = np.ascontiguousarray(b, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, 256)
    big = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(big != 0, np.float32(-127) / big, 0).astype(np.float32)
        d = np.where(big != 0, np.float32(1) / iscale, 0).astype(np.float32)
    return np.minimum(np.rint(blocks * iscale), 127).astype(np.int64), d


def q8_k_activations(b: np.ndarray) -> np.ndarray:
    """``b`` rounded as :func:`q8_k_blocks`, as the float64 values ``d·code``."""
    codes, d = q8_k_blocks(b)
    return (codes * d.astype(np.float64)).reshape(b.shape)


def ggml_activations(b: np.ndarray, t: tp.Type) -> np.ndarray:
    """``b`` as ggml's x86 CPU rounds it before multiplying it by ``t`` weights (the
    weight type's ``vec_dot_type``), float64: Q8_1 for Q4_1/Q5_1 (the codes of Q8_0,
    see :func:`ggml_product` for its ``s``), Q8_K for the 256-value K-quants, Q8_0 for
    the other quantized types, F16 or BF16 for those weights, F32 as it is."""
    x = np.asarray(b, np.float32)
    if t == tp.Type.F32:
        return x.astype(np.float64)
    if t == tp.Type.F16:
        return x.astype(np.float16).astype(np.float64)
    if t == tp.Type.BF16:
        from tensorplug.quants import bf16_to_f32, f32_to_bf16

        return bf16_to_f32(f32_to_bf16(x)).astype(np.float64)
    return q8_k_activations(x) if t.block_size == 256 else q8_activations(x)


#: ggml's ``ggml_table_gelu_f16`` as llama-cpp-python's ggml filled it
#: (``tests/data/make_gelu_fixture.py``), as float32
_GELU_TABLE = (
    np.load(Path(__file__).parent / "data" / "gelu_llamacpp.npz")["table"]
    .view(np.float16)
    .astype(np.float32)
)


def ggml_gelu(x: np.ndarray) -> np.ndarray:
    """GELU as ggml's CPU computes it (``GGML_GELU_FP16``), float64: 0 at or below -10,
    x at or above 10, else ggml's table at the f16 bits of float32 ``x`` (within an f16
    rounding of the tanh formula; ``tests/cpu/test_cpu_gelu_table.py`` says why)."""
    x32 = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        looked = _GELU_TABLE[x32.astype(np.float16).view(np.uint16)]
    return np.where(x32 <= -10, 0.0, np.where(x32 >= 10, x32, looked)).astype(np.float64)


def ggml_product(b: np.ndarray, w64: np.ndarray, t: tp.Type, raw: np.ndarray) -> np.ndarray:
    """``b @ W.T`` as ggml computes it for ``t`` weights (decoded values ``w64``, raw
    bytes ``raw``, a row of blocks per weight row), in float64: the activations of
    :func:`ggml_activations`, and for Q4_1/Q5_1 each block's offset ``m`` times Q8_1's
    ``s = f16(d·Σcode)`` (``d`` the float32 ``amax/127``) in place of ``d_x·Σcode``."""
    out = ggml_activations(b, t) @ w64.T
    if t not in (tp.Type.Q4_1, tp.Type.Q5_1):
        return out
    codes, d, _ = q8_0_blocks(b)
    total = codes.sum(axis=-1)
    s = (d[..., 0] * total.astype(np.float32)).astype(np.float16).astype(np.float64)
    delta = s - d[..., 0].astype(np.float16).astype(np.float64) * total
    blocks = np.ascontiguousarray(raw).reshape(w64.shape[0], -1, t.type_size)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return out + delta @ m.T


#: Weight types whose few-token products use Q8_0 activations when numba is there.
INT8_TYPES = (tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_0, tp.Type.Q5_1, tp.Type.Q8_0,
              tp.Type.Q4_K, tp.Type.Q6_K)  # fmt: skip


def int8_path(t: tp.Type, n_tokens: int, jit: bool = True) -> bool:
    """Whether the CPU backend computes this product with Q8_0 activations."""
    from tensorplug_cpu.kernels.dispatch import matvec_max_tokens
    from tensorplug_cpu.kernels.jit import load_jit

    return jit and load_jit() is not None and t in INT8_TYPES and n_tokens <= matvec_max_tokens(t)


def throwaway_cache_env(cache: Path, **more: str) -> dict[str, str]:
    """This process's environment for a subprocess that compiles into ``cache``, a
    folder the test throws away: without a compile-ahead child, which is made to outlive
    its process (finishing the cache for a next run) and would go on compiling into it
    under the tests that come next."""
    return {**os.environ, "NUMBA_CACHE_DIR": str(cache), "TENSORPLUG_CPU_COMPILE_AHEAD": "0",
            **more}  # fmt: skip

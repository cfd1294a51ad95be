"""Shared helpers for the CPU backend tests (no tests here).

``place`` puts every tensor of a graph into one host buffer with ``alloc_tensors``
(views get their base's memory), standing in for the graph allocator; ``nmse`` is the
conformance error measure of DESIGN.md. References in the tests are float64 numpy
written from the op contracts, never calls into the backend's kernels.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

import tensorplug as tp

__all__ = ["backend_for", "compute", "int8_path", "nmse", "place", "q8_activations"]


def backend_for(jit: bool = True) -> tp.Backend:
    """A fresh CPU backend straight from the plugin (no registry involved)."""
    from tensorplug_cpu.device import create_reg

    return create_reg().device(0).init_backend(None if jit else "jit=0")


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
    """``b`` (float32 rows) as ggml's x86 CPU path rounds it before an integer dot product
    with 32-block weights (Q4_0 ... Q8_0): 32-value blocks, ``d = f16(amax/127)``, codes
    ``rint(x·(127/amax))`` in float32; returned as the float64 values ``d·code``."""
    x = np.ascontiguousarray(b, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    codes = np.rint(blocks * inv)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
    return (codes.astype(np.float64) * d).reshape(x.shape)


#: Weight types whose few-token products use Q8_0 activations when numba is there.
INT8_TYPES = (tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_0, tp.Type.Q5_1, tp.Type.Q8_0,
              tp.Type.Q4_K, tp.Type.Q6_K)  # fmt: skip


def int8_path(t: tp.Type, n_tokens: int, jit: bool = True) -> bool:
    """Whether the CPU backend computes this product with Q8_0 activations."""
    from tensorplug_cpu.kernels.dispatch import matvec_max_tokens
    from tensorplug_cpu.kernels.jit import load_jit

    return (
        jit
        and load_jit() is not None
        and t in INT8_TYPES
        and n_tokens <= matvec_max_tokens(t)
    )

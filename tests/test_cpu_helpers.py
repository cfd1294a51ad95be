"""Shared helpers for the CPU backend tests (no tests here).

``place`` puts every tensor of a graph into one host buffer (views get their base's
memory), standing in for the graph allocator; ``nmse`` is the conformance error
measure of DESIGN.md. References in the tests are float64 numpy written from the op
contracts, never calls into the backend's kernels.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

import tensorplug as tp
from tensorplug.host import HOST_ALIGNMENT

__all__ = ["backend_for", "compute", "nmse", "place"]


def backend_for(jit: bool = True) -> tp.Backend:
    """A fresh CPU backend straight from the plugin (no registry involved)."""
    from tensorplug_cpu.device import create_reg

    return create_reg().device(0).init_backend(None if jit else "jit=0")


def _align(n: int) -> int:
    return (n + HOST_ALIGNMENT - 1) // HOST_ALIGNMENT * HOST_ALIGNMENT


def place(graph: tp.Graph, extra: Iterable[tp.Tensor] = ()) -> tp.Buffer:
    """Allocate every tensor of ``graph`` (and ``extra``) in one new host buffer."""
    tensors = [*graph.leafs, *graph.nodes, *extra]
    bases = [t for t in dict.fromkeys(tensors) if t.view_src is None and t.buffer is None]
    buf = tp.host_buffer_type().alloc_buffer(sum(_align(max(t.nbytes, 1)) for t in bases))
    buf.clear(0xAB)  # garbage, so that a kernel that skips work is caught
    offset = 0
    for t in bases:
        tp.tensor_alloc(buf, t, offset)
        offset += _align(max(t.nbytes, 1))
    for t in tensors:
        if t.view_src is not None and t.buffer is None:
            tp.view_init(t)
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

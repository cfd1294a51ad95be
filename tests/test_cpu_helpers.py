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

__all__ = ["backend_for", "compute", "nmse", "place"]


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

"""Speed of the Metal backend, next to references timed on the same Mac in the same run.

1. **Prompt mul_mat, F32 and F16 weights**: tensorplug on the GPU (a graph plan of one
   mul_mat, the shared library's local-memory tiles) against numpy's ``x @ w.T`` on the
   CPU (Apple's Accelerate BLAS in the numpy wheels for macOS) on the same values. The
   ratio is numpy's time over ours. Metal's own matrix library (MPS) is not timed.
2. **Decode mat×vec, Q4_0 and Q8_0 weights** (one token): weight bytes read per second
   on the GPU, next to the CPU backend on the same weights in the same run.
3. **Graph replay**: µs per node of a decode-like chain of small ops computed from a
   graph plan (bound once, encoded into a few command buffers per compute), next to
   ``graph_compute`` (which binds every node again).

Without a usable Metal device it says why and exits with status 2. Run::

    python benchmarks/bench_metal.py [--device Metal0] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from bench_opencl import best_time  # fastest of repeated runs within a time budget
from device_bench import mul_mat_plan, parse_device_args, plan_step, run_and_report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return parse_device_args(argv, __doc__.split("\n\n")[0], "Metal0", "4096x4096x512",
                             "4096x4096,14336x4096")  # fmt: skip


def metal_unavailable() -> str:
    """Why there is nothing to measure here, or "" when a Metal device can be used."""
    try:
        import tensorplug_metal
    except ImportError as e:
        return f"tensorplug-metal is not installed ({e}): pip install -e plugins/metal"
    value, reason = tensorplug_metal.score()
    return "" if value > 0 else reason


class Bench:
    """A Metal backend and the CPU backend of the same machine."""

    def __init__(self, backend: Any, cpu: Any, budget: float) -> None:
        import tensorplug as tp

        self.tp, self.budget = tp, budget
        self.backend, self.cpu = backend, cpu

    def matmul(self, wtype: str, n_out: int, k: int, tokens: int) -> dict[str, Any]:
        rng = np.random.default_rng(0)
        w = rng.standard_normal((n_out, k)).astype(np.float32)
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        stored = w.astype(np.float16) if wtype == "f16" else w
        _, d, plan = mul_mat_plan(self.backend, wtype, stored, x)
        ours = best_time(plan_step(self.backend, plan), self.budget)
        w32 = stored.astype(np.float32)
        theirs = best_time(lambda: x @ w32.T, self.budget)
        ref = x.astype(np.float64) @ w32.T.astype(np.float64)
        got = self.tp.get_array(d)
        nmse = float(((got - ref) ** 2).sum() / max((ref**2).sum(), 1e-30))
        flops = 2.0 * n_out * k * tokens
        return {
            "weights": wtype, "shape": [n_out, k, tokens],
            "tensorplug_ms": ours * 1e3, "numpy_ms": theirs * 1e3,
            "tensorplug_gflops": flops / ours / 1e9, "numpy_gflops": flops / theirs / 1e9,
            "ratio": theirs / ours, "nmse_vs_numpy": nmse,
        }  # fmt: skip

    def decode(self, wtype: str, n_out: int, k: int) -> dict[str, Any]:
        from tensorplug.quants import quantize

        rng = np.random.default_rng(1)
        w = quantize(
            rng.standard_normal((n_out, k)).astype(np.float32), self.tp.Type[wtype.upper()]
        )
        x = rng.standard_normal((1, k)).astype(np.float32)
        a, _, plan = mul_mat_plan(self.backend, wtype, w, x)
        ours = best_time(plan_step(self.backend, plan), self.budget)
        _, _, cpu_plan = mul_mat_plan(self.cpu, wtype, w, x)
        cpu = best_time(plan_step(self.cpu, cpu_plan), self.budget)
        return {
            "weights": wtype, "shape": [n_out, k], "us": ours * 1e6,
            "weights_gb_s": a.nbytes / ours / 1e9, "cpu_gb_s": a.nbytes / cpu / 1e9,
        }  # fmt: skip

    def replay(self, nodes: int) -> dict[str, Any]:
        tp = self.tp
        x = tp.new_tensor("f32", (1, 4096), "x")
        scale = tp.new_tensor("f32", (1, 4096), "scale")
        h = x
        while len(tp.Graph(h).nodes) < nodes:  # rms_norm -> mul -> silu: a decode step's small ops
            h = tp.ops.silu(tp.ops.mul(tp.ops.rms_norm(h, 1e-6), scale))
        graph = tp.Graph(h)
        tp.GraphAllocator(self.backend.buffer_type()).alloc_graph(graph)
        tp.set_array(x, np.ones((1, 4096), np.float32))
        tp.set_array(scale, np.ones((1, 4096), np.float32))
        n = len(graph.nodes)
        plan = self.backend.graph_plan_create(graph)
        replayed = best_time(plan_step(self.backend, plan), self.budget)
        eager = best_time(lambda: self.backend.graph_compute(graph), self.budget)
        return {
            "nodes": n, "plan_us_per_node": replayed / n * 1e6,
            "eager_us_per_node": eager / n * 1e6,
        }  # fmt: skip


def report(results: dict[str, Any]) -> str:
    lines = [f"device: {results['device']}"]
    for r in results["matmul"]:
        lines.append(
            f"mul_mat {r['weights']} {'x'.join(map(str, r['shape']))}: tensorplug "
            f"{r['tensorplug_ms']:.3f} ms ({r['tensorplug_gflops']:.0f} GFLOP/s), numpy on the CPU "
            f"{r['numpy_ms']:.3f} ms -> {r['ratio']:.2f}x; NMSE {r['nmse_vs_numpy']:.1e}"
        )
    for r in results["decode"]:
        lines.append(
            f"decode {r['weights']} {'x'.join(map(str, r['shape']))}: {r['us']:.1f} us, "
            f"{r['weights_gb_s']:.0f} GB/s of weights (the CPU backend: {r['cpu_gb_s']:.0f} GB/s)"
        )
    r = results["replay"]
    lines.append(
        f"replay: {r['nodes']} nodes, {r['plan_us_per_node']:.2f} us/node from a graph plan, "
        f"{r['eager_us_per_node']:.2f} us/node binding every node again"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    why = metal_unavailable()
    if why:
        print(f"bench_metal: no Metal device to measure on: {why}", file=sys.stderr)
        return 2
    import tensorplug as tp

    backend = tp.init_by_name(args.device)
    bench = Bench(backend, tp.init_by_name("CPU"), args.time)
    return run_and_report(bench, args, f"{backend.device.name}: {backend.device.description}",
                          report)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

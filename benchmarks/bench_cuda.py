"""Speed of the CUDA backend, next to references timed on the same GPU in the same run.

1. **Prompt mul_mat, F32 and F16 weights**: tensorplug (a graph of one mul_mat, which
   the plugin sends to cuBLAS through ``cupy.matmul``) against ``cupy.matmul(x, w.T)``
   on the same values (for F16 weights with the activations already F16: the same
   tensor-core product; ours also rounds the F32 activations to F16 and widens the
   result). The goal is a ratio of at least 0.9 (cupy's time / ours).
2. **Decode mat×vec, Q4_0 and Q8_0 weights** (one token: the shared library's 8-bit
   integer matrix-vector kernel on Q8_1 activations, after the activations' quantizer,
   replayed from a graph plan): weight bytes read per second,
   next to the GPU's memory bandwidth (from the driver: memory clock × 2 × bus width)
   and to ``cupy.matmul`` streaming the same matrix as F16.
3. **Graph replay**: µs per node of a decode-like chain of small ops, replayed as a
   captured CUDA graph (a graph plan after its warm-up), next to ``graph_compute`` of
   the same graph (replayed too, from the backend's cache of graphs it has seen:
   the signature check is the difference) and to launching every kernel, node by
   node. The goal is at most 5 µs per node.

Without a usable GPU it says why and exits with status 2. Run::

    python benchmarks/bench_cuda.py [--device CUDA0] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from bench_opencl import best_time  # fastest of repeated runs within a time budget
from device_bench import mul_mat_plan, parse_device_args, plan_step, run_and_report

#: The goals the CUDA backend is held to, printed next to the measurements.
MATMUL_RATIO_GOAL = 0.9
REPLAY_US_GOAL = 5.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return parse_device_args(argv, __doc__.split("\n\n")[0], "CUDA0",
                             "4096x4096x512,11008x4096x512", "4096x4096,14336x4096")  # fmt: skip


def gpu_unavailable() -> str:
    """Why there is nothing to measure here, or "" when a GPU can be used."""
    try:
        import tensorplug_cuda
    except ImportError as e:
        return f"tensorplug-cuda is not installed ({e}): pip install -e 'plugins/cuda[cuda12]'"
    value, reason = tensorplug_cuda.score()
    return "" if value > 0 else reason


class Bench:
    """A CUDA backend and ``cupy`` (the module its device uses) on the same GPU."""

    def __init__(self, backend: Any, budget: float) -> None:
        import tensorplug as tp

        self.tp, self.budget = tp, budget
        self.backend = backend
        self.device = backend.device
        self.cp = backend.device.cp

    def _cupy_time(self, fn: Callable[[], Any]) -> float:
        dev = self.cp.cuda.Device(self.device.index)

        def step() -> None:
            fn()
            dev.synchronize()

        with dev:
            return best_time(step, self.budget)

    def matmul(self, wtype: str, n_out: int, k: int, tokens: int) -> dict[str, Any]:
        tp, cp = self.tp, self.cp
        rng = np.random.default_rng(0)
        w = rng.standard_normal((n_out, k)).astype(np.float32)
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        stored = w.astype(np.float16) if wtype == "f16" else w
        _, d, plan = mul_mat_plan(self.backend, wtype, stored, x)
        ours = best_time(plan_step(self.backend, plan), self.budget)
        with cp.cuda.Device(self.device.index):
            wc, xc = cp.asarray(stored), cp.asarray(x)
            if wtype == "f16":  # the same tensor-core product ours is: F16 operands
                xc = xc.astype(np.float16)
            theirs = self._cupy_time(lambda: cp.matmul(xc, wc.T))
            ref = cp.asnumpy(cp.matmul(xc, wc.T)).astype(np.float32)
        got = tp.get_array(d)
        nmse = float(((got - ref) ** 2).sum() / max((ref**2).sum(), 1e-30))
        flops = 2.0 * n_out * k * tokens
        return {
            "weights": wtype, "shape": [n_out, k, tokens],
            "tensorplug_ms": ours * 1e3, "cupy_ms": theirs * 1e3,
            "tensorplug_tflops": flops / ours / 1e12, "cupy_tflops": flops / theirs / 1e12,
            "ratio": theirs / ours, "nmse_vs_cupy": nmse,
        }  # fmt: skip

    def decode(self, wtype: str, n_out: int, k: int) -> dict[str, Any]:
        tp, cp = self.tp, self.cp
        from tensorplug.quants import quantize

        rng = np.random.default_rng(1)
        w = rng.standard_normal((n_out, k)).astype(np.float32)
        x = rng.standard_normal((1, k)).astype(np.float32)
        a, _, plan = mul_mat_plan(self.backend, wtype, quantize(w, tp.Type[wtype.upper()]), x)
        ours = best_time(plan_step(self.backend, plan), self.budget)
        with cp.cuda.Device(self.device.index):
            w16, xc = cp.asarray(w.astype(np.float16)), cp.asarray(x.T.astype(np.float16))
            f16 = self._cupy_time(lambda: cp.matmul(w16, xc))
        bandwidth = self.device.info.bandwidth
        gbs = a.nbytes / ours / 1e9
        return {
            "weights": wtype, "shape": [n_out, k], "us": ours * 1e6, "weights_gb_s": gbs,
            "bandwidth_gb_s": bandwidth / 1e9, "of_bandwidth": gbs * 1e9 / bandwidth,
            "cupy_f16_gb_s": w16.nbytes / f16 / 1e9, "captured": plan.captured is not None,
        }  # fmt: skip

    def replay(self, nodes: int) -> dict[str, Any]:
        tp = self.tp
        x = tp.new_tensor("f32", (1, 4096), "x")
        scale = tp.new_tensor("f32", (1, 4096), "scale")
        h = x
        while True:  # rms_norm -> mul -> silu, repeated: a decode step's small ops
            for op in (lambda t: tp.ops.rms_norm(t, 1e-6), lambda t: tp.ops.mul(t, scale),
                       tp.ops.silu):  # fmt: skip
                h = op(h)
            if len(tp.Graph(h).nodes) >= nodes:
                break
        graph = tp.Graph(h)
        tp.GraphAllocator(self.backend.buffer_type()).alloc_graph(graph)
        tp.set_array(x, np.ones((1, 4096), np.float32))
        tp.set_array(scale, np.ones((1, 4096), np.float32))
        n = len(graph.nodes)
        plan = self.backend.graph_plan_create(graph)
        replayed = best_time(plan_step(self.backend, plan), self.budget)

        def graph_compute() -> None:
            self.backend.graph_compute(graph)

        replays = self.backend.graphs.replays
        cached = best_time(graph_compute, self.budget)
        replays = self.backend.graphs.replays - replays

        def eager() -> None:  # what graph_compute did before it replayed graphs
            with self.device.current():
                for node in graph.nodes:
                    self.backend.compute_node(node)
            self.backend.synchronize()

        launched = best_time(eager, self.budget)
        return {
            "nodes": n, "replay_us_per_node": replayed / n * 1e6,
            "graph_compute_us_per_node": cached / n * 1e6, "graph_compute_replays": replays,
            "eager_us_per_node": launched / n * 1e6, "captured": plan.captured is not None,
            "not_captured": plan.not_captured,
        }  # fmt: skip


def report(results: dict[str, Any]) -> str:
    lines = [f"device: {results['device']}"]
    for r in results["matmul"]:
        verdict = "ok" if r["ratio"] >= MATMUL_RATIO_GOAL else f"below {MATMUL_RATIO_GOAL}"
        lines.append(
            f"mul_mat {r['weights']} {'x'.join(map(str, r['shape']))}: tensorplug "
            f"{r['tensorplug_ms']:.3f} ms ({r['tensorplug_tflops']:.1f} TFLOP/s), cupy.matmul "
            f"{r['cupy_ms']:.3f} ms -> {r['ratio']:.2f}x ({verdict}); NMSE {r['nmse_vs_cupy']:.1e}"
        )
    for r in results["decode"]:
        lines.append(
            f"decode {r['weights']} {'x'.join(map(str, r['shape']))}: {r['us']:.1f} us, "
            f"{r['weights_gb_s']:.0f} GB/s of weights = {r['of_bandwidth']:.0%} of "
            f"{r['bandwidth_gb_s']:.0f} GB/s (cupy F16 mat x vec: {r['cupy_f16_gb_s']:.0f} GB/s)"
        )
    r = results["replay"]
    verdict = "ok" if r["replay_us_per_node"] <= REPLAY_US_GOAL else f"above {REPLAY_US_GOAL}"
    how = "CUDA graph" if r["captured"] else f"not captured: {r['not_captured']}"
    lines.append(
        f"replay: {r['nodes']} nodes, {r['replay_us_per_node']:.2f} us/node ({how}; {verdict}), "
        f"graph_compute {r['graph_compute_us_per_node']:.2f} us/node "
        f"({r['graph_compute_replays']} replays), "
        f"launching each kernel {r['eager_us_per_node']:.2f} us/node"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    why = gpu_unavailable()
    if why:
        print(f"bench_cuda: no GPU to measure on: {why}", file=sys.stderr)
        return 2
    import tensorplug as tp

    bench = Bench(tp.init_by_name(args.device), args.time)
    return run_and_report(bench, args, f"{bench.device.name}: {bench.device.description}", report)


if __name__ == "__main__":
    sys.exit(main())

"""Scheduler and graph-allocator speed on a 5,000-node llama-style graph, two backends.

    python benchmarks/bench_sched.py [--quick]

The backends are the registry's CPU and TESTACCEL, the scheduler tests' pretend
accelerator (tests/plugins_sched, loaded from its folder, private memory). Setups:

* ``offload``: weights on a TESTACCEL that runs every op, as a GPU would: the graph
  is one split and only the three inputs are copied — the usual case;
* ``partial``: TESTACCEL without soft_max and rope, so every layer splits six times
  and copies six tensors — a worst case for splitting;
* ``host weights``: weights in host memory, matrix products offloaded by
  ``offload_op``, so every weight is a split input of its own.

What is timed (best of several runs, ms, and µs per graph node):

* ``alloc_graph``: what an inference loop pays per batch to split and place a *new*
  graph of the shape it reserved for (``reset()`` + ``alloc_graph()``), the figure with
  the target of 25 ms (5 µs per node);
* ``reserve``: splitting plus the compact memory plan plus buffers, once per model;
* ``GraphAllocator.alloc_graph`` alone for the same graph on one backend.

The reference measured in the same run is building the graph itself (the ``ops``
calls that make its 5,000 tensors): splitting and placing should cost a fraction of it.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tensorplug as tp
from tensorplug.alloc import GraphAllocator, alloc_tensors
from tensorplug.registry import init_by_name
from tensorplug.sched import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "plugins_sched"))
import schedkit

TARGET_MS = 25.0
SHAPE = {"n_tokens": 32, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128, "n_vocab": 256}


def n_layers_for(nodes: int) -> int:
    one = len(schedkit.build_llama(n_layer=1, **SHAPE).graph.nodes)
    two = len(schedkit.build_llama(n_layer=2, **SHAPE).graph.nodes)
    return max(1, -(-(nodes - one) // (two - one)) + 1)


def timed(fn: Callable[..., object], *args: object) -> float:
    gc.collect()  # garbage of earlier steps is not this step's cost
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def report(label: str, times: list[float], builds: list[float], nodes: int) -> None:
    """Best and median ms, µs per node, and the median ratio to the paired graph builds."""
    ratio = statistics.median(t / b for t, b in zip(times, builds, strict=True))
    print(
        f"  {label:<40} {min(times) * 1e3:7.2f} ms (median {statistics.median(times) * 1e3:6.2f})"
        f"  {min(times) * 1e6 / nodes:5.2f} µs/node  {ratio:5.3f}x graph build"
    )


def run(setup: str, n_layer: int, repeat: int) -> float:
    cpu = init_by_name("CPU")
    reg = schedkit.TestAccelReg(n_devices=1, partial=setup == "partial")
    acc = reg.devices()[0].init_backend("min_batch=16")
    first = schedkit.build_llama(n_layer=n_layer, **SHAPE)
    weight_buft = cpu.buffer_type() if setup == "host weights" else acc.buffer_type()
    alloc_tensors(list(first.weights.values()), weight_buft, usage=tp.BufferUsage.WEIGHTS)
    nodes = len(first.graph.nodes)
    sched = Scheduler([acc, cpu])
    galloc = GraphAllocator(cpu.buffer_type())
    galloc.reserve(first.graph)
    builds: list[float] = []
    allocs: list[float] = []
    reserves: list[float] = []
    alone: list[float] = []

    def sched_reserve(graph: tp.Graph) -> None:
        sched.reset()
        sched.reserve(graph)

    def sched_alloc(graph: tp.Graph) -> None:
        sched.reset()
        sched.alloc_graph(graph)

    for _ in range(repeat):
        # each step is paired with a graph build measured just before it, so that the
        # machine's drift (other processes) cancels out of the ratios
        gc.collect()
        t0 = time.perf_counter()
        graph = schedkit.build_llama(n_layer, weights=first.weights, **SHAPE).graph
        builds.append(time.perf_counter() - t0)
        reserves.append(timed(sched_reserve, graph))
        allocs.append(timed(sched_alloc, graph))
        splits, copies = sched.n_splits, sched.n_split_inputs
        sched.reset()  # hand the graph's tensors back before the one-backend allocator
        alone.append(timed(galloc.alloc_graph, graph))
    print(
        f"{setup}: {nodes} nodes, {len(first.graph.leafs)} leafs, {splits} splits, "
        f"{copies} copies, compute buffers "
        f"{sched.buffer_size(acc) // 1024} KiB TESTACCEL + {sched.buffer_size(cpu) // 1024} KiB CPU"
    )
    print(f"  {'graph build (the reference)':<40} {min(builds) * 1e3:7.2f} ms")
    report("reset + alloc_graph (a new graph)", allocs, builds, nodes)
    report("reset + reserve", reserves, builds, nodes)
    report("GraphAllocator.alloc_graph (1 backend)", alone, builds, nodes)
    sched.free()
    galloc.free()
    return min(allocs) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--nodes", type=int, default=5000, help="graph size (default 5000)")
    args = parser.parse_args()
    repeat = 3 if args.quick else 9
    n_layer = n_layers_for(args.nodes)
    results = {
        setup: run(setup, n_layer, repeat) for setup in ("offload", "partial", "host weights")
    }
    print(f"\ntarget: split + allocate a {args.nodes}-node graph in <= {TARGET_MS:.0f} ms")
    for setup, ms in results.items():
        print(f"  {setup:<26} {ms:7.2f} ms = {ms / TARGET_MS:.2f}x the target")


if __name__ == "__main__":
    main()

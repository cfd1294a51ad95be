"""CPU backend benchmarks, each against a reference measured in the same run.

    python benchmarks/bench_cpu.py [--quick]

* f32 mul_mat 2048³ through a graph plan vs ``numpy.matmul`` on the same arrays;
* Q8_0 / Q4_0 weights (2048×2048) at batch 512 (GFLOP/s) and batch 1 (µs, GB/s of
  weight bytes, share of the memory bandwidth measured here), with the numba kernels
  and with the numpy-only fallback;
* graph replay overhead: a plan of 1000 tiny adds, µs per node, vs a bare Python loop
  of the same numpy calls.

Timings are the best of several runs (other processes on a small machine only ever
make a run slower); medians are printed too.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import tensorplug as tp
from tensorplug import ops
from tensorplug.host import available_cores
from tensorplug.quants import quantize
from tensorplug_cpu.device import create_reg

RNG = np.random.default_rng(0)


def timeit(fn: Callable[[], object], repeat: int, warmup: int = 1) -> tuple[float, float]:
    """(best, median) seconds of ``repeat`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def allocate(graph: tp.Graph) -> tp.Buffer | None:
    return tp.alloc_tensors([*graph.leafs, *graph.nodes], tp.host_buffer_type())


def mul_mat_plan(
    backend: tp.Backend, wtype: tp.Type, n: int, batch: int
) -> tuple[Callable[[], object], int]:
    """A plan computing W (n×n, ``wtype``) × x (batch×n); returns (run, weight bytes)."""
    w = tp.new_tensor(wtype, (n, n), "w")
    x = tp.new_tensor(tp.Type.F32, (batch, n), "x")
    out = ops.mul_mat(w, x)
    g = tp.Graph(out)
    allocate(g)
    values = RNG.standard_normal((n, n)).astype(np.float32)
    tp.set_array(w, quantize(values, wtype) if wtype.is_quantized else values)
    tp.set_array(x, RNG.standard_normal((batch, n)).astype(np.float32))
    plan = backend.graph_plan_create(g)
    return (lambda: backend.graph_plan_compute(plan)), w.nbytes


def memory_bandwidth(repeat: int) -> float:
    """Read bandwidth (GB/s) of a 512 MiB array summed by numpy (SIMD, all in RAM)."""
    a = np.ones(1 << 27, np.float32)
    best, _ = timeit(lambda: np.add.reduce(a), repeat)
    return a.nbytes / best / 1e9


def bench_f32(backend: tp.Backend, repeat: int) -> None:
    n = 2048
    run, _ = mul_mat_plan(backend, tp.Type.F32, n, n)
    a = RNG.standard_normal((n, n)).astype(np.float32)
    b = RNG.standard_normal((n, n)).astype(np.float32)
    flop = 2 * n**3
    ours = timeit(run, repeat)
    ref = timeit(lambda: np.matmul(b, a.T), repeat)
    print(f"f32 mul_mat {n}³")
    for label, (best, med) in (("numpy.matmul", ref), ("tensorplug CPU", ours)):
        print(f"  {label:<16} {flop / best / 1e9:7.1f} GFLOP/s  (median {flop / med / 1e9:.1f})")
    print(f"  ratio            {ref[0] / ours[0]:7.3f} × numpy  (target >= 0.95)")


def bench_quant(repeat: int, bandwidth: float) -> None:
    n = 2048
    ref = np.empty((512, n), np.float32)
    a = RNG.standard_normal((n, n)).astype(np.float32)
    x = RNG.standard_normal((512, n)).astype(np.float32)
    f32 = timeit(lambda: np.matmul(x, a.T, out=ref), repeat)
    print(f"\nquantized weights {n}×{n} (numpy f32 batch-512 reference: "
          f"{2 * 512 * n * n / f32[0] / 1e9:.1f} GFLOP/s)")  # fmt: skip
    print(f"  memory read bandwidth measured here: {bandwidth:.1f} GB/s")
    threads = available_cores()  # the backend's default: its pool on every usable core
    for label, params in (("numba", None), ("numpy", "jit=0")):
        backend = create_reg().device(0).init_backend(params)
        if label == "numba" and backend.jit is None:  # type: ignore[attr-defined]
            print("  (numba not available: skipping the JIT rows)")
            continue
        for wtype in (tp.Type.Q8_0, tp.Type.Q4_0):
            run, nbytes = mul_mat_plan(backend, wtype, n, 512)
            best, med = timeit(run, max(3, repeat // 2))
            print(f"  {wtype.name} batch 512 [{label}]  {2 * 512 * n * n / best / 1e9:7.1f} GFLOP/s"
                  f"  (median {2 * 512 * n * n / med / 1e9:.1f}; target >= 60)")  # fmt: skip
            run, nbytes = mul_mat_plan(backend, wtype, n, 1)
            # one thread too: a fork-join kernel stalls whenever another process holds one
            # of a few cores, so both counts tell what this machine delivers
            for n_threads in sorted({1, threads}):
                backend.set_n_threads(n_threads)  # type: ignore[attr-defined]
                best, med = timeit(run, repeat * 5)
                gbs = nbytes / best / 1e9
                print(f"  {wtype.name} batch 1   [{label}, {n_threads} thr]  {best * 1e6:6.0f} µs"
                      f"  {gbs:6.2f} GB/s of weights = {100 * gbs / bandwidth:5.1f}% of bandwidth"
                      f" (median {med * 1e6:.0f} µs; aim >= 25%)")  # fmt: skip
            backend.set_n_threads(threads)  # type: ignore[attr-defined]


def bench_replay(backend: tp.Backend, repeat: int) -> None:
    n_nodes = 1000
    x, c = tp.new_tensor("f32", (4,), "x"), tp.new_tensor("f32", (4,), "c")
    y = x
    for _ in range(n_nodes):
        y = ops.add(y, c)
    g = tp.Graph(y)
    allocate(g)
    tp.set_array(x, np.zeros(4, np.float32))
    tp.set_array(c, np.ones(4, np.float32))
    plan = backend.graph_plan_create(g)
    views = [tp.tensor_array(t) for t in g.nodes]
    cv, xv = tp.tensor_array(c), tp.tensor_array(x)

    def bare() -> None:
        prev = xv
        for v in views:
            np.add(prev, cv, out=v)
            prev = v

    plan_t = timeit(lambda: backend.graph_plan_compute(plan), repeat * 4)
    cached_t = timeit(lambda: backend.graph_compute(g), repeat * 4)
    bare_t = timeit(bare, repeat * 4)
    assert float(tp.get_array(y)[0]) == n_nodes
    print(f"\ngraph replay, {n_nodes} tiny adds")
    print(f"  bare numpy loop          {bare_t[0] / n_nodes * 1e6:5.2f} µs/node")
    print(f"  graph_plan_compute       {plan_t[0] / n_nodes * 1e6:5.2f} µs/node"
          f"  (median {plan_t[1] / n_nodes * 1e6:.2f}; target <= 1.5)")  # fmt: skip
    print(f"  graph_compute (cached)   {cached_t[0] / n_nodes * 1e6:5.2f} µs/node"
          f"  (median {cached_t[1] / n_nodes * 1e6:.2f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    repeat = 3 if args.quick else 7
    reg = create_reg()
    feats = reg.features()
    print(f"CPU: {feats['CPU']}; BLAS {feats.get('BLAS')} ({feats.get('BLAS_THREADS')} threads); "
          f"SIMD {feats['SIMD']}; JIT {feats['JIT']}\n")  # fmt: skip
    backend = reg.device(0).init_backend()
    bench_f32(backend, repeat)
    bench_quant(repeat, memory_bandwidth(repeat))
    bench_replay(backend, repeat)


if __name__ == "__main__":
    main()

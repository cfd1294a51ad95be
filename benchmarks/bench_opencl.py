"""mul_mat throughput of the OpenCL backend, next to references timed in the same run.

For each weight type and shape, d = b · aᵀ is computed through the backend (a graph
plan, so Python overhead is out of the loop) and reported in GFLOP/s, together with:

* numpy: float32 ``b @ a.T`` on the host (quantized/f16 weights dequantized first);
* naive: the textbook OpenCL kernel (one work-item per output value, a scalar loop
  over K) on the same device, f32 only — what a simple A·Bᵀ kernel gets here.

Ratios are against those two; absolute numbers only mean something next to them,
on the same machine, in the same run. Run:
``python benchmarks/bench_opencl.py [--size 1024] [--types f32,f16,q8_0,q4_0] [--time 1]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import tensorplug as tp
from tensorplug import Graph, Type, ops
from tensorplug.quants import dequantize, quantize

NAIVE = """
kernel void naive(global const float *A, global const float *B, global float *C,
                  int M, int N, int K) {
    const int o = get_global_id(0), t = get_global_id(1);
    if (o >= N || t >= M) return;
    float s = 0.0f;
    for (int k = 0; k < K; k++) s += A[o * K + k] * B[t * K + k];
    C[t * N + o] = s;
}
"""


def best_time(fn: Callable[[], None], budget: float) -> float:
    """Fastest of repeated runs (after one warm-up) within about ``budget`` seconds."""
    fn()
    best, spent, runs = float("inf"), 0.0, 0
    while spent < budget or runs < 3:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best


def bench_backend(backend: tp.Backend, wt: Type, n_out: int, n_tok: int, k: int,
                  budget: float) -> tuple[float, np.ndarray, np.ndarray]:  # fmt: skip
    rng = np.random.default_rng(0)
    a, b = tp.new_tensor(wt, (n_out, k)), tp.new_tensor(Type.F32, (n_tok, k))
    d = ops.mul_mat(a, b)
    buf = tp.alloc_tensors((a, b, d), backend.buffer_type())
    assert buf is not None
    w = rng.standard_normal((n_out, k)).astype(np.float32)
    raw = quantize(w, wt) if wt != Type.F32 else w
    if wt == Type.F16:
        raw = w.astype(np.float16)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    tp.set_array(a, raw)
    tp.set_array(b, x)
    plan = backend.graph_plan_create(Graph(d))

    def step() -> None:
        backend.graph_plan_compute(plan)
        backend.synchronize()

    seconds = best_time(step, budget)
    out = tp.get_array(d)
    w_f32 = dequantize(raw.view(np.uint8).reshape(n_out, -1), wt) if wt != Type.F32 else w
    buf.free()
    return seconds, out, (x, w_f32)  # type: ignore[return-value]


def bench_naive(device, n_out: int, n_tok: int, k: int, budget: float) -> float:
    import pyopencl as cl

    ctx = device.context
    queue = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, NAIVE).build()
    kern = cl.Kernel(prg, "naive")
    rng = np.random.default_rng(1)
    mf = cl.mem_flags
    a = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                  hostbuf=rng.standard_normal((n_out, k)).astype(np.float32))  # fmt: skip
    b = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                  hostbuf=rng.standard_normal((n_tok, k)).astype(np.float32))  # fmt: skip
    c = cl.Buffer(ctx, mf.WRITE_ONLY, 4 * n_out * n_tok)
    kern.set_args(a, b, c, np.int32(n_tok), np.int32(n_out), np.int32(k))

    def step() -> None:
        cl.enqueue_nd_range_kernel(queue, kern, (n_out, n_tok), None)
        queue.finish()

    return best_time(step, budget)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="n_out = K (default 1024)")
    parser.add_argument("--tokens", default="", help="comma-separated batch sizes (default: "
                        "size and 1)")  # fmt: skip
    parser.add_argument("--types", default="f32,f16,q8_0,q4_0")
    parser.add_argument("--device", type=int, default=0, help="OpenCL device index")
    parser.add_argument("--time", type=float, default=1.0, help="seconds per measurement")
    args = parser.parse_args()

    from tensorplug_opencl.reg import create_reg

    device = create_reg().devices()[args.device]
    backend = device.init_backend()
    n = args.size
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else [n, 1]
    print(f"device: {device.name} = {device.description}; n_out = K = {n}")
    print(f"{'weights':8} {'tokens':>6} {'GFLOP/s':>8} {'numpy':>8} {'naive':>8} "
          f"{'vs numpy':>8} {'vs naive':>8}")  # fmt: skip
    for n_tok in tokens:
        flops = 2.0 * n * n * n_tok
        naive = flops / bench_naive(device, n, n_tok, n, args.time) / 1e9
        for name in args.types.split(","):
            wt = Type.parse(name)
            seconds, out, (x, w) = bench_backend(backend, wt, n, n_tok, n, args.time)
            ref = x @ w.T
            err = float(((out - ref) ** 2).sum() / (ref**2).sum())
            assert err < 1e-8, f"{wt.name}: wrong result (NMSE {err:.2e})"
            numpy_product = lambda x=x, w=w: x @ w.T  # noqa: E731
            np_s = best_time(numpy_product, args.time)
            gf, gnp = flops / seconds / 1e9, flops / np_s / 1e9
            print(f"{wt.name:8} {n_tok:6d} {gf:8.1f} {gnp:8.1f} {naive:8.1f} "
                  f"{gf / gnp:7.2f}x {gf / naive:7.2f}x")  # fmt: skip
    backend.free()


if __name__ == "__main__":
    main()

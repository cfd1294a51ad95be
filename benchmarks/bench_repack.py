"""Repacked weights (``CPU_REPACK``) against the file's layout, product by product.

    python benchmarks/bench_repack.py [--types q4_1,q5_1] [--rows 1,2,4,8,16,32,128]
                                      [--shapes 576x1536,1536x576] [--threads 1] [--rounds 5]
                                      [--from-memory]

A repacked product runs one integer kernel for every activation row count, which makes
a row's bits independent of the rows beside it (what continuous batching needs). The
file's layout takes the fused kernels for a few rows and decodes the weights for BLAS
above (``tensorplug_cpu/kernels/dispatch.py``). Moving a type to the repacked layout
must cost nothing: this measures both layouts of the same weights and activations in
one process, interleaved round by round (a busy machine slows both alike), and prints
per type, shape and row count the best time of each and their ratio (plain / repacked:
above 1, repacked is faster), with the path the plain layout took.

A matrix multiplied again and again stays in the CPU's caches (a 32000×768 Q6_K matrix,
20 MB, fits a server CPU's L3), so by default this times products from cache. A
generated token reads every weight from memory once: ``--from-memory`` multiplies copies
of each matrix in turn, enough to fill :data:`FROM_MEMORY_BYTES`, and prints the time of
one product. Run that way, a type's repacked product can read its weights far slower
than another type's, which the cached figures hide (``plugins/cpu/README.md``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import quantize
from tensorplug_cpu.device import create_reg
from tensorplug_cpu.kernels.dispatch import PLAIN, select

RNG = np.random.default_rng(0)
#: ``--from-memory``: the bytes of copies of a matrix multiplied in turn, past any L3
FROM_MEMORY_BYTES = 128 << 20


def _product(backend: tp.Backend, w: tp.Tensor, n_in: int, rows: int) -> Callable[[], object]:
    """A compute of ``w`` times ``rows`` activation rows, its plan built once. The plan
    is the product's own: ``--from-memory`` runs hundreds of graphs in turn, more than
    the backend keeps plans for, and through ``graph_compute`` each call rebuilt one
    (a small product then takes several times what the model's takes)."""
    x = tp.new_tensor("f32", (rows, n_in), "x")
    y = ops.mul_mat(w, x)
    g = tp.Graph(y)
    tp.alloc_tensors([x, y], tp.host_buffer_type())
    tp.set_array(x, RNG.standard_normal((rows, n_in)).astype(np.float32))
    plan = backend.graph_plan_create(g)
    backend.graph_plan_compute(plan)  # compiles or loads the kernels once
    return lambda: backend.graph_plan_compute(plan)


def _weights(t: tp.Type, n_out: int, n_in: int, buft: tp.BufferType) -> tp.Tensor:
    raw = quantize(RNG.standard_normal((n_out, n_in)).astype(np.float32), t)
    w = tp.new_tensor(t, (n_out, n_in), "w")
    tp.alloc_tensors([w], buft, tp.BufferUsage.WEIGHTS)
    tp.set_array(w, np.ascontiguousarray(raw))
    return w


def _in_turn(fns: list[Callable[[], object]]) -> Callable[[], object]:
    """One call that runs each of ``fns`` once, in order."""

    def run() -> None:
        for fn in fns:
            fn()

    return run


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", default="q4_1,q5_1", help="comma-separated weight types")
    parser.add_argument("--rows", default="1,2,4,8,16,32,128", help="activation row counts")
    parser.add_argument("--shapes", default="576x1536,1536x576,2048x768,768x2048",
                        help="weight shapes OUTxIN (rows a multiple of 8)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--repeat", type=int, default=20, help="calls timed per round")
    parser.add_argument("--from-memory", action="store_true",
                        help=f"multiply copies of each matrix in turn ({FROM_MEMORY_BYTES >> 20} "
                        "MiB of them): each product reads its weights from memory")  # fmt: skip
    args = parser.parse_args()
    dev = create_reg().device(0)
    backend = dev.init_backend()
    tp.get_proc("CPU", "set_n_threads")(backend, args.threads)  # type: ignore[misc]
    repack = dev.repack_buffer_type()  # type: ignore[attr-defined]
    where = "from memory (copies in turn)" if args.from_memory else "from cache"
    print(f"threads {args.threads}; best of {args.rounds}×{args.repeat} calls, interleaved, "
          f"{where}")  # fmt: skip
    print(f"{'type':6} {'shape':>10} {'rows':>5} {'plain path':>20} {'plain µs':>10} "
          f"{'repacked µs':>12} {'plain/repacked':>15}")  # fmt: skip
    for name in args.types.split(","):
        t = tp.Type[name.upper()]
        for shape in args.shapes.split(","):
            n_out, n_in = (int(v) for v in shape.split("x"))
            if n_in % t.block_size:
                print(f"{t.name:6} {shape:>10}  skipped: rows of {n_in} are not whole blocks")
                continue
            nbytes = n_out * n_in // t.block_size * t.type_size
            copies = -(-FROM_MEMORY_BYTES // nbytes) if args.from_memory else 1
            plain_ws = [_weights(t, n_out, n_in, tp.host_buffer_type()) for _ in range(copies)]
            packed_ws = [_weights(t, n_out, n_in, repack) for _ in range(copies)]
            for rows in (int(r) for r in args.rows.split(",")):
                plain = _in_turn([_product(backend, w, n_in, rows) for w in plain_ws])
                packed = _in_turn([_product(backend, w, n_in, rows) for w in packed_ws])
                a, b = [], []
                for _ in range(args.rounds):
                    a.append(_best(plain, args.repeat) / copies)
                    b.append(_best(packed, args.repeat) / copies)
                path = select(t, PLAIN, rows, numba=True).name
                ratios = [x / y for x, y in zip(a, b, strict=True)]
                print(f"{t.name:6} {shape:>10} {rows:>5} {path:>20} {min(a) * 1e6:10.1f} "
                      f"{min(b) * 1e6:12.1f} {min(a) / min(b):8.2f} "
                      f"(median {statistics.median(ratios):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()

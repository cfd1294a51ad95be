"""CPU attention (``flash_attn_ext``) at SmolLM2-135M's shapes: one generated token and a
prompt, F32 and F16 caches, on one thread and two.

    python benchmarks/bench_attention.py [--quick] [--threads 1,2] [--paths exact,blas]

Uses only tensorplug's public API, so the same file times any build: run it with each
build's interpreter one after the other on a quiet machine and compare, e.g.
``../baseline/.venv/bin/python benchmarks/bench_attention.py`` (a baseline checkout) and
``.venv/bin/python benchmarks/bench_attention.py`` (this one). The cases: 9 query heads
over 3 KV heads of 64, a causal mask over a cache padded to a multiple of 256 with
-inf (as the runner pads it); times are the best of several graph replays, medians
beside them (other processes only ever make a run slower). ``--paths`` times each case
with the exact kernel (llama.cpp's arithmetic, the same bits for a row at any step
size: ``TENSORPLUG_CPU_EXACT_ATTENTION_ROWS=all``) and with BLAS (``=0``) one after the
other in the same run, so their ratio holds on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import tensorplug as tp
from tensorplug import ops
from tensorplug_cpu.device import create_reg

HEADS, KV_HEADS, DIM = 9, 3, 64


#: the exact-kernel row limit each ``--paths`` word stands for
PATHS = {"exact": "all", "blas": "0"}


def _case(
    n_q: int, seen: int, kv_type: str, threads: int, repeat: int, path: str
) -> tuple[float, float]:
    """(best, median) µs of one attention over ``seen`` visible cache rows for ``n_q``
    query rows (the last ``n_q`` positions, causal), by ``path`` (see :data:`PATHS`;
    the setting is read when the graph's plan is built)."""
    os.environ["TENSORPLUG_CPU_EXACT_ATTENTION_ROWS"] = PATHS[path]
    rng = np.random.default_rng(0)
    n_kv = -(-seen // 256) * 256
    q = tp.new_tensor("f32", (1, HEADS, n_q, DIM), "q")
    k = tp.new_tensor(kv_type, (1, KV_HEADS, n_kv, DIM), "k")
    v = tp.new_tensor(kv_type, (1, KV_HEADS, n_kv, DIM), "v")
    mask = tp.new_tensor("f16", (1, 1, n_q, n_kv), "mask")
    out = ops.flash_attn_ext(q, k, v, mask, scale=DIM**-0.5)
    g = tp.Graph(out)
    buf = tp.alloc_tensors([*g.leafs, *g.nodes], tp.host_buffer_type())
    assert buf is not None
    m = np.zeros(mask.shape, np.float16)
    for r in range(n_q):
        m[..., r, seen - n_q + r + 1 :] = -np.inf
    dtype = np.float16 if kv_type == "f16" else np.float32
    tp.set_array(q, rng.standard_normal(q.shape).astype(np.float32))
    tp.set_array(k, rng.standard_normal(k.shape).astype(dtype))
    tp.set_array(v, rng.standard_normal(v.shape).astype(dtype))
    tp.set_array(mask, m)
    backend = create_reg().device(0).init_backend(None)
    tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
    backend.graph_compute(g)  # plan, compile
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        backend.graph_compute(g)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6, statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--paths", default="exact,blas", help=f"of {', '.join(PATHS)}")
    a = p.parse_args()
    paths = a.paths.split(",")
    if unknown := set(paths) - set(PATHS):
        p.error(f"--paths: unknown {', '.join(sorted(unknown))} (known: {', '.join(PATHS)})")
    repeat = 3 if a.quick else 30
    cases = [(1, 128), (1, 512), (4, 512), (128, 128), (512, 512)]
    print("| query rows | visible rows | cache | threads | path | best µs | median µs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for threads in (int(t) for t in a.threads.split(",")):
        for kv_type in ("f32", "f16"):
            for n_q, seen in cases:
                rep = max(2, repeat // 10) if n_q >= 128 else repeat
                for path in paths:
                    best, median = _case(n_q, seen, kv_type, threads, rep, path)
                    print(f"| {n_q} | {seen} | {kv_type} | {threads} | {path} | {best:.0f} "
                          f"| {median:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""What remote devices on Ray cost: per-call overhead, and llama tokens/s over 1 and 2 actors.

    python benchmarks/bench_ray.py [--model tiny|100M] [--prompt 32] [--gen 16] [--runs 2]

Starts a private local cluster (``ray.init``) with two remote CPU devices (``Ray0``,
``Ray1``: actors each running the CPU backend) and measures, next to the local CPU
backend in the same run:

* ``graph call``: one ``graph_compute`` of a one-node graph (16 floats), round trip
  included — the fixed cost of a step on a remote device (µs per call);
* ``write``/``read``: ``tensor_set``/``tensor_get`` of 4 MiB;
* llama prompt and generation tokens/s with every block on the local CPU, on Ray0, and
  spread over Ray0 + Ray1 (layer split, as ``tensorplug run --device Ray0,Ray1``).

On one machine the actors share its cores with this process, so a remote run cannot be
faster than the local one; the figures say what the protocol costs per call and step.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

import tensorplug as tp
from tensorplug import ops

sys.path.insert(0, str(Path(__file__).parent))
from bench_llama import CHUNK, MODELS, model_options, timed_runs


def per_call(fn: Callable[[], object], n: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def call_overheads(backends: dict[str, tp.Backend], n: int) -> None:
    print(f"{'device':<8} {'graph call':>12} {'write 4 MiB':>12} {'read 4 MiB':>12}")
    payload = np.ones(1 << 20, np.float32)
    for name, be in backends.items():
        a = tp.new_tensor("f32", (16,))
        y = ops.scale(a, 2.0)
        big = tp.new_tensor("f32", payload.shape)
        g = tp.Graph(y)
        tp.alloc_tensors([a, y, big], be.buffer_type())
        tp.set_array(a, np.arange(16, dtype=np.float32))
        compute = lambda g=g, be=be: be.graph_compute(g)  # noqa: E731
        call = per_call(compute, n)

        def write_and_sync(big: tp.Tensor = big, be: tp.Backend = be) -> None:
            tp.set_array(big, payload)
            be.synchronize()

        write = per_call(write_and_sync, 10)
        get = lambda big=big: tp.get_array(big)  # noqa: E731
        read = per_call(get, 10)
        print(f"{name:<8} {call * 1e6:>9.0f} µs {write * 1e3:>9.2f} ms {read * 1e3:>9.2f} ms")


def tokens_per_s(
    path: Path, devices: Sequence[tp.Device], n_prompt: int, n_gen: int, runs: int
) -> tuple[float, float]:
    from tensorplug.gguf import GGUFFile
    from tensorplug_llm.placement import Placement
    from tensorplug_llm.runner import ModelRunner

    f = GGUFFile(path)
    n_layer = f.value("llama.block_count", int)
    placement = (Placement.on(devices[0], n_layer) if len(devices) == 1
                 else Placement.spread(devices, n_layer))  # fmt: skip
    m = ModelRunner(f, placement=placement, n_ctx=n_prompt + n_gen, n_batch=CHUNK, cache_type="f32")
    try:
        runs_ = timed_runs(m, n_prompt, n_gen, runs)
    finally:
        m.close()
    return max(t.prompt_tps for t in runs_), max(t.gen_tps for t in runs_)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model_options(p)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()

    import ray

    from tensorplug_llm.tiny import write_tiny_llama
    from tensorplug_ray.device import RayReg, start_devices
    from tensorplug_ray.settings import DeviceRequest

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    reg = RayReg(start_devices([DeviceRequest("CPU", 2)], 120), "local")
    cpu = tp.init_by_name("CPU").device
    remote = list(reg.devices())
    print(f"ray {ray.__version__}; remote devices: "
          + "; ".join(f"{d.name} = {d.description}" for d in remote))  # fmt: skip
    call_overheads({"CPU": cpu.init_backend(), "Ray0": remote[0].init_backend()}, args.calls)

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_llama(Path(tmp) / "m.gguf", "q8_0", 0, **MODELS[args.model])
        print(f"\nllama {args.model} Q8_0, prompt {args.prompt}, generate {args.gen}, F32 cache")
        print(f"{'placement':<12} {'prompt tok/s':>13} {'gen tok/s':>10} {'gen vs local':>13}")
        local_gen = None
        for label, devs in (("CPU (local)", [cpu]), ("Ray0", remote[:1]), ("Ray0+Ray1", remote)):
            pp, tg = tokens_per_s(path, devs, args.prompt, args.gen, args.runs)
            local_gen = local_gen or tg
            print(f"{label:<12} {pp:>13.1f} {tg:>10.1f} {tg / local_gen:>12.2f}x")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

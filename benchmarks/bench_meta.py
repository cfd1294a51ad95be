"""Tensor parallelism on PoCL: one OpenCL device against a meta device of two, same cores.

    python benchmarks/bench_meta.py [--model tiny|100M] [--prompt 32] [--gen 16] [--runs 2]

Each configuration runs in its own process, since PoCL reads its settings once:

* ``1 member``: ``POCL_DEVICES=pthread`` with ``POCL_MAX_PTHREAD_COUNT=2`` — one OpenCL
  device on both cores, every block on it;
* ``2 members``: ``POCL_DEVICES="pthread pthread"`` with one thread each — the same two
  cores as two devices, every block split by rows over both (``--split-mode row``).

It prints prompt and generation tokens/s of each, and for the meta device the share of
compute time spent in all-reduces (partial sums added across the members after the
attention output and FFN down projections). On one machine both members share its
memory and cores, so this measures the meta device's overhead, not a speed-up that
separate GPUs would give.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_llama import CHUNK, MODELS, model_options, timed_runs


def _inner(path: str, mode: str, n_prompt: int, n_gen: int, runs: int) -> dict[str, float]:

    import tensorplug as tp
    from tensorplug.gguf import GGUFFile
    from tensorplug.meta import MetaBackend
    from tensorplug_llm.placement import Placement
    from tensorplug_llm.row_split import row_split_device
    from tensorplug_llm.runner import ModelRunner

    f = GGUFFile(path)
    n_layer = f.value("llama.block_count", int)
    dev = tp.dev_by_name("OpenCL0")
    assert dev is not None
    if mode == "meta":
        second = tp.dev_by_name("OpenCL1")
        assert second is not None
        dev = row_split_device(f, [dev, second])
    m = ModelRunner(f, placement=Placement.on(dev, n_layer), n_ctx=n_prompt + n_gen, n_batch=CHUNK)
    meta = next((b for b in m.backends if isinstance(b, MetaBackend)), None)

    def reset() -> None:
        if meta is not None:
            meta.all_reduce_s = 0.0

    best: dict[str, float] = {"prompt": 0.0, "gen": 0.0, "all_reduce": 0.0, "compute": 0.0}
    try:
        for _ in range(runs):  # one at a time: the all-reduce time belongs to its run
            (t,) = timed_runs(m, n_prompt, n_gen, 1, reset)
            if t.gen_tps > best["gen"]:
                best.update(gen=t.gen_tps, compute=t.prompt_compute_s + t.gen_compute_s,
                            all_reduce=meta.all_reduce_s if meta is not None else 0.0)  # fmt: skip
            best["prompt"] = max(best["prompt"], t.prompt_tps)
    finally:
        m.close()
    return best


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    model_options(p)
    p.add_argument("--inner", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        print(json.dumps(_inner(args.inner[0], args.inner[1], args.prompt, args.gen, args.runs)))
        return 0

    from tensorplug_llm.tiny import write_tiny_llama

    dims = MODELS[args.model].copy()
    if args.model == "tiny":  # enough KV heads for two members
        dims.update({"n_embd": 128, "n_head": 8, "n_head_kv": 4, "n_ff": 256})
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_llama(Path(tmp) / "m.gguf", "q8_0", 0, **dims)
        print(f"llama {args.model} Q8_0 (F16 cache), prompt {args.prompt}, generate {args.gen}; "
              "2 cores in both configurations")  # fmt: skip
        print(f"{'configuration':<34} {'prompt tok/s':>13} {'gen tok/s':>10} {'all-reduce':>11}")
        for label, mode, devices, threads in (
            ("1 member: OpenCL0 (2 threads)", "single", "pthread", "2"),
            ("2 members: OpenCL0+1 (1 thread each)", "meta", "pthread pthread", "1"),
        ):
            env = dict(os.environ, POCL_DEVICES=devices, POCL_MAX_PTHREAD_COUNT=threads)
            cmd = [sys.executable, __file__, "--inner", str(path), mode, "--prompt",
                   str(args.prompt), "--gen", str(args.gen), "--runs", str(args.runs)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            share = f"{r['all_reduce'] / r['compute']:.0%}" if r["all_reduce"] else "-"
            print(f"{label:<34} {r['prompt']:>13.1f} {r['gen']:>10.1f} {share:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

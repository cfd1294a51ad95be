"""Prompt and generation speed of the llama runner (``tensorplug run``) per device.

    python benchmarks/bench_llama.py [--quick] [--devices CPU,OpenCL0] [--prompt 64] [--gen 16]

Models, written into a temporary folder with ``tensorplug_llm.tiny.write_tiny_llama``
(the ``gguf`` writer; Q8_0 quantized with the core's quants):

* ``tiny``: the test model — 2 blocks, n_embd 64, vocab 320 (0.1M parameters);
* ``100M``: 8 blocks, n_embd 768, 12 heads / 4 KV heads, n_ff 2048, vocab 32000
  (99.5M parameters), shaped like a small llama.

Each model runs with everything on one device. A run evaluates a prompt of ``--prompt``
tokens (chunks of 32) and generates ``--gen`` tokens greedily; the figures are the best
of ``--runs`` runs (after the runner's own warm-up):

* ``prompt tok/s`` and ``gen tok/s``, as llama.cpp counts them (prompt: batches of
  several tokens; generation: single-token steps);
* per generated token, where the time goes: ``compute`` is the scheduler's
  ``graph_compute`` (the backend's kernels and the copies between backends) and
  ``python`` everything else the runner does per step (writing the inputs, replaying or
  switching graphs, reading the logits) plus sampling;
* ``of numpy``: the runner's speed as a fraction of a numpy floor measured in the same
  run (1.00x: as fast as the floor) — the same model's matrix products alone, with
  float32 weights decoded once beforehand (``x @ W.T`` per matrix per block, plus the
  output layer for the last token), for one token and for one 32-token chunk. It
  leaves out attention, norms and the decoding of quantized weights: a bound a runner
  on this machine's BLAS can approach, not beat (except by reading fewer bytes: Q8_0
  weights are 3.8x smaller than float32 ones).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from tensorplug import registry
from tensorplug.gguf import GGUFFile
from tensorplug.quants import dequantize
from tensorplug_llm.placement import Placement
from tensorplug_llm.runner import ModelRunner, Timings
from tensorplug_llm.tiny import write_tiny_llama


class ModelDims(TypedDict, total=False):
    """Keywords for :func:`write_tiny_llama`'s ``**dims``; one left out keeps ``TINY_DIMS``'s."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int


MODELS: dict[str, ModelDims] = {
    "tiny": {},
    "100M": {
        "n_vocab": 32000, "n_embd": 768, "n_layer": 8, "n_head": 12, "n_head_kv": 4,
        "n_ff": 2048, "n_ctx": 512,
    },
}  # fmt: skip
CHUNK = 32


@dataclass
class Result:
    prompt_tps: float
    gen_tps: float
    compute_ms: float
    python_ms: float
    load_s: float


def model_options(p: argparse.ArgumentParser, prompt: int = 32, runs: int = 2) -> None:
    """The options every llama benchmark takes: which model, how long, how many runs."""
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--prompt", type=int, default=prompt, help=f"prompt tokens ({prompt})")
    p.add_argument("--gen", type=int, default=16, help="generated tokens (16)")
    p.add_argument("--runs", type=int, default=runs, help=f"runs; the best counts ({runs})")


def timed_runs(
    m: ModelRunner, n_prompt: int, n_gen: int, runs: int, before: Callable[[], None] | None = None
) -> list[Timings]:
    """``runs`` fresh prompt + greedy generations of ``m``, each one's timings; ``before``
    runs first each time (to reset a counter of one's own)."""
    prompt = [1] + [int(t) for t in np.random.default_rng(0).integers(3, 300, n_prompt - 1)]
    out = []
    for _ in range(runs):
        m.reset()
        m.timings = type(m.timings)(load_s=m.timings.load_s)
        gc.collect()
        if before is not None:
            before()
        m.generate(prompt, n_gen, stop_at_eos=False)
        out.append(m.timings)
    return out


def run_model(path: Path, device: str, n_prompt: int, n_gen: int, runs: int) -> Result:
    dev = registry.dev_by_name(device)
    assert dev is not None
    f = GGUFFile(path)
    n_layer = f.value("llama.block_count", int)
    m = ModelRunner(f, placement=Placement.on(dev, n_layer), n_ctx=n_prompt + n_gen, n_batch=CHUNK)
    results = []
    try:
        for t in timed_runs(m, n_prompt, n_gen, runs):
            n = t.gen_tokens
            python = (t.gen_s - t.gen_compute_s + t.sample_s) / n
            results.append(
                Result(t.prompt_tps, t.gen_tps, t.gen_compute_s / n * 1e3, python * 1e3, t.load_s)
            )
    finally:
        m.close()
    g = max(results, key=lambda r: r.gen_tps)
    return Result(
        max(r.prompt_tps for r in results), g.gen_tps, g.compute_ms, g.python_ms, g.load_s
    )


def numpy_floor(path: Path, runs: int) -> tuple[float, float]:
    """Seconds for the matrix products of one token and of one 32-token prompt chunk,
    float32 weights decoded beforehand (best of ``runs`` after a warm-up). Like the
    runner, a chunk needs the output layer for its last token only."""
    f = GGUFFile(path)
    blocks, output = [], None
    for name, info in f.tensors.items():
        if len(info.shape) == 2 and name != "token_embd.weight":
            raw = np.asarray(f.tensor_bytes(name)).reshape(info.shape[0], -1)
            w = np.ascontiguousarray(dequantize(raw, info.type))
            if name == "output.weight":
                output = w
            else:
                blocks.append(w)
    assert output is not None
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal((CHUNK, n), dtype=np.float32) for n in {w.shape[1] for w in blocks}}

    def product(n: int) -> float:
        times = []
        for _ in range(runs + 1):
            t0 = time.perf_counter()
            for w in blocks:
                x[w.shape[1]][:n] @ w.T
            x[output.shape[1]][:1] @ output.T
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return product(1), product(CHUNK)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model and 100M Q8_0 only, 1 run")
    p.add_argument("--devices", default=None, help="comma-separated devices (default: all)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (64)")
    p.add_argument("--gen", type=int, default=16, help="generated tokens (16)")
    p.add_argument("--runs", type=int, default=3, help="runs per case; the best counts (3)")
    args = p.parse_args()
    runs = 1 if args.quick else args.runs
    names = args.devices.split(",") if args.devices else [d.name for d in registry.devices()]
    print(f"tensorplug llama runner: prompt {args.prompt} tokens (chunks of {CHUNK}), "
          f"{args.gen} generated, best of {runs}")  # fmt: skip
    print(f"{'model':<12} {'device':<9} {'load s':>7} {'prompt tok/s':>13} {'of numpy':>9} "
          f"{'gen tok/s':>10} {'of numpy':>9} {'compute ms':>11} {'python ms':>10}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-llama-") as tmp:
        for label, dims in MODELS.items():
            for wtype in ("f32", "q8_0"):
                if args.quick and label == "100M" and wtype == "f32":
                    continue
                t0 = time.perf_counter()
                path = Path(tmp) / f"{label}-{wtype}.gguf"
                write_tiny_llama(path, wtype, 0, **dims)
                written = time.perf_counter() - t0
                tok_s, chunk_s = numpy_floor(path, max(5, runs))
                print(f"{label + ' ' + wtype:<12} (written in {written:.1f} s; numpy floor "
                      f"{1 / tok_s:9.1f} tok/s for one token, {CHUNK / chunk_s:9.1f} tok/s "
                      f"for a chunk)")  # fmt: skip
                for device in names:
                    r = run_model(path, device, args.prompt, args.gen, runs)
                    prompt_x, gen_x = r.prompt_tps * chunk_s / CHUNK, r.gen_tps * tok_s
                    print(f"{'':<12} {device:<9} {r.load_s:7.2f} {r.prompt_tps:13.1f} "
                          f"{prompt_x:8.2f}x {r.gen_tps:10.1f} {gen_x:8.2f}x "
                          f"{r.compute_ms:11.2f} {r.python_ms:10.2f}")  # fmt: skip
                    sys.stdout.flush()
                path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

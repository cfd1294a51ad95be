"""Aggregate generation speed of the engine with 1, 4, 8 concurrent streams.

    python benchmarks/bench_engine.py [--model PATH.gguf | --size 100M] [--streams 1,4,8]
                                      [--prompt 32] [--gen 32] [--threads N] [--rounds 5]
                                      [--cold]

Batched decoding reads each weight once for all streams of a step, so aggregate
tokens/s should grow with the number of streams until the products stop being bound
by reading the weights. Each stream gets its own prompt (random token ids, ``--prompt``
long), then ``--gen`` greedy tokens; the engine runs them on ``n_parallel = streams``
slots. Reported per stream count, each with its speed-up over one stream:

- ``S_TG``: aggregate generation speed as llama.cpp's ``llama-batched-bench`` defines it
  (``B·TG / T_TG``): the tokens the decode steps generate over the wall time from the
  end of the prompts to the last token, the engine's own work between steps (sampling,
  scheduling, building each step's inputs) included. This is what batching the decode
  changes, and what the serving goal "8 streams ≥ 3× one stream" measures.
- ``all``: every generated token over the time from the first submit to the last
  token, the prompts included (batched-bench's ``T``, counting generated tokens only).
  The prompts' cost grows with the streams however they are batched (each is its own
  compute), so this ratio stays below ``S_TG``'s.
- steps, and graphs built during the run.

Each stream count first runs once untimed (other prompts of the same lengths), as a
server's warm-up builds its step shapes before it serves: otherwise the timed run pays
for building its prompt and decode graphs (a graph, its allocation and its CPU plan
each, a large share of a short run), which is loading, not generation. ``--cold`` times
the first run instead.

A run of 8 streams and 32 tokens is short, and on a small shared machine one such run
can measure anywhere within a wide range of one stream's rate. So the stream counts are
run ``--rounds`` times, round after round (each round every count once: drift hits them
alike), and each figure is the median of its rounds; the ratios are of medians.

Without ``--model`` the model is written by ``tensorplug_llm.tiny.write_tiny_llama``
(``--size tiny``: the test model; ``100M``: 8 blocks, n_embd 768, vocab 32000, Q8_0).
The model goes where ``ModelRunner`` puts it by default (the best GPU, else the CPU).
Figures are only meaningful on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorplug_llm.engine import Engine, Request
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

SIZES: dict[str, dict[str, int]] = {
    "tiny": {},
    "100M": {
        "n_vocab": 32000, "n_embd": 768, "n_layer": 8, "n_head": 12, "n_head_kv": 4,
        "n_ff": 2048, "n_ctx": 2048,
    },
}  # fmt: skip


@dataclass
class Figures:
    """One stream count's run."""

    tps: float  # generated tokens / (first submit .. last token)
    s_tg: float  # decode steps' tokens / (end of the prompts .. last token)
    steps: int
    graphs: int  # built during the run


def run(llama: ModelRunner, streams: int, prompt: int, gen: int, seed: int = 0) -> Figures:
    """The figures of ``streams`` concurrent requests."""
    rng = np.random.default_rng([streams, seed])
    n_vocab = llama.config.n_vocab
    prompts = [[1, *rng.integers(3, n_vocab, size=prompt - 1).tolist()] for _ in range(streams)]
    t = llama.timings
    built, prompt_s0 = t.graphs_built, t.prompt_s
    with Engine(llama, n_parallel=streams, n_batch=max(llama.n_batch, streams)) as engine:
        start = time.perf_counter()
        handles = [
            engine.submit(Request(p, max_tokens=gen, stop_tokens=frozenset())) for p in prompts
        ]
        tokens = sum(len(h.result()) for h in handles)
        elapsed = time.perf_counter() - start
        steps = engine.stats.steps
    t = llama.timings
    # the steps that carry prompt tokens are timed by the runner (all the prompts fit
    # one step at the default sizes, and it gives each stream its first token); the
    # rest of the time from the first submit on is generation
    prompt_s = t.prompt_s - prompt_s0
    s_tg = (tokens - streams) / (elapsed - prompt_s) if elapsed > prompt_s else 0.0
    return Figures(tokens / elapsed, s_tg, steps, t.graphs_built - built)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="a GGUF file (default: a written random model)")
    p.add_argument("--size", choices=sorted(SIZES), default="100M")
    p.add_argument("--streams", default="1,4,8", help="comma-separated stream counts")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: governed)")
    p.add_argument("--rounds", type=int, default=5, help="runs per stream count (median)")
    p.add_argument("--cold", action="store_true", help="time the first run (graph builds)")
    args = p.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            path = write_tiny_llama(Path(tmp) / "model.gguf", "q8_0", 0, **SIZES[args.size])  # type: ignore[arg-type]
        n_ctx = max(counts) * (args.prompt + args.gen) + 64
        with ModelRunner(path, n_ctx=n_ctx, n_threads=args.threads) as llama:
            rounds: dict[int, list[Figures]] = {n: [] for n in counts}
            for r in range(1 if args.cold else args.rounds):
                for n in counts:
                    if not args.cold and r == 0:
                        run(llama, n, args.prompt, args.gen, seed=1)
                    # new prompts each round: a repeated one would reuse its cached prefix
                    rounds[n].append(run(llama, n, args.prompt, args.gen, seed=2 + r))
    _report(rounds)


def _report(rounds: dict[int, list[Figures]]) -> None:
    """Each stream count's median figures, and their ratios to the first count's."""
    n_rounds = len(next(iter(rounds.values())))
    print(f"{'streams':>7} {'S_TG tok/s':>11} {'x one':>6} {'all tok/s':>10} {'x one':>6} "
          f"{'steps':>6} {'graphs':>6}  (median of {n_rounds})")  # fmt: skip
    one: tuple[float, float] | None = None
    for n, figs in rounds.items():
        s_tg = statistics.median(f.s_tg for f in figs)
        tps = statistics.median(f.tps for f in figs)
        one = one or (s_tg, tps)
        steps, graphs = max(f.steps for f in figs), max(f.graphs for f in figs)
        print(f"{n:>7} {s_tg:>11.1f} {s_tg / one[0]:>6.2f} {tps:>10.1f} {tps / one[1]:>6.2f} "
              f"{steps:>6} {graphs:>6}")  # fmt: skip


if __name__ == "__main__":
    main()

"""Where one generated token's time goes: the Python around the compiled calls, and them.

    python benchmarks/profile_step.py [--models 100M:q4_0] [--threads 2] [--tokens 300]
        [--as-avx2] [--json]

loads each model as ``benchmarks/bench_vs_llamacpp.py`` does, evaluates a 16-token
prompt and generates greedily, in alternate blocks of :data:`BLOCK` tokens bare (the
token time a user sees) and with each function of :data:`PROBES` wrapped in a timer,
so that both kinds of token see the same minutes of a shared machine. Per function it
prints the calls per token, the median of its time per token (itself and what it
calls) and the median of its own time (without the probed functions it calls); then
the Python time per token (the step's time outside the compiled program; less the
probes' own cost, the probed tokens' extra over the bare ones) and how many calls into
compiled code a token's graph makes (a plan's runs: a program runs the graph's jobs in
one call; the steps left between programs are calls of their own).

Medians of per-token records, not sums: on a shared VM one token in a few hundred stalls
for many tokens' time, which would swamp a mean. A probe's cost lands in its caller's
own time; the bare and probed token medians side by side show it whole. cProfile is no
use here: its overhead per Python call is larger than most of the functions it would
time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_llamacpp import (  # the benchmark's models, prompt and loader
    AUTO,
    MODEL_CACHE,
    load_tensorplug,
    model_path,
    parse_counts,
    parse_models,
    prompt_tokens,
)

#: (depth in the printed tree, module, class, method): a generated token's call path,
#: from ``ModelRunner.eval`` down to the compiled program, and the work of the step beside it
PROBES: tuple[tuple[int, str, str, str], ...] = (
    (0, "tensorplug_llm.runner", "ModelRunner", "eval"),
    (1, "tensorplug_llm.runner", "ModelRunner", "decode"),
    (2, "tensorplug_llm.runner", "ModelRunner", "_step"),
    (3, "tensorplug_llm.runner", "ModelRunner", "_shape"),
    (3, "tensorplug_llm.kv_cells", "KVCells", "assign"),
    (3, "tensorplug_llm.runner", "ModelRunner", "_allocated"),
    (3, "tensorplug_llm.step_io", "StepIO", "write"),
    (3, "tensorplug_llm.kv_cells", "KVCells", "mask"),
    (3, "tensorplug_llm.kv_cells", "KVCells", "position_order"),
    (3, "tensorplug.gguf", "GGUFFile", "check_unchanged"),
    (3, "tensorplug.sched", "Scheduler", "graph_compute"),
    (4, "tensorplug_cpu.backend", "CpuBackend", "_run"),
    (5, "tensorplug_cpu.kernels.program", "Program", "__call__"),
    (3, "tensorplug_llm.step_io", "StepIO", "read"),
)
#: the probe whose time is compiled code: the rest of a token is Python's
COMPILED = "Program.__call__"
PROMPT = 16
QUANTILES = (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))
#: generated tokens in a row with the probes on, then off
BLOCK = 25


@dataclass
class Probe:
    """One function's calls and seconds in the current token."""

    label: str
    depth: int
    calls: int = 0
    total: float = 0.0
    own: float = 0.0


class Timer:
    """Wraps methods to add their time to a :class:`Probe`, and to their caller's; the
    wrappers are put in place by :meth:`on` and taken away by :meth:`off`."""

    def __init__(self) -> None:
        self.probes: list[Probe] = []
        self._children: list[float] = []  # per open call: the probed time of its callees
        self._swaps: list[tuple[type, str, Callable[..., Any], Callable[..., Any]]] = []

    def wrap(self, depth: int, module: str, cls_name: str, name: str) -> None:
        """Probe ``module.cls_name.name`` (a method, looked up now) from the next :meth:`on`."""
        owner = getattr(importlib.import_module(module), cls_name, None)
        original = getattr(owner, name, None) if owner is not None else None
        if owner is None or original is None:
            raise SystemExit(
                f"{module}.{cls_name}.{name} is gone: update PROBES in {__file__} to the "
                "functions a generated token now goes through"
            )
        probe = Probe(f"{cls_name}.{name}", depth)
        children, perf = self._children, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            children.append(0.0)
            start = perf()
            try:
                return original(*args, **kwargs)
            finally:
                spent = perf() - start
                probe.calls += 1
                probe.total += spent
                probe.own += spent - children.pop()
                if children:
                    children[-1] += spent

        self.probes.append(probe)
        self._swaps.append((owner, name, original, timed))

    def on(self) -> None:
        for owner, name, _, timed in self._swaps:
            setattr(owner, name, timed)

    def off(self) -> None:
        for owner, name, original, _ in reversed(self._swaps):
            setattr(owner, name, original)

    def take(self) -> dict[str, tuple[int, float, float]]:
        """This token's (calls, total, own) per probe; the probes start again at zero."""
        record = {p.label: (p.calls, p.total, p.own) for p in self.probes}
        for p in self.probes:
            p.calls, p.total, p.own = 0, 0.0, 0.0
        return record


def _warm(m: Any, n: int) -> None:
    """``n`` greedy tokens after a prompt: the first tokens of a length build its graphs."""
    m.reset()
    tok = int(m.eval(prompt_tokens(PROMPT, m.config.n_vocab)).argmax())
    for _ in range(n):
        tok = int(m.eval([tok]).argmax())


def _record_plans() -> tuple[list[Any], Callable[[], None]]:
    """The CPU plans computed from now on (the last is a token's), and an undo."""
    from tensorplug_cpu.backend import CpuBackend

    seen: list[Any] = []
    original = CpuBackend._run

    def run(self: CpuBackend, plan: Any) -> Any:
        seen[:] = [plan]
        return original(self, plan)

    CpuBackend._run = run  # type: ignore[method-assign]

    def undo() -> None:
        CpuBackend._run = original  # type: ignore[method-assign]

    return seen, undo


def _plan_calls(plan: Any) -> dict[str, int]:
    """How a token's CPU plan runs: its nodes, its steps and the calls they make."""
    from tensorplug_cpu.kernels.program import Program

    programs = [s for s, _ in plan.runs if isinstance(s, Program)]
    return {
        "nodes": len(plan.nodes),
        "steps": len(plan.steps),
        "calls": len(plan.runs),
        "programs": len(programs),
        "steps_in_programs": sum(len(p) for p in programs),
    }


def profile(path: Path, threads: int, tokens: int) -> dict[str, Any]:
    m = load_tensorplug(path, threads, PROMPT + 2 * tokens, PROMPT, PROMPT)
    # the recorder first, so that the probe of _run wraps it (and times it with _run)
    plans, forget_plans = _record_plans()
    timer = Timer()
    for probe in PROBES:
        timer.wrap(*probe)
    _warm(m, max(8, tokens // 10))
    # bare and probed tokens in alternate blocks, so that both see the same machine (on
    # a shared VM, the speed of one minute is not the next one's)
    bare: list[float] = []
    probed: list[float] = []
    records: list[dict[str, tuple[int, float, float]]] = []
    m.reset()
    tok = int(m.eval(prompt_tokens(PROMPT, m.config.n_vocab)).argmax())
    for block in range(2 * -(-tokens // BLOCK)):
        on = block % 2 == 1
        if on:
            timer.on()
        for _ in range(min(BLOCK, tokens - len(probed if on else bare))):
            start = time.perf_counter()
            tok = int(m.eval([tok]).argmax())
            (probed if on else bare).append(time.perf_counter() - start)
            if on:
                records.append(timer.take())
        timer.off()
        timer.take()
    forget_plans()
    if not plans:
        raise SystemExit(f"{path.name}: no CPU plan computed its tokens (is the CPU plugin there?)")
    plan = _plan_calls(plans[-1])
    m.close()
    rows = []
    for p in timer.probes:
        rows.append({
            "function": p.label, "depth": p.depth,
            "calls": statistics.median(r[p.label][0] for r in records),
            "total_us": 1e6 * statistics.median(r[p.label][1] for r in records),
            "own_us": 1e6 * statistics.median(r[p.label][2] for r in records),
        })  # fmt: skip
    top = timer.probes[0].label
    token, token_probed = statistics.median(bare), statistics.median(probed)
    # the probes' cost, which lands in their callers' own times: the probed tokens' extra
    extra = max(0.0, token_probed - token)
    python = sorted(r[top][1] - r[COMPILED][1] for r in records)
    quantiles = {q: 1e6 * python[int(f * (len(python) - 1))] for q, f in QUANTILES}
    return {
        "tokens": tokens,
        "token_us": 1e6 * token,
        "profiled_token_us": 1e6 * token_probed,
        "python_us": quantiles,
        "python_bare_us": quantiles["p50"] - 1e6 * extra,
        "rows": rows,
        "plan": plan,
    }


def report(name: str, threads: int, result: dict[str, Any]) -> str:
    t = "auto" if threads == AUTO else str(threads)
    py, plan = result["python_us"], result["plan"]
    lines = [
        f"{name}, {t} threads, {result['tokens']} generated tokens: "
        f"{result['token_us']:.0f} us a token (median; "
        f"{result['profiled_token_us']:.0f} probed, in alternate blocks of {BLOCK})",
        f"{'function':<38} {'calls':>6} {'median us':>10} {'own us':>8}",
    ]
    for r in result["rows"]:
        label = "  " * r["depth"] + r["function"]
        lines.append(f"{label:<38} {r['calls']:>6g} {r['total_us']:>10.1f} {r['own_us']:>8.1f}")
    lines.append(
        f"Python per token (eval outside {COMPILED}): {py['p50']:.0f} us median "
        f"(p10 {py['p10']:.0f}, p90 {py['p90']:.0f}) probed; "
        f"~{result['python_bare_us']:.0f} us without the probes' cost"
    )
    lines.append(
        f"a token's graph: {plan['nodes']} nodes in {plan['steps']} steps, run as "
        f"{plan['calls']} calls: {plan['programs']} compiled program(s) running "
        f"{plan['steps_in_programs']} steps, {plan['calls'] - plan['programs']} step(s) alone"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="100M:q4_0")
    p.add_argument("--threads", default="2", help="thread counts (2); 'auto': the runner's")
    p.add_argument("--tokens", type=int, default=300, help="generated tokens timed (300)")
    p.add_argument("--cache", type=Path, default=MODEL_CACHE)
    p.add_argument("--as-avx2", action="store_true", help="an AVX2 host's kernels")
    p.add_argument("--json", action="store_true", help="one JSON line per model and threads")
    a = p.parse_args(argv)
    if a.tokens < 1:
        raise SystemExit("--tokens must be >= 1")
    if a.as_avx2:  # before numba is imported: its compile target is read once
        if "numba" in sys.modules:
            raise SystemExit("--as-avx2: numba was imported before its target could be set")
        from tensorplug_cpu.system import AVX2_FEATURES

        os.environ["NUMBA_CPU_FEATURES"] = AVX2_FEATURES
    for spec in parse_models(a.models):
        path = model_path(spec, a.cache)
        for threads in parse_counts(a.threads, "--threads"):
            result = profile(path, threads, a.tokens)
            if a.json:
                print(json.dumps({"model": spec.name, "threads": threads, **result}))
            else:
                print(report(spec.name, threads, result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

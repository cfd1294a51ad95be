"""Where one ``tensorplug run`` spends its time from launch to the first token.

    python benchmarks/profile_launch.py [--cold] [-- RUN-ARGS...]

runs ``tensorplug run --plain -p "The capital of France is" -n 1`` (or the arguments
after ``--``) in this process under cProfile and prints the time of each launch step
(imports, plugin discovery, opening the GGUF file, loading and repacking the weights,
zeroing the KV cache, the warm-up steps, the kernels loaded from kept code and numba's
cache loads inside them, numba's import where the plugin needs it: none where every
kernel is kept) and, per numba kernel the CPU time its compile took on the compiling
thread (a load from numba's disk cache raises no compile event: those are in the step
"numba compiles and cache loads"). ``--cold`` points numba's disk cache at an empty folder first
(``NUMBA_CACHE_DIR``): a new install's first run. CPU time, not wall time, is what the
kernels are ranked by: on a shared machine the wall time of a compile is mostly other
processes'. Steps are cumulative times of the functions named in :data:`STEPS` (they
nest: the warm-up holds the cache loads). cProfile adds its own overhead to Python-heavy
steps; the total wall time without it is ``benchmarks/bench_vs_llamacpp.py``'s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import os
import pstats
import sys
import tempfile
import time
from typing import Any

#: (step, file the function is in, function name): cumulative times read from cProfile
STEPS: tuple[tuple[str, str, str], ...] = (
    ("import tensorplug", "tensorplug/__init__.py", "<module>"),
    ("import numba", "numba/__init__.py", "<module>"),
    ("plugin discovery", "tensorplug/registry.py", "_load_all_locked"),
    ("open the GGUF file", "tensorplug/gguf.py", "__init__"),
    # run's own loader: the model, then the warm-up for the prompt's length
    ("load the model (all below)", "tensorplug_llm/run_cli.py", "_load"),
    ("  weights and KV cache", "tensorplug_llm/runner.py", "_load"),
    ("    repack weights", "tensorplug_cpu/repack.py", "pack_blocks"),
    ("    zero the KV cache", "tensorplug/host.py", "_clear"),
    ("  warm-up steps", "tensorplug_llm/runner.py", "warm_up"),
    ("    CPU plans (bind)", "tensorplug_cpu/backend.py", "bind"),
    ("    kernels a prepared plan calls", "tensorplug_cpu/kernels/jit.py", "load_expected"),
    ("    kept kernels loaded", "tensorplug_cpu/kernels/numba_internals/kept_code.py", "load"),
    ("    numba compiles and cache loads", "numba/core/dispatcher.py", "_compile_for_args"),
)
DEFAULT_RUN = ["run", "--plain", "-p", "The capital of France is", "-n", "1"]


def kernel_times() -> dict[str, float]:
    """CPU seconds per numba kernel, of the compiling thread, from numba's compile
    events (nested compiles of callees count toward the outermost kernel), once the
    plugin imports numba (a launch whose kernels are all kept never does)."""
    from tensorplug_cpu.kernels.numba_import import on_import

    totals: dict[str, float] = collections.defaultdict(float)

    def listen(numba: Any) -> None:
        class Timer(numba.core.event.Listener):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                self.started: list[float] = []

            def on_start(self, ev: Any) -> None:
                self.started.append(time.thread_time())

            def on_end(self, ev: Any) -> None:
                spent = time.thread_time() - self.started.pop()
                if not self.started:
                    fn = ev.data["dispatcher"].py_func
                    totals[f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__qualname__}"] += spent

        numba.core.event.register("numba:compile", Timer())

    on_import(listen)
    return totals


def step_times(stats: pstats.Stats) -> list[tuple[str, float]]:
    """The cumulative seconds of each of :data:`STEPS` that ran."""
    found = []
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # pstats's own table
    for label, file, name in STEPS:
        total = sum(v[3] for (path, _, fn), v in table.items()
                    if fn == name and path.endswith(file))  # fmt: skip
        found.append((label, total))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cold", action="store_true", help="numba's disk cache empty (first run)")
    p.add_argument("run", nargs="*", help="tensorplug arguments (after --)")
    a = p.parse_args(argv)
    folder = tempfile.TemporaryDirectory(prefix="tensorplug-cold-numba-") if a.cold else None
    if folder is not None:
        if "numba" in sys.modules:
            raise SystemExit("--cold: numba was imported before its cache could be moved")
        os.environ["NUMBA_CACHE_DIR"] = folder.name
    launched = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    kernels = kernel_times()  # numba's import, where the plugin needs it, is a step of its own
    from tensorplug.cli import main as tensorplug

    with contextlib.suppress(SystemExit):
        tensorplug(a.run or DEFAULT_RUN)
    profile.disable()
    wall = time.perf_counter() - launched
    print(f"\nlaunch to exit {wall:.2f} s wall (under cProfile), "
          f"{'empty' if a.cold else 'warm'} numba cache", file=sys.stderr)  # fmt: skip
    for label, seconds in step_times(pstats.Stats(profile)):
        print(f"{seconds:8.2f} s  {label}", file=sys.stderr)
    print("numba kernels compiled, CPU s of the compiling thread:", file=sys.stderr)
    for name, seconds in sorted(kernels.items(), key=lambda kv: -kv[1]):
        print(f"{seconds:8.2f} s  {name}", file=sys.stderr)
    print(f"{sum(kernels.values()):8.2f} s  all kernels", file=sys.stderr)
    if folder is not None:
        folder.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

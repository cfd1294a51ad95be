"""How long plugin discovery takes before any plugin's heavy part is imported.

Installs the test plugin distributions (tests/plugins/*, 10 of them: working, variants,
broken ones) with pip into a temporary folder, then in fresh processes measures, after
``import tensorplug``:

* discover: read the ``tensorplug.backends`` entry points, import every registration
  module, check API versions and score (``tensorplug.registry.discover()``), with
  ``importlib.metadata`` already imported, and as the process's first use of it
  (tensorplug imports it lazily; importing it costs tens of ms on a slow machine);
* load_all: importing and initialising the winners and registering their devices and
  hooks (pluggy included), for comparison.

Target: discovery under 20 ms with 4+ plugins installed, so that finding plugins stays a
small part of any launch.
Run: ``python benchmarks/bench_discovery.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from plugin_dists import PluginEnv

PROBE = """
import json, sys, time
import tensorplug
from tensorplug import registry
t0 = time.perf_counter()
if {warm}:
    import importlib.metadata  # what pluggy, pip and most tools import anyway
t1 = time.perf_counter()
records = registry.discover()
t2 = time.perf_counter()
heavy = sorted(m for m in sys.modules if m.startswith("tp_") and m.count(".") and
               not m.endswith(".registration"))
registry.load_all()
t3 = time.perf_counter()
print(json.dumps({{"stdlib": (t1 - t0) * 1e3, "discover": (t2 - t1) * 1e3,
                  "load_all": (t3 - t2) * 1e3, "plugins": len(records),
                  "heavy_during_discovery": heavy}}))
"""


def measure(env: PluginEnv, runs: int, warm: bool) -> list[dict[str, Any]]:
    out = []
    for _ in range(runs):
        proc = env.run(["-c", PROBE.format(warm=warm)])
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        out.append(json.loads(proc.stdout.splitlines()[-1]))
    return out


def _stats(label: str, values: list[float]) -> None:
    print(
        f"{label:<58} median {statistics.median(values):6.2f} ms  min {min(values):6.2f}  "
        f"max {max(values):6.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh processes per measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = PluginEnv.create(Path(tmp))
        warm = measure(env, args.runs, warm=True)
        cold = measure(env, args.runs, warm=False)
    print(f"plugins installed: {warm[0]['plugins']}, fresh processes per row: {args.runs}")
    disc = [r["discover"] for r in warm]
    _stats("discover() (entry points, registrations, scores)", disc)
    _stats("  one-time import of importlib.metadata before it", [r["stdlib"] for r in warm])
    _stats("discover() as the process's first metadata use", [r["discover"] for r in cold])
    _stats("load_all() after discover() (winners' init, pluggy)", [r["load_all"] for r in warm])
    heavy = sorted({m for r in warm + cold for m in r["heavy_during_discovery"]})
    print(f"plugin modules imported by discovery beyond registrations: {heavy or 'none'}")
    print(f"target: discover() < 20 ms -> {'met' if statistics.median(disc) < 20 else 'MISSED'}")
    return 0 if statistics.median(disc) < 20 else 1


if __name__ == "__main__":
    raise SystemExit(main())

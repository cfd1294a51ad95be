"""numba's threading layer: TBB from the ``tbb`` wheel where it is installed, the user's
choice where one is named. The layer is chosen once per process, so each case runs in a
fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cached_kernels import kernel_folder, run_script

from tensorplug_cpu.kernels.threading_layer import (
    TBB_LIBRARY_NAMES,
    default_thread_count,
    find_tbb_library,
    preload_tbb,
)

pytest.importorskip("numba", reason="numba is not installed: there is no threading layer")

TBB = find_tbb_library()
needs_tbb = pytest.mark.skipif(
    TBB is None, reason="the tbb distribution is not installed here (pip install tbb)"
)

_REPORT = (
    "import numpy as np, numba\n"
    "from tensorplug_cpu.kernels.jit import jit_status, load_jit\n"
    "kernels = load_jit()\n"
    "kernels.set_num_threads(2)\n"
    "x = np.arange(64, dtype=np.float32).reshape(2, 32)\n"
    "out = np.empty_like(x)\n"
    "kernels.rms_norm_rows(x, out, 1e-6)\n"
    "print(numba.threading_layer())\n"
    "print(jit_status())\n"
)


def _fresh_process(**env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    out = subprocess.run([sys.executable, "-c", _REPORT], capture_output=True, text=True,
                         env={**environ, **env}, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


@needs_tbb
def test_installed_tbb_is_the_layer_the_kernels_run_on() -> None:
    layer, status, _ = _fresh_process()
    assert layer == "tbb"
    assert ", tbb threading layer, " in status


@needs_tbb
def test_a_layer_the_user_names_is_kept() -> None:
    layer, status, _ = _fresh_process(NUMBA_THREADING_LAYER="workqueue")
    assert layer == "workqueue"
    assert ", workqueue threading layer, " in status


@needs_tbb
def test_the_public_path_starts_the_layer_through_numba() -> None:
    """With the fast launch off, numba starts its own threads, on the layer asked for
    (through ``numba.config``), and the status says which path loads the kernels."""
    layer, status, _ = _fresh_process(TENSORPLUG_CPU_NUMBA_INTERNALS="0")
    assert layer == "tbb"
    assert status.endswith(
        ", tbb threading layer, numba's public API only (TENSORPLUG_CPU_NUMBA_INTERNALS=0)"
    )
    layer, status, _ = _fresh_process(TENSORPLUG_CPU_NUMBA_INTERNALS="0",
                                      NUMBA_THREADING_LAYER="workqueue")  # fmt: skip
    assert layer == "workqueue" and ", workqueue threading layer, " in status


def test_nothing_is_loaded_for_a_layer_that_is_not_tbb() -> None:
    assert preload_tbb("omp") is None
    assert preload_tbb(" WorkQueue ") is None


@needs_tbb
def test_the_library_found_is_the_one_numba_asks_for() -> None:
    assert TBB is not None and TBB.is_file()
    assert TBB.name == TBB_LIBRARY_NAMES[sys.platform]
    assert preload_tbb("default") == TBB


_PARALLEL_KERNELS = """
import numpy as np
from numba import prange
from tensorplug_cpu.kernels._numba_cache import kernel

@kernel(parallel=True)
def halves_into(x, out):
    for i in prange(x.shape[0]):
        out[i] = x[i] * 0.5
"""

#: numba compiles the parallel kernel and keeps its code (numba starts its layer)
_KEEP = """
import json
import numpy as np
import user_kernels as u
from tensorplug_cpu.kernels.numba_internals.kept_kernels import keep_overload
x = np.arange(1000, dtype=np.float64)
out = np.empty_like(x)
u.halves_into(x, out)
keep_overload(u.halves_into, (x, out))
print(json.dumps({"sum": float(out.sum())}))
"""

#: the layer started without numba, the kept parallel kernel run on it at one and two
#: threads, then numba imported and handed the layer, and a parallel kernel numba
#: compiles here run on it
_START_THEN_NUMBA = """
import json, sys
from pathlib import Path
import numpy as np
from tensorplug_cpu.kernels.arg_types import arg_key
from tensorplug_cpu.kernels.kernel_identity import identity
from tensorplug_cpu.kernels.numba_internals.kept_kernels import kept_in
from tensorplug_cpu.kernels.numba_internals.threads import tell_numba
from tensorplug_cpu.kernels.threading_layer import preload_tbb, start_threads

layer = sys.argv[1]
preload_tbb(layer)
threads = start_threads(layer)
seen = {"layer": threads.layer, "count": threads.count, "numba": "numba" in sys.modules}
kept = kept_in()
x = np.arange(1000, dtype=np.float64)
out = np.empty_like(x)
halves = kept.load(identity(("module", "user_kernels", "halves_into")), arg_key((x, out)))
sums = []
for n in (1, min(2, threads.count)):
    threads.set_num_threads(n)
    out[:] = 0
    halves(x, out)
    sums.append(float(out.sum()))
seen.update(sums=sums, numba_after_kernel="numba" in sys.modules)

import numba
tell_numba()
seen["numba_layer"] = numba.threading_layer()
seen["numba_threads"] = numba.get_num_threads()
numba.set_num_threads(1)
seen["ours_after_numba_set"] = threads.get_num_threads()
numba.set_num_threads(threads.count)

@numba.njit(parallel=True)
def total(v):
    acc = 0.0
    for i in numba.prange(v.shape[0]):
        acc += v[i]
    return acc

seen["numba_total"] = total(x)
print(json.dumps(seen))
"""


def _layers() -> list[str]:
    return ["workqueue", "omp", *(["tbb"] if TBB is not None else [])]


@pytest.mark.parametrize("layer", _layers())
def test_a_layer_started_without_numba_runs_kept_kernels_and_is_numbas_later(
    tmp_path: Path, layer: str
) -> None:
    """:func:`start_threads` in a process without numba: the kept parallel kernel runs
    on the layer asked for (one thread and two give its result), and numba, imported
    after, takes that layer as its own: its name, its thread count, its parallel code."""
    folder = kernel_folder(tmp_path, _PARALLEL_KERNELS)
    kept = run_script(folder, _KEEP)
    seen = run_script(folder, _START_THEN_NUMBA, layer)
    assert seen["layer"] == layer and seen["numba_layer"] == layer
    assert not seen["numba"] and not seen["numba_after_kernel"]
    assert seen["sums"] == [kept["sum"], kept["sum"]] == [0.5 * 999 * 1000 / 2] * 2
    assert seen["count"] == seen["numba_threads"] == default_thread_count()
    assert seen["ours_after_numba_set"] == 1
    assert seen["numba_total"] == 999 * 1000 / 2


def test_an_unknown_layer_is_refused() -> None:
    code = ("from tensorplug_cpu.kernels.threading_layer import start_threads\n"
            "start_threads('fastest')\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0
    assert "ValueError: The threading layer requested 'fastest' is unknown" in done.stderr

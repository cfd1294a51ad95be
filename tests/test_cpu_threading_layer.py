"""numba's threading layer: TBB from the ``tbb`` wheel where it is installed, the user's
choice where one is named. The layer is chosen once per process, so each case runs in a
fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tensorplug_cpu.kernels.threading_layer import (
    TBB_LIBRARY_NAMES,
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
    assert status.endswith(", tbb threading layer")


@needs_tbb
def test_a_layer_the_user_names_is_kept() -> None:
    layer, status, _ = _fresh_process(NUMBA_THREADING_LAYER="workqueue")
    assert layer == "workqueue"
    assert status.endswith(", workqueue threading layer")


def test_nothing_is_loaded_for_a_layer_that_is_not_tbb() -> None:
    assert preload_tbb("omp") is None
    assert preload_tbb(" WorkQueue ") is None


@needs_tbb
def test_the_library_found_is_the_one_numba_asks_for() -> None:
    assert TBB is not None and TBB.is_file()
    assert TBB.name == TBB_LIBRARY_NAMES[sys.platform]
    assert preload_tbb("default") == TBB

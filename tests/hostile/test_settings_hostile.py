"""Settings and the layers below: a value tensorplug or a library under it cannot use
is refused (or made safe, with a warning) before it can crash the process or fail
deep inside the library, and a damaged cache is repaired, not fatal forever."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba", reason="the CPU plugin's numba kernels are not installed")

_PRODUCT = """
import numpy as np, tensorplug as tp
from tensorplug import ops
be = tp.dev_by_name("CPU").init_backend()
w = tp.new_tensor("q4_0", (64, 256), "w")
x = tp.new_tensor("f32", (1, 256), "x")
y = ops.mul_mat(w, x)
tp.alloc_tensors([w, x, y], be.buffer_type())
tp.set_array(w, np.zeros((64, w.row_bytes), np.uint8))
tp.set_array(x, np.ones((1, 256), np.float32))
be.graph_compute(tp.Graph(y))
print("computed", tp.get_array(y).sum())
"""


def _run_product(**env: str) -> subprocess.CompletedProcess[str]:
    """A fresh process (numba reads its variables once, at import) that computes one
    quantized product on the CPU: numba's parallel kernels start their threads."""
    return subprocess.run([sys.executable, "-c", _PRODUCT], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env})  # fmt: skip


def test_too_many_numba_threads_are_lowered_not_a_segfault() -> None:
    done = _run_product(NUMBA_NUM_THREADS="100000")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "computed 0.0" in done.stdout
    assert "NUMBA_NUM_THREADS=100000 is more threads than numba can start" in done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NUMBA_THREADING_LAYER": "bogus"}, "NUMBA_THREADING_LAYER='bogus': numba knows"),
        ({"NUMBA_NUM_THREADS": "0"}, "NUMBA_NUM_THREADS='0': numba needs at least 1 thread"),
        ({"TENSORPLUG_CPU_JIT": "maybe"}, "TENSORPLUG_CPU_JIT='maybe': expected one of"),
    ],
)
def test_a_setting_numba_cannot_use_is_refused_when_the_backend_starts(
    env: dict[str, str], message: str
) -> None:
    done = _run_product(**env)
    assert done.returncode == 1
    assert f"tensorplug.settings.SettingError: {message}" in done.stderr, done.stderr[-2000:]

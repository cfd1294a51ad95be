"""A kernel loaded from numba's disk cache does not import the numba modules whose code
it inlined (``deferred_environments`` of
tensorplug_cpu.kernels.numba_internals.numba_private): their environments are rebuilt
with the module's name alone. Each case runs in fresh processes with their
own cache folder: a kernel loads once a process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cached_kernels import kernel_folder, run_script

pytest.importorskip("numba")

_KERNELS = """
import numpy as np
from tensorplug_cpu.kernels._numba_cache import kernel

@kernel()
def squares_sum(n):
    a = np.empty(n, np.float64)  # numba.np.arrayobj's code, inlined
    for i in range(n):
        a[i] = i * i
    return a.sum()

@kernel()
def checked(n):
    if n < 0:
        raise ValueError("n must be at least 0, got a negative n")
    return np.arange(n).sum()
"""

_RUN = """
import json, sys
import user_kernels

out = {"sum": user_kernels.squares_sum(10), "ok": int(user_kernels.checked(4))}
try:
    user_kernels.checked(-1)
except ValueError as e:
    out["error"] = str(e)
out["hits"] = sum(sum(k.stats.cache_hits.values())
                  for k in (user_kernels.squares_sum, user_kernels.checked))
out["arrayobj"] = "numba.np.arrayobj" in sys.modules
print(json.dumps(out))
"""


def test_a_cached_kernel_loads_without_the_numba_modules_it_inlined(tmp_path: Path) -> None:
    folder = kernel_folder(tmp_path, _KERNELS)
    first = run_script(folder, _RUN)  # compiles: numba imports what it compiles with
    assert first["hits"] == 0 and first["arrayobj"]
    second = run_script(folder, _RUN)  # loads both from the cache
    assert second["hits"] == 2 and not second["arrayobj"]
    expected = {"sum": 285.0, "ok": 6, "error": "n must be at least 0, got a negative n"}
    assert {k: second[k] for k in expected} == {k: first[k] for k in expected} == expected


_UNIT = """
import json, pickle, sys
from numba.core import environment
from tensorplug_cpu.kernels.numba_internals.numba_private import (
    deferred_environments,
    rebuild_environment,
)

numbas = environment._rebuild_env
out = {}
env = rebuild_environment("numba.np.arrayobj", [1, "x"], "tp_env_a")
out["deferred"] = [env.globals, list(env.consts), env.env_name,
                   environment.lookup_environment("tp_env_a") is env,
                   "numba.np.arrayobj" in sys.modules]
other = rebuild_environment("json", [], "tp_env_b")  # not numba's: numba's way
out["other"] = [other.globals is sys.modules["json"].__dict__, "json" in sys.modules]
again = pickle.loads(pickle.dumps(env))  # pickled as numba pickles it: by module name
out["round trip"] = again is env
with deferred_environments():
    out["inside"] = environment._rebuild_env is rebuild_environment
out["restored"] = environment._rebuild_env is numbas
print(json.dumps(out))
"""


def test_a_numba_module_not_imported_yet_gives_an_environment_of_its_name() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_UNIT)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {
        "deferred": [{"__name__": "numba.np.arrayobj"}, [1, "x"], "tp_env_a", True, False],
        "other": [True, True],
        "round trip": True,
        "inside": True,
        "restored": True,
    }

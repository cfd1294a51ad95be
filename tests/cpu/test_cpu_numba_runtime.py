"""A kernel loaded from numba's disk cache runs without numba compiling anything:
neither its registries (imported for a compile) nor its runtime library (kept as
object code beside the kernels). Each case runs in fresh processes, with its own cache
folder, since both happen once a process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from cached_kernels import kernel_folder, run_script

pytest.importorskip("numba")

#: a module of cached kernels: one allocates an array (numba's runtime frees it)
_KERNELS = """
import numpy as np
from tensorplug_cpu.kernels._numba_cache import kernel

@kernel()
def squares_sum(n):
    a = np.empty(n, np.float64)
    for i in range(n):
        a[i] = i * i
    return a.sum()
"""

#: runs the kernel, then reports what the process loaded; with "compile", compiles an
#: uncached function that needs numba's numpy registries afterwards
_RUN = """
import json, sys
import numba
from numba.core.runtime import nrtdynmod
built = []  # numba's runtime library built from its IR (rather than loaded)
create_nrt_module = nrtdynmod.create_nrt_module
nrtdynmod.create_nrt_module = lambda ctx: built.append(1) or create_nrt_module(ctx)
import user_kernels
out = {"sum": user_kernels.squares_sum(10)}
out["hits"] = sum(user_kernels.squares_sum.stats.cache_hits.values())
out["runtime_built"] = bool(built)
if "compile" in sys.argv:
    import numpy as np
    @numba.njit
    def draw(seed):  # np.random's typing and lowering come with the registries
        np.random.seed(seed)
        return np.random.random()
    out["draw"] = draw(3)
out["registries_loaded"] = "numba.np.random.legacy" in sys.modules  # refresh() imports it
print(json.dumps(out))
"""


def _run(folder: Path, *args: str) -> dict:
    return run_script(folder, _RUN, *args)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return kernel_folder(tmp_path, _KERNELS)


def _runtime_files(folder: Path) -> list[Path]:
    return sorted((folder / "cache").rglob("nrt-*.nbo"))


def test_a_cached_kernel_loads_without_registries_or_compiling_the_runtime(
    folder: Path,
) -> None:
    first = _run(folder)
    assert first == {"sum": 285.0, "hits": 0, "runtime_built": True, "registries_loaded": True}
    [kept] = _runtime_files(folder)
    second = _run(folder)
    assert second == {"sum": 285.0, "hits": 1, "runtime_built": False, "registries_loaded": False}
    assert _runtime_files(folder) == [kept]


def test_a_compile_after_a_cache_load_still_has_numbas_registries(folder: Path) -> None:
    _run(folder)
    after = _run(folder, "compile")
    assert after["hits"] == 1 and after["registries_loaded"]
    assert after["draw"] == np.random.RandomState(3).random_sample()  # numba's generator is numpy's


def _flip_a_middle_bit(data: bytes) -> bytes:
    """One bit of the machine code changed: still a valid pickle, but not what was
    written (LLVM's loader would take it as code)."""
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1 :]


@pytest.mark.parametrize(
    "damage",
    [lambda d: b"", lambda d: b"\x00" * 64, lambda d: d[: len(d) // 2], _flip_a_middle_bit],
    ids=["empty", "zeros", "cut short", "one bit of the code changed"],
)
def test_an_unreadable_runtime_file_is_compiled_again_and_replaced(
    folder: Path, damage: Callable[[bytes], bytes]
) -> None:
    _run(folder)
    [kept] = _runtime_files(folder)
    good = kept.read_bytes()
    kept.write_bytes(damage(good))
    again = _run(folder)
    assert again["sum"] == 285.0 and again["runtime_built"]
    assert kept.read_bytes() == good  # rewritten whole
    after = _run(folder)
    assert after["sum"] == 285.0 and not after["runtime_built"]

"""Settings and the layers below: a value tensorplug or a library under it cannot use
is refused (or made safe, with a warning) before it can crash the process or fail
deep inside the library, and a damaged cache is repaired, not fatal forever."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def _kernel_module(folder: Path) -> ModuleType:
    """A module with one cached kernel, loaded afresh (a new dispatcher, as in a new
    run): its cache lives in the plugin's kernel cache (``NUMBA_CACHE_DIR`` set to
    ``folder/cache`` by the caller)."""
    path = folder / "kmod.py"
    if not path.exists():
        path.write_text(
            "from tensorplug_cpu.kernels._numba_cache import kernel\n\n"
            "@kernel()\ndef add_one(x):\n    return x + 1\n"
        )
    spec = importlib.util.spec_from_file_location("kmod", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", ["fast launch", "public API"])
@pytest.mark.parametrize("damage", ["index zeroed", "data truncated", "both emptied"])
def test_a_damaged_numba_cache_is_discarded_and_compiled_again(
    tmp_path: Path, damage: str, path: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from tensorplug_cpu.kernels import cache_folder, compiled, numba_internals
    from tensorplug_cpu.kernels.numba_internals import numba_private

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    if path == "public API":
        monkeypatch.setenv("TENSORPLUG_CPU_NUMBA_INTERNALS", "0")
    else:
        assert numba_internals.enabled(), numba_internals.why_off()
    monkeypatch.setattr(numba_private, "_warned", [])
    monkeypatch.setattr(cache_folder, "_warned_damage", [])

    def add_one(x: int) -> int:  # as the plugin makes a kernel's first call
        kmod = _kernel_module(tmp_path)
        compiled.guarded(kmod.add_one.compile, (kmod.add_one.typeof_pyval(x),))
        return int(kmod.add_one(x))

    assert add_one(1) == 2  # compiled, written to the cache
    index = next((tmp_path / "cache").rglob("*.nbi"))
    data = next((tmp_path / "cache").rglob("*.nbc"))
    if damage in ("index zeroed", "both emptied"):
        index.write_bytes(bytes(index.stat().st_size) if damage == "index zeroed" else b"")
    if damage in ("data truncated", "both emptied"):
        data.write_bytes(data.read_bytes()[: 0 if damage == "both emptied" else 40])
    with caplog.at_level(logging.WARNING, "tensorplug_cpu"):
        assert add_one(2) == 3  # the next run: compiled again
        assert add_one(3) == 4  # and the one after: cached
    said = [r.getMessage() for r in caplog.records if "kernel cache" in r.getMessage()]
    assert len(said) == 1 and "discarded" in said[0]


def test_doctor_says_which_settings_are_invalid() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tensorplug", "doctor", "--plain"], capture_output=True,
        text=True, timeout=600, env={**os.environ, "TENSORPLUG_SCHED_COPIES": "abc"},
    )  # fmt: skip
    row = next(line for line in done.stdout.splitlines() if "TENSORPLUG_SCHED_COPIES " in line)
    assert "abc (invalid)" in row
    assert "TENSORPLUG_SCHED_COPIES='abc': expected a whole number" in done.stdout


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"margin": float("nan")}, "margin a finite number >= 0 (got nan)"),
        ({"margin": float("inf")}, "margin a finite number >= 0 (got inf)"),
        ({"abandon": float("nan")}, "abandon > 1 (got nan)"),
        ({"window": float("nan")}, "window >= 1 (got nan)"),
        ({"max_wait": 2}, "max_wait >= first_wait (got 2)"),
    ],
)
def test_a_thread_governor_refuses_nan_and_impossible_options(
    option: dict[str, float], message: str
) -> None:
    import tensorplug as tp
    from tensorplug_llm.threads import ThreadGovernor

    with pytest.raises(tp.InvalidArgumentError) as info:
        ThreadGovernor(lambda n: None, 2, **option)  # type: ignore[arg-type]
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("value", "rows"), [("16", 16), ("0", 0), (" ALL ", 2**62), ("all", 2**62)]
)
def test_exact_attention_rows_reads_a_count_or_all(value: str, rows: int) -> None:
    from tensorplug_cpu.settings import EXACT_ATTENTION_ROWS

    assert EXACT_ATTENTION_ROWS.get({"TENSORPLUG_CPU_EXACT_ATTENTION_ROWS": value}) == rows
    assert EXACT_ATTENTION_ROWS.get({}) == 2**62  # all: batching changes no bit by default


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_exact_attention_rows_refuses_what_it_cannot_read(value: str) -> None:
    from tensorplug.settings import SettingError
    from tensorplug_cpu.settings import EXACT_ATTENTION_ROWS

    with pytest.raises(SettingError, match="TENSORPLUG_CPU_EXACT_ATTENTION_ROWS"):
        EXACT_ATTENTION_ROWS.get({"TENSORPLUG_CPU_EXACT_ATTENTION_ROWS": value})

"""The "numba is compiling" notice: said when numba compiles, never for a slow cached load.

It used to fire on a timer: a kernel whose first call took longer than the notice's delay
(numba's disk cache read on a busy machine: `tensorplug doctor`'s smoke test took 1.7 s)
announced a compile that never happened, on every run.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

numba = pytest.importorskip("numba")

from numba.core import event  # noqa: E402

from tensorplug_cpu.kernels import jit  # noqa: E402
from tensorplug_cpu.kernels.threading_layer import start_threads  # noqa: E402


def _kernels(monkeypatch: pytest.MonkeyPatch) -> jit.JitKernels:
    monkeypatch.setattr(jit, "COMPILE_NOTICE_S", 0.01)
    return jit.JitKernels(start_threads("default"))


def _slow_cached_load(*_: Any) -> int:
    time.sleep(0.2)  # far past the notice's delay, and nothing compiles
    return 1


def _compiles(*_: Any) -> int:
    with event.trigger_event("numba:compile", data={"dispatcher": None, "args": ()}):
        time.sleep(0.2)
    return 2


def test_a_slow_first_call_that_compiles_nothing_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernels = _kernels(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tensorplug_cpu"):
        assert kernels._call("cached kernel", _slow_cached_load) == 1
        time.sleep(0.05)  # a timer that was started would have fired by now
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]


def test_a_first_call_that_compiles_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernels = _kernels(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tensorplug_cpu"):
        assert kernels._call("Q4_0 kernel", _compiles) == 2
        assert kernels._call("Q4_0 kernel", _compiles) == 2  # not the first call: silent
    said = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert said == [
        "numba is compiling the Q4_0 kernel (once: it is cached on disk for later runs)"
    ]

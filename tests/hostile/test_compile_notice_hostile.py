"""The "numba is compiling" notice: said when numba compiles, never for a slow cached load.

It used to fire on a timer: a kernel whose first call took longer than the notice's delay
(numba's disk cache read on a busy machine: `tensorplug doctor`'s smoke test took 1.7 s)
announced a compile that never happened, on every run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

numba = pytest.importorskip("numba")

from numba.core import event  # noqa: E402

from tensorplug_cpu.kernels import jit, jit_calls  # noqa: E402
from tensorplug_cpu.kernels.threading_layer import start_threads  # noqa: E402


def _kernels(monkeypatch: pytest.MonkeyPatch) -> jit.JitKernels:
    monkeypatch.setattr(jit_calls, "COMPILE_NOTICE_S", 0.01)
    return jit.JitKernels(start_threads("default"))


def _slow_cached_load(*_: Any) -> int:
    time.sleep(0.2)  # far past the notice's delay, and nothing compiles
    return 1


class _Said(logging.Handler):
    """Keeps the notices logged, then sets ``said`` (the timer's thread logs them: read
    ``notices`` once ``said`` is set, not caplog, which it may not have reached yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.said = threading.Event()
        self.notices: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "compiling" in record.getMessage():
            self.notices.append(record.getMessage())
            self.said.set()


def _compiling_until_said(said: threading.Event) -> Callable[..., int]:
    """A first call that compiles until the notice is out: its timer fires however late
    a busy machine runs it (a compile of a fixed length raced the timer)."""

    def compiles(*_: Any) -> int:
        with event.trigger_event("numba:compile", data={"dispatcher": None, "args": ()}):
            said.wait(300)  # a bound, so that a notice never said fails rather than hangs
        return 2

    return compiles


def test_a_slow_first_call_that_compiles_nothing_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernels = _kernels(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tensorplug_cpu"):
        assert kernels.call("cached kernel", _slow_cached_load) == 1
        time.sleep(0.05)  # a timer that was started would have fired by now
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]


def test_a_first_call_that_compiles_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernels = _kernels(monkeypatch)
    handler = _Said()
    logging.getLogger("tensorplug_cpu").addHandler(handler)
    compiles = _compiling_until_said(handler.said)
    try:
        with caplog.at_level(logging.WARNING, logger="tensorplug_cpu"):
            assert kernels.call("Q4_0 kernel", compiles) == 2
            assert kernels.call("Q4_0 kernel", compiles) == 2  # not the first call: silent
    finally:
        logging.getLogger("tensorplug_cpu").removeHandler(handler)
    assert handler.notices == [
        "numba is compiling the Q4_0 kernel (once: it is cached on disk for later runs)"
    ]

"""A GPU plugin's kept device list only saves time: replaced by a FIFO, a link to
/dev/zero, garbage or 100,000 records, it is a miss (one warning naming it) and the
drivers are asked; a device whose state changed (PoCL's largest allocation follows the
machine's free memory) is opened as the driver says now, never refused."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tensorplug_kernels.runtime.probe import MAX_DEVICES, DeviceProbe


class Drivers:
    """A fake runtime with one device; how often its drivers were asked."""

    def __init__(self) -> None:
        self.asked = 0

    def probe(self) -> list[tuple[dict[str, Any], str]]:
        self.asked += 1
        return [({"name": "gpu a", "memory": 1024}, "live gpu a")]

    def listing(self) -> DeviceProbe[str]:
        return DeviceProbe("Fake", self.probe, lambda: "key-1")


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", str(tmp_path))
    monkeypatch.setattr("tensorplug.kept._warned", set())
    return tmp_path / "devices" / "Fake.json"


def _many(path: Path) -> None:
    record = {"name": "gpu a", "memory": 1024}
    listing = {"format": 1, "key": "key-1", "devices": [record] * 100_000}
    path.write_text(json.dumps(listing))


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _garbage(path: Path) -> None:
    path.write_bytes(b"\xff\x00garbage" * 100)


def _nested(path: Path) -> None:
    path.write_text('{"format": 1, "key": "key-1", "devices": [' + "[" * 1000 + "]" * 1000 + "]}")


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and links to devices are POSIX's")
@pytest.mark.parametrize("make", [_many, _fifo, _dev_zero, _garbage, _nested])
def test_a_list_that_is_no_list_is_a_miss_with_one_warning(
    kept: Path, make: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    drivers = Drivers()
    drivers.listing().records()
    kept.unlink()
    make(kept)
    found: list[Any] = []
    worker = threading.Thread(target=lambda: found.append(drivers.listing().records()))
    worker.daemon = True
    worker.start()
    worker.join(60)  # a miss takes milliseconds: only a read blocked for ever waits
    assert not worker.is_alive(), "reading the kept device list blocked"
    assert found == [[{"name": "gpu a", "memory": 1024}]] and drivers.asked == 2
    # the kept file's warnings (a first run also tells of a kernel numba compiles)
    warned = [
        m
        for r in caplog.records
        if r.levelno == logging.WARNING and "numba is compiling" not in (m := r.getMessage())
    ]
    assert len(warned) == 1 and str(kept) in warned[0]
    assert "tensorplug cache clear" in warned[0]


def test_the_bound_on_devices_is_far_above_any_machine() -> None:
    assert 64 <= MAX_DEVICES < 100_000


# -- the real OpenCL plugin, in processes of its own ---------------------------------------------


def _python(code: str, folder: Path) -> Any:
    env = {**os.environ, "TENSORPLUG_DEVICE_CACHE": str(folder)}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_SCORE = """
    import json
    from tensorplug_opencl import score
    print(json.dumps(score()))
"""


def _opencl_list(folder: Path) -> Path:
    pytest.importorskip("pyopencl")
    first = _python(_SCORE, folder)
    if first[0] == 0:
        pytest.skip(f"no OpenCL device here: {first[1]}")
    return folder / "devices" / "OpenCL.json"


def test_a_list_of_100000_devices_shows_the_drivers_devices(tmp_path: Path) -> None:
    path = _opencl_list(tmp_path)
    listing = json.loads(path.read_text())
    real = len(listing["devices"])
    listing["devices"] = listing["devices"] * (100_000 // real)
    path.write_text(json.dumps(listing))
    assert _python(_SCORE, tmp_path)[1].startswith(f"{real} OpenCL device(s)")


@pytest.mark.skipif(sys.platform == "win32", reason="links to devices are POSIX's")
def test_a_list_replaced_by_dev_zero_does_not_drop_opencl(tmp_path: Path) -> None:
    path = _opencl_list(tmp_path)
    path.unlink()
    path.symlink_to("/dev/zero")
    assert _python(_SCORE, tmp_path)[0] > 0


def test_a_changed_max_alloc_is_taken_not_refused(tmp_path: Path) -> None:
    """PoCL's max_alloc follows the machine's free memory: a list kept when it was
    lower made the next process refuse its device ("a driver changed since the list
    was made ... start the process again")."""
    path = _opencl_list(tmp_path)
    listing = json.loads(path.read_text())
    real = listing["devices"][0]["max_alloc"]
    listing["devices"][0]["max_alloc"] = real // 2
    path.write_text(json.dumps(listing))
    opened = _python(
        """
        import json
        import numpy as np
        import tensorplug as tp
        dev = tp.dev_by_name("OpenCL0")
        listed = dev.max_alloc
        buf = dev.buffer_type().alloc_buffer(64)
        buf.free()
        print(json.dumps([listed, dev.max_alloc]))
        """,
        tmp_path,
    )
    assert opened == [real // 2, real]
    assert json.loads(path.read_text())["devices"][0]["max_alloc"] == real

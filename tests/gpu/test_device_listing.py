"""GPU plugins keep their device lists between processes (``tensorplug_kernels.runtime.probe``).

A process that does not use an OpenCL or WebGPU device must not start its driver (PoCL's
LLVM, Vulkan); the list it would have given is read from a file while nothing the
drivers depend on has changed, and a device is opened, and checked against what the
driver says then, when it is first used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tensorplug_kernels.runtime.probe import (
    DEVICE_CACHE,
    DeviceListChangedError,
    DeviceProbe,
    cache_folder,
    driver_key,
)


class Drivers:
    """A fake runtime: its devices, how often it was asked, and the key it reports."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.asked = 0
        self.key = "key-1"

    def probe(self) -> list[tuple[dict[str, Any], str]]:
        self.asked += 1
        return [({"name": n, "memory": 1024 * i}, f"live {n}") for i, n in enumerate(self.names)]

    def listing(self) -> DeviceProbe[str]:
        """A new process's list (a DeviceProbe remembers what it was told)."""

        def check(record: dict[str, Any]) -> None:
            if not isinstance(record["name"], str):
                raise TypeError("name")

        return DeviceProbe("Fake", self.probe, lambda: self.key, check=check)


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lists kept in a folder of this test's own; the file of the fake runtime."""
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", str(tmp_path))
    return tmp_path / "devices" / "Fake.json"


def test_the_second_process_reads_the_list_without_asking_the_drivers(kept: Path) -> None:
    drivers = Drivers("gpu a", "gpu b")
    first = drivers.listing()
    assert [r["name"] for r in first.records()] == ["gpu a", "gpu b"]
    assert drivers.asked == 1 and first.fresh and kept.is_file()
    second = drivers.listing()
    assert second.records() == first.records() and drivers.asked == 1 and not second.fresh
    assert json.loads(kept.read_text())["devices"] == first.records()


def test_opening_a_device_asks_the_drivers_once_and_gives_the_live_object(kept: Path) -> None:
    drivers = Drivers("gpu a", "gpu b")
    drivers.listing().records()
    listing = drivers.listing()
    listing.records()
    assert drivers.asked == 1
    assert listing.open(1) == "live gpu b" and listing.open(0) == "live gpu a"
    assert drivers.asked == 2 and listing.fresh


def test_a_changed_key_asks_the_drivers_again_and_rewrites_the_list(kept: Path) -> None:
    drivers = Drivers("gpu a")
    drivers.listing().records()
    drivers.names, drivers.key = ["gpu a", "new gpu"], "key-2"
    assert [r["name"] for r in drivers.listing().records()] == ["gpu a", "new gpu"]
    assert drivers.asked == 2 and json.loads(kept.read_text())["key"] == "key-2"
    assert drivers.listing().records()[1]["name"] == "new gpu" and drivers.asked == 2


def test_a_device_that_went_under_the_same_key_refuses_and_the_list_is_rewritten(
    kept: Path,
) -> None:
    """A driver replaced in place (nothing the key sees changed): the device named in
    this process is not used as something else, a device still there is found where
    the drivers give it now, and the next process sees the truth."""
    drivers = Drivers("gpu a", "gpu b")
    drivers.listing().records()
    drivers.names = ["gpu b"]  # gpu a went away
    listing = drivers.listing()
    assert [r["name"] for r in listing.records()] == ["gpu a", "gpu b"]  # as kept
    gone = r"Fake0: the drivers no longer give gpu a \(device 0 is now gpu b\)"
    with pytest.raises(DeviceListChangedError, match=gone):
        listing.open(0)
    assert listing.open(1) == "live gpu b"
    assert [r["name"] for r in drivers.listing().records()] == ["gpu b"]


def test_a_device_described_otherwise_opens_as_the_drivers_say_now(kept: Path) -> None:
    """The list only saves time: a device the drivers still give under its name is
    opened with what they say of it now (PoCL's memory and largest allocation follow
    the machine's free memory), and the list is rewritten; never a refusal."""
    drivers = Drivers("gpu a")
    drivers.listing().records()  # kept: memory 0
    drivers.probe = lambda: [({"name": "gpu a", "memory": 7}, "live")]  # type: ignore[method-assign]
    listing = drivers.listing()
    assert listing.records()[0]["memory"] == 0 and listing.record_now(0)["memory"] == 0
    assert listing.open(0) == "live"
    assert listing.record_now(0) == {"name": "gpu a", "memory": 7}
    assert json.loads(kept.read_text())["devices"] == [{"name": "gpu a", "memory": 7}]


@pytest.mark.parametrize("field", ["memory_total", "max_alloc", "driver_version"])
def test_opencl_tells_devices_apart_by_what_they_are_not_their_state(field: str) -> None:
    pytest.importorskip("pyopencl")
    from tensorplug_opencl.listing import identity

    record = {"name": "cpu-x86-64", "platform": "Portable Computing Language",
              "vendor": "GenuineIntel", "type": "cpu", "device_id": None,
              "memory_total": 4 << 30, "max_alloc": 4 << 30, "driver_version": "6.0"}  # fmt: skip
    assert identity(record) == identity({**record, field: 8 << 30})
    assert identity(record) != identity({**record, "name": "another"})


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"format": 0, "key": "key-1", "devices": []}),
        json.dumps({"format": 1, "key": "key-1", "devices": "gpu a"}),
        json.dumps({"format": 1, "key": "key-1", "devices": [{"name": 7}]}),  # check refuses
        json.dumps({"format": 1, "key": "key-1", "devices": [{"memory": 1}]}),  # no name
    ],
)
def test_a_file_that_does_not_read_is_asked_again_and_replaced(kept: Path, text: str) -> None:
    kept.parent.mkdir(parents=True)
    kept.write_text(text)
    drivers = Drivers("gpu a")
    assert [r["name"] for r in drivers.listing().records()] == ["gpu a"] and drivers.asked == 1
    assert json.loads(kept.read_text())["devices"][0]["name"] == "gpu a"


def test_zero_keeps_nothing_and_asks_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", "0")
    assert cache_folder() is None
    drivers = Drivers("gpu a")
    drivers.listing().records()
    drivers.listing().records()
    assert drivers.asked == 2 and drivers.listing().path is None


def test_the_default_folder_is_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TENSORPLUG_DEVICE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder() == tmp_path / "tensorplug"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_folder() == Path.home() / ".cache" / "tensorplug"
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", " ")  # blank: unset
    assert cache_folder() == Path.home() / ".cache" / "tensorplug"
    assert DEVICE_CACHE.get({"TENSORPLUG_DEVICE_CACHE": "off"}) is False
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", "1")  # on: the default folder, not "./1"
    assert cache_folder() == Path.home() / ".cache" / "tensorplug"
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", "~/elsewhere ")
    assert cache_folder() == Path.home() / "elsewhere"


def test_a_folder_that_cannot_be_written_only_costs_the_asking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", str(blocker))  # a folder below a file
    drivers = Drivers("gpu a")
    assert drivers.listing().records()[0]["name"] == "gpu a"
    assert drivers.listing().records()[0]["name"] == "gpu a" and drivers.asked == 2


def test_the_driver_key_follows_what_the_drivers_depend_on(tmp_path: Path) -> None:
    icd = tmp_path / "icd.d"
    icd.mkdir()
    library = tmp_path / "libdriver.so"
    library.write_bytes(b"\0" * 10)
    (icd / "driver.json").write_text(json.dumps({"ICD": {"library_path": str(library)}}))

    def key(env: dict[str, str], packages: tuple[str, ...] = ("numpy",)) -> str:
        return driver_key("Fake", packages, [str(icd)], ("VK_", "MESA_"), env)

    base = key({"HOME": "/root"})
    assert key({"HOME": "/elsewhere"}) == base  # a variable drivers do not read
    assert key({"OCL_ICD_VENDORS": "/etc/x"}) == base  # another runtime's variable
    assert key({"VK_ICD_FILENAMES": "/x.json"}) != base
    assert key({"LD_LIBRARY_PATH": "/opt/lib"}) != base  # every runtime's
    assert key({}, ("numpy", "pytest")) != base  # another package's version
    assert driver_key("Other", ("numpy",), [str(icd)], ("VK_", "MESA_"), {}) != key({})
    library.write_bytes(b"\0" * 11)  # the library a manifest names, replaced
    changed = key({})
    assert changed != base
    (icd / "second.icd").write_text("/opt/vendor/libOpenCL-driver.so\n")  # a new manifest
    assert key({}) != changed


# -- the real plugins, across processes ---------------------------------------------------------

_LOAD = textwrap.dedent(
    """
    import json, sys
    from tensorplug import registry
    registry.load_all()
    devices = [d.name + ": " + d.description for d in registry.devices()
               if d.reg.name in ("OpenCL", "WebGPU")]
    started = sorted(m for m in ("pyopencl", "wgpu") if m in sys.modules)
    # what only computing needs: the encoders, the kernel texts, the backends
    computing = sorted(m for m in sys.modules if m.startswith((
        "tensorplug_kernels.encode", "tensorplug_kernels.source", "tensorplug_kernels.abi",
        "tensorplug_kernels.runtime.backend", "tensorplug_kernels.runtime.program",
        "tensorplug_opencl.backend", "tensorplug_opencl.program", "tensorplug_webgpu.backend",
        "tensorplug_webgpu.program", "tensorplug_webgpu.wgsl")))
    print(json.dumps({"devices": devices, "started": started, "computing": computing}))
    """
)


def _run(code: str, folder: Path) -> Any:
    env = {**os.environ, "TENSORPLUG_DEVICE_CACHE": str(folder)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_process_that_uses_no_gpu_device_starts_no_gpu_driver(tmp_path: Path) -> None:
    """Nor imports the kernel code: describing the devices took the encoders, kernel
    texts and backends with it, 12 ms of every launch (2-core Zen 4)."""
    first = _run(_LOAD, tmp_path)
    if not first["devices"]:
        pytest.skip("neither OpenCL nor WebGPU has a device here")
    assert first["computing"] == []  # asking the drivers (this process) needs none either
    second = _run(_LOAD, tmp_path)
    assert second == {"devices": first["devices"], "started": [], "computing": []}


def test_a_device_described_from_the_kept_list_computes_when_used(tmp_path: Path) -> None:
    """The second process opens each kept device on first use, and computes on it."""
    code = textwrap.dedent(
        """
        import json
        import numpy as np
        import tensorplug as tp
        from tensorplug import Graph, Type, ops, registry
        registry.load_all()
        done = []
        for dev in registry.devices():
            if dev.reg.name not in ("OpenCL", "WebGPU"):
                continue
            assert not dev.opened, dev.name
            backend = dev.init_backend()
            a, b = tp.new_tensor(Type.F32, (8,)), tp.new_tensor(Type.F32, (8,))
            graph = Graph(ops.add(a, b))
            buf = dev.buffer_type().alloc_buffer(4096)
            for i, t in enumerate((a, b, *graph.nodes)):
                tp.tensor_alloc(buf, t, i * 1024)
            tp.tensor_set(a, np.arange(8, dtype=np.float32))
            tp.tensor_set(b, np.full(8, 0.5, np.float32))
            backend.graph_compute(graph)
            got = np.frombuffer(tp.tensor_get(graph.nodes[-1]), np.float32)
            done.append([dev.name, dev.opened, got.tolist()])
            buf.free()
            backend.free()
        print(json.dumps(done))
        """
    )
    _run(_LOAD, tmp_path)
    done = _run(code, tmp_path)
    if not done:
        pytest.skip("neither OpenCL nor WebGPU has a device here")
    assert {n.rstrip("0123456789") for n, _, _ in done} <= {"OpenCL", "WebGPU"}
    for name, opened, values in done:
        assert opened and values == [i + 0.5 for i in range(8)], name

"""The main job: ``tensorplug demo`` must run end to end and agree with numpy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensorplug import registry


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorplug", "demo", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _has_device(name: str) -> bool:
    try:
        registry.dev_by_name(name)
    except LookupError:
        return False
    return True


@pytest.mark.parametrize("weights", ["f32", "q4_0"])
def test_demo_on_cpu_matches_numpy(weights: str) -> None:
    if not _has_device("CPU"):
        pytest.skip("the tensorplug-cpu plugin is not installed (pip install -e plugins/cpu)")
    proc = _demo("--device", "CPU", "--weights", weights, "--runs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches the float64 numpy reference" in proc.stderr
    assert "split 0: CPU" in proc.stderr


def test_demo_over_every_device() -> None:
    if not _has_device("CPU"):
        pytest.skip("the tensorplug-cpu plugin is not installed (pip install -e plugins/cpu)")
    proc = _demo("--runs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches the float64 numpy reference" in proc.stderr
    for dev in registry.devices():
        assert f"device {dev.name}" in proc.stderr

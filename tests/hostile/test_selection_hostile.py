"""Which devices a run uses: TENSORPLUG_BACKENDS and --split-mode row at their edges.

The rule (README, "Selecting backends"): the host CPU backend is always loaded as the
fallback for inputs and the ops other devices cannot run, unless TENSORPLUG_DISABLE=CPU
removes it; the first backend listed in TENSORPLUG_BACKENDS is where ``run`` places the
model's blocks. Each case runs in a fresh process: the environment is read once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorplug import registry
from tensorplug_llm.tiny import write_tiny_llama

pytestmark = pytest.mark.skipif(
    registry.dev_by_name("OpenCL0") is None,
    reason="no OpenCL device (pip install -e plugins/opencl pocl-binary-distribution)",
)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorplug", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("select") / "tiny.gguf", "q8_0", 2)


def _placement(err: str) -> str:
    found = re.search(r"^placement: (.*)$", err, re.M)
    assert found, err[-3000:]
    return found.group(1)


@pytest.mark.parametrize("backends", ["OpenCL", "OpenCL,CPU"])
def test_the_first_listed_backend_holds_the_blocks(model: Path, backends: str) -> None:
    done = _cli("run", str(model), "-n", "2", TENSORPLUG_BACKENDS=backends)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "every block runs on the CPU" not in done.stderr
    assert _placement(done.stderr) == "token_embd: OpenCL0, blocks 0-1: OpenCL0, output: OpenCL0"
    assert re.search(r"^  CPU +cpu ", done.stderr, re.M)  # the fallback is there


def test_listing_the_cpu_first_keeps_the_blocks_there(model: Path) -> None:
    done = _cli("run", str(model), "-n", "2", TENSORPLUG_BACKENDS="CPU,OpenCL")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _placement(done.stderr) == "token_embd: CPU, blocks 0-1: CPU, output: CPU"


def test_the_tiny_demo_uses_the_listed_backends() -> None:
    done = _cli("run", "--tiny", "-n", "2", "--weights", "f32", TENSORPLUG_BACKENDS="OpenCL")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "blocks 0-3: OpenCL0" in _placement(done.stderr)


def test_only_disabling_the_cpu_removes_the_fallback(model: Path) -> None:
    done = _cli("run", str(model), "-n", "2", TENSORPLUG_BACKENDS="OpenCL",
                TENSORPLUG_DISABLE="CPU")  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "no CPU device is registered" in done.stderr
    assert "remove CPU from TENSORPLUG_DISABLE" in done.stderr


def test_row_split_gives_every_device_a_kv_head(model: Path, tmp_path: Path) -> None:
    """3,1 over 2 KV heads rounds to 2 and 0; each device gets one, the FFN keeps 3:1."""
    split, alone = tmp_path / "split.npy", tmp_path / "cpu.npy"
    argv = ["run", str(model), "--tokens", "1,300,301,302", "-n", "1", "--cache-type", "f32"]
    done = _cli(*argv, "--device", "CPU,OpenCL0", "--split-mode", "row", "--tensor-split",
                "3,1", "--logits-out", str(split))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KV heads 1,1" in done.stderr and "FFN 96,32" in done.stderr, done.stderr[-3000:]
    done = _cli(*argv, "--device", "CPU", "--logits-out", str(alone))
    assert done.returncode == 0, done.stderr[-3000:]
    got, want = np.load(split), np.load(alone)
    assert float(np.sum((got - want) ** 2) / np.sum(want**2)) < 5e-4
    assert (got.argmax(-1) == want.argmax(-1)).all()

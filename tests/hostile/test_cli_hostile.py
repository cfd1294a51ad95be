"""A user's mistakes on the command line: one line saying what is wrong, exit code 1, and
no traceback."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tensorplug.llama.tiny import write_tiny_llama


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorplug", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["run", "-c", "-5", "-n", "1"], {}, "need n_ctx, n_batch, kv_pad >= 1 (got -5"),
        (["run", "--tokens", "99999", "-n", "1"], {}, "token id 99999 is outside the vocabulary"),
        (["demo", "--device", "NOPE"], {}, "no device named 'NOPE'"),
        (["run", "--device", "NOPE"], {}, "no device named 'NOPE'"),
        (["demo"], {"TENSORPLUG_DISABLE": "CPU"}, "no CPU device is registered"),
        (["run", "-n", "1"], {"TENSORPLUG_BACKENDS": ",,"}, "it names no backend"),
        (
            ["run", "-n", "1"],
            {"TENSORPLUG_DISABLE": "CPU,OpenCL,Ray"},
            "no backend plugin is loaded",
        ),
    ],
)
def test_user_mistakes_get_one_line_and_no_traceback(
    args: list[str], env: dict[str, str], message: str
) -> None:
    done = _cli(*args, **env)
    assert done.returncode == 1, done.stdout[-1000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert message in done.stderr


def test_a_damaged_model_file_is_one_line(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", "f32", 0)
    data = bytearray(path.read_bytes())
    key = b"llama.block_count"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    struct.pack_into("<I", data, at, 0)
    path.write_bytes(bytes(data))
    done = _cli("run", str(path), "-n", "1")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "llama.block_count = 0" in done.stderr

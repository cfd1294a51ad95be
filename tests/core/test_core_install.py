"""The runtime alone: ``pip install tensorplug`` with no extras and no application.

One fresh virtual environment (no system site-packages, no index, no pip configuration)
gets the core from this checkout. Its requirements must be met by numpy and pluggy
alone — they are linked in from this interpreter, nothing else is — and then the
``tensorplug`` command must work and say clearly what it cannot do: no backend, no
``gguf``, no ``rich``, and no LLM commands. ~30 s: a venv and two pip installs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugin_dists import PLUGINS, Venv, listed, on_a_terminal

ROOT = Path(__file__).resolve().parents[2]

#: What the core's metadata may require, and setuptools, which builds the editable
#: install (pip is told to use no build isolation and no index; setuptools >= 70.1, as
#: the test extra and the test plugins require, builds wheels without ``wheel``).
PROVIDED = ["numpy", "pluggy", "setuptools"]

#: What only an extra or the application brings.
OPTIONAL = {"gguf", "rich", "regex", "jinja2", "tensorplug-llm"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    env = Venv.create(tmp_path_factory.mktemp("core-only") / "venv", PROVIDED)
    done = env.pip_install("-e", ROOT)
    assert done.returncode == 0, done.stdout + done.stderr  # e.g. a requirement beyond numpy
    return env


def _installed(venv: Venv) -> dict[str, str]:
    out = venv.run("python", "-m", "pip", "list", "--format=json")
    assert out.returncode == 0, out.stderr
    return {d["name"].lower(): d["version"] for d in json.loads(out.stdout)}


def test_the_core_requires_only_numpy_and_pluggy(venv: Venv) -> None:
    installed = _installed(venv)
    assert "tensorplug" in installed and {"numpy", "pluggy"} <= set(installed)
    assert not OPTIONAL & set(installed)
    check = venv.run("python", "-m", "pip", "check")
    assert check.returncode == 0, check.stdout


def test_import_and_what_needs_an_extra(venv: Venv) -> None:
    code = """
import json, sys, tensorplug
from tensorplug import extras
from tensorplug.gguf import GGUFFile
try:
    GGUFFile("model.gguf")
    error = None
except tensorplug.MissingDependencyError as e:
    error = str(e)
print(json.dumps({"version": tensorplug.__version__, "gguf": extras.available("gguf"),
                  "rich": extras.available("rich"), "error": error,
                  "app": sorted(m for m in sys.modules if m.startswith("tensorplug_llm"))}))
"""
    out = venv.run("python", "-c", code)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["version"] == "0.1.0" and got["gguf"] is False and got["rich"] is False
    assert got["error"] == (
        "reading GGUF files needs the gguf package: pip install 'tensorplug[gguf]'"
    )
    assert got["app"] == []


def test_the_command_without_a_backend(venv: Venv) -> None:
    helped = venv.run("tensorplug", "--help")
    assert helped.returncode == 0, helped.stderr
    core = ["devices", "doctor", "check", "bench", "cache"]
    assert list(listed(helped.stdout)) == core  # no run, chat...: no application installed
    kept = venv.run("tensorplug", "cache")  # reads, and removes nothing
    assert kept.returncode == 0 and "kept in " in kept.stdout, kept.stderr

    devices = venv.run("tensorplug", "devices")
    assert devices.returncode == 1 and devices.stdout == ""
    assert "tensorplug: error: no devices. Install a backend plugin" in devices.stderr

    doctor = venv.run("tensorplug", "doctor")
    assert doctor.returncode == 1
    assert "Plugins (0 found)" in doctor.stdout and "Devices (0)" in doctor.stdout
    assert "Commands (5)" in doctor.stdout  # the core's own, nothing broken

    check = venv.run("tensorplug", "check", "--op", "add")
    assert check.returncode == 2
    assert "no installed plugin provides a backend called 'CPU'" in check.stderr
    assert "(plugins found: none)" in check.stderr


def test_the_kit_checks_floats_and_names_the_extra_for_quantized_types(venv: Venv) -> None:
    """The float64 reference against itself: float cases compute and pass; quantized
    ones need gguf's codecs and are reported unsupported with the extra to install."""
    args = ["check", "--backend", "reference", "--reference", "reference", "--op", "get_rows"]
    out = venv.run("tensorplug", *args, "--output", "json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    by_outcome: dict[str, list[dict[str, str]]] = {}
    for case in report["cases"]:
        by_outcome.setdefault(case["outcome"], []).append(case)
    assert set(by_outcome) == {"pass", "unsupported"}
    assert any("f32" in c["case"] for c in by_outcome["pass"])
    for case in by_outcome["unsupported"]:
        assert case["message"] == (
            "the conformance kit's float64 reference for quantized and BF16 types needs "
            "the gguf package: pip install 'tensorplug[gguf]'"
        )
        assert any(q in case["case"] for q in ("q4", "q5", "q8", "bf16", "_k"))


def test_the_command_with_a_backend_plugin_and_no_rich(venv: Venv) -> None:
    done = venv.pip_install("--no-deps", PLUGINS / "tp-good")
    assert done.returncode == 0, done.stdout + done.stderr

    devices = venv.run("tensorplug", "devices")
    assert devices.returncode == 0, devices.stderr
    rows = [line.split()[:3] for line in devices.stdout.splitlines()[1:]]
    assert rows == [["TEST", "TEST0", "cpu"], ["TEST", "TEST1", "igpu"]]

    doctor = venv.run("tensorplug", "doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert "tp-good 0.1.0" in doctor.stdout and "Devices (2)" in doctor.stdout
    # TEST supports no op: the smoke test still writes and reads back through it
    assert doctor.stdout.count("ok: transfers only") == 2

    # on a terminal, where rich would draw a table, the plain text instead
    screen = _on_a_terminal(venv, "tensorplug", "devices")
    assert screen.splitlines()[0].split()[:3] == ["backend", "device", "type"]
    assert "TEST1" in screen and not {"┃", "│", "━"} & set(screen)

    args = ["check", "--backend", "TEST0", "--reference", "reference", "--output", "json"]
    check = venv.run("tensorplug", *args)
    assert check.returncode == 0, check.stderr  # unsupported is reported, never failed
    report = json.loads(check.stdout)
    assert report["ok"] is True and report["summary"]["total"] > 100
    assert report["summary"]["unsupported"] == report["summary"]["total"]


def _on_a_terminal(venv: Venv, *args: str) -> str:
    """What the command writes to a terminal (a pty), for output that depends on one."""
    return on_a_terminal([str(venv.bin / args[0]), *args[1:]], venv.env())

"""The backend author's guide is true: its example backend, copied out of
docs/writing-a-backend.md, passes the conformance kit for the cases it supports."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from plugin_dists import Venv

import tensorplug as tp
from tensorplug.testing.families import catalogue
from tensorplug.testing.refbackend import reference_backend
from tensorplug.testing.runner import Outcome, run_cases

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "writing-a-backend.md"
PACKAGE = "tensorplug_numpylite"


def guide_files() -> dict[str, str]:
    """The files the guide shows, by the path in the ``<!-- file: PATH -->`` line above
    each code block: what a reader copies out of the page."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.findall(r"<!-- file: (\S+)[^>]*-->\n```\w+\n(.*?)```", text, re.DOTALL)
    assert found, "the guide's files are missing"
    return dict(found)


def _example() -> types.ModuleType:
    code = guide_files()[f"{PACKAGE}/__init__.py"]
    module = types.ModuleType(PACKAGE)
    sys.modules[PACKAGE] = module
    exec(compile(code, f"{GUIDE.name}:{PACKAGE}", "exec"), module.__dict__)
    return module


def test_the_guides_example_is_short() -> None:
    assert len(guide_files()[f"{PACKAGE}/__init__.py"].splitlines()) <= 80


def test_the_guide_shows_every_file_of_the_distribution() -> None:
    files = guide_files()
    assert set(files) == {"pyproject.toml", f"{PACKAGE}/__init__.py", f"{PACKAGE}/registration.py"}
    assert 'version = "0.1.0"' in files["pyproject.toml"]  # pip refuses a project without
    registration = files[f"{PACKAGE}/registration.py"]
    assert f"api_version={tp.API_VERSION}".replace(" ", "") in registration.replace(" ", "")


def test_the_guides_backend_passes_the_kit() -> None:
    lite = _example()
    backend = lite.create_reg().devices()[0].init_backend()
    cases = catalogue(True, ["add", "mul", "scale", "neg"], [])
    report = run_cases(cases, backend, reference_backend())
    assert report.ok, [r.message for r in report.results if r.outcome is Outcome.FAIL]
    passed = report.count(Outcome.PASS)
    assert passed >= 15, report.summary()
    assert report.count(Outcome.UNSUPPORTED) == len(cases) - passed  # F16 etc.: said so


def test_the_guides_backend_is_placed_only_when_named() -> None:
    lite = _example()
    dev = lite.create_reg().devices()[0]
    assert dev.type is tp.DeviceType.ACCEL and dev.buffer_type().name == "LITE0"
    assert dev.buffer_type().is_host
    x = tp.new_tensor("f32", (2, 3), "x")
    y = tp.ops.scale(tp.ops.neg(x), 2.0)
    sched = tp.Scheduler([dev.init_backend(), tp.init_by_name("CPU")])
    g = tp.Graph(y)
    sched.alloc_graph(g)
    tp.set_array(x, np.arange(6, dtype=np.float32).reshape(2, 3))
    sched.graph_compute(g)
    np.testing.assert_array_equal(tp.get_array(y), -2 * np.arange(6).reshape(2, 3))
    backend = sched.get_tensor_backend(y)
    assert backend is not None
    assert backend.name == "LITE0"


# -- the guide, followed to the letter --------------------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv with the core, and the guide's distribution built from the files the
    page shows and pip-installed (not editable: as it would be published)."""
    root = tmp_path_factory.mktemp("guide")
    project = root / "tensorplug-numpylite"
    for name, text in guide_files().items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text, encoding="utf-8")
    venv = Venv.create(root / "venv", ["numpy", "pluggy", "setuptools"])
    for what in (["-e", str(ROOT)], [str(project)]):
        done = venv.pip_install(*what)
        assert done.returncode == 0, done.stdout + done.stderr
    return venv


def test_the_guides_distribution_installs_and_is_discovered(installed: Venv) -> None:
    proc = installed.run("tensorplug", "doctor", "--plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(ln for ln in proc.stdout.splitlines() if ln.startswith("LITE "))
    assert "tensorplug-numpylite" in row and "loaded" in row
    assert "every loaded plugin declares op contract" in proc.stdout
    assert " ok: computed (a+b)*a" in proc.stdout  # the smoke test ran on LITE0


def test_the_guides_distribution_passes_the_kit(installed: Venv) -> None:
    args = ("check", "--backend", "LITE0", "--reference", "reference", "--plain")
    proc = installed.run("tensorplug", *args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("LITE0 vs reference: ") and " 0 failed" in summary
    passed = int(summary.split(": ")[1].split("/")[0])
    assert passed >= 15, summary


def test_the_readmes_registration_is_cheap() -> None:
    """The README's registration finds its driver without importing it (discovery imports
    every installed plugin's registration), and declares the newest API."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
                if "registration = Registration(" in b)  # fmt: skip
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["_score"]() == (0, "foo_driver is not installed")  # type: ignore[operator]
    assert "foo_driver" not in sys.modules
    assert namespace["registration"].api_version == tp.API_VERSION  # type: ignore[attr-defined]

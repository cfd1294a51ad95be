"""Qwen 2 and Qwen 3 in the runner, held to llama.cpp's own logits.

``tests/data/qwen_llamacpp.npz`` holds llama.cpp's logits (llama-cpp-python, F32 cache)
at every position of an 11-token prompt for the tiny random-weight Qwen 2 file (biases
on the Q, K and V projections, NEOX rope) and Qwen 3 file (per-head Q/K RMS norms
before NEOX rope); ``tests/data/make_qwen_fixture.py`` rebuilds the same files and
regenerates it. The runner must give those logits whether the prompt is evaluated at
once or token by token through the KV cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

import tensorplug as tp
from tensorplug_llm.model import LlamaWeights
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_qwen_fixture import FILES, TOKENS  # noqa: E402

FIXTURE = np.load(DATA / "qwen_llamacpp.npz")


@pytest.fixture(scope="module", params=sorted(FILES))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return write_tiny_llama(tmp_path_factory.mktemp(name) / f"{name}.gguf", **FILES[name])  # type: ignore[arg-type]


def _open(path: Path, use_mmap: bool = True) -> ModelRunner:
    return ModelRunner(
        path,
        placement=Placement.on(host_cpu(), 3),
        cache_type="f32",
        warmup=False,
        use_mmap=use_mmap,
    )


def test_the_logits_are_llama_cpps_at_every_position(model: Path) -> None:
    want = FIXTURE[model.stem]
    with _open(model) as m:
        assert m.config.arch.name == model.stem
        got = m.eval(TOKENS, all_logits=True)
        m.reset()
        stepped = np.stack([np.atleast_2d(m.eval([t]))[-1] for t in TOKENS])
    # measured: 4e-7 (Qwen 2) and 3e-7 (Qwen 3) of the largest logit, float32 rounding
    assert ref.rel_err(got, want) <= 1e-5
    assert ref.rel_err(stepped, want) <= 1e-5
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_what_sets_each_architecture_apart_changes_the_result(model: Path) -> None:
    """Zeroing Qwen 2's biases or setting Qwen 3's Q/K norm weights to 1 moves the logits
    away from llama.cpp's: the comparison above would catch a runner that ignored them."""
    want = FIXTURE[model.stem]
    with _open(model, use_mmap=False) as m:  # weights uploaded, so they can be changed
        assert isinstance(m.weights, LlamaWeights)
        for layer in m.weights.layers:
            if model.stem == "qwen2":
                assert layer.bq is not None and layer.bk is not None and layer.bv is not None
                for bias in (layer.bq, layer.bk, layer.bv):
                    tp.set_array(bias, np.zeros(bias.shape, np.float32))
            else:
                assert layer.q_norm is not None and layer.k_norm is not None
                for weight in (layer.q_norm, layer.k_norm):
                    tp.set_array(weight, np.ones(weight.shape, np.float32))
        got = m.eval(TOKENS, all_logits=True)
    assert ref.rel_err(got, want) > 1e-3

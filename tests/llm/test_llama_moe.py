"""Mixture-of-experts llama files (Mixtral-style ``llama.expert_count``): the runner against
the independent float64 numpy llama of test_llama_reference, on every backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

import tensorplug as tp
from tensorplug_llm.placement import Placement
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

TOKENS = [1, 37, 5, 212, 90, 9, 33, 70, 2, 100, 7, 140]


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("moe")
    return {
        t: write_tiny_llama(d / f"moe-{t}.gguf", t, 3, n_expert=4, n_expert_used=2)
        for t in ("f32", "q8_0")
    }


@pytest.mark.parametrize("wtype", ["f32", "q8_0"])
def test_moe_logits_match_the_reference(moe: dict[str, Path], wtype: str) -> None:
    m = ModelRunner(moe[wtype], n_ctx=64, cache_type="f32")
    assert (m.config.n_expert, m.config.n_expert_used) == (4, 2)
    got = m.eval(TOKENS, all_logits=True)
    # the CPU rounds every product's activations as ggml does for the weight type (Q8_0
    # blocks for Q8_0 matrices and experts, nothing for F32)
    want = ref.logits(ref.load(moe[wtype]), TOKENS, q8=True)
    assert ref.rounded_err(got, want) <= 2e-5


def test_tokens_are_routed_to_different_experts(moe: dict[str, Path]) -> None:
    """The check above would pass for a router stuck on one expert only if every token
    chose alike: make sure they do not."""
    model = ref.load(moe["f32"])
    h = model.w["token_embd.weight"][TOKENS]
    chosen = {tuple(np.argsort(-(r @ model.w["blk.0.ffn_gate_inp.weight"].T))[:2]) for r in h}
    assert len(chosen) > 2


def test_moe_runs_on_opencl_too(moe: dict[str, Path]) -> None:
    dev = tp.dev_by_name("OpenCL0")
    if dev is None:
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    n_layer = ModelRunner(moe["q8_0"], n_ctx=32, warmup=False).config.n_layer
    m = ModelRunner(moe["q8_0"], n_ctx=64, cache_type="f32", placement=Placement.on(dev, n_layer))
    got = m.eval(TOKENS, all_logits=True)
    assert ref.rel_err(got, ref.logits(ref.load(moe["q8_0"]), TOKENS)) <= 2e-5


def test_expert_counts_must_be_consistent(tmp_path: Path) -> None:
    from tensorplug.gguf import GGUFError, GGUFFile
    from tensorplug_llm.model import LlamaConfig

    path = write_tiny_llama(tmp_path / "bad.gguf", "f32", n_expert=2, n_expert_used=3)
    with pytest.raises(GGUFError, match=r"expert_used_count \(3\) must be between 1 and"):
        LlamaConfig.from_gguf(GGUFFile(path))

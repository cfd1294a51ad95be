"""Tiny llamas with IQ4_NL and IQ4_XS matrices in the runner, held to llama.cpp.

``tests/data/iq4_llamacpp.npz`` holds llama.cpp's logits (llama-cpp-python, F32 cache) at
every position of an 11-token prompt for two tiny random-weight files whose matrices
(token embeddings included) are IQ4_NL and IQ4_XS; ``tests/data/make_iq4_llama_fixture.py``
rebuilds the same files (weights encoded by ``tensorplug.quants``) and regenerates it.

llama.cpp rounds the activations of these products to Q8_0 (IQ4_NL) and Q8_K (IQ4_XS,
256-value blocks, float32 scale), as tensorplug's CPU does. The runner repacks IQ4
matrices for its integer kernels, which give llama.cpp's logits; in the file's layout
it is held to the float64 reference of the same file. For IQ4_XS the reference with
Q8_K rounding gives llama.cpp's logits too, so ggml reads the bytes tensorplug wrote as
tensorplug does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_iq4_llama_fixture import FILES, TOKENS  # noqa: E402

FIXTURE = np.load(DATA / "iq4_llamacpp.npz")


@pytest.fixture(scope="module", params=sorted(FILES))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return write_tiny_llama(tmp_path_factory.mktemp(name) / f"{name}.gguf", **FILES[name])  # type: ignore[arg-type]


def _q8_k(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` as ggml's ``quantize_row_q8_K`` rounds them: 256-value blocks,
    ``iscale = -127 / max`` (max: the signed value of largest magnitude), codes
    ``min(127, nearest(iscale·x))``, scale ``1 / iscale`` kept in float32."""
    blocks = np.ascontiguousarray(x, np.float32).reshape(*x.shape[:-1], -1, 256)
    at = np.abs(blocks).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(blocks, at, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(127, np.rint(iscale * blocks))
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


#: how close to llama.cpp's logits each file is held (relative to the largest logit)
TOLERANCE = {"iq4_xs": 1e-5, "iq4_nl": 1e-5}


def test_the_runner_computes_the_reference_logits(model: Path) -> None:
    """In the file's layout a prompt decodes the weights for BLAS: held to the float64
    reference. Repacked (the runner's default), one integer kernel computes every row
    count: the prompt and one token at a time both give llama.cpp's logits."""
    want = ref.logits(ref.load(model), TOKENS, q8=True)  # activations rounded as ggml's
    with ModelRunner(model, placement=Placement.on(host_cpu(), 2), cache_type="f32",
               warmup=False, repack=False) as m:  # fmt: skip
        plain = m.eval(TOKENS, all_logits=True)
    # measured: 9.2e-8 (IQ4_NL), 2.0e-7 (IQ4_XS) of the largest logit, float32 rounding
    assert ref.rel_err(plain, want) <= 1e-5
    with ModelRunner(model, placement=Placement.on(host_cpu(), 2), cache_type="f32",
               warmup=False) as m:  # fmt: skip
        got = m.eval(TOKENS, all_logits=True)
        m.reset()
        stepped = np.stack([np.atleast_2d(m.eval([t]))[-1] for t in TOKENS])
    # measured: 0 (IQ4_NL, to the bit) and 1.7e-7 (IQ4_XS), prompt and steps alike. The
    # plain prompt path and the reference part from llama.cpp by 7.8e-3 for IQ4_NL (not
    # yet explained; the integer kernels, one token or a prompt, do not)
    assert ref.rel_err(got, FIXTURE[model.stem]) <= 1e-5
    assert ref.rel_err(stepped, FIXTURE[model.stem]) <= 1e-5


def test_the_logits_are_llama_cpps_within_its_activation_rounding(model: Path) -> None:
    want = FIXTURE[model.stem]
    with ModelRunner(model, placement=Placement.on(host_cpu(), 2), cache_type="f32",
               warmup=False) as m:  # fmt: skip
        got = m.eval(TOKENS, all_logits=True)
    # measured with the repacked integer kernels (Q8_K activations for IQ4_XS, Q8_0 for
    # IQ4_NL): 1.7e-7 (IQ4_XS) and 0 (IQ4_NL) of the largest logit; decoding + BLAS gave
    # 2.9e-7 and 7.8e-3, and f32 activations 1.06e-2 and 1.40e-2
    assert ref.rel_err(got, want) <= TOLERANCE[model.stem]
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.05  # positions where llama.cpp's choice is not a tie
    assert clear.sum() >= 8
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()


def test_llama_cpp_reads_the_iq4_xs_bytes_as_tensorplug_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its activations rounded to Q8_K the float64 reference gives llama.cpp's
    logits: ggml decodes the bytes tensorplug wrote to the same weights. (IQ4_NL's
    products agree with a Q8_0-rounded reference at the first two positions only, which
    is not yet explained, so no such test holds IQ4_NL.)"""
    path = write_tiny_llama(tmp_path / "iq4_xs.gguf", **FILES["iq4_xs"])  # type: ignore[arg-type]
    monkeypatch.setattr(ref, "_q8", _q8_k)  # the reference's activation rounding, as Q8_K
    rounded = ref.logits(ref.load(path), TOKENS, q8=True)
    # measured 2.0e-7: the same weights, the same rounding, float64 against float32
    assert ref.rel_err(rounded, FIXTURE["iq4_xs"]) <= 1e-5


def test_tensorplug_run_gives_llama_cpps_prompt_logits(model: Path, tmp_path: Path) -> None:
    from tensorplug.cli import main

    out = tmp_path / "logits.npy"
    argv = ["run", str(model), "--device", "CPU", "--tokens", ",".join(map(str, TOKENS))]
    assert main([*argv, "-n", "3", "--cache-type", "f32", "--logits-out", str(out)]) == 0
    assert ref.rel_err(np.load(out), FIXTURE[model.stem]) <= TOLERANCE[model.stem]

"""The CPU backend against llama.cpp's own logits, one tiny model per weight type.

ggml rounds a product's activations to the weight type's ``vec_dot_type`` before it
multiplies (Q8_0; Q8_1 with its f16 ``s`` for Q4_1/Q5_1; Q8_K for the K-quants; F16 for
F16 weights), and so does the CPU backend (``tensorplug_cpu.kernels.activations``).
``tests/data/rounding_llamacpp.npz`` holds llama-cpp-python 0.3.36's logits (F32 KV
cache) at every position of an 11-token prompt for a 2-layer, 256-wide random-weight
llama of each type; ``tests/data/make_rounding_fixture.py`` rebuilds the same files
and regenerates it.

Measured (largest |difference| over the largest logit, per position): the median
position is 0 to 3e-7 for every quantized type, whole prompt and token by token (0 at
every position for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, held below 1e-7), where
exact float32 activations (the CPU before) left 1e-2 for Q4_1, Q5_1 and the K-quants.
Rounding can still tip one activation to the neighbouring code where the engines' last
float32 bits differ, and that moves a position (and the ones that attend to it) by up to
~1.4e-2: the median over positions is what is held, every position to 2e-2. F16 weights,
token by token (the CPU's own one-row kernel, the same on every host): median 1.6e-4,
3.5e-4 with exact activations. A whole prompt's F16 products go through BLAS, whose
order of additions is OpenBLAS's kernel's for the host (``OPENBLAS_CORETYPE``): median
1.9e-4 with its SkylakeX kernels, 3.1e-4 with its Haswell and Zen ones on the same Zen 5
machine, so the prompt is held only to what any of them gives; the one-row bound is the
one that tells F16 activations from exact ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_rounding_fixture import FILES, TOKENS  # noqa: E402

FIXTURE = np.load(DATA / "rounding_llamacpp.npz")
#: the median position's error each type is held to, token by token (see the module's
#: docstring)
MEDIAN = {name: 2.5e-4 if name == "f16" else 1e-5 for name in FILES}
#: ... and for the whole prompt where it differs: F16's prompt products are BLAS's, whose
#: order depends on the host's OpenBLAS kernel (measured 1.9e-4 to 3.1e-4)
PROMPT_MEDIAN = {**MEDIAN, "f16": 4e-4}
#: types whose products keep ggml's order of float32 operations as well as its rounding
#: (the repacked kernels' lane sums: ``_numba_repack``): llama.cpp's logits to the bit
#: at every position (measured 0)
EXACT = {"q4_0", "q4_1", "q5_1"}
#: types that keep ggml's order only in its own orders, a backend's default (a
#: batch-invariant one sums each block as one integer, a tenth to a third less work):
#: then 0 at every position; batch-invariant, Q5_0 is 1.9e-4 off at its worst
#: position, Q8_0 1.3e-7
GGML_ORDER_EXACT = {"q5_0", "q8_0"}
#: ... and types whose ggml order depends on the product's row count (Q4_K: its four-row
#: gemm for a prompt's rows in fours, its gemv for the rest; Q6_K: vec_dot under 8 rows,
#: the tiled product from 8): in ggml's orders the whole prompt's logits are 0 from the
#: recorded ones at every position (4e-7 batch-invariant), while token by token they
#: are llama.cpp's one-row products, which are not its prompt's (measured 4.0e-7 and
#: 2.7e-7 from the prompt's logits, as batch-invariant)
GGML_ORDER_PROMPT_EXACT = {"q4_k", "q6_k"}


@pytest.fixture(scope="module", params=sorted(FILES))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return write_tiny_llama(tmp_path_factory.mktemp(name) / f"{name}.gguf", **FILES[name])  # type: ignore[arg-type]


def _errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Each position's largest |difference|, over the largest logit."""
    return np.abs(got - want).max(axis=-1) / np.abs(want).max()


def _logits(model: Path, batch_invariant: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's logits at every position, evaluated whole and token by token."""
    with ModelRunner(model, placement=Placement.on(host_cpu(), 2), cache_type="f32", warmup=False,
               batch_invariant=batch_invariant) as m:  # fmt: skip
        whole = m.eval(TOKENS, all_logits=True)
        m.reset()
        stepped = np.stack([np.atleast_2d(m.eval([t]))[-1] for t in TOKENS])
    return whole, stepped


@pytest.mark.parametrize("name", sorted(GGML_ORDER_EXACT | GGML_ORDER_PROMPT_EXACT))
def test_the_default_order_gives_llama_cpps_bits(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", raising=False)
    path = write_tiny_llama(tmp_path / f"{name}.gguf", **FILES[name])  # type: ignore[arg-type]
    whole, stepped = _logits(path)
    assert _errors(whole, FIXTURE[name]).max() <= 1e-7
    assert _errors(stepped, FIXTURE[name]).max() <= (1e-7 if name in GGML_ORDER_EXACT else 1e-6)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["ggml-order", "invariant"])
def test_every_weight_type_gives_llama_cpps_logits(model: Path, batch_invariant: bool) -> None:
    """Either order: ggml's rounding of the activations is what holds them this close."""
    want = FIXTURE[model.stem]
    whole, stepped = _logits(model, batch_invariant)
    for got, median in ((whole, PROMPT_MEDIAN), (stepped, MEDIAN)):
        errors = _errors(got, want)
        assert np.median(errors) <= median[model.stem], errors
        assert errors.max() <= (1e-7 if model.stem in EXACT else 2e-2), errors

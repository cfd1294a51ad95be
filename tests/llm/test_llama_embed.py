"""Embeddings: ``ModelRunner.embed`` on a BERT encoder and on a llama decoder, held to
llama.cpp's own (llama-cpp-python's ``ModelRunner(embedding=True).embed``).

``tests/data/embed_llamacpp.npz`` holds llama.cpp's raw embeddings of three texts and
the token ids its tokenizer gave them, for a tiny random-weight BERT file (WordPiece
vocabulary, ``pooling_type`` mean; pooled by mean and by its CLS token) and a tiny
llama file (mean and last pooling); ``tests/data/make_embed_fixture.py`` rebuilds the
same files and regenerates it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import test_llama_reference as ref

import tensorplug as tp
from tensorplug.cli import main
from tensorplug.errors import RunError
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ContextFullError, ModelRunner

DATA = Path(__file__).parents[1] / "data"
sys.path.insert(0, str(DATA))
from make_embed_fixture import CASES, FILES, TEXTS, write  # noqa: E402

FIXTURE = np.load(DATA / "embed_llamacpp.npz")
TOKENS: dict[str, list[list[int]]] = json.loads(str(FIXTURE["tokens"]))
POOLING = {1: "mean", 2: "cls", 3: "last"}
#: measured: 2e-7 of the largest value for the llama decoder (float32 rounding); 1e-4
#: (mean) and 3e-4 (CLS) for BERT, whose GELU ggml reads from an F16 table
TOLERANCE = {"bert": 1e-3, "llama": 1e-5}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("embed")
    return {name: write(name, d) for name in FILES}


def _open(path: Path) -> ModelRunner:
    return ModelRunner(
        path, placement=Placement.on(host_cpu(), 2), n_ctx=128, cache_type="f32", warmup=False
    )


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_tokens_are_llama_cpps(models: dict[str, Path], name: str) -> None:
    """WordPiece (BERT: [CLS] ... [SEP], lowercased, punctuation split) and SentencePiece."""
    with _open(models[name]) as m:
        assert m.vocab is not None
        assert [m.vocab.encode(text) for text in TEXTS] == TOKENS[name]
    if name == "bert":
        assert all(ids[0] == 2 and ids[-1] == 3 for ids in TOKENS[name])


@pytest.mark.parametrize(("name", "pooling"), CASES)
def test_embeddings_are_llama_cpps(models: dict[str, Path], name: str, pooling: int) -> None:
    want = FIXTURE[f"{name}-{pooling}"]
    with _open(models[name]) as m:
        got = np.stack([m.embed(ids, POOLING[pooling]) for ids in TOKENS[name]])
        assert m.n_past == 0  # embed leaves the context empty
    assert got.shape == (len(TEXTS), 64)
    assert ref.rel_err(got, want) <= TOLERANCE[name]


def test_the_file_says_how_to_pool_and_normalize_gives_unit_vectors(
    models: dict[str, Path],
) -> None:
    with _open(models["bert"]) as m:
        assert (m.config.pooling, m.config.causal) == ("mean", False)
        ids = TOKENS["bert"][1]
        mean = m.embed(ids)
        unit = m.embed(ids, normalize=True)
        rows = m.embed(ids, "none")
    assert ref.rel_err(mean, FIXTURE["bert-1"][1]) <= TOLERANCE["bert"]
    assert np.allclose(unit, mean / np.linalg.norm(mean), rtol=1e-6)
    assert rows.shape == (len(ids), 64)
    assert np.allclose(rows.mean(axis=0), mean, rtol=1e-6)
    with _open(models["llama"]) as m:  # no pooling_type in a decoder's file: mean
        assert m.config.pooling == "none"
        assert np.array_equal(m.embed(TOKENS["llama"][0]), m.embed(TOKENS["llama"][0], "mean"))


def test_the_encoder_attends_both_ways(models: dict[str, Path]) -> None:
    """BERT's tokens see the tokens after them: with a causal mask its embedding differs
    from llama.cpp's (so the comparison above would catch a causal encoder)."""
    with _open(models["bert"]) as m:
        object.__setattr__(m.config, "causal", True)
        got = m.embed(TOKENS["bert"][1], "mean")
    assert ref.rel_err(got, FIXTURE["bert-1"][1]) > 1e-2


def test_bad_requests_are_refused(models: dict[str, Path]) -> None:
    with _open(models["bert"]) as m:
        with pytest.raises(RunError, match="pooling must be one of none, mean, cls, last"):
            m.embed([2, 3], "max")
        with pytest.raises(ContextFullError, match="129 new ones exceed n_ctx = 128"):
            m.embed([5] * 129)
        with pytest.raises(RunError, match="is an embedding model"):
            m.generate([2, 3], 4)


def test_tensorplug_run_says_a_bert_file_is_an_embedding_model(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(models["bert"]), "-p", "hello", "-n", "4"]) == 1
    err = capsys.readouterr().err
    assert "'bert' is an embedding model" in err and ".embed(tokens)" in err
    assert "Traceback" not in err and "placement" not in err


def test_bert_embeds_on_opencl_too(models: dict[str, Path]) -> None:
    dev = tp.dev_by_name("OpenCL0")
    if dev is None:
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    with ModelRunner(models["bert"], placement=Placement.on(dev, 2), n_ctx=128, cache_type="f32",
               warmup=False) as m:  # fmt: skip
        got = np.stack([m.embed(ids, "mean") for ids in TOKENS["bert"]])
        assert [split[0] for split in m.split_summaries["prompt"].splits] == ["OpenCL0"]
    assert ref.rel_err(got, FIXTURE["bert-1"]) <= TOLERANCE["bert"]

"""``tensorplug serve -hf USER/MODEL[:QUANT]``: llama.cpp's choice of a repository's GGUF
file, fetched through huggingface_hub; tested offline against a Hub cache laid out here
(``HF_HUB_OFFLINE``: the files the cache holds are the repository's)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tensorplug.errors import RunError
from tensorplug_llm.hub import HubError, download_quant, pick_gguf
from tensorplug_llm.serve_cli import _from_hub, _resolve, add_arguments
from tensorplug_llm.tiny import write_tiny_llama

pytest.importorskip("huggingface_hub")

FILES = [
    "README.md", "model-Q8_0.gguf", "model-q4_k_m.gguf", "mmproj-model-f16.gguf",
    "big/model-Q2_K-00002-of-00002.gguf", "big/model-Q2_K-00001-of-00002.gguf",
]  # fmt: skip


def test_the_quant_is_a_word_of_the_name_in_any_case_and_q4_k_m_by_default() -> None:
    assert pick_gguf(FILES, "Q8_0") == ["model-Q8_0.gguf"]
    assert pick_gguf(FILES, "q8_0") == ["model-Q8_0.gguf"]
    assert pick_gguf(FILES, None) == ["model-q4_k_m.gguf"]
    # a split model: every shard, in order
    assert pick_gguf(FILES, "Q2_K") == [
        "big/model-Q2_K-00001-of-00002.gguf", "big/model-Q2_K-00002-of-00002.gguf"
    ]  # fmt: skip
    # no Q4_K_M: the first GGUF file, never the projector
    assert pick_gguf(["mmproj-f16.gguf", "b-F16.gguf", "a-Q8_0.gguf"], None) == ["a-Q8_0.gguf"]
    with pytest.raises(HubError, match="no GGUF file of quantization Q5_0"):
        pick_gguf(FILES, "Q5_0")
    with pytest.raises(HubError, match="no GGUF file in the repository"):
        pick_gguf(["README.md"], None)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache holding ``someone/tiny-GGUF``: two quantizations of the tiny model."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    commit = "0" * 40
    repo = cache / "models--someone--tiny-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, weights in (("tiny-Q8_0.gguf", "q8_0"), ("tiny-F16.gguf", "f16")):
        write_tiny_llama(snapshot / name, weights, 0)
    (snapshot / "README.md").write_text("a model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return snapshot


def test_a_quant_of_a_cached_repository_is_found_offline(hub: Path) -> None:
    cache = str(hub.parents[2])
    assert Path(download_quant("someone/tiny-GGUF:f16", cache_dir=cache)).name == "tiny-F16.gguf"
    # no Q4_K_M there: the first GGUF file
    assert Path(download_quant("someone/tiny-GGUF", cache_dir=cache)).name == "tiny-F16.gguf"
    named = download_quant("someone/tiny-GGUF", "tiny-Q8_0.gguf", cache_dir=cache)
    assert Path(named).name == "tiny-Q8_0.gguf"
    with pytest.raises(HubError, match="nothing of it"):
        download_quant("someone/other-GGUF", cache_dir=cache)
    with pytest.raises(HubError, match="Q5_0"):
        download_quant("someone/tiny-GGUF:Q5_0", cache_dir=cache)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(list(argv))
    _resolve(args)
    return args


def test_serve_takes_llama_servers_hub_flags(hub: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("-hf", "someone/tiny-GGUF:Q8_0")
    path = _from_hub(args)
    assert Path(path).name == "tiny-Q8_0.gguf" and Path(path).is_file()
    assert f"model: {path}" in capsys.readouterr().err
    args = _args("--hf-repo", "someone/tiny-GGUF", "--hf-file", "tiny-F16.gguf")
    assert Path(_from_hub(args)).name == "tiny-F16.gguf"
    with pytest.raises(RunError, match="-hf someone/tiny-GGUF:Q5_0: no GGUF file of"):
        _from_hub(_args("-hf", "someone/tiny-GGUF:Q5_0"))
    with pytest.raises(RunError, match="two models given"):
        _args(str(hub / "tiny-F16.gguf"), "-hf", "someone/tiny-GGUF")
    with pytest.raises(RunError, match="--hf-file .* add -hf"):
        _args("--hf-file", "tiny-F16.gguf")

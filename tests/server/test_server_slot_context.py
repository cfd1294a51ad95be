"""Each slot's context as llama-server's: ``-c N -np P`` gives each slot ``N / P`` tokens
unless ``--kv-unified``; without ``-np`` the 4 slots share the whole context. A prompt
too long for a slot is refused in llama-server's ``exceed_context_size_error`` shape,
and ``/props`` and ``/slots`` report the slot's context."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient

from tensorplug.errors import RunError
from tensorplug_llm.api import LLM
from tensorplug_llm.engine import Engine
from tensorplug_llm.generation import EngineGenerator
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE, _resolve, add_arguments
from tensorplug_llm.serve_flags import slot_context
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--tiny", *argv])
    _resolve(args)
    return args


@pytest.mark.parametrize(
    ("argv", "parallel", "unified"),
    [([], 4, True), (["--no-kv-unified"], 4, True), (["-np", "2"], 2, False),
     (["-np", "2", "--kv-unified"], 2, True), (["-np", "2", "-kvu"], 2, True),
     (["-np", "3", "-no-kvu"], 3, False)],
)  # fmt: skip
def test_slots_share_the_context_only_when_unified(
    argv: list[str], parallel: int, unified: bool
) -> None:
    """llama-server's defaults: -np left out is "auto", 4 slots on a unified cache."""
    args = _parse(argv)
    assert (args.parallel, args.kv_unified) == (parallel, unified)


def test_a_slots_context_is_its_share_at_most_the_trained_length() -> None:
    assert slot_context(512, 2, False, 8192) == 256
    assert slot_context(512, 2, True, 8192) == 512
    assert slot_context(1000, 3, False, 8192) == 333
    assert slot_context(16384, 1, False, 8192) == 8192  # llama-server caps at n_ctx_train
    assert slot_context(512, 2, False, 0) == 256  # a file without a trained length
    with pytest.raises(RunError, match="leaves none per slot"):
        slot_context(2, 4, False, 8192)


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, LLM]]:
    path = write_tiny_llama(
        tmp_path_factory.mktemp("slot_ctx") / "tiny.gguf", "q8_0", 0,
        metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=128, warmup=False)
    llm = LLM(llama, EngineGenerator(Engine(llama, 2, n_ctx_seq=64)), model_name="tiny")
    yield TestClient(create_app(llm, ServerConfig())), llm
    llm.close()
    llama.close()


def test_props_and_slots_report_a_slots_context(http: tuple[TestClient, LLM]) -> None:
    client, llm = http
    assert llm.n_ctx == 64 and llm.llama.n_ctx == 128
    props = client.get("/props").json()
    assert (props["default_generation_settings"]["n_ctx"], props["total_slots"]) == (64, 2)
    assert [s["n_ctx"] for s in client.get("/slots").json()] == [64, 64]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/completion"])
def test_a_prompt_longer_than_a_slot_is_refused_as_llama_servers(
    route: str, http: tuple[TestClient, LLM]
) -> None:
    """80 tokens fit the cache of 128 but not a slot's 64."""
    client, llm = http
    words = " ".join(["the of"] * 40)
    assert 64 < len(llm.tokenize(words)) < 128
    body = (
        {"messages": [{"role": "user", "content": words}]}
        if route.endswith("chat/completions")
        else {"prompt": words}
    )
    r = client.post(route, json={**body, "max_tokens": 2, "n_predict": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["n_ctx"]) == ("exceed_context_size_error", 400, 64)
    assert error["n_prompt_tokens"] > 64


def test_a_reply_ends_when_its_slot_is_full(http: tuple[TestClient, LLM]) -> None:
    """The slot's 64 cells hold the prompt and the reply; the token sampled when they
    are full ends it (it needs no cell), as ``tensorplug run`` ends at a full context."""
    client, llm = http
    prompt = " ".join(["the of"] * 25)
    n_prompt = len(llm.tokenize(prompt))
    assert n_prompt < 64
    got = client.post(
        "/completion", json={"prompt": prompt, "n_predict": 100, "ignore_eos": True}
    ).json()
    assert got["stop_type"] == "limit"
    assert n_prompt + got["tokens_predicted"] == 64 + 1


def test_engine_refuses_a_slot_context_larger_than_the_cache(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "t.gguf", "q8_0", 0)
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=32, warmup=False)
    try:
        with pytest.raises(RunError, match="n_ctx_seq must be 1..n_ctx = 32"):
            Engine(llama, 2, n_ctx_seq=33)
    finally:
        llama.close()

"""llama-server's ``/infill`` on ``tensorplug serve``: the prompt is made of the GGUF's
FIM tokens in llama.cpp's order (extra files, BOS, prefix, prompt, suffix, middle),
checked token by token through what the runner generates from it; a model without FIM
tokens is a 400 saying so."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient
from tiny_server import TinyModel, tiny_model

from tensorplug_llm.api import LLM
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

PRE, SUF, MID, REP, SEP = 300, 301, 302, 303, 304
FIM_KEYS = {"tokenizer.ggml.fim_pre_token_id": PRE, "tokenizer.ggml.fim_suf_token_id": SUF,
            "tokenizer.ggml.fim_mid_token_id": MID, "tokenizer.ggml.fim_rep_token_id": REP,
            "tokenizer.ggml.fim_sep_token_id": SEP}  # fmt: skip


@pytest.fixture(scope="module")
def fim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    # n_ctx 512, n_batch 256: the extra files get what a batch and 2 * n_predict leave
    path = write_tiny_llama(tmp_path_factory.mktemp("fim") / "fim.gguf", "q8_0", 0,
                            n_ctx=512, metadata=FIM_KEYS)  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=512, warmup=False)
    assert llama.n_batch == 256
    llm = LLM(llama, n_parallel=2, model_name="fim.gguf")
    yield llm
    llm.close()
    llama.close()


@pytest.fixture(scope="module")
def http(fim: LLM) -> TestClient:
    return TestClient(create_app(fim, ServerConfig()))


def _greedy(llm: LLM, ids: list[int], n: int) -> str:
    got = llm.create_completion(ids, max_tokens=n, temperature=0)
    assert isinstance(got, dict)
    text: str = got["choices"][0]["text"]
    return text


def test_the_prompt_is_llama_cpps_fim_sequence(fim: LLM, http: TestClient) -> None:
    enc, bos = fim.vocab.encode, fim.vocab.bos
    assert bos is not None
    body: dict[str, Any] = {
        "input_prefix": "the of", "input_suffix": "and to", "prompt": "in",
        "input_extra": [{"filename": "a", "text": "hello"}], "n_predict": 6, "temperature": 0,
    }  # fmt: skip
    want = [REP, *enc("myproject\n", add_bos=False), SEP, *enc("a\n", add_bos=False),
            *enc("hello", add_bos=False), SEP, *enc("filename\n", add_bos=False),
            bos, PRE, *enc("the of", add_bos=False), *enc("in", add_bos=False),
            SUF, *enc("and to", add_bos=False), MID]  # fmt: skip
    got = http.post("/infill", json=body)
    assert got.status_code == 200, got.text
    r = got.json()
    assert r["tokens_evaluated"] == len(want)
    assert r["prompt"] == fim.vocab.decode(want, special=True)
    assert r["content"] == _greedy(fim, want, 6) and r["tokens_predicted"] == 6
    assert r["stop"] is True and r["stop_type"] == "limit"
    streamed = http.post("/infill", json={**body, "stream": True}).text
    assert '"stop": true' in streamed and "[DONE]" not in streamed
    # 512 - 256 - 2 * 125 = 6 tokens left for the extra files: their last 6 are kept
    tight = http.post("/infill", json={**body, "n_predict": 125}).json()
    n_extra = want.index(bos)
    assert tight["prompt"] == fim.vocab.decode(want[n_extra - 6 :], special=True)
    assert tight["tokens_evaluated"] == len(want) - n_extra + 6


def test_token_ids_in_the_prefix_are_kept(fim: LLM, http: TestClient) -> None:
    ids = fim.vocab.encode("the of", add_bos=False)
    r = http.post("/infill", json={"input_prefix": ids, "input_suffix": "", "n_predict": 2,
                                   "temperature": 0}).json()  # fmt: skip
    enc, bos = fim.vocab.encode, fim.vocab.bos
    assert bos is not None
    want = [REP, *enc("myproject\n", add_bos=False), SEP, *enc("filename\n", add_bos=False),
            bos, PRE, *ids, SUF, MID]  # fmt: skip
    assert r["content"] == _greedy(fim, want, 2)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input_suffix": "x"}, "input_prefix"),
        ({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "a"}]},
         "input_extra.0.text"),
        ({"input_prefix": "x", "input_suffix": "y", "prompt": [1, 2]}, "prompt"),
    ],
)  # fmt: skip
def test_malformed_requests_are_400_naming_the_field(
    http: TestClient, body: dict[str, Any], words: str
) -> None:
    r = http.post("/infill", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == words


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("nofim"))
    yield m
    m.close()


def test_a_model_without_fim_tokens_is_a_400_saying_so(plain: TinyModel) -> None:
    r = TestClient(create_app(plain.llm)).post("/infill", json={"input_prefix": "the",
                                                                "input_suffix": "of"})  # fmt: skip
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith("tiny.gguf cannot fill in the middle: it has no FIM")
    assert "tokenizer.ggml.fim_pre_token_id" in error["message"]

"""Requests a server meets in the wild, each answered with a 4xx naming the field (never a
500), or accepted in the form OpenAI clients really send. Found by sending them by hand
to ``tensorplug serve --tiny``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient

from tensorplug_llm.api import LLM
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

MODEL = "tiny.gguf"
N_CTX = 64
BODY_LIMIT = 4096


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    path: Path = write_tiny_llama(
        tmp_path_factory.mktemp("hostile-serve") / MODEL, "q8_0", 0,
        metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=N_CTX, warmup=False)
    llm = LLM(llama, n_parallel=2, model_name=MODEL)
    try:
        with TestClient(create_app(llm, ServerConfig(max_body_bytes=BODY_LIMIT))) as client:
            yield client
    finally:
        llm.close()
        llama.close()


def _error(response: Any, status: int, param: str, kind: str = "invalid_request_error") -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["type"] == kind and body["param"] == param
    return str(body["message"])


OVERFLOW = "exceed_context_size_error"


def test_a_prompt_longer_than_the_context_is_a_400_saying_so_as_llama_server_does(
    http: TestClient,
) -> None:
    body = {"model": MODEL, "prompt": list(range(1, N_CTX + 10)), "max_tokens": 2}
    response = http.post("/v1/completions", json=body)
    message = _error(response, 400, "prompt", OVERFLOW)
    assert message.startswith(
        f"request ({N_CTX + 9} tokens) exceeds the available context size ({N_CTX} tokens)"
    )
    error = response.json()["error"]
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (N_CTX + 9, N_CTX)
    chat = {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": "word " * (4 * N_CTX)}]}  # fmt: skip
    message = _error(http.post("/v1/chat/completions", json=chat), 400, "messages", OVERFLOW)
    assert "n_ctx" in message


def test_a_text_that_cannot_fit_is_refused_before_it_is_tokenized(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = http.app.state.llm  # type: ignore[attr-defined]
    longest = max(len(t) for t in llm.vocab.tokens)

    def no_tokenizing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a text too long for any tokenization was tokenized")

    monkeypatch.setattr(llm.vocab, "encode", no_tokenizing)
    monkeypatch.setattr(llm.vocab, "encode_parts", no_tokenizing)
    text = "a" * (N_CTX * longest + 1)
    body = {"model": MODEL, "prompt": text, "max_tokens": 1}
    message = _error(http.post("/v1/completions", json=body), 400, "prompt", OVERFLOW)
    assert f"{len(text)} characters" in message and f"holds {N_CTX}" in message
    chat = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
    _error(http.post("/v1/chat/completions", json=chat), 400, "messages", OVERFLOW)


def test_a_token_id_outside_the_vocabulary_is_a_400_naming_it(http: TestClient) -> None:
    body = {"model": MODEL, "prompt": [1, 2, 99_999_999], "max_tokens": 2}
    assert "99999999" in _error(http.post("/v1/completions", json=body), 400, "prompt")


def test_text_content_parts_are_read_as_one_text(http: TestClient) -> None:
    def reply(content: Any) -> Any:
        body = {"model": MODEL, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": content}]}  # fmt: skip
        return http.post("/v1/chat/completions", json=body)

    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]
    as_parts, as_text = reply(parts), reply("hello\nthere")
    assert as_parts.status_code == 200, as_parts.text
    assert as_parts.json()["choices"] == as_text.json()["choices"]
    image = [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]
    refused = reply(image)  # llama-server's answer for a model without a projector
    assert refused.status_code == 500, refused.text
    assert refused.json()["error"]["message"].startswith("image input is not supported")
    message = _error(reply([{"type": "hologram"}]), 400, "messages.0.content")
    assert "'hologram'" in message and "text only" in message


def test_a_list_of_prompts_says_to_send_one_request_each(http: TestClient) -> None:
    one = {"model": MODEL, "prompt": ["a b"], "max_tokens": 2, "temperature": 0}
    assert (
        http.post("/v1/completions", json=one).json()["choices"][0]["text"]
        == (
            http.post("/v1/completions", json={**one, "prompt": "a b"}).json()["choices"][0]["text"]
        )
    )
    several = {**one, "prompt": ["a", "b"]}
    message = _error(http.post("/v1/completions", json=several), 400, "prompt")
    assert "one request per prompt" in message


def test_a_body_past_the_limit_is_a_413_whether_or_not_its_length_is_declared(
    http: TestClient,
) -> None:
    big = b'{"model": "tiny.gguf", "max_tokens": 1, "prompt": "' + b"a" * BODY_LIMIT + b'"}'
    declared = http.post("/v1/completions", content=big,
                         headers={"content-type": "application/json"})  # fmt: skip
    assert declared.status_code == 413 and "4096 bytes" in declared.json()["error"]["message"]

    def chunked() -> Iterator[bytes]:  # no content-length: the limit counts what is read
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    streamed = http.post("/v1/completions", content=chunked(),
                         headers={"content-type": "application/json"})  # fmt: skip
    assert streamed.status_code == 413, streamed.text
    assert "--max-request-size" in streamed.json()["error"]["message"]


def test_the_server_still_answers_after_every_refusal(http: TestClient) -> None:
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 3, "temperature": 0}
    got = http.post("/v1/completions", json=body)
    assert got.status_code == 200 and got.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("/v1/completions", "stream", "yes"),
        ("/v1/completions", "echo", "yes"),
        ("/v1/completions", "max_tokens", "10"),
        ("/v1/completions", "n", "2"),
        ("/v1/completions", "temperature", "0.5"),
        ("/v1/chat/completions", "logprobs", "yes"),
        ("/v1/chat/completions", "parallel_tool_calls", "no"),
        ("/completion", "n_predict", "10"),
        ("/completion", "stream", "yes"),
    ],
)
def test_a_string_is_not_taken_for_a_number_or_a_boolean(
    http: TestClient, route: str, field: str, value: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, field: value}
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "a b"
    response = http.post(route, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


def test_booleans_are_not_token_ids(http: TestClient) -> None:
    body = {"model": MODEL, "prompt": [True], "max_tokens": 2}
    message = _error(http.post("/v1/completions", json=body), 400, "prompt.0")
    assert "valid integer" in message

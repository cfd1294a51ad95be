"""Structured output, tools and text that a client gets wrong: each is a 400 in OpenAI's
error shape naming the field, answered before the request is admitted (a bad grammar
costs milliseconds, never a 500 "internal error"), and a stream that fails after it
began ends with an error event and ``[DONE]``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")
pytest.importorskip("llguidance", reason="structured output needs llguidance")

from fastapi.testclient import TestClient

from tensorplug_llm.api import LLM
from tensorplug_llm.constraint import MAX_GRAMMAR_BYTES
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

MODEL = "tiny.gguf"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    path: Path = write_tiny_llama(
        tmp_path_factory.mktemp("hostile-structured") / MODEL, "q8_0", 0,
        metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=64, warmup=False)
    llm = LLM(llama, n_parallel=2, model_name=MODEL)
    try:
        with TestClient(create_app(llm, ServerConfig(max_body_bytes=1 << 20))) as client:
            yield client
    finally:
        llm.close()
        llama.close()


def _error(response: Any, param: str) -> str:
    assert response.status_code == 400, response.text
    body = response.json()["error"]
    assert body["type"] == "invalid_request_error" and body["param"] == param, body
    return str(body["message"])


def _complete(http: TestClient, **fields: Any) -> Any:
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 3, "temperature": 0, **fields}
    return http.post("/v1/completions", json=body)


REF_LOOP = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": REF_LOOP}},
         "response_format.json_schema.schema"),
        ({"type": "regex", "regex": "[^\\s\\S]"}, "response_format.regex"),
        ({"type": "grammar", "grammar": 'start: a\na: a "x"'}, "grammar"),
    ],
    ids=["ref-loop", "empty-regex", "endless-grammar"],
)  # fmt: skip
def test_a_format_that_accepts_nothing_is_a_400_before_anything_runs(
    http: TestClient, response_format: dict[str, Any], param: str
) -> None:
    message = _error(_complete(http, response_format=response_format), param)
    assert "accepts nothing" in message
    streamed = _complete(http, response_format=response_format, stream=True)
    assert "accepts nothing" in _error(streamed, param)


def test_a_grammar_past_the_size_limit_is_refused_before_it_is_compiled(
    http: TestClient,
) -> None:
    words = " | ".join(f'"w{i}"' for i in range(MAX_GRAMMAR_BYTES // 6))
    message = _error(_complete(http, grammar=f"start: {words}"), "grammar")
    assert f"limit of {MAX_GRAMMAR_BYTES}" in message


def test_a_pathological_regex_is_bounded_by_llguidances_budgets(http: TestClient) -> None:
    got = _complete(http, response_format={"type": "regex", "regex": "((a{100}){100}){100}"})
    assert got.status_code in (200, 400), got.text
    if got.status_code == 200:
        assert set(got.json()["choices"][0]["text"]) <= {"a"}


def test_a_response_format_without_a_type_is_refused(http: TestClient) -> None:
    assert "type" in _error(_complete(http, response_format={}), "response_format.type")


def test_a_lone_surrogate_is_a_400_naming_the_field(http: TestClient) -> None:
    raw = '{"model": "tiny.gguf", "max_tokens": 2, "prompt": "a \\ud800 b"}'
    got = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert "surrogate" in _error(got, "prompt")
    chat = (
        '{"model": "tiny.gguf", "max_tokens": 2, '
        '"messages": [{"role": "user", "content": "hi \\udfff"}]}'
    )
    got = http.post("/v1/chat/completions", content=chat,
                    headers={"content-type": "application/json"})  # fmt: skip
    assert "surrogate" in _error(got, "messages.0.content")


def test_deeply_nested_tool_call_arguments_are_a_400(http: TestClient) -> None:
    deep = "[" * 5000 + "]" * 5000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    body = {
        "model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
    }  # fmt: skip
    message = _error(http.post("/v1/chat/completions", json=body),
                     "messages[1].tool_calls[0].function.arguments")  # fmt: skip
    assert "nested" in message


def test_dimensions_other_than_the_models_are_refused(http: TestClient) -> None:
    got = http.post("/v1/embeddings", json={"model": MODEL, "input": "a b", "dimensions": 8})
    assert "cannot shorten them to 8" in _error(got, "dimensions")
    size = http.app.state.llm.llama.config.n_embd  # type: ignore[attr-defined]
    same = http.post("/v1/embeddings", json={"model": MODEL, "input": "a b", "dimensions": size})
    assert same.status_code == 200 and len(same.json()["data"][0]["embedding"]) == size


def test_a_stream_that_fails_ends_with_an_error_event_and_done(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorplug_llm import api

    def failing(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        raise api.RunError("the engine failed")
        yield  # a generator

    monkeypatch.setattr(api.LLM, "_pieces", failing)
    got = _complete(http, stream=True)
    assert got.status_code == 200
    events = [line[6:] for line in got.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "RunError" in error["message"]

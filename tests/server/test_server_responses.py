"""OpenAI's Responses API on ``tensorplug serve`` (``/v1/responses``), driven by the
real ``openai`` client's ``client.responses.create`` against 127.0.0.1: the output text
is the chat route's reply to the same conversation, streamed as the Responses events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from tiny_server import TinyModel, tiny_model
from uvicorn_thread import UvicornThread

from tensorplug_llm.server import ServerConfig, create_app


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("responses"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def client(model: TinyModel) -> Iterator[openai.OpenAI]:
    srv = UvicornThread(create_app(model.llm, ServerConfig()))
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    srv.stop()


def _chat_text(model: TinyModel, messages: list[dict[str, Any]], n: int) -> str:
    got = model.llm.create_chat_completion(messages, temperature=0, max_tokens=n)
    assert isinstance(got, dict)
    text: str = got["choices"][0]["message"]["content"]
    return text


def test_a_response_is_the_chat_routes_reply(model: TinyModel, client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the of"}]
    got = client.responses.create(model="any", instructions="be brief", input="the of",
                                  max_output_tokens=8, temperature=0)  # fmt: skip
    assert got.id.startswith("resp_") and got.object == "response" and got.model == "tiny.gguf"
    assert got.output_text == _chat_text(model, messages, 8)
    (item,) = got.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    assert got.status == "incomplete" and got.incomplete_details is not None
    assert got.incomplete_details.reason == "max_output_tokens"
    assert got.usage is not None
    n_prompt = len(model.llm.chat_prompt(messages))
    assert (got.usage.input_tokens, got.usage.output_tokens) == (n_prompt, 8)


def test_message_items_read_as_a_conversation(model: TinyModel, client: openai.OpenAI) -> None:
    items: Any = [
        {"role": "user", "content": "the of"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "and to"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "in is"}]},
    ]  # fmt: skip
    messages = [{"role": "user", "content": "the of"}, {"role": "assistant", "content": "and to"},
                {"role": "user", "content": "in is"}]  # fmt: skip
    got = client.responses.create(model="any", input=items, max_output_tokens=6, temperature=0)
    assert got.output_text == _chat_text(model, messages, 6)


def test_a_stream_is_the_responses_events(client: openai.OpenAI) -> None:
    want = client.responses.create(model="any", input="the of", max_output_tokens=8,
                                   temperature=0)  # fmt: skip
    events = list(client.responses.create(model="any", input="the of", max_output_tokens=8,
                                          temperature=0, stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == want.output_text
    done = events[-1]
    assert done.type == "response.completed"
    assert done.response.output_text == want.output_text
    assert done.response.usage is not None and done.response.usage.output_tokens == 8


def test_bad_requests_are_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="any", input="hi", previous_response_id="resp_1")
    assert "previous_response_id" in str(bad.value)
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="any", input="hi", max_output_tokens=0)
    assert "max_output_tokens" in str(bad.value)


def test_a_stream_carries_llama_servers_telemetry_when_asked(client: openai.OpenAI) -> None:
    """``return_progress``: the prompt's evaluation as ``response.in_progress`` events;
    ``timings_per_token``: timings on the text deltas and on ``response.completed``,
    as llama-server streams them; the text is the plain stream's."""
    body = {"input": "the of and to " * 6, "max_output_tokens": 6, "temperature": 0,
            "stream": True}  # fmt: skip
    plain = _sse_events(client, body)
    events = _sse_events(client, {**body, "timings_per_token": True, "return_progress": True})
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    last = progress[-1]["prompt_progress"]
    assert last["processed"] == last["total"] > 0 and last["processed"] >= last["cache"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    completed = events[-1]
    assert completed["type"] == "response.completed"
    assert completed["timings"]["predicted_n"] == completed["response"]["usage"]["output_tokens"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in deltas)
    assert text == "".join(e["delta"] for e in plain if e["type"] == "response.output_text.delta")
    assert not any("timings" in e or "prompt_progress" in e for e in plain)


def _sse_events(client: openai.OpenAI, body: dict[str, Any]) -> list[dict[str, Any]]:
    url = str(client.base_url).rstrip("/") + "/responses"
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line.removeprefix("data: ")) for line in lines]

"""Anthropic's Messages API on ``tensorplug serve`` (``/v1/messages``,
``/v1/messages/count_tokens``), driven by the real ``anthropic`` client against
127.0.0.1: the reply is the chat route's reply to the same conversation, streamed as
Anthropic's events; stop sequences, tool calls (a tiny model with Qwen 2.5's template,
the call forced by ``tool_choice``), keys and errors in Anthropic's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic", reason="pip install -e 'apps/llm[test]'")
jsonschema = pytest.importorskip("jsonschema", reason="pip install -e 'apps/llm[test]'")

import httpx  # noqa: E402
from tiny_server import TinyModel, tiny_model  # noqa: E402
from uvicorn_thread import UvicornThread  # noqa: E402

from tensorplug_llm.api import LLM  # noqa: E402
from tensorplug_llm.placement import Placement, host_cpu  # noqa: E402
from tensorplug_llm.runner import ModelRunner  # noqa: E402
from tensorplug_llm.server import ServerConfig, create_app  # noqa: E402
from tensorplug_llm.tiny import write_tiny_llama  # noqa: E402

QWEN25 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["paris", "oslo", "lima"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}  # fmt: skip
WEATHER = {"name": "get_weather", "description": "The forecast of a city",
           "input_schema": WEATHER_SCHEMA}  # fmt: skip
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
ASK = [{"role": "user", "content": "the of and"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("anthropic"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def server(model: TinyModel) -> Iterator[UvicornThread]:
    srv = UvicornThread(create_app(model.llm, ServerConfig(api_key="sk-test")))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: UvicornThread) -> Any:
    return anthropic.Anthropic(base_url=server.url, api_key="sk-test", max_retries=0, timeout=120)


def _chat(llm: LLM, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    got = llm.create_chat_completion(messages, temperature=0, **kwargs)
    assert isinstance(got, dict)
    return got


def test_a_message_is_the_chat_routes_reply(model: TinyModel, client: Any) -> None:
    system = [{"role": "system", "content": "be brief"}]
    want = _chat(model.llm, system + ASK, max_tokens=8)
    got = client.messages.create(model="any", max_tokens=8, system="be brief", messages=ASK,
                                 **GREEDY)  # fmt: skip
    assert got.id.startswith("msg_") and got.type == "message" and got.role == "assistant"
    assert got.model == "tiny.gguf"
    assert [b.type for b in got.content] == ["text"]
    assert got.content[0].text == want["choices"][0]["message"]["content"]
    assert (got.stop_reason, got.stop_sequence) == ("max_tokens", None)
    n_prompt = len(model.llm.chat_prompt(system + ASK))
    # the prompt's tokens read from the cache are counted apart, as Anthropic's
    used = got.usage
    assert (used.input_tokens + used.cache_read_input_tokens, used.output_tokens) == (n_prompt, 8)


def test_system_blocks_and_text_blocks_read_as_strings(model: TinyModel, client: Any) -> None:
    blocks = client.messages.count_tokens(
        model="any", system=[{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "the of and"}]}],
    )  # fmt: skip
    n_prompt = len(model.llm.chat_prompt([{"role": "system", "content": "be brief"}, *ASK]))
    assert blocks.input_tokens == n_prompt


def test_a_stop_sequence_ends_the_reply_and_is_named(model: TinyModel, client: Any) -> None:
    whole = _chat(model.llm, ASK, max_tokens=12)["choices"][0]["message"]["content"]
    stop = next(whole[i : i + 2] for i in range(2, len(whole)) if whole[i : i + 2].isalpha())
    got = client.messages.create(model="any", max_tokens=12, messages=ASK,
                                 stop_sequences=[stop], **GREEDY)  # fmt: skip
    assert (got.stop_reason, got.stop_sequence) == ("stop_sequence", stop)
    assert got.content[0].text == whole[: whole.index(stop)]


def test_a_stream_is_anthropics_events(model: TinyModel, client: Any, server: Any) -> None:
    want = client.messages.create(model="any", max_tokens=8, messages=ASK, **GREEDY)
    with client.messages.stream(model="any", max_tokens=8, messages=ASK, **GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == want.content[0].text
    assert final.content[0].text == want.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", 8)
    assert (final.usage.input_tokens + final.usage.cache_read_input_tokens
            == want.usage.input_tokens + want.usage.cache_read_input_tokens)  # fmt: skip
    body = {"model": "any", "max_tokens": 3, "messages": ASK, "stream": True, "temperature": 0}
    raw = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": "sk-test"},
                     timeout=120).text  # fmt: skip
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert [d["type"] for d in data] == names  # each event's name is its data's type


def test_errors_are_in_anthropics_shape(client: Any, server: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="any", max_tokens=0, messages=ASK)
    assert bad.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "max_tokens: Input should be greater than or equal to 1"}}  # fmt: skip
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "sk-test"}, json={
        "model": "any", "messages": ASK}, timeout=60)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens")
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="any", max_tokens=4,
                               messages=[{"role": "user", "content": [document]}])  # fmt: skip
    assert "type 'document'" in refused.value.body["error"]["message"]
    wrong = anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="any", max_tokens=4, messages=ASK)


# -- tools --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("llguidance", reason="a forced tool call needs llguidance")
    path = write_tiny_llama(
        tmp_path_factory.mktemp("anthropic-tools") / "tiny-qwen.gguf", "q8_0", 0, n_ctx=2048,
        metadata={"tokenizer.chat_template": QWEN25.read_text()},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=2048, warmup=False)
    llm = LLM(llama, n_parallel=2, model_name="tiny-qwen.gguf")
    srv = UvicornThread(create_app(llm, ServerConfig()))
    try:
        yield anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=120)
    finally:
        srv.stop()
        llm.close()
        llama.close()


def test_a_forced_tool_call_is_a_tool_use_block(tools_client: Any) -> None:
    ask = [{"role": "user", "content": "weather in oslo"}]
    kwargs: dict[str, Any] = {"model": "any", "max_tokens": 200, "messages": ask,
                              "tools": [WEATHER], **GREEDY,
                              "tool_choice": {"type": "tool", "name": "get_weather"}}  # fmt: skip
    got = tools_client.messages.create(**kwargs)
    assert got.stop_reason == "tool_use"
    (call,) = got.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    with tools_client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in final.content] == [
        ("tool_use", "get_weather", call.input)
    ]
    # the call and its result go back in the conversation as Anthropic's blocks
    turn = [*ask, {"role": "assistant", "content": [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "cold"}]}]  # fmt: skip
    reply = tools_client.messages.create(model="any", max_tokens=2, messages=turn,
                                         tools=[WEATHER], **GREEDY)  # fmt: skip
    assert reply.usage.output_tokens == 2
    counted = tools_client.messages.count_tokens(model="any", messages=turn, tools=[WEATHER])
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_an_image_is_refused_as_llama_server_refuses_it_without_a_projector(
    client: Any,
) -> None:
    """llama-server answers an image to a model without a multimodal projector with a
    500 saying the input is not supported, in a message or in a tool's result; clients
    match that text."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}  # fmt: skip
    use = {"type": "tool_use", "id": "t1", "name": "read", "input": {"file": "a.png"}}
    result = {"type": "tool_result", "tool_use_id": "t1",
              "content": [{"type": "text", "text": "a.png"}, image]}  # fmt: skip
    for messages in (
        [{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}],
        [*ASK, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}],
    ):
        with pytest.raises(anthropic.InternalServerError) as refused:
            client.messages.create(model="any", max_tokens=4, messages=messages)
        error = refused.value.body["error"]
        assert error["type"] == "api_error"
        assert error["message"].startswith("image input is not supported")


def test_an_empty_conversation_is_answered_and_a_missing_one_refused(
    client: Any, server: Any
) -> None:
    """llama-server accepts no messages at all (the reply to an empty chat), and refuses
    a request without the field."""
    reply = client.messages.create(model="any", max_tokens=3, messages=[], **GREEDY)
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.usage.output_tokens >= 1
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "sk-test"},
                   json={"model": "any", "max_tokens": 3}, timeout=60)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages")


def test_a_thinking_block_of_an_earlier_reply_is_its_reasoning_content() -> None:
    """As llama-server converts it: the template renders it where it keeps reasoning."""
    from tensorplug_llm.http.anthropic_schema import MessagesRequest

    body = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look first", "signature": "s"},
                {"type": "tool_use", "id": "c1", "name": "ls", "input": {"path": "."}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "main.py"},
            ]},
        ],
    })  # fmt: skip
    assistant = body.oai_messages()[1]
    assert assistant["reasoning_content"] == "look first"
    assert assistant["content"] is None and assistant["tool_calls"][0]["id"] == "c1"

"""Tool calling through ``tensorplug serve``'s HTTP API, driven by the real ``openai``
client against 127.0.0.1: a tiny random-weight model with Qwen 2.5's real chat template
(the hermes syntax) must, under ``tool_choice``, always answer with a call whose
arguments validate; streamed deltas join up to the whole answer; a conversation with a
call and its result is the prompt jinja2 renders from that template; bad tools are 400s
naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

jsonschema = pytest.importorskip("jsonschema", reason="pip install -e 'apps/llm[test]'")
pytest.importorskip("llguidance", reason="pip install -e 'apps/llm[structured]'")

from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402
from uvicorn_thread import UvicornThread  # noqa: E402

from tensorplug_llm.api import LLM, Stream  # noqa: E402
from tensorplug_llm.generation import GeneratorStats  # noqa: E402
from tensorplug_llm.placement import Placement, host_cpu  # noqa: E402
from tensorplug_llm.runner import ModelRunner  # noqa: E402
from tensorplug_llm.server import ServerConfig, create_app  # noqa: E402
from tensorplug_llm.tiny import write_tiny_llama  # noqa: E402
from tensorplug_llm.tool_spec import tool_spec  # noqa: E402

MODEL = "tiny-qwen-tools.gguf"
TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
QWEN25 = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["paris", "oslo", "lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
ALARM = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "parameters": {
            "type": "object",
            "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
            "required": ["hour"],
            "additionalProperties": False,
        },
    },
}
TOOLS: list[Any] = [WEATHER, ALARM]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@dataclass
class Served:
    llm: LLM
    client: openai.OpenAI


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = write_tiny_llama(
        tmp_path_factory.mktemp("tools") / MODEL, "q8_0", 0, n_ctx=2048,
        metadata={"tokenizer.chat_template": QWEN25},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=2048, warmup=False)
    llm = LLM(llama, n_parallel=2, model_name=MODEL)
    server = UvicornThread(create_app(llm, ServerConfig()))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    try:
        yield Served(llm, client)
    finally:
        server.stop()
        llm.close()
        llama.close()


def _ask(client: openai.OpenAI, prompt: str, **kwargs: Any) -> Any:
    kwargs.setdefault("max_tokens", 300)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], tools=TOOLS, **kwargs
    )


@pytest.mark.parametrize(
    ("prompt", "seed"),
    [("weather in paris", 1), ("will it rain", 2), ("the of and", 3), ("hello tensor", 4)],
)
def test_a_named_function_is_always_called_with_valid_arguments(
    served: Served, prompt: str, seed: int
) -> None:
    got = _ask(served.client, prompt, temperature=1.0, seed=seed,
               tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS["get_weather"])


@pytest.mark.parametrize("seed", [5, 6])
def test_required_without_parallel_calls_one_of_the_tools(served: Served, seed: int) -> None:
    got = _ask(served.client, "wake me", temperature=1.0, seed=seed, tool_choice="required",
               parallel_tool_calls=False)  # fmt: skip
    calls = got.choices[0].message.tool_calls
    assert got.choices[0].finish_reason == "tool_calls"
    assert calls is not None and len(calls) == 1
    name = calls[0].function.name
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS[name])


def test_each_of_n_choices_is_its_own_constrained_call(served: Served) -> None:
    # n > 1 with a forced call: every choice gets a grammar of its own (one grammar's
    # state shared by two replies would refuse the second), and each is read for calls
    forced = {"type": "function", "function": {"name": "get_weather"}}
    got = _ask(served.client, "weather please", temperature=1.0, seed=11, n=2, tool_choice=forced)
    assert [c.index for c in got.choices] == [0, 1]
    arguments = []
    for choice in got.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
        arguments.append(call.function.arguments)
    one = _ask(served.client, "weather please", temperature=1.0, seed=11, tool_choice=forced)
    assert one.choices[0].message.tool_calls[0].function.arguments == arguments[0]
    streamed = _ask(served.client, "weather please", temperature=1.0, seed=11, n=2,
                    tool_choice=forced, stream=True)  # fmt: skip
    joined: dict[int, str] = {0: "", 1: ""}
    for chunk in streamed:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                joined[choice.index] += (d.function.arguments or "") if d.function else ""
    assert [joined[0], joined[1]] == arguments


def test_streamed_deltas_join_up_to_the_whole_answer(served: Served) -> None:
    kwargs: dict[str, Any] = {
        "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "set_alarm"}},
    }
    whole = _ask(served.client, "wake me at six", **kwargs).choices[0]
    chunks = list(_ask(served.client, "wake me at six", stream=True, **kwargs))
    calls: dict[int, dict[str, Any]] = {}
    content = ""
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                assert call["id"] is None, "an id is sent once, with the name"
                call["id"] = d.id
            if d.function is not None:
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
    assert content == ""  # the call's markup never leaks as text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"
    assert whole.message.tool_calls is not None
    want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == want
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_a_call_and_its_result_are_rendered_as_the_template_writes_them(served: Served) -> None:
    first = _ask(served.client, "weather in oslo", temperature=0,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages: list[Any] = [
        {"role": "user", "content": "weather in oslo"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "cold, -3 C"},
    ]  # fmt: skip
    reply = served.client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=2, temperature=0
    )
    # the same conversation as the template's authors meant it: arguments an object
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    by_hand = [
        messages[0],
        {**messages[1], "content": "", "tool_calls": [
            {**messages[1]["tool_calls"][0], "function": {
                "name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
        {**messages[2], "name": "get_weather"},
    ]  # fmt: skip
    alarm = {"name": "set_alarm", "description": "", "parameters": SCHEMAS["set_alarm"]}
    tools_as_given = [WEATHER, {**ALARM, "function": alarm}]
    text = env.from_string(QWEN25).render(
        messages=by_hand, tools=tools_as_given, add_generation_prompt=True
    )
    assert "<tool_response>\ncold, -3 C\n</tool_response>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {' in text
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(served.llm.tokenize(text))
    assert served.llm.chat_prompt(messages, tool_spec(TOOLS)) == served.llm.tokenize(text)


def test_tool_choice_none_leaves_the_tools_out(served: Served) -> None:
    plain = served.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    none = _ask(served.client, "hi", max_tokens=1, tool_choice="none")  # type: ignore[arg-type]
    assert plain.usage is not None and none.usage is not None
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]},
         "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        # the template writes tools and calls as its own markup: a control token there
        # would act as one (</s> ends the tiny model's text)
        ({"tools": [{"type": "function", "function": {"name": "f", "description": "a</s>"}}]},
         "tools"),
        ({"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": '{"a": "</s>"}'}}]}]},
         "messages[1].tool_calls"),
        ({"tools": [WEATHER], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}]},
         "messages[0].tool_calls[0].function.arguments"),
    ],
)  # fmt: skip
def test_bad_tools_are_400_naming_the_field(
    served: Served, fields: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                            "max_tokens": 2, **fields}  # fmt: skip
    with pytest.raises(openai.BadRequestError) as e:
        served.client.chat.completions.create(**body)
    assert e.value.param == param
    assert param in e.value.message


def test_the_python_api_answers_as_the_server_does(served: Served) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    messages = [{"role": "user", "content": "weather in lima"}]
    over_http = _ask(served.client, "weather in lima", temperature=0, tool_choice=named)
    direct = served.llm.create_chat_completion(
        messages, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=300
    )
    assert isinstance(direct, dict)
    message = direct["choices"][0]["message"]
    assert direct["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] is None
    want = over_http.choices[0].message.tool_calls[0].function
    got = message["tool_calls"][0]["function"]
    assert (got["name"], got["arguments"]) == (want.name, want.arguments)


def test_a_marker_that_is_a_control_token_begins_a_call(tmp_path: Path) -> None:
    """Mistral's ``[TOOL_CALLS]`` is a control token (it decodes to nothing): the forced
    call must start with that token, not its spelling, and the reader must see it."""
    from tensorplug_llm.tiny import tiny_vocab
    from tensorplug_llm.tokenizer import TokenType

    tokens, _, types = tiny_vocab(320)
    tokens[-1], types[-1] = "[TOOL_CALLS]", TokenType.CONTROL
    nemo = (TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()
    path = write_tiny_llama(
        tmp_path / "tiny-nemo.gguf", "q8_0", 0, n_ctx=2048,
        metadata={"tokenizer.chat_template": nemo, "tokenizer.ggml.tokens": tokens,
                  "tokenizer.ggml.token_type": types},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=2048, warmup=False)
    llm = LLM(llama, n_parallel=1)
    generated: list[int] = []
    submit = llm.generator.submit

    def recorded(job: Any) -> Any:  # the tokens, which the answer shows only as text
        handle = submit(job)

        class Recorded:
            def __iter__(self) -> Iterator[Any]:
                for event in handle:
                    generated.append(event.token)
                    yield event

            def cancel(self) -> None:
                handle.cancel()

        return Recorded()

    llm.generator.submit = recorded  # type: ignore[method-assign]
    try:
        assert llm.tool_syntax.name == "mistral"
        named = {"type": "function", "function": {"name": "set_alarm"}}
        messages = [{"role": "user", "content": "wake me"}]
        whole = llm.create_chat_completion(
            messages, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=200
        )
        assert isinstance(whole, dict)
        calls = whole["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["set_alarm"]
        assert generated[0] == len(tokens) - 1  # the control token, not its spelling
        assert len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), SCHEMAS["set_alarm"])
        stream = llm.create_chat_completion(
            messages, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=200, stream=True
        )
        assert isinstance(stream, Stream)
        chunks = list(stream)
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == ""
        args = "".join(
            d["function"].get("arguments") or ""
            for c in chunks
            for d in c["choices"][0]["delta"].get("tool_calls") or []
        )
        assert args == calls[0]["function"]["arguments"]
    finally:
        llm.close()
        llama.close()


@dataclass(frozen=True)
class _Event:
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None


class _Replay:
    """A generator that answers every request with the tokens of one text, as a model
    choosing freely (``tool_choice: "auto"``) might write it, then end of generation."""

    def __init__(self, llm: LLM, text: str) -> None:
        exact = dataclasses.replace(llm.vocab, add_space_prefix=False)  # the text as it is
        self.tokens = [*exact.encode(text, add_bos=False), min(llm.vocab.eog)]

    def submit(self, job: Any) -> Any:
        events = [_Event(t) for t in self.tokens[:-1]]
        events.append(_Event(self.tokens[-1], finish_reason="stop"))

        class Handle:
            def __iter__(self) -> Iterator[_Event]:
                return iter(events)

            def cancel(self) -> None:
                pass

        return Handle()

    def stats(self) -> GeneratorStats:  # what the server's admission reads: one idle slot
        return GeneratorStats(1, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    def close(self) -> None:
        pass


CALL_TEXT = '<tool_call>\n{"name": "set_alarm", "arguments": {"hour": 6}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls", "finish"),
    [
        ("Setting it.\n" + CALL_TEXT, "Setting it.\n", [("set_alarm", '{"hour": 6}')],
         "tool_calls"),
        ("No alarm today.", "No alarm today.", [], "stop"),
        # what a model free to choose may get wrong stays text, never an error
        ('<tool_call>\n{"name": "set_alarm", "arguments": {"hour": }}\n</tool_call>',
         '<tool_call>\n{"name": "set_alarm", "arguments": {"hour": }}\n</tool_call>', [], "stop"),
        ('<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>',
         '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>', [], "stop"),
        ('Sure: <tool_call>\n{"name": "set_al', 'Sure: <tool_call>\n{"name": "set_al', [], "stop"),
    ],
)  # fmt: skip
def test_an_auto_reply_is_read_for_calls_whole_and_streamed(
    served: Served, text: str, content: str, calls: list[tuple[str, str]], finish: str
) -> None:
    # a stand-in generator: only what a chat completion calls (no embed, no submit_choices)
    llm = LLM(served.llm.llama, _Replay(served.llm, text), model_name=MODEL)  # type: ignore[arg-type]
    messages = [{"role": "user", "content": "wake me"}]
    whole = llm.create_chat_completion(messages, tools=TOOLS)
    assert isinstance(whole, dict)
    choice = whole["choices"][0]
    got = [(c["function"]["name"], c["function"]["arguments"])
           for c in choice["message"].get("tool_calls", [])]  # fmt: skip
    assert (choice["message"]["content"], got, choice["finish_reason"]) == (
        content or None,
        calls,
        finish,
    )
    stream = llm.create_chat_completion(messages, tools=TOOLS, stream=True)
    assert isinstance(stream, Stream)
    chunks = list(stream)
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
    assert "".join(pieces) == content
    if calls:  # the text before the call streamed as its tokens came, before the call's
        exact = dataclasses.replace(llm.vocab, add_space_prefix=False)
        n_text = len(exact.encode(content, add_bos=False))  # chunk 0 is the role
        assert "".join(pieces[: 1 + n_text]) == content
    assert chunks[-1]["choices"][0]["finish_reason"] == finish
    # over HTTP too: 200 with the same message, never a 500
    server = UvicornThread(create_app(llm, ServerConfig()))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        message = reply.choices[0].message
        assert message.content == (content or None)
        got = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]  # type: ignore[union-attr]
        assert got == calls
    finally:
        server.stop()

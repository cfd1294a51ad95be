"""What llama-server adds to OpenAI's responses: ``system_fingerprint`` on every
response and chunk, and ``__verbose`` (the prompt as the model read it, the reply in
``/completion``'s fields) for a request with ``"verbose": true`` or a server with
``--verbose``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient
from tiny_server import PROMPT, TinyModel, tiny_model

from tensorplug_llm.http.model_info import system_fingerprint
from tensorplug_llm.server import ServerConfig, create_app

MESSAGES = [{"role": "system", "content": "Book"}, {"role": "user", "content": "hello"}]
CHAT: dict[str, Any] = {
    "messages": MESSAGES,
    "max_tokens": 4,
    "temperature": 0,
}
#: the tiny model's template is ChatML
CHAT_PROMPT = (
    "<|im_start|>system\nBook<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("llama_fields"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def http(model: TinyModel) -> TestClient:
    return TestClient(create_app(model.llm, ServerConfig()))


def _events(text: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_the_fingerprint_is_llama_servers_shape() -> None:
    fingerprint = system_fingerprint()
    assert fingerprint.startswith("b") and fingerprint.endswith("-tensorplug-llm")


@pytest.mark.parametrize(
    ("route", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": PROMPT, "max_tokens": 4})],
)
def test_every_response_and_chunk_has_the_fingerprint(
    http: TestClient, route: str, body: dict[str, Any]
) -> None:
    got = http.post(route, json=body).json()
    assert got["system_fingerprint"] == system_fingerprint()
    events = _events(http.post(route, json={**body, "stream": True}).text)
    assert len(events) > 1
    assert all(e["system_fingerprint"] == system_fingerprint() for e in events)


def test_verbose_gives_the_prompt_as_the_model_read_it(model: TinyModel, http: TestClient) -> None:
    got = http.post("/v1/chat/completions", json={**CHAT, "verbose": True}).json()
    verbose = got["__verbose"]
    assert verbose["prompt"] == "<s> " + CHAT_PROMPT  # BOS, as llama-server writes it
    assert verbose["content"] == got["choices"][0]["message"]["content"]
    assert verbose["tokens_evaluated"] == got["usage"]["prompt_tokens"]
    assert verbose["tokens_predicted"] == got["usage"]["completion_tokens"] == 4
    assert verbose["stop_type"] == "limit"
    assert "__verbose" not in http.post("/v1/chat/completions", json=CHAT).json()
    # a stream: on the chunk that finishes the reply
    events = _events(
        http.post("/v1/chat/completions", json={**CHAT, "verbose": True, "stream": True}).text
    )
    marked = [e for e in events if "__verbose" in e]
    assert len(marked) == 1 and marked[0]["choices"][0]["finish_reason"] == "length"
    assert marked[0]["__verbose"]["prompt"] == "<s> " + CHAT_PROMPT


def test_a_verbose_server_answers_every_request_so(model: TinyModel) -> None:
    http = TestClient(create_app(model.llm, ServerConfig(verbose=True)))
    got = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}).json()
    assert got["__verbose"]["prompt"] == model.llm.vocab.decode(model.ids, special=True)
    assert got["__verbose"]["tokens_evaluated"] == len(model.ids)
    assert got["__verbose"]["content"] == got["choices"][0]["text"]


# -- continuing the assistant's message ---------------------------------------------------------

PREFILL = [*MESSAGES, {"role": "assistant", "content": "Once upon"}]


def test_a_final_assistant_message_is_continued(http: TestClient) -> None:
    """llama-server's assistant prefill: the prompt is the conversation before it, ready
    for the reply, then the reply begun (no end of turn, no new turn)."""
    got = http.post("/v1/chat/completions", json={**CHAT, "messages": PREFILL,
                                                   "verbose": True}).json()  # fmt: skip
    assert got["__verbose"]["prompt"] == "<s> " + CHAT_PROMPT + "Once upon"
    vllm = {**CHAT, "messages": PREFILL, "verbose": True, "add_generation_prompt": False,
            "continue_final_message": True}  # fmt: skip
    same = http.post("/v1/chat/completions", json=vllm).json()
    assert same["__verbose"]["prompt"] == got["__verbose"]["prompt"]
    assert same["choices"][0]["message"] == got["choices"][0]["message"]  # greedy, same prompt


@pytest.mark.parametrize(
    ("body", "says"),
    [({"messages": PREFILL, "continue_final_message": True}, "are both true"),
     ({"messages": [*PREFILL, {"role": "assistant", "content": "x"}]}, "two assistant messages"),
     ({"messages": CHAT["messages"], "continue_final_message": True,
       "add_generation_prompt": False}, "only an assistant message")],
)  # fmt: skip
def test_a_continuation_that_cannot_be_is_400(
    http: TestClient, body: dict[str, Any], says: str
) -> None:
    r = http.post("/v1/chat/completions", json={**CHAT, **body})
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_a_continued_messages_parts_are_joined_by_a_blank_line(http: TestClient) -> None:
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    messages = [*MESSAGES, {"role": "assistant", "content": parts}]
    got = http.post("/v1/chat/completions", json={**CHAT, "messages": messages, "verbose": True})
    assert got.json()["__verbose"]["prompt"].endswith("<|im_start|>assistant\nWh\n\nill")


# -- llama-server's stream ----------------------------------------------------------------------


def test_a_chat_stream_finishes_in_a_chunk_of_its_own(http: TestClient) -> None:
    events = _events(http.post("/v1/chat/completions", json={**CHAT, "stream": True}).text)
    finishing = [e for e in events if e["choices"][0]["finish_reason"] is not None]
    assert len(finishing) == 1 and finishing[0] is events[-1]
    assert finishing[0]["choices"][0]["delta"] == {} and finishing[0]["usage"]["completion_tokens"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    whole = http.post("/v1/chat/completions", json=CHAT).json()
    assert text == whole["choices"][0]["message"]["content"] != ""
    assert whole["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_include_usage_ends_the_stream_with_usage_and_timings(http: TestClient, route: str) -> None:
    # greedy, and past the end token, so that every stream carries its four tokens
    body = {**(CHAT if "chat" in route else {"prompt": PROMPT, "max_tokens": 4}),
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    events = _events(
        http.post(route, json={**body, "stream": True,
                               "stream_options": {"include_usage": True}}).text
    )  # fmt: skip
    last = events[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    assert last["timings"]["predicted_n"] == 4
    assert last["timings"]["prompt_n"] == last["usage"]["prompt_tokens"]
    assert all("usage" not in e and "timings" not in e for e in events[:-1])
    per_token = _events(
        http.post(route, json={**body, "stream": True, "timings_per_token": True}).text
    )
    if "chat" in route:  # the role's chunk comes before any timing, as llama-server's
        assert "timings" not in per_token[0]
        per_token = per_token[1:]
    assert all("predicted_per_second" in e["timings"] for e in per_token)


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_input_tokens_counts_the_chat_prompt(
    model: TinyModel, http: TestClient, prefix: str
) -> None:
    got = http.post(f"{prefix}/chat/completions/input_tokens", json={"messages": MESSAGES})
    assert got.status_code == 200, got.text
    n = len(model.llm.chat_prompt(MESSAGES))
    assert got.json() == {"input_tokens": n, "object": "response.input_tokens"}
    continued = http.post(
        "/chat/completions/input_tokens",
        json={"messages": [*MESSAGES, {"role": "assistant", "content": "Once upon"}]},
    ).json()
    assert continued["input_tokens"] > n

"""A streamed completion or chat sends each token's chunk as soon as the token comes,
never waiting for the next one: a chunk held until the next token arrives reaches the
client a whole engine step late, the first token included (its time to first token
one decode step longer than llama-server's)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send
from tiny_server import PROMPT, TinyModel, tiny_model

from tensorplug_llm.api import LLM, Stream
from tensorplug_llm.generation import GeneratorStats
from tensorplug_llm.request import TokenEvent
from tensorplug_llm.server import ServerConfig, create_app


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("stream"))
    yield m
    m.close()


class _Counted:
    """A generator that answers with ``tokens`` and counts how many the stream took;
    ``finish``: the last token's finish reason (None: it ends as a cancelled request
    does, without one)."""

    def __init__(self, tokens: list[int], finish: str | None = "length") -> None:
        self.tokens, self.finish, self.taken = tokens, finish, 0

    def submit(self, job: Any) -> Any:
        counted = self
        last = len(self.tokens) - 1

        class Handle:
            def __iter__(self) -> Iterator[TokenEvent]:
                for k, token in enumerate(counted.tokens):
                    counted.taken += 1
                    finish = counted.finish if k == last else None
                    yield TokenEvent(token, None, None, None, finish)

            def cancel(self) -> None:
                pass

        return Handle()

    def stats(self) -> GeneratorStats:  # what admission reads: one idle slot
        return GeneratorStats(1, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    def close(self) -> None:
        pass


def _llm(model: TinyModel, generator: _Counted) -> LLM:
    return LLM(model.llama, generator, model_name="tiny.gguf")  # type: ignore[arg-type]


def test_a_completion_chunk_goes_out_before_the_next_token_is_asked_for(
    model: TinyModel,
) -> None:
    generator = _Counted(model.greedy[:5])
    stream = _llm(model, generator).create_completion(PROMPT, max_tokens=5, stream=True)
    assert isinstance(stream, Stream)
    texts = []
    for n, chunk in enumerate(stream, start=1):
        assert generator.taken == n  # this token's chunk, and no token after it, yet
        texts.append(chunk["choices"][0]["text"])
    assert "".join(texts) == _text(model, model.greedy[:5])
    assert chunk["choices"][0]["finish_reason"] == "length"
    assert chunk["usage"]["completion_tokens"] == 5


def test_a_chat_chunk_goes_out_before_the_next_token_is_asked_for(model: TinyModel) -> None:
    generator = _Counted(model.greedy[:4])
    messages = [{"role": "user", "content": PROMPT}]
    stream = _llm(model, generator).create_chat_completion(messages, max_tokens=4, stream=True)
    assert isinstance(stream, Stream)
    chunks = iter(stream)
    assert next(chunks)["choices"][0]["delta"]["role"] == "assistant"
    assert generator.taken == 0
    rest = []
    for n, chunk in enumerate(chunks, start=1):
        assert generator.taken == n
        rest.append(chunk)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in rest) == _text(
        model, model.greedy[:4]
    )
    assert rest[-1]["choices"][0]["finish_reason"] == "length"
    assert rest[-1]["usage"]["completion_tokens"] == 4


def test_a_stream_that_ends_without_a_finish_still_ends_with_the_usage(
    model: TinyModel,
) -> None:
    generator = _Counted(model.greedy[:3], finish=None)  # as a cancelled request ends
    stream = _llm(model, generator).create_completion(PROMPT, max_tokens=8, stream=True)
    assert isinstance(stream, Stream)
    chunks = list(stream)
    assert [c["choices"][0]["text"] for c in chunks[-1:]] == [""]
    assert "usage" in chunks[-1] and all("usage" not in c for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert "".join(c["choices"][0]["text"] for c in chunks) == _text(model, model.greedy[:3])


def _text(model: TinyModel, tokens: list[int]) -> str:
    from tensorplug_llm.tokenizer import StreamDecoder

    assert model.llama.vocab is not None
    decoder = StreamDecoder(model.llama.vocab)
    return "".join(decoder.feed(t) for t in tokens) + decoder.flush()


class _Gated(_Counted):
    """A :class:`_Counted` that gives its next token only once the client was sent the
    delta of the one before (or fails the request after ``WAIT_S``): a stream that
    held a delta back until the next token came would never send it."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__(tokens)
        self.sent = [threading.Event() for _ in tokens]

    def submit(self, job: Any) -> Any:
        inner = super().submit(job)
        gated = self

        class Handle:
            def __iter__(self) -> Iterator[TokenEvent]:
                for k, event in enumerate(inner):
                    if k and not gated.sent[k - 1].wait(WAIT_S):
                        raise AssertionError(f"delta {k - 1} was not sent before token {k}")
                    yield event

            def cancel(self) -> None:
                pass

        return Handle()


#: how long a gated token waits for the delta before it (reached only when it never comes)
WAIT_S = 30.0


TELEMETRY = {
    "none": {},
    "progress": {"return_progress": True},
    "timings": {"timings_per_token": True},
    "both": {"timings_per_token": True, "return_progress": True},
}


@pytest.mark.parametrize("telemetry", TELEMETRY.values(), ids=TELEMETRY.keys())
def test_a_responses_stream_sends_each_delta_before_the_next_token(
    model: TinyModel, telemetry: dict[str, bool]
) -> None:
    generator = _Gated(model.ids[1:5])  # words of the prompt: each token's delta has text
    app = create_app(_llm(model, generator), ServerConfig())
    deltas = 0

    async def watched(scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            nonlocal deltas
            await send(message)
            for line in message.get("body", b"").decode().splitlines():
                if line.startswith("data: ") and '"response.output_text.delta"' in line:
                    generator.sent[deltas].set()
                    deltas += 1

        await app(scope, receive, sending)

    body = {"model": "tiny.gguf", "input": PROMPT, "stream": True, "max_output_tokens": 4,
            **telemetry}  # fmt: skip
    with TestClient(watched) as http:
        r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert deltas == 4 and generator.taken == 4
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.completed"
    delta_timings = [("timings" in e) for e in events if e["type"] == "response.output_text.delta"]
    # with per-token timings each delta carries its token's, as on llama-server
    assert delta_timings == [bool(telemetry.get("timings_per_token"))] * 4

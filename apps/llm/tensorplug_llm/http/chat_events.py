"""A chat stream read as what Anthropic's and the Responses API's routes tell their
clients: text, tool calls (their start, then their arguments) and the end. Both APIs
are served over :meth:`~tensorplug_llm.api.LLM.create_chat_completion` (as llama-server
serves them over its chat route), each writing these in its own event shapes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallArgs", "CallStart", "End", "Reply", "Telemetry", "Text", "read_chat"]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    """Arguments (JSON text, maybe a fragment) of the call last started."""

    arguments: str


@dataclass(frozen=True)
class End:
    """``finish``: OpenAI's finish reason (``stop``, ``length``, ``tool_calls``);
    ``stop_sequence``: the stop string that ended the reply, if one did."""

    finish: str | None
    stop_sequence: str | None
    prompt_tokens: int
    completion_tokens: int
    #: of the prompt tokens, those found in the cache
    cached_tokens: int = 0


@dataclass(frozen=True)
class Telemetry:
    """What llama-server adds to a chunk beside its text: ``timings`` (the request's
    ``timings_per_token``) and ``progress`` (``prompt_progress``, with
    ``return_progress``). It follows the events of the chunk that carried it."""

    timings: dict[str, Any] | None
    progress: dict[str, Any] | None


ChatEvent = Text | CallStart | CallArgs | End | Telemetry


def read_chat(chunks: Iterable[dict[str, Any]]) -> Iterator[ChatEvent]:
    """The events of one choice's chat chunks (``stop_sequence=True`` streams), ending
    with one :class:`End`."""
    finish: str | None = None
    stop: str | None = None
    usage: dict[str, Any] = {}
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("content"):
                yield Text(delta["content"])
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") or {}
                if call.get("id"):
                    yield CallStart(call["id"], fn.get("name", ""))
                if fn.get("arguments"):
                    yield CallArgs(fn["arguments"])
            finish = choice.get("finish_reason") or finish
            stop = choice.get("stop_sequence") or stop
        if "timings" in chunk or "prompt_progress" in chunk:
            yield Telemetry(chunk.get("timings"), chunk.get("prompt_progress"))
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    yield End(finish, stop, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
              cached)  # fmt: skip


@dataclass
class Reply:
    """A whole reply gathered from its events: the text, the calls as
    ``[id, name, arguments]`` and the end."""

    text: str = ""
    calls: list[list[str]] = field(default_factory=list)
    end: End = field(default_factory=lambda: End(None, None, 0, 0))

    @classmethod
    def of(cls, events: Iterable[ChatEvent]) -> Reply:
        reply = cls()
        texts: list[str] = []
        for e in events:
            if isinstance(e, Text):
                texts.append(e.text)
            elif isinstance(e, CallStart):
                reply.calls.append([e.id, e.name, ""])
            elif isinstance(e, CallArgs) and reply.calls:
                reply.calls[-1][2] += e.arguments
            elif isinstance(e, End):
                reply.end = e
        reply.text = "".join(texts)
        return reply

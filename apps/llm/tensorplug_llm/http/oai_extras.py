"""What llama-server adds to OpenAI's completion and chat responses: ``system_fingerprint``
on every response and chunk, ``timings`` (on the usage chunk of a stream that asks for
usage, on every chunk with ``timings_per_token``), and ``__verbose`` (the request's
prompt as the model read it, and the reply in llama-server's own ``/completion``
fields) when the request asks for it with ``"verbose": true`` or the server runs with
``--verbose``."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..api import LLM, Stream
from .model_info import system_fingerprint
from .relay import Canceller
from .timings import llama_timings

__all__ = ["Verbose", "stamped", "template_context"]

#: OpenAI's finish reasons as llama-server's ``stop_type``
_STOP_TYPES = {"length": "limit", "stop": "eos", "tool_calls": "eos"}


@dataclass(frozen=True)
class Verbose:
    """The request's side of ``__verbose``: its prompt's text (control tokens written
    out) and its tokens' count, and the model's name."""

    prompt: str
    n_prompt: int
    model: str

    @classmethod
    def of(cls, llm: LLM, ids: list[int]) -> Verbose:
        """The prompt ``ids`` of a request to ``llm``."""
        return cls(llm.vocab.decode(ids, special=True), len(ids), llm.model_name)

    def body(self, content: str, n_predicted: int, finish: str | None) -> dict[str, Any]:
        """llama-server's ``__verbose``: its ``/completion`` result for this generation."""
        return {
            "index": 0,
            "content": content,
            "tokens": [],
            "stop": True,
            "model": self.model,
            "tokens_predicted": n_predicted,
            "tokens_evaluated": self.n_prompt,
            "prompt": self.prompt,
            "truncated": False,
            "stop_type": _STOP_TYPES.get(finish or "", "none"),
            "stopping_word": "",
        }


def template_context(
    enable_thinking: bool,
    add_generation_prompt: bool = True,
    kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The chat template's variables as llama-server gives them: ``enable_thinking``
    (``--reasoning``), today's ``datetime`` ("Nov 29 2026") and ``date_string`` ("29 Nov
    2026"), ``add_generation_prompt``, then the request's ``chat_template_kwargs``."""
    now = datetime.now()
    return {
        "enable_thinking": enable_thinking,
        "datetime": now.strftime("%b %d %Y"),
        "date_string": now.strftime("%d %b %Y"),
        "add_generation_prompt": add_generation_prompt,
        **(kwargs or {}),
    }


@dataclass
class _Clock:
    """llama-server's ``timings`` of a generation, as the HTTP layer sees it: the prompt
    until the first text arrives, the reply after."""

    started: float = field(default_factory=time.monotonic)
    first: float | None = None

    def timings(self, n_prompt: int, n_predicted: int) -> dict[str, Any]:
        now = time.monotonic()
        first = self.first if self.first is not None else now
        return llama_timings(self.started, first, now, n_prompt, n_predicted)


def stamped(
    stream: Stream,
    verbose: Verbose | None,
    *,
    usage_apart: bool = False,
    timings_per_token: bool = False,
) -> Stream:
    """``stream``'s chunks with ``system_fingerprint`` on each and, with ``verbose``,
    ``__verbose`` on the chunk that finishes the first choice. ``usage_apart`` (OpenAI's
    ``stream_options.include_usage``): the usage comes last in a chunk of its own, with no
    choices and llama-server's ``timings``; ``timings_per_token``: every chunk but a chat
    stream's opening role has them."""
    fingerprint = system_fingerprint()
    clock = _Clock()

    def chunks() -> Iterator[dict[str, Any]]:
        texts: list[str] = []
        wanted = verbose
        n_prompt = n_chunks = 0
        last: dict[str, Any] | None = None
        for chunk in stream:
            chunk["system_fingerprint"] = fingerprint
            said = [_said(c) for c in chunk["choices"]]
            if clock.first is None and not all(_role_only(c) for c in chunk["choices"]):
                clock.first = time.monotonic()
            n_chunks += any(said)
            if wanted is not None:
                finish = None
                for choice, text in zip(chunk["choices"], said, strict=True):
                    if choice["index"] == 0:
                        texts.append(text)
                        finish = choice["finish_reason"]
                if finish is not None:
                    n = (chunk.get("usage") or {}).get("completion_tokens", 0)
                    chunk["__verbose"] = wanted.body("".join(texts), n, finish)
                    wanted = None
            usage = chunk.pop("usage", None) if usage_apart else chunk.get("usage")
            if usage:
                last, n_prompt = {**chunk, "choices": [], "usage": usage}, usage["prompt_tokens"]
            if timings_per_token and clock.first is not None:  # not on the role's chunk
                # the last chunk's usage counts every token (some show no text)
                n = usage["completion_tokens"] if usage else n_chunks
                chunk["timings"] = clock.timings(n_prompt, n)
            yield chunk
        if usage_apart and last is not None:
            last.pop("__verbose", None)
            n = last["usage"]["completion_tokens"]
            yield {**last, "timings": clock.timings(last["usage"]["prompt_tokens"], n)}

    return Stream(chunks(), Canceller(stream))


def _role_only(choice: dict[str, Any]) -> bool:
    """Whether a chunk's choice is a chat stream's opening delta: the role, with no text
    or call yet (it carries no timings in llama-server's stream; every later chunk, and
    every chunk of a completion's, does, whether or not its token showed text yet)."""
    delta = choice.get("delta")
    if delta is None or "role" not in delta or choice.get("finish_reason") is not None:
        return False
    return not any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls"))


def _said(choice: dict[str, Any]) -> str:
    """The text a chunk's choice carries (a chat delta's or a completion's)."""
    delta = choice.get("delta")
    return str((delta.get("content") if delta is not None else choice.get("text")) or "")

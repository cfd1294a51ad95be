"""What llama-server adds to OpenAI's completion and chat responses: ``system_fingerprint``
on every response and chunk, and ``__verbose`` (the request's prompt as the model read
it, and the reply in llama-server's own ``/completion`` fields) when the request asks
for it with ``"verbose": true`` or the server runs with ``--verbose``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..api import LLM, Stream
from .model_info import system_fingerprint
from .relay import Canceller

__all__ = ["Verbose", "stamped"]

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


def stamped(result: dict[str, Any] | Stream, verbose: Verbose | None) -> dict[str, Any] | Stream:
    """``result`` (a response, or a stream of chunks) with ``system_fingerprint`` on each
    and, with ``verbose``, ``__verbose`` on the chunk that finishes the first choice."""
    fingerprint = system_fingerprint()
    if isinstance(result, dict):
        result["system_fingerprint"] = fingerprint
        if verbose is not None:
            choice = result["choices"][0]
            text = choice.get("text")
            if text is None:
                text = choice["message"].get("content") or ""
            n = result.get("usage", {}).get("completion_tokens", 0)
            result["__verbose"] = verbose.body(text, n, choice["finish_reason"])
        return result
    stream = result

    def chunks() -> Iterator[dict[str, Any]]:
        texts: list[str] = []
        wanted = verbose
        for chunk in stream:
            chunk["system_fingerprint"] = fingerprint
            if wanted is not None:
                finish = None
                for choice in (c for c in chunk["choices"] if c["index"] == 0):
                    delta = choice.get("delta")
                    texts.append((delta.get("content") if delta else choice.get("text")) or "")
                    finish = choice["finish_reason"]
                if finish is not None:
                    n = (chunk.get("usage") or {}).get("completion_tokens", 0)
                    chunk["__verbose"] = wanted.body("".join(texts), n, finish)
                    wanted = None
            yield chunk

    return Stream(chunks(), Canceller(stream))

"""One OpenAI response made of its stream's chunks: the server always streams from the
generator and, for a client that did not ask for a stream, joins the chunks here."""

from __future__ import annotations

from typing import Any

from ..tool_calls import join_tool_call_deltas
from .errors import ApiError

__all__ = ["merge_chunks"]


def merge_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """One response dict made of a stream's chunks (completion or chat), a choice per
    ``index`` (``n`` > 1 interleaves them)."""
    if not chunks:
        raise ApiError(500, "the request produced no response", "server_error")
    head = dict(chunks[0])
    by_index: dict[int, list[dict[str, Any]]] = {}
    for c in chunks:
        for choice in c["choices"]:
            by_index.setdefault(choice["index"], []).append(choice)
    usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)
    completion = head["object"] == "text_completion"
    if not completion:
        head["object"] = "chat.completion"
    merge = _merge_text if completion else _merge_message
    choices = [merge(i, by_index[i]) for i in sorted(by_index)]
    merged = {**head, "choices": choices, "usage": usage}
    verbose = next((c["__verbose"] for c in chunks if "__verbose" in c), None)
    if verbose is not None:  # llama-server's debugging fields (oai_extras)
        merged["__verbose"] = verbose
    return merged


def _finish(choices: list[dict[str, Any]]) -> str | None:
    return next((c["finish_reason"] for c in reversed(choices) if c["finish_reason"]), None)


def _merge_text(index: int, choices: list[dict[str, Any]]) -> dict[str, Any]:
    lps = [c["logprobs"] for c in choices if c["logprobs"] is not None]
    logprobs = None
    if lps:
        logprobs = {k: [x for lp in lps for x in lp[k]] for k in lps[0]}
    return {
        "text": "".join(c["text"] for c in choices),
        "index": index,
        "logprobs": logprobs,
        "finish_reason": _finish(choices),
    }


def _merge_message(index: int, choices: list[dict[str, Any]]) -> dict[str, Any]:
    lps = [c["logprobs"] for c in choices if c["logprobs"] is not None]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(c["delta"].get("content") or "" for c in choices),
    }
    calls = join_tool_call_deltas([c["delta"] for c in choices])
    if calls:  # as the Python API answers: no text is null content
        message = {**message, "content": message["content"] or None, "tool_calls": calls}
    return {
        "index": index,
        "message": message,
        "logprobs": {"content": [x for lp in lps for x in lp["content"]]} if lps else None,
        "finish_reason": _finish(choices),
    }

"""Anthropic's Messages API, which llama-server serves too: ``POST /v1/messages`` (a
message of ``text`` and ``tool_use`` blocks, or Anthropic's event stream) and
``POST /v1/messages/count_tokens``, over the chat route's generation.

Errors on these routes are in Anthropic's shape, ``{"type": "error", "error": {"type",
"message"}}``, so that Anthropic's clients read them: the app's own handlers write the
message and the status (one source for both shapes) and :class:`AnthropicRoute`
reshapes the body."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from ..api import LLM, InvalidRequestError, Stream
from ..tool_spec import ToolSpecError, tool_spec
from .anthropic_schema import CountTokensRequest, MessagesRequest
from .chat_events import CallArgs, CallStart, ChatEvent, End, Reply, Text, read_chat
from .relay import Canceller
from .service import ServiceDep

__all__ = ["AnthropicRoute", "anthropic_error", "router"]

#: Anthropic's error type of each HTTP status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error", 504: "timeout_error"}  # fmt: skip


def anthropic_error(status: int | None, error: dict[str, Any]) -> dict[str, Any]:
    """An error in OpenAI's shape (its ``error`` object) in Anthropic's; ``status``
    None: an error event in a stream (its kind tells the type)."""
    kind = str(error.get("type", ""))
    if status is None:
        status = 504 if kind == "timeout" else 400 if "request" in kind else 500
    fallback = "api_error" if status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, fallback),
                                       "message": str(error.get("message", ""))}}  # fmt: skip


class AnthropicRoute(APIRoute):
    """A route whose errors, its body's validation included, answer in Anthropic's
    shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return await _reshaped(request, exc)

        return route


async def _reshaped(request: Request, exc: Exception) -> Response:
    handlers = request.app.exception_handlers
    handle = next((handlers[c] for c in type(exc).__mro__ if c in handlers), None)
    if handle is None:
        raise exc
    answer: Response = await handle(request, exc)
    body = json.loads(bytes(answer.body))
    headers = {k: v for k, v in answer.headers.items() if k.lower() == "retry-after"}
    return JSONResponse(
        anthropic_error(answer.status_code, body.get("error", {})),
        status_code=answer.status_code,
        headers=headers,
    )


router = APIRouter(route_class=AnthropicRoute)


def _prompt(llm: LLM, body: CountTokensRequest) -> list[int]:
    """The conversation's tokens, its tools rendered by the chat template."""
    try:
        spec = tool_spec(body.oai_tools(), body.oai_tool_choice(), body.parallel_tool_calls())
    except ToolSpecError as e:
        raise InvalidRequestError(str(e), e.param) from None
    return llm.chat_prompt(body.oai_messages(), spec)


@router.post("/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, svc: ServiceDep) -> dict[str, int]:
    llm = svc.llm
    ids: list[int] = await svc.call(lambda: _prompt(llm, body))
    return {"input_tokens": len(ids)}


@router.post("/messages")
async def messages(body: MessagesRequest, request: Request, svc: ServiceDep) -> Response:
    llm = svc.llm
    given = body.model_fields_set
    sampling = {
        "temperature": svc.default("temperature", body.temperature, "temperature" in given),
        "seed": svc.config.defaults.get("seed"),
        "top_p": body.top_p,
        "top_k": body.top_k,
    }
    sampling = {k: v for k, v in sampling.items() if v is not None}
    model = llm.model_name

    def start() -> Stream:
        ids = _prompt(llm, body)
        chat = llm.create_chat_completion(
            body.oai_messages(),
            tools=body.oai_tools(),
            tool_choice=body.oai_tool_choice(),
            parallel_tool_calls=body.parallel_tool_calls(),
            max_tokens=body.max_tokens,
            stop=body.stop_sequences,
            stream=True,
            prompt_ids=ids,
            stop_sequence=True,
            **sampling,
        )
        assert isinstance(chat, Stream)
        if not body.stream:
            return chat
        return Stream(_events(model, len(ids), read_chat(chat)), Canceller(chat))

    return await svc.answer(
        request,
        body.stream,
        start,
        merge=lambda chunks: _message(model, Reply.of(read_chat(chunks))),
        done=None,
        encode=_sse,
    )


def _stop_reason(end: End, called: bool) -> str:
    if called:
        return "tool_use"
    if end.finish == "length":
        return "max_tokens"
    return "stop_sequence" if end.stop_sequence is not None else "end_turn"


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object (what is not a JSON object is given
    under ``arguments``, never dropped)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _usage(end: End) -> dict[str, int]:
    """Anthropic's ``usage``: the prompt tokens read from the cache apart from the others
    (``input_tokens``), as Anthropic's prompt caching and llama-server report them."""
    return {
        "cache_read_input_tokens": end.cached_tokens,
        "input_tokens": end.prompt_tokens - end.cached_tokens,
        "output_tokens": end.completion_tokens,
    }


def _head(model: str) -> dict[str, Any]:
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": model}  # fmt: skip


def _message(model: str, reply: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for call_id, name, arguments in reply.calls:
        content.append({"type": "tool_use", "id": call_id, "name": name,
                        "input": _input(arguments)})  # fmt: skip
    end = reply.end
    return {
        **_head(model),
        "content": content,
        "stop_reason": _stop_reason(end, bool(reply.calls)),
        "stop_sequence": end.stop_sequence,
        "usage": _usage(end),
    }


def _events(model: str, n_prompt: int, events: Iterable[ChatEvent]) -> Iterator[dict[str, Any]]:
    """Anthropic's stream: ``message_start``, ``ping``, each content block's start,
    deltas and stop, ``message_delta`` (the stop reason, the output tokens) and
    ``message_stop``."""
    yield {"type": "message_start", "message": {
        **_head(model), "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": n_prompt, "cache_read_input_tokens": 0,
                  "output_tokens": 0}}}  # fmt: skip
    yield {"type": "ping"}
    index, open_kind, called = -1, "", False
    for e in events:
        if isinstance(e, Text | CallStart) and (open_kind != "text" or isinstance(e, CallStart)):
            if open_kind:
                yield {"type": "content_block_stop", "index": index}
            index += 1
            block: dict[str, Any]
            if isinstance(e, Text):
                open_kind, block = "text", {"type": "text", "text": ""}
            else:
                open_kind, called = "tool_use", True
                block = {"type": "tool_use", "id": e.id, "name": e.name, "input": {}}
            yield {"type": "content_block_start", "index": index, "content_block": block}
        if isinstance(e, Text):
            delta = {"type": "text_delta", "text": e.text}
            yield {"type": "content_block_delta", "index": index, "delta": delta}
        elif isinstance(e, CallArgs):
            delta = {"type": "input_json_delta", "partial_json": e.arguments}
            yield {"type": "content_block_delta", "index": index, "delta": delta}
        elif isinstance(e, End):
            if open_kind:
                yield {"type": "content_block_stop", "index": index}
            reason = _stop_reason(e, called)
            yield {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": e.stop_sequence},
                "usage": _usage(e),
            }  # cumulative: the cache's share known by now
            yield {"type": "message_stop"}


def _sse(item: dict[str, Any]) -> bytes:
    """An event as Anthropic writes it, named by its type; an error (OpenAI's body, from
    the relay) in Anthropic's shape."""
    if "error" in item and item.get("type") != "error":
        item = anthropic_error(None, item["error"])
    return f"event: {item['type']}\ndata: {json.dumps(item)}\n\n".encode()

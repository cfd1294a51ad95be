"""OpenAI's Responses API, which llama-server serves too: ``POST /v1/responses`` (and
``/responses``) over the chat route's generation, answered as a ``response`` object
(``message`` items of ``output_text``, ``function_call`` items) or as its event stream
(``response.created`` ... ``response.output_text.delta`` ... ``response.completed``).
Nothing is stored: ``previous_response_id`` is refused. ``/responses/input_tokens``
counts a request's prompt tokens, as llama-server's.

llama-server's telemetry rides on the stream as it writes it: with ``return_progress``
the prompt's evaluation comes as ``response.in_progress`` events carrying
``prompt_progress``; with ``timings_per_token`` the last event of each generated piece
carries ``timings``, and ``response.completed`` the whole reply's."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..api import InvalidRequestError, Stream
from ..tool_spec import ToolSpecError, tool_spec
from .chat_events import CallArgs, CallStart, ChatEvent, End, Reply, Telemetry, Text, read_chat
from .errors import ApiError
from .oai_extras import stamped
from .relay import Canceller
from .responses_schema import ResponsesRequest
from .service import ServiceDep

__all__ = ["router"]

router = APIRouter()


@router.post("/responses")
async def responses(body: ResponsesRequest, request: Request, svc: ServiceDep) -> Response:
    if body.previous_response_id is not None:
        raise ApiError(
            400,
            "this server keeps no responses: send the whole conversation as 'input' "
            "instead of previous_response_id",
            param="previous_response_id",
        )
    llm = svc.llm
    given = body.model_fields_set
    sampling = {
        "temperature": svc.default("temperature", body.temperature, "temperature" in given),
        "top_p": body.top_p,
    }
    sampling = {k: v for k, v in sampling.items() if v is not None}
    max_tokens = body.max_output_tokens or svc.config.defaults.get("n_predict")
    base = _base(llm.model_name, body)

    def start() -> Stream:
        chat = llm.create_chat_completion(
            body.messages(),
            tools=body.chat_tools(),
            tool_choice=body.chat_tool_choice(),
            parallel_tool_calls=body.parallel_tool_calls,
            max_tokens=None if max_tokens is None or max_tokens < 0 else max_tokens,
            stream=True,
            return_progress=body.return_progress and body.stream,
            **sampling,
        )
        assert isinstance(chat, Stream)
        if not body.stream:
            return chat
        if body.timings_per_token:
            chat = stamped(chat, None, timings_per_token=True)
        events = _events(base, read_chat(chat))
        if body.timings_per_token or body.return_progress:
            events = _with_telemetry(events, base, per_token=body.timings_per_token)
        numbered = ({**e, "sequence_number": i} for i, e in enumerate(events))
        return Stream(numbered, Canceller(chat))

    return await svc.answer(
        request,
        body.stream,
        start,
        merge=lambda chunks: _response(base, Reply.of(read_chat(chunks))),
        done=None,
        encode=_sse,
    )


@router.post("/responses/input_tokens")
async def responses_input_tokens(body: ResponsesRequest, svc: ServiceDep) -> dict[str, Any]:
    """llama-server's count of a Responses request's prompt tokens, as ``/responses``
    would render its conversation (instructions and tools included)."""
    llm = svc.llm

    def count() -> int:
        try:
            spec = tool_spec(body.chat_tools(), body.chat_tool_choice(), body.parallel_tool_calls)
        except ToolSpecError as e:
            raise InvalidRequestError(str(e), e.param) from None
        return len(llm.chat_prompt(body.messages(), spec))

    n: int = await svc.call(count)
    return {"input_tokens": n, "object": "response.input_tokens"}


def _base(model: str, body: ResponsesRequest) -> dict[str, Any]:
    """The response object's fields known before the generation."""
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
        "status": "in_progress", "model": model, "output": [], "error": None,
        "incomplete_details": None, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "temperature": body.temperature,
        "top_p": body.top_p, "tools": [t.model_dump() for t in body.tools or []],
        "tool_choice": body.tool_choice or "auto", "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": None, "store": False, "metadata": body.metadata or {},
        "text": {"format": {"type": "text"}}, "usage": None,
    }  # fmt: skip


def _text_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [_part(text)] if status == "completed" else []}  # fmt: skip


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def _finished(base: dict[str, Any], output: list[dict[str, Any]], end: End) -> dict[str, Any]:
    """The response once generated: ``incomplete`` where ``max_output_tokens`` cut it."""
    cut = end.finish == "length"
    usage = {"input_tokens": end.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": end.completion_tokens,
             "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": end.prompt_tokens + end.completion_tokens}  # fmt: skip
    return {**base, "status": "incomplete" if cut else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "usage": usage}  # fmt: skip


def _response(base: dict[str, Any], reply: Reply) -> dict[str, Any]:
    output = []
    if reply.text or not reply.calls:
        output.append(_text_item(f"msg_{uuid.uuid4().hex}", reply.text, "completed"))
    output += [_call_item(i, n, a, "completed") for i, n, a in reply.calls]
    return _finished(base, output, reply.end)


def _events(base: dict[str, Any], events: Iterable[ChatEvent]) -> Iterator[dict[str, Any]]:
    """The Responses event stream: each output item added, its text or arguments in
    deltas, then done; the response created first and completed last."""
    yield {"type": "response.created", "response": base}
    yield {"type": "response.in_progress", "response": base}
    output: list[dict[str, Any]] = []
    text: list[str] = []  # the open message item's text
    call: list[str] = []  # the open call: id, name, arguments

    def close() -> Iterator[dict[str, Any]]:
        if not output:
            return
        n, item = len(output) - 1, output[-1]
        if item["type"] == "message" and item["status"] == "in_progress":
            whole = "".join(text)
            where = {"item_id": item["id"], "output_index": n, "content_index": 0}
            yield {"type": "response.output_text.done", **where, "text": whole, "logprobs": []}
            yield {"type": "response.content_part.done", **where, "part": _part(whole)}
            output[n] = _text_item(item["id"], whole, "completed")
        elif item["type"] == "function_call" and item["status"] == "in_progress":
            yield {"type": "response.function_call_arguments.done", "item_id": item["id"],
                   "output_index": n, "name": call[1], "arguments": call[2]}  # fmt: skip
            output[n] = _call_item(call[0], call[1], call[2], "completed")
        else:
            return
        yield {"type": "response.output_item.done", "output_index": n, "item": output[n]}

    for e in events:
        if isinstance(e, Text) and not (output and output[-1]["type"] == "message"):
            yield from close()
            item = _text_item(f"msg_{uuid.uuid4().hex}", "", "in_progress")
            output.append(item)
            text.clear()
            where = {"item_id": item["id"], "output_index": len(output) - 1, "content_index": 0}
            yield {"type": "response.output_item.added", "output_index": len(output) - 1,
                   "item": item}  # fmt: skip
            yield {"type": "response.content_part.added", **where, "part": _part("")}
        if isinstance(e, Text):
            text.append(e.text)
            yield {"type": "response.output_text.delta", "item_id": output[-1]["id"],
                   "output_index": len(output) - 1, "content_index": 0, "delta": e.text,
                   "logprobs": []}  # fmt: skip
        elif isinstance(e, CallStart):
            yield from close()
            call[:] = [e.id, e.name, ""]
            output.append(_call_item(e.id, e.name, "", "in_progress"))
            yield {"type": "response.output_item.added", "output_index": len(output) - 1,
                   "item": output[-1]}  # fmt: skip
        elif isinstance(e, CallArgs) and call:
            call[2] += e.arguments
            yield {"type": "response.function_call_arguments.delta", "item_id": output[-1]["id"],
                   "output_index": len(output) - 1, "delta": e.arguments}  # fmt: skip
        elif isinstance(e, End):
            yield from close()
            yield {"type": "response.completed", "response": _finished(base, output, e)}
        elif isinstance(e, Telemetry):
            yield {_TELEMETRY: e}


#: the key of :func:`_events`' telemetry marks, which :func:`_with_telemetry` replaces
_TELEMETRY = "__telemetry"


def _with_telemetry(
    events: Iterable[dict[str, Any]], base: dict[str, Any], per_token: bool
) -> Iterator[dict[str, Any]]:
    """The event stream with each telemetry mark applied as llama-server applies it:
    progress as a ``response.in_progress`` event of its own (with the timings so far),
    timings on the last event before the mark, and the last timings seen on
    ``response.completed``.

    ``per_token``: every token's chunk ends with a mark of its timings, so an event is
    held until its chunk's mark comes (right behind it, the same chunk's), never until
    the next token. Without, no mark comes after a token (progress comes before the
    first): each event goes out as it comes."""
    held: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    for event in events:
        mark = event.get(_TELEMETRY)
        if not isinstance(mark, Telemetry):
            if held is not None:
                yield held
                held = None
            if event["type"] == "response.completed" and timings is not None:
                event = {**event, "timings": timings}
            if per_token:
                held = event
            else:
                yield event
            continue
        timings = mark.timings or timings
        if mark.progress is not None:
            if held is not None:
                yield held
            held = {"type": "response.in_progress", "response": base,
                    "prompt_progress": mark.progress}  # fmt: skip
        if held is not None:  # the mark's chunk has ended: nothing more lands on it
            yield held if mark.timings is None else {**held, "timings": mark.timings}
            held = None
    if held is not None:
        yield held


def _sse(item: dict[str, Any]) -> bytes:
    """An event named by its type; an error (OpenAI's body, from the relay) as the
    ``error`` event."""
    if "error" in item and "type" not in item:
        item = {"type": "error", **item}
    return f"event: {item['type']}\ndata: {json.dumps(item)}\n\n".encode()

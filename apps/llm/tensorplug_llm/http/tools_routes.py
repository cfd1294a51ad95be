"""llama-server's ``/tools``: ``GET`` lists the server's tools, ``POST`` runs one,
``{"tool": NAME, "params": {...}}``, answering its result object (``"stream": true``:
server-sent events, ``{"chunk": TEXT}`` as the tool writes, then ``{"done": true}``
with ``"error"`` if it failed; no ``[DONE]``).

Off unless ``--tools`` or an MCP server is given: then both answer 403
``feature_disabled``, as llama-server's. These routes run commands and write files
with the server's rights, for whoever holds the API key (or anyone, without one).

What a call's status says: 200 when the tool ran, its own failure being the result's
``error`` (the model reads it); 400 for a body or a parameter that is not what the tool
takes; 404 for a tool the server does not offer (or that cannot stream); 500 for a
runtime that cannot be used (``x-tool-runtime``)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..server_tools import ParamError, Tool, ToolBox, ToolRuntimeError, UnknownTool
from .errors import ApiError, log
from .relay import EventStream, data_event, hand_over, in_thread
from .service import SSE_HEADERS

__all__ = ["router"]

router = APIRouter()

_END = object()


def _toolbox(request: Request) -> ToolBox:
    tools: ToolBox | None = getattr(request.app.state, "tools", None)
    if tools is None:
        raise ApiError(403, "this feature is disabled", "feature_disabled")
    return tools


@router.get("/tools")
async def list_tools(request: Request) -> JSONResponse:
    return JSONResponse(_toolbox(request).listing())


@router.post("/tools")
async def call_tool(request: Request) -> Response:
    tools = _toolbox(request)
    name, params, stream = _call(await request.body())
    try:
        tool = tools.find(name, stream)
        params = tools.call_params(params, request.headers, tool.kind == "server")
    except UnknownTool as e:
        raise ApiError(404, str(e), code="not_found") from None
    except ToolRuntimeError as e:  # --tools-runtime's container could not be started again
        raise ApiError(500, str(e), "server_error") from None
    if stream:
        return _streamed(tool, params)
    try:
        result = await in_thread(lambda: tool.invoke(params))
    except ParamError as e:
        raise ApiError(400, str(e)) from None
    except ToolRuntimeError as e:
        raise ApiError(500, str(e), "server_error") from None
    return JSONResponse(result)


def _call(body: bytes) -> tuple[str, dict[str, Any], bool]:
    """The tool's name, its parameters and whether to stream, from the request body."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "the request body must be a JSON object")
    name, params, stream = doc.get("tool"), doc.get("params", {}), doc.get("stream", False)
    if not isinstance(name, str):
        raise ApiError(400, "tool: the name of a tool (a string) is required", param="tool")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ApiError(400, "params: must be an object", param="params")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream: must be a boolean", param="stream")
    return name, params, stream


def _streamed(tool: Tool, params: dict[str, Any]) -> Response:
    """The tool on a thread of its own, its output carried to the client as it comes;
    the client gone, the tool is told (its command is killed)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    gone = threading.Event()

    def put(item: Any) -> None:
        if not hand_over(loop, queue.put_nowait, item):  # the server stopped meanwhile
            gone.set()

    def sink(chunk: str) -> bool:
        if chunk:
            put({"chunk": chunk})
        return not gone.is_set()

    def work() -> None:
        done: dict[str, Any] = {"done": True}
        try:
            tool.invoke(params, sink)
        except (ParamError, ToolRuntimeError) as e:
            done["error"] = str(e)
        except Exception as e:
            log.exception("tool %s failed", tool.name)
            done["error"] = f"internal error: {type(e).__name__}"
        put(done)
        put(_END)

    async def events() -> AsyncIterator[bytes]:
        while (item := await queue.get()) is not _END:
            yield data_event(item)

    threading.Thread(target=work, name=f"tool-{tool.name}", daemon=True).start()
    return EventStream(events(), on_close=gone.set, media_type="text/event-stream",
                       headers=SSE_HEADERS)  # fmt: skip

"""The OpenAI-compatible HTTP server: FastAPI over one :class:`~tensorplug_llm.api.LLM`.

What a team deploying it expects, besides the endpoints:

* **bad requests are 4xx, never 500**: pydantic validates every body
  (:mod:`openai_schema`), and every error — validation, malformed JSON, unknown model
  or route, wrong API key — is OpenAI's error body ``{"error": {"message", "type",
  "param", "code"}}`` naming the field; an unexpected failure is a 500 with that body
  and the traceback in the server's log, never in the response;
* **bounded queue**: at most ``n_parallel + max_queue`` requests are admitted; the next
  gets 503 with ``Retry-After`` (clients back off instead of piling up);
* **cancellation**: a client that disconnects (streaming or not) cancels its request,
  so its sequence stops taking a slot; a request running past ``request_timeout`` is
  cancelled too (504, or an error event on a stream);
* **API key** on every route but ``/health`` (a load balancer's probe needs none);
* ``/metrics`` in Prometheus text (prometheus_client): tokens, tokens/s, queue depth,
  KV cache use, HTTP requests by route and status.

Generation runs on the generator's thread; each request's chunks are carried to the
event loop by a thread of its own (so 64 waiting clients do not exhaust a shared pool).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tensorplug.errors import RunError

from .api import LLM, InvalidRequestError, Stream
from .openai_schema import ChatRequest, CompletionRequest, EmbeddingRequest
from .tool_calls import join_tool_call_deltas

__all__ = ["ServerConfig", "create_app"]

log = logging.getLogger("tensorplug.server")


class ServerConfig:
    """The server's limits. ``max_queue``: requests admitted beyond the generator's
    ``n_parallel`` slots (waiting for one); ``request_timeout``: seconds a request may
    run; ``retry_after``: the seconds a 503 tells a client to wait; ``max_body_bytes``:
    the largest request body read (a 413 past it: a 50 MB prompt once held a tiny
    model's server for minutes and 0.9 GB while it was parsed and tokenized)."""

    def __init__(
        self,
        api_key: str | None = None,
        max_queue: int = 64,
        request_timeout: float = 600.0,
        retry_after: int = 1,
        max_body_bytes: int = 16 * 2**20,
    ) -> None:
        if max_queue < 0 or request_timeout <= 0 or max_body_bytes < 1:
            raise RunError("max_queue must be >= 0, request_timeout > 0 and max_body_bytes >= 1")
        self.api_key = api_key
        self.max_queue = max_queue
        self.request_timeout = request_timeout
        self.retry_after = retry_after
        self.max_body_bytes = max_body_bytes


class _ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers

    def response(self) -> JSONResponse:
        return _error(self.status, self.message, self.kind, self.param, self.code, self.headers)


def _error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class _Metrics:
    """Prometheus metrics: HTTP counters here, the generator's counters read at scrape."""

    def __init__(self, llm: LLM, in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.http = Counter(
            "tensorplug_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "tensorplug_rejected_requests",
            "requests refused with 503 because the queue was full",
            registry=self.registry,
        )
        Gauge(
            "tensorplug_http_in_flight", "requests admitted and not yet answered",
            registry=self.registry,
        ).set_function(lambda: in_flight())  # fmt: skip
        self.registry.register(_GeneratorCollector(llm))  # type: ignore[arg-type]


class _GeneratorCollector:
    """The generator's counters, and generation tokens/s since the previous scrape."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._last = (time.monotonic(), 0)

    def collect(self) -> Iterator[Any]:
        s = self.llm.stats()
        now = time.monotonic()
        then, before = self._last
        self._last = (now, s.generated_tokens_total)
        rate = (s.generated_tokens_total - before) / max(now - then, 1e-9)
        yield CounterMetricFamily(
            "tensorplug_prompt_tokens", "prompt tokens evaluated", value=s.prompt_tokens_total
        )
        yield CounterMetricFamily(
            "tensorplug_generated_tokens", "tokens generated", value=s.generated_tokens_total
        )
        yield CounterMetricFamily(
            "tensorplug_requests", "requests given to the generator", value=s.requests_total
        )
        yield CounterMetricFamily(
            "tensorplug_preemptions",
            "running requests preempted (cells freed, resumed later) when the KV cache was full",
            value=s.preemptions,
        )
        gauges = {
            "tensorplug_generation_tokens_per_second": ("tokens/s since the last scrape", rate),
            "tensorplug_requests_running": ("requests holding a slot", s.running),
            "tensorplug_requests_waiting": ("requests waiting for a slot (queue depth)", s.waiting),
            "tensorplug_slots": ("parallel sequences (-np)", s.n_parallel),
            "tensorplug_kv_cells_used": ("KV cache cells holding tokens", s.kv_cells_used),
            "tensorplug_kv_cells_total": ("KV cache cells (the context)", s.kv_cells_total),
            "tensorplug_kv_cache_usage_ratio": (
                "used / total KV cells",
                s.kv_cells_used / max(s.kv_cells_total, 1),
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)


class _Guard:
    """The API key check, the body size limit and the HTTP counters, as plain ASGI
    middleware: Starlette's ``BaseHTTPMiddleware`` relays a streamed body through a
    queue of its own, and a client that disconnected then left the stream's generator
    waiting for ever (its request never released its place in the queue)."""

    def __init__(
        self, app: ASGIApp, api_key: str | None, metrics: _Metrics, max_body_bytes: int
    ) -> None:
        self.app, self.api_key, self.metrics = app, api_key, metrics
        self.max_body_bytes = max_body_bytes
        self.too_large = (
            f"the request body is larger than the server's limit of {max_body_bytes} "
            "bytes (tensorplug serve --max-request-size)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in _ROUTES else "other"
        headers = Headers(scope=scope)
        if path != "/health" and self.api_key is not None:
            header = headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(given.encode(), self.api_key.encode()):
                self.metrics.http.labels(route, "401").inc()
                response = _error(
                    401, "invalid API key: send it as 'Authorization: Bearer KEY'",
                    code="invalid_api_key",
                )  # fmt: skip
                await response(scope, receive, send)
                return
        too_large = self.too_large
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            self.metrics.http.labels(route, "413").inc()
            await _error(413, too_large)(scope, receive, send)
            return
        read = 0

        async def limited() -> Message:  # a body sent without a length is counted as read
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.max_body_bytes:  # answered by the app's HTTP error handler
                raise StarletteHTTPException(413, too_large)
            return message

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, limited, counted)


def create_app(llm: LLM, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving ``llm`` under ``config``'s limits."""
    cfg = config or ServerConfig()
    app = FastAPI(title="tensorplug", docs_url=None, redoc_url=None, openapi_url=None)
    state = {"in_flight": 0}
    metrics = _Metrics(llm, lambda: state["in_flight"])
    app.state.llm = llm
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return _error(400, f"the request body is not valid JSON: {first.get('msg', '')}")
        param = ".".join(loc) or None
        what = f"{param}: " if param else ""
        return _error(400, f"{what}{first.get('msg', 'invalid request')}", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return _error(exc.status_code, str(exc.detail), code=code)

    @app.exception_handler(_ApiError)
    async def api_error(_: Request, exc: _ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return _error(500, f"internal error: {type(exc).__name__}", "server_error")

    app.add_middleware(
        _Guard, api_key=cfg.api_key, metrics=metrics, max_body_bytes=cfg.max_body_bytes
    )

    def admit() -> None:
        limit = llm.stats().n_parallel + cfg.max_queue
        if state["in_flight"] >= limit:
            metrics.rejected.inc()
            raise _ApiError(
                503,
                f"the server is busy ({state['in_flight']} requests admitted, at most "
                f"{limit}); retry after {cfg.retry_after} s",
                "server_overloaded",
                headers={"Retry-After": str(cfg.retry_after)},
            )
        state["in_flight"] += 1

    def check_model(name: str) -> None:
        if name != llm.model_name:
            raise _ApiError(
                404,
                f"the model {name!r} does not exist here; this server has {llm.model_name!r}",
                param="model",
                code="model_not_found",
            )

    async def answer(
        request: Request, stream: bool, start: Callable[[], dict[str, Any] | Stream]
    ) -> Response:
        """Run ``start`` (it submits the request and returns a :class:`Stream`) and answer
        with server-sent events, or with ``stream`` false the whole response at once."""
        admit()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                state["in_flight"] -= 1

        try:
            result = await _in_thread(start)
        except InvalidRequestError as e:
            release()
            raise _ApiError(400, str(e), param=e.param) from None
        except BaseException:
            release()
            raise
        if isinstance(result, dict):
            release()
            return JSONResponse(result)
        deadline = time.monotonic() + cfg.request_timeout
        chunks = _relay(result)
        if not stream:
            try:
                return JSONResponse(await _gather(request, result, chunks, deadline))
            finally:
                release()

        def close() -> None:
            result.cancel()
            release()

        return _EventStream(
            _sse(request, result, chunks, deadline, release),
            on_close=close,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": llm.model_name, "object": "model", "created": 0, "owned_by": "tensorplug"}
            ],
        }

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(
            generate_latest(metrics.registry).decode(),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body.model)
        kwargs = body.sampling()
        kwargs["stream"] = True  # the server streams internally; non-stream gathers
        return await answer(
            request,
            body.stream,
            lambda: llm.create_completion(
                body.prompt,
                max_tokens=body.max_tokens,
                logprobs=body.logprobs,
                echo=body.echo,
                **kwargs,
            ),
        )

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Response:
        check_model(body.model)
        kwargs = body.sampling()
        kwargs["stream"] = True
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        return await answer(
            request,
            body.stream,
            lambda: llm.create_chat_completion(
                messages,
                tools=body.tools,
                tool_choice=body.tool_choice,
                parallel_tool_calls=body.parallel_tool_calls,
                max_tokens=body.max_completion_tokens or body.max_tokens,
                logprobs=body.logprobs,
                top_logprobs=body.top_logprobs,
                **kwargs,
            ),
        )

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> Response:
        check_model(body.model)
        admit()
        try:
            result = await _in_thread(lambda: llm.create_embedding(body.input))
        except InvalidRequestError as e:
            raise _ApiError(400, str(e), param=e.param) from None
        finally:
            state["in_flight"] -= 1
        if body.encoding_format == "base64":
            for item in result["data"]:
                raw = np.asarray(item["embedding"], dtype="<f4").tobytes()
                item["embedding"] = base64.b64encode(raw).decode()
        return JSONResponse(result)

    return app


_ROUTES = {"/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions",
           "/v1/embeddings"}  # fmt: skip


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread of its own (tokenizing and template rendering take time)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            value = fn()
        except BaseException as e:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, done, None, e)
        else:
            loop.call_soon_threadsafe(_settle, done, value, None)

    threading.Thread(target=run, daemon=True).start()
    return await done


class _EventStream(StreamingResponse):
    """A streamed response that cleans up however it ends: the event generator's own
    ``finally`` does not run if the client is gone before the first event is sent (a
    generator never started has nothing to finalize), and the request would keep its
    place in the queue for ever."""

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


_DONE = object()


def _relay(stream: Stream) -> asyncio.Queue[Any]:
    """The stream's chunks carried into an asyncio queue by a thread of their own,
    ending with ``_DONE`` (or an exception)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[Any] = asyncio.Queue()

    def pump() -> None:
        try:
            for chunk in stream:
                loop.call_soon_threadsafe(q.put_nowait, chunk)
        except BaseException as e:  # re-raised on the loop
            loop.call_soon_threadsafe(q.put_nowait, e)
        loop.call_soon_threadsafe(q.put_nowait, _DONE)

    threading.Thread(target=pump, daemon=True).start()
    return q


async def _next(chunks: asyncio.Queue[Any], deadline: float) -> Any:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    item = await asyncio.wait_for(chunks.get(), remaining)
    if isinstance(item, BaseException):
        raise item
    return item


async def _gather(
    request: Request, stream: Stream, chunks: asyncio.Queue[Any], deadline: float
) -> dict[str, Any]:
    """A whole response from the chunks; the request is cancelled if the client goes
    away or the deadline passes."""
    watcher = asyncio.create_task(_watch_disconnect(request, stream))
    got: list[dict[str, Any]] = []
    try:
        while (item := await _next(chunks, deadline)) is not _DONE:
            got.append(item)
    except TimeoutError:
        stream.cancel()
        raise _ApiError(504, "the request ran past the server's --timeout", "timeout") from None
    except InvalidRequestError as e:
        raise _ApiError(400, str(e), param=e.param) from None
    finally:
        watcher.cancel()
    return _merge(got)


async def _watch_disconnect(request: Request, stream: Stream) -> None:
    """Cancel ``stream`` when its client goes away. It waits for the connection's
    ``http.disconnect`` (the body is read by then, so nothing else can come), where
    polling ``is_disconnected`` every 0.25 s per request took a fifth of the event
    loop's time with 16 clients: time the engine's thread waits for the GIL."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()


async def _sse(
    request: Request,
    stream: Stream,
    chunks: asyncio.Queue[Any],
    deadline: float,
    release: Callable[[], None],
) -> AsyncIterator[bytes]:
    """Server-sent events; a client that disconnects cancels the request, as does the
    deadline. Sending to a client that went away fails, but a request still waiting
    for a slot sends nothing: the watcher notices the disconnect meanwhile."""
    watcher = asyncio.create_task(_watch_disconnect(request, stream))
    try:
        while (item := await _next(chunks, deadline)) is not _DONE:
            yield f"data: {json.dumps(item)}\n\n".encode()
        yield b"data: [DONE]\n\n"
    except TimeoutError:
        stream.cancel()
        body = {"error": {"message": "the request ran past the server's --timeout",
                          "type": "timeout", "param": None, "code": None}}  # fmt: skip
        yield f"data: {json.dumps(body)}\n\n".encode()
    except InvalidRequestError as e:
        body = {"error": {"message": str(e), "type": "invalid_request_error",
                          "param": e.param, "code": None}}  # fmt: skip
        yield f"data: {json.dumps(body)}\n\n".encode()
    finally:
        watcher.cancel()
        stream.cancel()
        release()


def _merge(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """One response dict made of a stream's chunks (completion or chat), a choice per
    ``index`` (``n`` > 1 interleaves them)."""
    if not chunks:
        raise _ApiError(500, "the request produced no response", "server_error")
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
    return {**head, "choices": choices, "usage": usage}


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
        "content": "".join(c["delta"].get("content", "") for c in choices),
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

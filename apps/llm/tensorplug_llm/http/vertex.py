"""Vertex AI's prediction protocol, as llama-server serves it when ``AIP_MODE=PREDICTION``:
``POST {AIP_PREDICT_ROUTE}`` (``/predict``) takes ``{"instances": [...]}``, each instance
a request body naming its route in ``@requestFormat`` (``chatCompletions``: the route's
path in camelCase, or the path itself), and answers ``{"predictions": [...]}``, each
the route's JSON answer (an error object for an instance that failed), in order.

Each instance goes through the whole app again, headers included (the key, the
counters, the queue: an instance is a request like any other), never streamed; the
instances run together, as llama-server's do."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message

from tensorplug.errors import RunError

from .errors import error_body

__all__ = ["MAX_INSTANCES", "VertexRoutes", "add_predict_route", "request_format"]

#: instances one prediction request may carry (llama-server's limit)
MAX_INSTANCES = 128

#: what routing added to the outer request's scope
_ROUTING = ("route", "endpoint", "path_params", "router", "app")


class VertexRoutes:
    """Where Vertex AI expects the routes: ``predict`` (``AIP_PREDICT_ROUTE``) and, when
    given, ``health`` (``AIP_HEALTH_ROUTE``, answered as ``/health``)."""

    def __init__(self, predict: str = "/predict", health: str | None = None) -> None:
        self.predict, self.health = predict, health

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> VertexRoutes | None:
        """The routes Vertex AI's variables name; None unless ``AIP_MODE=PREDICTION``."""
        env = os.environ if env is None else env
        if env.get("AIP_MODE", "") != "PREDICTION":
            return None
        return cls(env.get("AIP_PREDICT_ROUTE") or "/predict", env.get("AIP_HEALTH_ROUTE") or None)


def request_format(path: str) -> str:
    """A route's ``@requestFormat`` name: ``/v1/chat/completions`` → ``chatCompletions``,
    ``/apply-template`` → ``applyTemplate`` (its path in camelCase, without ``/v1``)."""
    path = path.removeprefix("/v1/") if path.startswith("/v1/") else path.lstrip("/")
    words = [w for w in re.split(r"[/_-]", path.split("{", 1)[0]) if w]
    return "".join(w if i == 0 else w[:1].upper() + w[1:] for i, w in enumerate(words))


def _formats(paths: Sequence[str]) -> dict[str, str]:
    """Each POST route's ``@requestFormat`` name and path → its path (the first route
    of a name wins, as llama-server's first registration does)."""
    out: dict[str, str] = {}
    for path in paths:
        out.setdefault(request_format(path), path)
    for path in paths:
        out.setdefault(path, path)
    return out


async def _call(app: ASGIApp, request: Request, path: str, body: bytes) -> Any:
    """The JSON answer of ``app`` to a POST of ``body`` to ``path``, with ``request``'s
    headers (its text where it is not JSON)."""
    headers = [
        (k, v) for k, v in request.scope["headers"] if k not in (b"content-length", b"content-type")
    ]
    headers += [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = {
        **request.scope,
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
    }
    for key in [k for k in scope if k.startswith("fastapi") or k in _ROUTING]:
        del scope[key]  # the outer request's routing, not this one's
    sent = False
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the outer request's own watch ends it
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    data = b"".join(chunks)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def _invalid(message: str) -> dict[str, Any]:
    return error_body(message, code=400)


def add_predict_route(
    app: FastAPI, routes: VertexRoutes, post_paths: Sequence[str], health: Callable[..., Any]
) -> None:
    """``POST routes.predict`` on ``app``, dispatching to ``post_paths`` (``app``'s POST
    routes), and ``GET routes.health`` answered by ``health`` when it is named."""
    if routes.health is not None:
        app.add_api_route(routes.health, health, methods=["GET"], include_in_schema=False)
    formats = _formats(post_paths)
    if routes.predict in formats.values():
        raise RunError(
            f"AIP_PREDICT_ROUTE={routes.predict} is one of the server's own routes: name another"
        )

    async def one(request: Request, instance: Any) -> Any:
        if not isinstance(instance, dict):
            return _invalid("each instance must be a JSON object")
        name = instance.get("@requestFormat")
        if not isinstance(name, str):
            return _invalid("each instance must include a string @requestFormat")
        path = formats.get(name)
        if path is None:
            return _invalid(f"no handler registered for @requestFormat: {name}")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            payload["stream"] = False  # a prediction is one answer
        return await _call(request.app, request, path, json.dumps(payload).encode())

    async def predict(request: Request) -> JSONResponse:
        try:
            data = json.loads(await request.body())
        except ValueError as e:
            return JSONResponse(_invalid(f"the request body is not valid JSON: {e}"), 400)
        instances = data.get("instances") if isinstance(data, dict) else None
        if not isinstance(instances, list):
            return JSONResponse(
                _invalid("the request body must be a JSON object with an array 'instances'"), 400
            )
        if len(instances) > MAX_INSTANCES:
            return JSONResponse(
                _invalid(f"'instances' holds {len(instances)}: at most {MAX_INSTANCES}"), 400
            )
        predictions = await asyncio.gather(*(one(request, i) for i in instances))
        return JSONResponse({"predictions": list(predictions)})

    app.add_api_route(routes.predict, predict, methods=["POST"], include_in_schema=False)

"""CORS as llama-server answers it: any ``OPTIONS`` request (a browser's preflight) gets
200 before any key is asked for, and a request from an allowed origin gets that origin
back in ``Access-Control-Allow-Origin`` with credentials allowed. By default every
origin is allowed, as llama-server's default; ``--cors-origins`` narrows them."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["Cors", "origin_allowed"]

#: llama-server's list, verbatim (its router mode deletes models): a page written for it
#: checks the methods it calls are listed, and a method no route takes is still a 405
METHODS = "GET, POST, DELETE, OPTIONS"


#: the hosts ``localhost`` stands for, as llama-server's ``--cors-origins localhost``
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def origin_allowed(origin: str, allowed: Sequence[str] | None) -> bool:
    """``allowed`` None or holding ``*``: every origin. An entry with a scheme is one
    origin (``https://app.example``); a bare host allows that host on any scheme and
    port, and ``localhost`` every loopback name (``127.0.0.1``, ``[::1]``), as
    llama-server's."""
    if allowed is None or "*" in allowed:
        return True
    try:
        host = urlsplit(origin).hostname or origin
    except ValueError:  # not a URL (an unclosed "[", say): only an exact entry matches
        host = origin
    return any(
        origin == a or ("://" not in a and (host == a or (a == "localhost" and host in LOOPBACK)))
        for a in allowed
    )


class Cors:
    """Plain ASGI middleware, the outermost: a preflight never reaches the key check."""

    def __init__(self, app: ASGIApp, origins: Sequence[str] | None) -> None:
        self.app, self.origins = app, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        allowed = origin is not None and origin_allowed(origin, self.origins)

        def add(target: MutableHeaders) -> None:
            if allowed and origin is not None:
                target["Access-Control-Allow-Origin"] = origin
                target["Access-Control-Allow-Credentials"] = "true"
                target.add_vary_header("Origin")

        if scope["method"] == "OPTIONS":
            out = MutableHeaders({"content-length": "0"})
            add(out)
            if allowed:
                out["Access-Control-Allow-Methods"] = METHODS
                out["Access-Control-Allow-Headers"] = "*"
            await send({"type": "http.response.start", "status": 200, "headers": out.raw})
            await send({"type": "http.response.body", "body": b""})
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                add(MutableHeaders(scope=message))
            await send(message)

        await self.app(scope, receive, with_cors)

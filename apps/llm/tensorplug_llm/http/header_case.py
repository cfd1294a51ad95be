"""Response header names written as llama-server writes them: ``Content-Type``,
``Access-Control-Allow-Origin``, ``Process-Start-Time-Unix``.

HTTP says header names are case-insensitive, and the clients we know compare them so;
Starlette hands them to the server in lower case. Some scripts read a response's
headers into a plain dict and look names up as llama-server sends them (llama.cpp's own
server tests among them: ``dict(response.headers)["Access-Control-Allow-Origin"]``), so
the app's outermost layer gives each name the canonical case, every word capitalized.
uvicorn's h11 writes names in the case it is given.
"""

from __future__ import annotations

import functools

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CanonicalHeaderCase", "canonical"]


@functools.lru_cache(maxsize=256)
def canonical(name: bytes) -> bytes:
    """``b"access-control-allow-origin"`` → ``b"Access-Control-Allow-Origin"``."""
    return b"-".join(word[:1].upper() + word[1:] for word in name.split(b"-"))


class CanonicalHeaderCase:
    """ASGI middleware: each response's header names in :func:`canonical` case."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_canonical(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers") or ()
                message = {**message, "headers": [(canonical(k), v) for k, v in headers]}
            await send(message)

        await self.app(scope, receive, send_canonical)

"""The server before its model is ready: it listens from the start, as llama-server
does, and answers every request 503 ``Loading model`` (``/health`` included, which is
how a client or a load balancer waits for it) until :class:`Switch` is given the app."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import error_response

__all__ = ["Switch"]


async def _loading(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":  # nothing to start or stop: said so at once
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    response = error_response(
        503, "Loading model", "unavailable_error", headers={"Retry-After": "1"}
    )
    await response(scope, receive, send)


class Switch:
    """An ASGI app that answers "loading" until ``app`` is set."""

    def __init__(self) -> None:
        self.app: ASGIApp = _loading

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

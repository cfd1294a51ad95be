"""The connection's limits, where uvicorn has none: a client must send a request's
head within :data:`HEADER_TIMEOUT` seconds of connecting (or of the previous response)
and each piece of its body within the body timeout, only HTTP/1.0 and 1.1 are spoken,
and at most :data:`MAX_CONNECTIONS` connections are served at once: a request on a
connection past the cap is answered 503 in OpenAI's error shape by
:class:`ConnectionCap` (uvicorn's own ``limit_concurrency`` answers a plain-text 503,
which an OpenAI client cannot read: it stays only as a backstop, twice higher).

uvicorn arms its keep-alive timer only after a response, and any byte received
cancels it: a client that connects and sends nothing, or one header byte every few
seconds, held its connection for ever. :func:`timed_h11` adds a deadline for the
whole head to uvicorn's h11 protocol; :class:`Transport` (ASGI) gives each body read a
deadline (a 408 after it: a Content-Length larger than the body sent no longer holds
the connection) and refuses unknown HTTP versions (505). The protocol counts the open
connections (:class:`Connections`) for :class:`ConnectionCap`, which sits outside every
other part of the app, so that the 503 is given while the model loads too."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_response

__all__ = [
    "BODY_TIMEOUT",
    "ConnectionCap",
    "Connections",
    "HEADER_TIMEOUT",
    "IDLE_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_HEADER_BYTES",
    "Transport",
    "timed_h11",
    "uvicorn_settings",
]

#: seconds a client has to send a request's head (request line and headers)
HEADER_TIMEOUT = 10.0
#: seconds a client may take to send each piece of a request's body
BODY_TIMEOUT = 30.0
#: seconds an idle keep-alive connection stays open between requests
IDLE_TIMEOUT = 5.0
#: connections served at once; a request on one past it is answered 503
MAX_CONNECTIONS = 256
#: the largest request head h11 buffers (a longer one is a 400)
MAX_HEADER_BYTES = 64 * 1024

VERSIONS = ("1.0", "1.1")


class Connections:
    """The connections open now (kept by :func:`timed_h11`'s protocol) and the cap on
    them (``tensorplug serve --max-connections``)."""

    __slots__ = ("limit", "open")

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        if limit < 1:
            raise ValueError(f"max_connections is {limit}: give at least 1")
        self.limit, self.open = limit, 0


def timed_h11(header_timeout: float, connections: Connections | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol, counting its open connections in ``connections`` and
    closing a connection whose request head has not all come ``header_timeout``
    seconds after the connection opened or the previous response ended. The deadline
    follows uvicorn's h11 protocol class (the ``http`` setting uvicorn documents takes a
    class) through two of its members, a request's ``cycle`` and
    ``on_response_complete``; a uvicorn without them gets no head deadline (the body
    and idle ones stand)."""
    counted = connections if connections is not None else Connections()
    timed = hasattr(H11Protocol, "on_response_complete")

    class TimedH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            counted.open += 1  # first: a request on it is parsed after this returns
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            counted.open -= 1
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            if timed:
                self._head_timer = self.loop.call_later(header_timeout, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            # no request under way (one has its own deadlines): the next one's head is late
            cycle = getattr(self, "cycle", None)
            idle = cycle is None or cycle.response_complete
            if idle and not self.transport.is_closing():
                self.transport.close()

    return TimedH11


def uvicorn_settings(
    connections: Connections,
    header_timeout: float = HEADER_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that bound a connection; the app
    given to uvicorn is wrapped in :class:`ConnectionCap` over the same ``connections``."""
    return {
        "http": timed_h11(header_timeout, connections),
        "timeout_keep_alive": idle_timeout,
        # uvicorn's plain-text 503: a backstop past ours (it counts running requests too)
        "limit_concurrency": 2 * connections.limit + 1,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
    }


class ConnectionCap:
    """ASGI middleware: a request on a connection past ``connections.limit`` is answered
    503 with ``Retry-After``, in OpenAI's error shape, and its connection is closed (an
    open connection past the cap would go on counting against it)."""

    def __init__(self, app: ASGIApp, connections: Connections, retry_after: int = 1) -> None:
        self.app, self.connections, self.retry_after = app, connections, retry_after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cap = self.connections
        if scope["type"] != "http" or cap.open <= cap.limit:
            await self.app(scope, receive, send)
            return
        response = error_response(
            503,
            f"the server is at its connection limit ({cap.limit} open at once): retry "
            f"after {self.retry_after} s, or raise the limit (tensorplug serve "
            "--max-connections)",
            "unavailable_error",
            code=503,
            headers={"Retry-After": str(self.retry_after), "Connection": "close"},
        )
        await response(scope, receive, send)


class Transport:
    """ASGI middleware: 505 for an HTTP version other than 1.0 and 1.1, and a 408 when
    a piece of the body does not come within ``body_timeout`` seconds (raised from the
    body's read, answered by the app's error handler as the body limit's 413 is)."""

    def __init__(self, app: ASGIApp, body_timeout: float = BODY_TIMEOUT) -> None:
        self.app, self.body_timeout = app, body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        version = scope.get("http_version", "1.1")
        if version not in VERSIONS:
            response = error_response(
                505, f"HTTP/{version} is not supported: send HTTP/1.1 (or 1.0)"
            )
            await response(scope, receive, send)
            return
        body_done = False

        async def timed() -> Message:
            nonlocal body_done
            if body_done:  # after the body only a disconnect can come: no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout)
            except TimeoutError:
                raise StarletteHTTPException(
                    408,
                    f"the request body did not arrive: nothing came for {self.body_timeout:g} "
                    "s (is its Content-Length larger than the body sent?)",
                    headers={"Connection": "close"},  # the rest of the body is not awaited
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await self.app(scope, timed, send)

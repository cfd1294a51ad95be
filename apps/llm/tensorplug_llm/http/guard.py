"""The API key check, the body size limit and the HTTP counters, as plain ASGI
middleware: Starlette's ``BaseHTTPMiddleware`` relays a streamed body through a queue
of its own, and a client that disconnected then left the stream's generator waiting
for ever (its request never released its place in the queue).

The key is read from ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (Anthropic's
header, which llama-server takes too); the routes llama-server leaves public (health,
the model list, the page at ``/`` and its files) need none."""

from __future__ import annotations

import secrets
from collections.abc import Collection

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response
from .metrics import Metrics
from .web_page import ASSETS

__all__ = ["PUBLIC_ROUTES", "Guard", "given_key"]

PUBLIC_ROUTES = frozenset({"/", "/health", "/v1/health", "/models", "/v1/models", "/api/tags"})
#: what monitors poll (a health check, a metrics scrape, the props and slots a page
#: refreshes): answered, and not counted in ``tensorplug_http_requests_total``, whose
#: figures are the API's use (a scrape would count itself; an asleep server's scrapes
#: give what it gave when it fell asleep, as llama-server's)
MONITORING_ROUTES = frozenset({"/health", "/v1/health", "/metrics", "/props", "/slots"})


def given_key(headers: Headers) -> str:
    """The key a request carries ("" without one)."""
    header = headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return headers.get("x-api-key", "").strip()


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        api_keys: Collection[str],
        metrics: Metrics,
        max_body_bytes: int,
        routes: Collection[str],
        public: Collection[str] = PUBLIC_ROUTES,
    ) -> None:
        self.app, self.metrics, self.public = app, metrics, public
        self.keys = [k.encode() for k in api_keys]
        self.max_body_bytes = max_body_bytes
        self.routes = routes
        self.too_large = (
            f"the request body is larger than the server's limit of {max_body_bytes} "
            "bytes (tensorplug serve --max-request-size)"
        )

    def _key_ok(self, headers: Headers) -> bool:
        given = given_key(headers).encode()
        # every key compared, so the time taken does not tell which one came close
        return any([secrets.compare_digest(given, key) for key in self.keys])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.routes else "other"
        headers = Headers(scope=scope)
        public = path in self.public or path.startswith(ASSETS)
        if self.keys and not public and not self._key_ok(headers):
            self.metrics.http.labels(route, "401").inc()
            response = error_response(
                401,
                "Invalid API Key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                "authentication_error",
                code="invalid_api_key",
            )
            await response(scope, receive, send)
            return
        too_large = self.too_large
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            self.metrics.http.labels(route, "413").inc()
            await error_response(413, too_large)(scope, receive, send)
            return
        read = 0

        async def limited() -> Message:  # a body sent without a length is counted as read
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.max_body_bytes:  # answered by the app's HTTP error handler
                raise StarletteHTTPException(413, too_large)
            return message

        monitoring = scope["method"] in ("GET", "HEAD") and path in MONITORING_ROUTES

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and not monitoring:
                self.metrics.http.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, limited, counted)

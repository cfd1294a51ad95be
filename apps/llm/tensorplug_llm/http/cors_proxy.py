"""llama-server's ``/cors-proxy`` (``--ui-mcp-proxy``): a page in the browser reaches an
HTTP service its origin's CORS rules would not let it call (an MCP server over HTTP)
through the model server: ``GET`` or ``POST /cors-proxy?url=TARGET`` sends the same
request to ``TARGET`` and answers with the target's status, headers and body, streamed.

Off unless ``--ui-mcp-proxy`` (or ``--agent``) is given: then 403 ``feature_disabled``,
as llama-server's. On, it lets whoever can call the server (the API key's holders, or
anyone without one) make requests from the server's network: do not turn it on where
that network holds what clients must not reach.

Nothing of the caller's own request is forwarded but its body: a header goes to the
target only when the caller names it ``x-llama-server-proxy-header-NAME`` (its
``Authorization`` for this server, cookies and the rest stay here)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from .errors import ApiError

__all__ = ["PROXY_HEADER_PREFIX", "router"]

router = APIRouter()

#: the prefix of the caller's headers meant for the target (the rest of the name is the
#: header's name there)
PROXY_HEADER_PREFIX = "x-llama-server-proxy-header-"
#: headers the proxy sets itself, never taken from the caller or passed back as they came
_HOP_HEADERS = frozenset(
    {"accept-encoding", "connection", "content-encoding", "content-length", "host",
     "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade"}
)  # fmt: skip
#: seconds to connect, and between two reads or writes (llama-server's 10 minutes)
TIMEOUT_SECONDS = 600.0


@router.get("/cors-proxy")
async def proxy_get(request: Request) -> Response:
    return await _proxy(request, "GET")


@router.post("/cors-proxy")
async def proxy_post(request: Request) -> Response:
    return await _proxy(request, "POST")


async def _proxy(request: Request, method: str) -> Response:
    if not getattr(request.app.state, "cors_proxy", False):
        raise ApiError(403, "this feature is disabled", "feature_disabled")
    url = _target(request.query_params.get("url"))
    headers = {
        name[len(PROXY_HEADER_PREFIX) :]: value
        for name, value in request.headers.items()
        if name.lower().startswith(PROXY_HEADER_PREFIX)
        and name[len(PROXY_HEADER_PREFIX) :].lower() not in _HOP_HEADERS
        and len(name) > len(PROXY_HEADER_PREFIX)
    }
    body = await request.body() if method == "POST" else None
    if body and not any(k.lower() == "content-type" for k in headers):
        given = request.headers.get("content-type")
        if given is not None:
            headers["content-type"] = given
    client = httpx.AsyncClient(follow_redirects=True, timeout=TIMEOUT_SECONDS)
    try:
        upstream = await client.send(
            client.build_request(method, url, headers=headers, content=body), stream=True
        )
    except httpx.HTTPError as e:
        await client.aclose()
        raise ApiError(502, f"the proxied request to {url} failed: {e}", "server_error") from None
    passed = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
    if upstream.status_code in (204, 304) or method == "HEAD":
        await upstream.aclose()
        await client.aclose()
        return Response(status_code=upstream.status_code, headers=passed)

    async def relayed() -> AsyncIterator[bytes]:
        try:
            async for piece in upstream.aiter_bytes():
                yield piece
        finally:
            await upstream.aclose()
            await client.aclose()

    return StreamingResponse(relayed(), status_code=upstream.status_code, headers=passed)


def _target(url: str | None) -> str:
    """The ``url`` query parameter, checked as llama-server checks it."""
    if not url:
        raise ApiError(400, "give the target as ?url=http(s)://HOST/PATH", param="url")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or not host:
        raise ApiError(400, f"invalid target URL {url!r}: missing host", param="url")
    if parts.scheme not in ("http", "https"):
        raise ApiError(
            400, f"unsupported URL scheme in target URL: {parts.scheme!r} (http or https)",
            param="url",
        )  # fmt: skip
    if parts.password is not None or parts.username is not None:
        raise ApiError(400, "authentication in the target URL is not supported: send it "
                       f"as an {PROXY_HEADER_PREFIX}authorization header", param="url")  # fmt: skip
    return url

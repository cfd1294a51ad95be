"""Every error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``
(``code``: a string naming the error, or the HTTP status as llama-server's carry it).

One place turns what went wrong into that body: pydantic's validation errors, malformed
JSON, unknown routes, the API's own refusals (:class:`~tensorplug_llm.api.InvalidRequestError`,
a context overflow as llama-server types it: ``exceed_context_size_error``) and, last, an
unexpected failure (a 500 whose traceback goes to the server's log, never to the client).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api import ContextSizeError, InvalidRequestError
from ..openai_schema import MediaInputError

__all__ = ["ApiError", "error_body", "error_response", "install_error_handlers", "refused"]

log = logging.getLogger("tensorplug.server")


class ApiError(Exception):
    """An HTTP error answered in OpenAI's shape; ``extra``: fields added to the error
    object (llama-server's ``n_prompt_tokens`` and ``n_ctx`` for a context overflow)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code, self.extra)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": kind, "param": param, "code": code, **(extra or {})}
    }


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return ApiError(status, message, kind, param, code, headers).response()


def refused(e: InvalidRequestError, rename: dict[str, str] | None = None) -> ApiError:
    """The 400 of a request the API refused; ``rename`` maps the API's field names to the
    route's (``response_format`` is ``json_schema`` or ``grammar`` on llama-server's)."""
    param = e.param
    for old, new in (rename or {}).items():
        if param is not None and param.startswith(old):
            param = new + param[len(old) :]
            break
    if isinstance(e, ContextSizeError):
        extra = {"n_prompt_tokens": e.n_prompt_tokens, "n_ctx": e.n_ctx}
        return ApiError(400, str(e), "exceed_context_size_error", param, 400, extra=extra)
    return ApiError(400, str(e), param=param)


def _type_tag(part: str) -> bool:
    """Whether a pydantic error location's part names a union's member (``str``,
    ``list[int]``), not a field."""
    return "[" in part or part in ("str", "int", "float", "bool", "bytes", "none", "dict", "list")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        # a union's members each report: the one that got furthest says what is wrong
        first = max(errors, key=lambda e: len(e.get("loc", ()))) if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _type_tag(str(p))]
        if first.get("type") == "json_invalid":
            return error_response(
                400, f"the request body is not valid JSON: {first.get('msg', '')}"
            )
        param = ".".join(loc) or None
        what = f"{param}: " if param else ""
        return error_response(400, f"{what}{first.get('msg', 'invalid request')}", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        headers = dict(exc.headers or {})  # a 408's Connection: close
        return error_response(exc.status_code, str(exc.detail), code=code, headers=headers)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(InvalidRequestError)
    async def api_refused(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return refused(exc).response()

    @app.exception_handler(MediaInputError)
    async def media(_: Request, exc: MediaInputError) -> JSONResponse:
        # llama-server's answer to an image without a projector: a 500, its text matched
        return error_response(500, str(exc), "server_error", code=500)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return error_response(500, f"internal error: {type(exc).__name__}", "server_error")

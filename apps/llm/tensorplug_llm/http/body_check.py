"""What no request body may hold, whatever its route: a lone surrogate (``"\\ud800"``
is valid JSON but no character: the tokenizer, the template and the reply's encoder
would each fail on it later) and lists or objects nested past :data:`MAX_NESTING`
(parsers, templates and schema compilers recurse). Both are a 400 naming the field,
checked once on the parsed body before any route sees it."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from .errors import ApiError

__all__ = ["MAX_NESTING", "check_body"]

#: how deep a request body may nest; real ones (a JSON schema, a tool's parameters)
#: are a few levels
MAX_NESTING = 64


async def check_body(request: Request) -> None:
    """A FastAPI dependency: refuses a JSON body holding a lone surrogate or nested too
    deeply (other bodies are left to their routes)."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    if "json" not in request.headers.get("content-type", "json"):
        return
    try:
        body = await request.json()
    except Exception:  # malformed JSON: the route's own parsing says what is wrong
        return
    _check(body)


def _check(body: Any) -> None:
    stack: list[tuple[Any, tuple[str, ...]]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if isinstance(value, dict):
            items: Any = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        if len(path) >= MAX_NESTING:
            raise ApiError(
                400,
                f"{_name(path)}: the body nests lists and objects more than {MAX_NESTING} "
                "levels deep here: flatten it",
                param=_name(path),
            )
        for key, item in items:
            if isinstance(key, str):
                _check_text(key, path)
            stack.append((item, (*path, str(key))))


def _check_text(text: str, path: tuple[str, ...]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        name = _name(path)
        raise ApiError(
            400,
            f"{name}: holds a lone surrogate ({text[e.start]!r} at index {e.start}), which is "
            "not a character: escape only whole characters (a pair \\ud83d\\ude00 is one)",
            param=name,
        ) from None


def _name(path: tuple[str, ...]) -> str:
    return ".".join(path) or "body"

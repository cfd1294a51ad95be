"""What a tool is to ``/tools``: its name, how it is listed (llama-server's fields:
``display_name``, ``type``, ``permissions``, ``uses_cwd``, the OpenAI ``definition``
that a client hands to ``/v1/chat/completions`` as one of its ``tools``), and its call.

A call's result is a JSON object: ``plain_text_response`` (text for the model),
other fields, or ``error`` (the tool ran and failed: still a 200, the model reads
it). A parameter missing or of the wrong type where the tool cannot do without it is a
:class:`ParamError` (a 400); an optional one of the wrong type gets its default, as
llama-server's."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = [
    "ParamError",
    "StreamSink",
    "Tool",
    "function_definition",
    "opt_bool",
    "opt_int",
    "opt_str",
    "required",
    "required_str",
]

#: where a streaming call's output goes, chunk by chunk; returns False once the client
#: is gone (the tool then stops)
StreamSink = Callable[[str], bool]

T = TypeVar("T")


class ParamError(ValueError):
    """A parameter the tool needs is missing or not of its type (a 400)."""


class Tool(ABC):
    name: str = ""
    display_name: str = ""
    kind: str = "server"  # "mcp" for a tool of an MCP server
    write: bool = False  # it changes something: a client asks its user first
    stream: bool = False  # it can stream its output (``"stream": true``)
    uses_cwd: bool = False  # it resolves paths and runs in the working directory

    @abstractmethod
    def definition(self) -> dict[str, Any]:
        """The OpenAI function tool: ``{"type": "function", "function": {...}}``."""

    @abstractmethod
    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        """Run the call. ``params`` holds the model's arguments and the request's
        ``cwd``, ``runtime`` and ``resp_type`` (from its headers, never the model's).
        With ``sink`` the output is streamed there and the result is empty."""

    def listing(self) -> dict[str, Any]:
        """This tool in ``GET /tools``."""
        return {
            "display_name": self.display_name,
            "tool": self.name,
            "type": self.kind,
            "permissions": {"write": self.write},
            "uses_cwd": self.uses_cwd,
            "definition": self.definition(),
        }


def function_definition(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def required(params: Mapping[str, Any], key: str) -> Any:
    if key not in params or params[key] is None:
        raise ParamError(f"params.{key} is required")
    return params[key]


def required_str(params: Mapping[str, Any], key: str) -> str:
    value = required(params, key)
    if not isinstance(value, str):
        raise ParamError(f"params.{key} must be a string")
    return value


def _opt(params: Mapping[str, Any], key: str, default: T, ok: Callable[[Any], bool]) -> T:
    value = params.get(key)
    return value if value is not None and ok(value) else default


def opt_str(params: Mapping[str, Any], key: str, default: str) -> str:
    return _opt(params, key, default, lambda v: isinstance(v, str))


def opt_bool(params: Mapping[str, Any], key: str, default: bool) -> bool:
    return _opt(params, key, default, lambda v: isinstance(v, bool))


def opt_int(params: Mapping[str, Any], key: str, default: int) -> int:
    """An integer (a whole float too: JSON does not tell them apart)."""
    value = params.get(key)
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return default

"""OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked and normalized.

A request's tools reach a chat template, a grammar and a parser; each would fail in its
own way on a malformed one (a template's ``tool.function.name`` on a string, llguidance
on a schema that is a list). So they are checked here first, and anything wrong is a
:class:`ToolSpecError` whose ``param`` names the field as an OpenAI error body does
(``tools[1].function.name``), with the fix in the message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensorplug.errors import RunError

__all__ = ["Function", "ToolSpec", "ToolSpecError", "tool_spec"]

#: OpenAI's rule for function names (and what every chat template's syntax can carry)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")


class ToolSpecError(RunError):
    """A malformed ``tools``/``tool_choice``; ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Function:
    """One callable function: its name, what it does, the JSON schema of its arguments."""

    name: str
    description: str | None
    parameters: dict[str, Any]

    def as_tool(self) -> dict[str, Any]:
        """OpenAI's ``{"type": "function", "function": {...}}``, as templates read it: with
        a ``description`` always (Hermes 3's template reads it unguarded; llama.cpp also
        always gives one)."""
        fn = {
            "name": self.name,
            "description": self.description or "",
            "parameters": self.parameters,
        }
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolSpec:
    """The tools of a request and how the model must use them.

    ``choice``: ``"none"`` (the tools are not shown to the model), ``"auto"`` (it may
    call them), ``"required"`` (it must call one or more), or ``"function"``: it must
    call the one named ``named``. ``parallel``: whether a reply may hold several calls.
    """

    functions: tuple[Function, ...]
    choice: str
    parallel: bool = True
    named: str | None = None

    @property
    def active(self) -> bool:
        """Whether the tools are rendered and the reply parsed for calls."""
        return bool(self.functions) and self.choice != "none"

    @property
    def forced(self) -> tuple[Function, ...]:
        """The functions the reply is constrained to call; empty when not constrained."""
        if not self.active or self.choice == "auto":
            return ()
        if self.choice == "required":
            return self.functions
        return tuple(f for f in self.functions if f.name == self.named)

    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.functions)


def tool_spec(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = True) -> ToolSpec:
    """The checked :class:`ToolSpec` of a request's fields (``tool_choice`` defaults to
    ``"auto"`` with tools and ``"none"`` without, as OpenAI's does)."""
    functions = _functions(tools)
    if not isinstance(parallel_tool_calls, bool):
        raise ToolSpecError("parallel_tool_calls", "must be true or false")
    if tool_choice is None:
        return ToolSpec(functions, "auto" if functions else "none", parallel_tool_calls)
    choice, named = _choice(tool_choice, {f.name for f in functions})
    if choice != "none" and not functions:
        raise ToolSpecError(
            "tool_choice", f"{tool_choice!r} needs tools: give the functions in 'tools'"
        )
    return ToolSpec(functions, choice, parallel_tool_calls, named)


def _functions(tools: Any) -> tuple[Function, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ToolSpecError(
            "tools", f'must be a list of {{"type": "function", "function": {{...}}}} objects, '
            f"got {type(tools).__name__}"
        )  # fmt: skip
    out: list[Function] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise ToolSpecError(where, f"must be an object, got {type(tool).__name__}")
        if tool.get("type", "function") != "function":
            raise ToolSpecError(
                f"{where}.type", f"only 'function' tools exist here, got {tool.get('type')!r}"
            )
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ToolSpecError(
                f"{where}.function", 'must be an object: {"name": ..., "parameters": {...}}'
            )
        out.append(_function(fn, f"{where}.function"))
    seen: set[str] = set()
    for i, f in enumerate(out):
        if f.name in seen:
            raise ToolSpecError(
                f"tools[{i}].function.name", f"{f.name!r} is given twice: names must be unique"
            )
        seen.add(f.name)
    return tuple(out)


def _function(fn: Mapping[str, Any], where: str) -> Function:
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ToolSpecError(
            f"{where}.name",
            f"must be 1 to 64 letters, digits, '_' or '-', got {name!r}",
        )
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolSpecError(f"{where}.description", "must be a string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    _check_schema(params, f"{where}.parameters")
    return Function(name, description, dict(params))


def _check_schema(schema: Any, where: str) -> None:
    """The arguments are one JSON object, so their schema must describe an object."""
    if not isinstance(schema, Mapping):
        raise ToolSpecError(
            where, f"must be a JSON schema object (of the arguments), got {type(schema).__name__}"
        )
    kind = schema.get("type", "object")
    if kind != "object":
        raise ToolSpecError(
            f"{where}.type",
            f"the arguments are a JSON object: the type must be 'object', got {kind!r}",
        )
    props = schema.get("properties", {})
    if not isinstance(props, Mapping) or not all(isinstance(p, Mapping) for p in props.values()):
        raise ToolSpecError(f"{where}.properties", "must map each argument's name to its schema")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ToolSpecError(f"{where}.required", "must be a list of argument names")


def _choice(choice: Any, names: set[str]) -> tuple[str, str | None]:
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolSpecError(
                "tool_choice",
                f'must be "none", "auto", "required" or {{"type": "function", "function": '
                f'{{"name": ...}}}}, got {choice!r}',
            )
        return choice, None
    if not isinstance(choice, Mapping) or choice.get("type", "function") != "function":
        raise ToolSpecError(
            "tool_choice", 'a named choice is {"type": "function", "function": {"name": ...}}'
        )
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ToolSpecError("tool_choice.function.name", "must be the name of a function")
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        raise ToolSpecError(
            "tool_choice.function.name", f"{name!r} is not one of the tools (they are: {known})"
        )
    return "function", name

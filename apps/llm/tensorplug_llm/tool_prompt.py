"""A conversation with tools, made ready for the model's chat template.

OpenAI's messages and a template's expectations differ in small ways that matter:

* an assistant turn that called tools has ``tool_calls`` whose ``function.arguments``
  is a JSON *string*; templates (Qwen, Llama 3.1, Hermes, Mistral) write
  ``arguments | tojson`` and want the object, so the string is parsed (llama.cpp does
  the same); its ``content`` is often null, which templates do not expect: it becomes "";
* a ``tool`` message carries ``tool_call_id``; some templates also print the function's
  ``name``, so it is filled in from the call it answers when missing.

A template that takes a ``tools`` variable and renders ``tool_calls`` is *native*: it
gets the tools (OpenAI's ``[{"type": "function", "function": {...}}]``) and the messages
as above. Any other template knows nothing of tools, and silently dropping them would
give a model that never calls one; so, as llama.cpp's generic chat format does, the
tools and how to call them go into the system message (:data:`GENERIC_INSTRUCTIONS`),
earlier calls into their assistant turn's text as the same JSON, and tool results into
user turns as ``{"tool_response": {...}}`` JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from .tool_spec import Function, ToolSpecError

__all__ = ["GENERIC_INSTRUCTIONS", "generic_system_text", "prepare_messages", "takes_tools"]

#: how deep an earlier call's arguments may nest (a real call's are a few levels)
MAX_NESTING = 64

#: What a model whose template has no tool support is told (``{tools}``: the functions
#: as a JSON list of ``{"name", "description", "parameters"}``).
GENERIC_INSTRUCTIONS = (
    "You can call the following tools. Each one's arguments follow the JSON schema under "
    '"parameters":\n{tools}\n\n'
    "To call tools, reply with nothing but one JSON object of this form:\n"
    '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{<the arguments>}}}}]}}\n'
    "Otherwise, answer the user normally."
)


@lru_cache(maxsize=16)
def takes_tools(template: str) -> bool:
    """Whether a chat template renders tools itself: it reads a ``tools`` variable and
    writes ``tool_calls`` back (parsed, not run: the syntax tree's free names)."""
    import jinja2
    from jinja2 import meta

    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False  # rendering will say what is wrong with it
    return "tools" in meta.find_undeclared_variables(tree) and "tool_calls" in template


def generic_system_text(functions: Sequence[Function]) -> str:
    tools = [
        {"name": f.name, **({"description": f.description} if f.description else {}),
         "parameters": f.parameters}
        for f in functions
    ]  # fmt: skip
    return GENERIC_INSTRUCTIONS.format(tools=json.dumps(tools, ensure_ascii=False, indent=2))


def prepare_messages(
    messages: Sequence[Mapping[str, Any]],
    functions: Sequence[Function] | None,
    native: bool,
    has_system_role: bool = True,
) -> list[dict[str, Any]]:
    """The messages as the template should see them. ``functions``: the tools shown to
    the model (None: none are; earlier calls are still rendered). ``native``: the
    template renders tools itself (else the generic form described above).
    ``has_system_role``: whether the template writes system messages (else the generic
    instructions open the first user message)."""
    names = _call_names(messages)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        msg = dict(m)
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            calls = [_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in
                     enumerate(_list(msg["tool_calls"], f"messages[{i}].tool_calls"))]  # fmt: skip
            if native:
                msg["tool_calls"] = calls
                msg["content"] = msg.get("content") or ""
            else:
                del msg["tool_calls"]
                text = json.dumps({"tool_calls": [
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    for c in calls
                ]}, ensure_ascii=False)  # fmt: skip
                msg["content"] = f"{msg['content']}\n{text}" if msg.get("content") else text
        elif msg.get("role") == "tool":
            call_id = msg.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise ToolSpecError(f"messages[{i}].tool_call_id", "must be a string")
            if "name" not in msg and call_id in names:
                msg["name"] = names[call_id]
            if not native:
                response: dict[str, Any] = {k: msg[k] for k in ("tool_call_id", "name") if k in msg}
                response["content"] = msg.get("content") or ""
                text = json.dumps({"tool_response": response}, ensure_ascii=False)
                msg = {"role": "user", "content": text}
        out.append(msg)
    if functions and not native:
        _add_instructions(out, generic_system_text(functions), has_system_role)
    return out


def _add_instructions(messages: list[dict[str, Any]], text: str, has_system_role: bool) -> None:
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        first["content"] = f"{first.get('content') or ''}\n\n{text}".lstrip()
    elif has_system_role:
        messages.insert(0, {"role": "system", "content": text})
    else:
        user = next((m for m in messages if m.get("role") == "user"), None)
        if user is None:
            messages.insert(0, {"role": "user", "content": text})
        else:
            user["content"] = f"{text}\n\n{user.get('content') or ''}"


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ToolSpecError(where, "must be a list of tool calls")
    return value


def _call(call: Any, where: str) -> dict[str, Any]:
    """An earlier tool call with its arguments parsed (the template writes them)."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ToolSpecError(
            f"{where}.function", 'must be {"name": ..., "arguments": "<JSON text>"}'
        )
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolSpecError(
                f"{where}.function.arguments", f"is not valid JSON ({e.msg} at {e.pos})"
            ) from None
        except RecursionError:
            args = None
        if args is None or _deeper_than(args, MAX_NESTING):
            raise ToolSpecError(
                f"{where}.function.arguments",
                f"is nested more than {MAX_NESTING} levels deep: flatten the arguments",
            )
    return {**call, "function": {**fn, "arguments": args}}


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (the template
    writes them recursively)."""
    level: list[Any] = [value] if isinstance(value, Mapping | list) else []
    for _ in range(limit):
        level = [
            v
            for item in level
            for v in (item.values() if isinstance(item, Mapping) else item)
            if isinstance(v, Mapping | list)
        ]
    return bool(level)


def _call_names(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Function names by call id, from the assistant turns' calls."""
    names: dict[str, str] = {}
    for m in messages:
        for c in m.get("tool_calls") or () if isinstance(m.get("tool_calls"), list) else ():
            fn = c.get("function") if isinstance(c, Mapping) else None
            if isinstance(c, Mapping) and isinstance(fn, Mapping) and isinstance(c.get("id"), str):
                names[c["id"]] = str(fn.get("name"))
    return names

"""Tool calls in a model's output: which syntax a model writes them in, finding them in
its text (streamed or whole), and the grammar that makes it write one.

Each family of chat templates teaches its models one syntax (llama.cpp's
``common/chat.cpp`` keeps the same list); the template's own text says which:

* **mistral** — the template contains ``[TOOL_CALLS]``; a call:
  ``[TOOL_CALLS][{"name": "f", "arguments": {..}}]``, or with ``[ARGS]`` in the template
  (v11 and later) ``[TOOL_CALLS]f[ARGS]{..}``.
* **hermes** — ``<tool_call>`` (Qwen 2.5/3, Hermes 2/3, SmolLM3):
  ``<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>``, repeated for several.
* **llama3** — ``<|python_tag|>``, or ``<|start_header_id|>`` with ``ipython``
  (Llama 3.1-3.3): ``{"name": "f", "parameters": {..}}`` as the whole reply or after
  ``<|python_tag|>``; several joined by ``;``.
* **generic** — none of these, or a template that takes no ``tools``:
  ``{"tool_calls": [{"name": "f", "arguments": {..}}]}`` as the whole reply (what
  :mod:`tool_prompt`'s instructions ask for); ``{"tool_call": {..}}`` and
  ``{"response": "text"}`` are read too.

Reading is lenient where models are (``arguments`` given as a JSON string, a missing
``</tool_call>`` at the very end) and strict where it matters: a call names one of the
request's functions and its arguments are a JSON object, or it is no call. Anything that
is not a well-formed call — a marker followed by prose, broken JSON, an unknown
function, a call cut off by ``max_tokens`` — stays text (the reply's ``content``).

:class:`ToolCallParser` reads a streamed reply piece by piece: text before a call goes
out at once, except what could be the start of a marker (held back, as a stop string
is); a call goes out when it is complete, so a call that turns out malformed is never
half sent. The whole reply is read by the same parser fed once, so a stream's pieces
join up to exactly the non-streamed result.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .tool_spec import Function

__all__ = [
    "SYNTAXES",
    "Call",
    "ToolCallParser",
    "ToolSyntax",
    "join_tool_call_deltas",
    "syntax_for_template",
    "tool_grammar",
]

#: JSON written as json.dumps writes it; llguidance's default would allow free whitespace
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Call:
    """One tool call: the function's name and its arguments as JSON text (OpenAI's
    ``function.arguments``), ``id`` as the syntax's templates want ids."""

    name: str
    arguments: str
    id: str

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class _Invalid(Exception):
    """The text at a marker is not a well-formed call."""


class _Incomplete(Exception):
    """The text at a marker may still become a call: more is needed."""


@dataclass(frozen=True)
class _Block:
    """What a marker began: calls (and for the generic syntax, maybe text instead),
    and how many characters they took."""

    calls: list[tuple[str, str]]
    end: int
    content: str = ""


@dataclass(frozen=True)
class ToolSyntax:
    """One way of writing tool calls. ``markers``: the text that begins a call anywhere
    in the reply; ``leading_json``: a JSON object that is the reply's first non-blank text
    begins one too; ``id_length``: the ids its templates accept (Mistral's check for 9
    letters and digits)."""

    name: str
    markers: tuple[str, ...]
    leading_json: bool
    args_key: str = "arguments"
    id_length: int | None = None
    #: the v11 Mistral form, [TOOL_CALLS]name[ARGS]{...}
    named_args: bool = False
    repeats: bool = True

    def new_id(self) -> str:
        if self.id_length is not None:
            alphabet = string.ascii_letters + string.digits
            return "".join(secrets.choice(alphabet) for _ in range(self.id_length))
        return "call_" + secrets.token_hex(12)

    def parse(self, text: str, final: bool, names: frozenset[str]) -> _Block:
        """The call(s) at the start of ``text`` (which starts with a marker, or with ``{``
        for a leading JSON object); raises :class:`_Incomplete` or :class:`_Invalid`."""
        marker = next((m for m in self.markers if text.startswith(m)), "")
        if self.name == "hermes":
            return _hermes(text, len(marker), final, names)
        if self.name == "mistral":
            return _mistral(text, len(marker), final, names)
        if self.name == "llama3":
            return _llama3(text, len(marker), final, names)
        return _generic(text, final, names)


SYNTAXES = {
    "hermes": ToolSyntax("hermes", ("<tool_call>",), leading_json=False),
    "mistral": ToolSyntax("mistral", ("[TOOL_CALLS]",), leading_json=False, id_length=9),
    "llama3": ToolSyntax(
        "llama3", ("<|python_tag|>",), leading_json=True, args_key="parameters", repeats=False
    ),
    "generic": ToolSyntax("generic", (), leading_json=True, repeats=False),
}


def syntax_for_template(template: str | None, native: bool = True) -> ToolSyntax:
    """The syntax a chat template's models write calls in (the table above); ``native``
    false (the template takes no ``tools``): the generic one."""
    t = template or ""
    if not native:
        return SYNTAXES["generic"]
    if "[TOOL_CALLS]" in t:
        if "[ARGS]" in t:
            return ToolSyntax(
                "mistral", ("[TOOL_CALLS]",), leading_json=False, id_length=9, named_args=True
            )
        return SYNTAXES["mistral"]
    if "<tool_call>" in t:
        return SYNTAXES["hermes"]
    if "<|python_tag|>" in t or ("<|start_header_id|>" in t and "ipython" in t):
        return SYNTAXES["llama3"]
    return SYNTAXES["generic"]


# -- reading calls -------------------------------------------------------------------------


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _skip(text: str, i: int) -> int:
    m = _SPACE.match(text, i)
    return m.end() if m else i


def _json_at(text: str, i: int, final: bool) -> tuple[Any, int]:
    """The JSON value at ``text[i:]`` and where it ends; incomplete while it may grow."""
    if i >= len(text):
        raise _Incomplete if not final else _Invalid
    if text[i] not in "{[":
        raise _Invalid
    try:
        return _DECODER.raw_decode(text, i)
    except json.JSONDecodeError:
        raise (_Invalid if final else _Incomplete) from None


def _call(obj: Any, names: frozenset[str], args_keys: Sequence[str]) -> tuple[str, str]:
    """(name, arguments JSON) of one call object, or :class:`_Invalid`."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        raise _Invalid
    key = next((k for k in args_keys if k in obj), None)
    return str(obj["name"]), _arguments(obj.get(key, {}) if key else {})


def _arguments(args: Any) -> str:
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise _Invalid from None
    if not isinstance(args, dict):
        raise _Invalid
    return json.dumps(args, ensure_ascii=False)


def _hermes(text: str, start: int, final: bool, names: frozenset[str]) -> _Block:
    close = "</tool_call>"
    try:
        obj, end = _json_at(text, _skip(text, start), final)
    except _Incomplete:
        if close in text:
            raise _Invalid from None
        raise
    call = _call(obj, names, ("arguments", "parameters"))
    after = _skip(text, end)
    rest = text[after:]
    if rest.startswith(close):
        return _Block([call], after + len(close))
    if not final and close.startswith(rest):
        raise _Incomplete
    if final and not rest:  # the reply ended before its closing tag
        return _Block([call], len(text))
    raise _Invalid


_MISTRAL_NAME = re.compile(r"([A-Za-z0-9_-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]")


def _mistral_head(text: str) -> bool:
    """Whether ``text`` may still grow into ``name[ARGS]`` or ``name[CALL_ID]id[ARGS]``
    (checked piece by piece: a regex with nested repeats could backtrack for long)."""
    name = _NAME_CHARS.match(text)
    rest = text[name.end() if name else 0 :]
    if rest.startswith("[CALL_ID]"):
        after = _ID_CHARS.match(rest, len("[CALL_ID]"))
        rest = rest[after.end() if after else len("[CALL_ID]") :]
    elif "[CALL_ID]".startswith(rest):
        return True
    return "[ARGS]".startswith(rest)


_NAME_CHARS = re.compile(r"[A-Za-z0-9_-]*")
_ID_CHARS = re.compile(r"[A-Za-z0-9]*")


def _mistral(text: str, start: int, final: bool, names: frozenset[str]) -> _Block:
    i = _skip(text, start)
    if i < len(text) and text[i] != "[":  # v11: name[ARGS]{...}
        m = _MISTRAL_NAME.match(text, i)
        if m is None:
            if not final and _mistral_head(text[i:]):
                raise _Incomplete
            raise _Invalid
        if m.group(1) not in names:
            raise _Invalid
        args, end = _json_at(text, m.end(), final)
        return _Block([(m.group(1), _arguments(args))], end)
    calls, end = _json_at(text, i, final)
    if not isinstance(calls, list) or not calls:
        raise _Invalid
    return _Block([_call(c, names, ("arguments",)) for c in calls], end)


def _llama3(text: str, start: int, final: bool, names: frozenset[str]) -> _Block:
    calls = []
    i = _skip(text, start)
    while True:
        obj, end = _json_at(text, i, final)
        calls.append(_call(obj, names, ("parameters", "arguments")))
        after = _skip(text, end)
        if after < len(text) and text[after] == ";":
            i = _skip(text, after + 1)
            if i >= len(text) and final:
                return _Block(calls, len(text))
            continue
        if after >= len(text) and not final:
            raise _Incomplete  # a ';' and another call may follow
        return _Block(calls, end)


def _generic(text: str, final: bool, names: frozenset[str]) -> _Block:
    obj, end = _json_at(text, _skip(text, 0), final)
    if not isinstance(obj, dict):
        raise _Invalid
    if isinstance(obj.get("tool_calls"), list) and obj["tool_calls"]:
        return _Block([_call(c, names, ("arguments",)) for c in obj["tool_calls"]], end)
    if "tool_call" in obj:
        return _Block([_call(obj["tool_call"], names, ("arguments",))], end)
    if isinstance(obj.get("response"), str) and len(obj) == 1:
        return _Block([], end, obj["response"])
    raise _Invalid


# -- the parser ------------------------------------------------------------------------------


@dataclass
class ToolCallParser:
    """Reads a reply as it streams: :meth:`feed` a piece of text, get back the text
    that may be sent as content now and the calls that are complete; :meth:`finish`
    at the end returns the rest."""

    syntax: ToolSyntax
    names: frozenset[str]
    _pending: str = ""
    _at_start: bool = True
    _in_call: bool = False
    _done: bool = False  # a syntax that allows one block has had it: the rest is text
    calls: list[Call] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[Call]]:
        self._pending += text
        return self._advance(final=False)

    def finish(self) -> tuple[str, list[Call]]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> tuple[str, list[Call]]:
        out: list[str] = []
        new: list[Call] = []
        while True:
            if self._in_call:
                try:
                    block = self.syntax.parse(self._pending, final, self.names)
                except _Incomplete:
                    break
                except _Invalid:
                    # not a call: its first character is text, and the search goes on after it
                    out.append(self._pending[0])
                    self._pending = self._pending[1:]
                    self._in_call = False
                    continue
                for name, args in block.calls:
                    new.append(Call(name, args, self.syntax.new_id()))
                out.append(block.content)
                self._pending = self._pending[block.end :]
                self._in_call = False
                self._done = not self.syntax.repeats
                continue
            if self._done:
                out.append(self._pending)
                self._pending = ""
                break
            start, keep = self._find_start(final)
            if start is None:
                cut = len(self._pending) - keep
                out.append(self._pending[:cut])
                self._pending = self._pending[cut:]
                break
            out.append(self._pending[:start])
            self._pending = self._pending[start:]
            self._in_call = True
        if final:
            out.append(self._pending)
            self._pending = ""
        self.calls.extend(new)
        return "".join(out), new

    def _find_start(self, final: bool) -> tuple[int | None, int]:
        """Where a call begins in the pending text, or None and how many characters at
        its end must be held back (they may begin a marker)."""
        text = self._pending
        if self._at_start and self.syntax.leading_json:
            lead = _skip(text, 0)
            if lead == len(text) and not final:
                return None, len(text)  # blank so far: the reply may still begin with JSON
            if lead < len(text):
                self._at_start = False
                if text[lead] == "{":
                    return 0, 0  # the blanks before it go with the call
        elif text.strip():
            self._at_start = False
        found = [i for i in (text.find(m) for m in self.syntax.markers) if i >= 0]
        if found:
            return min(found), 0
        keep = 0
        for m in self.syntax.markers:
            for n in range(min(len(m) - 1, len(text)), keep, -1):
                if text.endswith(m[:n]):
                    keep = n
                    break
        return None, keep


def join_tool_call_deltas(deltas: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of a streamed reply, joined from its ``delta.tool_calls`` as an
    OpenAI client joins them: by ``index``, the id, type and name given once, the
    arguments in fragments."""
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for d in delta.get("tool_calls") or ():
            call = calls.setdefault(
                d["index"],
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = d.get("id") or call["id"]
            fn = d.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


# -- the grammar of a call ------------------------------------------------------------------


def tool_grammar(
    syntax: ToolSyntax,
    functions: Sequence[Function],
    parallel: bool,
    token: Callable[[str], str],
) -> str:
    """A Lark grammar (llguidance's, with ``%json`` schemas inside) of a reply that is
    nothing but calls of ``functions`` in ``syntax``, each one's arguments valid for its
    ``parameters``; ``parallel``: one call or more, else exactly one. ``token(text)``
    writes a marker as a grammar term (the special token when the vocabulary has one)."""

    def call_schema(f: Function, args_key: str) -> dict[str, Any]:
        """One call's object: the name a constant, the arguments the function's schema."""
        return {
            "type": "object",
            "properties": {"name": {"const": f.name}, args_key: f.parameters},
            "required": ["name", args_key],
            "additionalProperties": False,
        }

    def embedded(schema: dict[str, Any]) -> str:
        return "%json " + json.dumps({"x-guidance": JSON_STYLE, **schema})

    rules: list[str] = []
    names = [f"fn{i}" for i in range(len(functions))]
    alternatives = " | ".join(names)
    if syntax.name == "mistral" and syntax.named_args:
        for rule, f in zip(names, functions, strict=True):
            rules.append(f"{rule}: {json.dumps(f.name)} {token('[ARGS]')} {embedded(f.parameters)}")
        block = f"{token('[TOOL_CALLS]')} call"
        start = f"{block}+" if parallel else block
        return _lark(f"start: {start}", f"call: {alternatives}", *rules)
    if syntax.name == "generic":
        calls = {"anyOf": [call_schema(f, "arguments") for f in functions]}
        reply = {
            "type": "object",
            "properties": {
                "tool_calls": {
                    "type": "array",
                    "items": calls,
                    "minItems": 1,
                    **({} if parallel else {"maxItems": 1}),
                }
            },
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        return _lark(f"start: {embedded(reply)}")
    for rule, f in zip(names, functions, strict=True):
        rules.append(f"{rule}: {embedded(call_schema(f, syntax.args_key))}")
    if syntax.name == "hermes":
        block = f'{token("<tool_call>")} "\\n" call "\\n" {token("</tool_call>")}'
        start = 'block ("\\n" block)*' if parallel else "block"
        return _lark(f"start: {start}", f"block: {block}", f"call: {alternatives}", *rules)
    if syntax.name == "mistral":
        many = ' (", " call)*' if parallel else ""
        start = f'{token("[TOOL_CALLS]")} "[" call{many} "]"'
        return _lark(f"start: {start}", f"call: {alternatives}", *rules)
    # llama3: the reply is the JSON call(s) themselves
    start = 'call ("; " call)*' if parallel else "call"
    return _lark(f"start: {start}", f"call: {alternatives}", *rules)


def _lark(*rules: str) -> str:
    return "%llguidance {}\n" + "\n".join(rules) + "\n"

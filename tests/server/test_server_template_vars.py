"""The chat template's variables as llama-server gives them: ``enable_thinking``
(``--reasoning``), today's ``date_string`` and ``datetime``, ``add_generation_prompt``
and a request's ``chat_template_kwargs``; ``/apply-template`` renders a chat request as
the chat route does (tools, a continued final message)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient

from tensorplug_llm.api import LLM
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

#: writes out each variable the test looks for
TEMPLATE = (
    "[{{ date_string }}|{{ datetime }}|{{ enable_thinking }}|{{ flavour | default('-') }}]"
    "{% if tools is defined and tools %}TOOLS:{{ tools | length }}{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    path: Path = write_tiny_llama(
        tmp_path_factory.mktemp("template_vars") / "t.gguf", "q8_0", 0,
        metadata={"tokenizer.chat_template": TEMPLATE},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=128, warmup=False)
    llm = LLM(llama, n_parallel=1)
    yield llm
    llm.close()
    llama.close()


def _prompt(http: TestClient, **body: object) -> str:
    r = http.post("/apply-template", json={"messages": USER, **body})
    assert r.status_code == 200, r.text
    prompt: str = r.json()["prompt"]
    return prompt


def test_the_template_sees_llama_servers_variables(llm: LLM) -> None:
    http = TestClient(create_app(llm, ServerConfig()))
    today = date.today()
    head = f"[{today.strftime('%d %b %Y')}|{today.strftime('%b %d %Y')}|True|-]"
    assert _prompt(http).endswith(head + "<user>hi<assistant>")
    assert _prompt(http, add_generation_prompt=False).endswith("<user>hi")
    assert "|vanilla]" in _prompt(http, chat_template_kwargs={"flavour": "vanilla"})
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    # a template that does not take tools natively gets them in the first message
    assert '"name": "f"' in _prompt(http, tools=[tool]).split("<user>")[1]
    continued = _prompt(http, messages=[*USER, {"role": "assistant", "content": "Once"}])
    assert continued.endswith("<user>hi<assistant>Once")


def test_reasoning_off_makes_enable_thinking_false(llm: LLM) -> None:
    http = TestClient(create_app(llm, ServerConfig(enable_thinking=False)))
    assert "|False|" in _prompt(http)
    assert "|True|" in _prompt(http, chat_template_kwargs={"enable_thinking": True})


def test_loop_controls_render_as_llama_cpps_jinja_does() -> None:
    """``{% break %}`` and ``{% continue %}`` (Command R7B's template uses them)."""
    from tensorplug_llm.template import render

    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "{{ m['content'] }}{% if m['content'] == 'stop' %}{% break %}{% endif %}{% endfor %}"
    )
    messages = [{"role": r, "content": c} for r, c in
                (("system", "S"), ("user", "a"), ("user", "stop"), ("user", "b"))]  # fmt: skip
    assert render(template, messages) == "astop"


def test_text_plus_an_unset_variable_renders_as_llama_cpps_jinja_does() -> None:
    """firefunction-v2's template adds ``functions``, which llama.cpp never sets, to its
    system text: llama.cpp's engine reads an undefined value (or None) beside a string
    as "", where jinja2 alone refuses the ``+``. Other sums are left as jinja2's."""
    from tensorplug_llm.template import ChatTemplateError, render

    template = (
        "{% set s = 'Functions:' + '\\n' + functions %}{% set s = s + '\\nToday is ' + datetime %}"
        "{{ s }}|{{ none_value + 'x' }}|{{ 'y' + none_value }}"
    )
    out = render(template, USER, context={"datetime": "Nov 29 2026", "none_value": None})
    assert out == "Functions:\n\nToday is Nov 29 2026|x|y"
    with pytest.raises(ChatTemplateError, match="undefined"):
        render("{{ 1 + functions }}", USER)


def test_without_jinja_a_chat_with_tools_is_refused(llm: LLM) -> None:
    """As llama-server ``--no-jinja``: its built-in templates render no tools, so a chat
    that brings tools (or a tool_choice other than auto) is a 400 naming the flag."""
    http = TestClient(create_app(llm, ServerConfig(jinja=False)))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for extra, param in (({"tools": [tool]}, "tools"), ({"tool_choice": "none"}, "tool_choice")):
        r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param
        assert "--no-jinja" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1})
    assert r.status_code == 200

"""llama.cpp's built-in chat templates: which one llama.cpp detects in a model's
template when it runs without Jinja (``--no-jinja``), and what serve renders then."""

from __future__ import annotations

import pytest

from tensorplug_llm.builtin_templates import (
    BUILTIN_TEMPLATES,
    detected_name,
    legacy_template,
)
from tensorplug_llm.chat import CHATML_TEMPLATE, GEMMA_TEMPLATE
from tensorplug_llm.template import render


@pytest.mark.parametrize(
    "source,name",
    [
        (CHATML_TEMPLATE, "chatml"),
        ("{{'<|im_start|>'}}{{'<|im_sep|>'}}", "phi4"),
        ("<|im_start|>User:<end_of_utterance>", "smolvlm"),
        (GEMMA_TEMPLATE, "gemma"),
        ("[SYSTEM_PROMPT] {{ s }}[/SYSTEM_PROMPT][INST]", "mistral-v7"),
        ("{{ ' [INST] ' + system_message }}", "mistral-v1"),
        ('[AVAILABLE_TOOLS]{{ "[INST]" }}', "mistral-v3-tekken"),
        ("[INST] <<SYS>>", "llama2-sys"),
        ("[INST] {{ content.strip() }}", "llama2-sys-strip"),
        ("<|user|>\n{{ c }}<|end|>\n<|assistant|>", "phi3"),
        ("<|user|>{{ c }}<|endoftext|>", "zephyr"),
        ("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "command-r"),
        ("<|start_header_id|>user<|end_header_id|>", "llama3"),
        ("<|start_of_role|>user<|end_of_role|>", "granite"),
        ("llama3", "llama3"),  # a template that is a name is that name
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", None),
    ],
)
def test_the_detected_template_is_llama_cpps(source: str, name: str | None) -> None:
    """The markers llama.cpp's ``llm_chat_detect_template`` tests, in its order."""
    assert detected_name(source) == name


def test_no_jinja_renders_with_the_built_in_llama_cpp_detects() -> None:
    """``--no-jinja`` on a model whose template llama.cpp reads as ChatML renders with
    llama.cpp's ChatML (no default system prompt of the model's own template); a
    template llama.cpp knows but tensorplug does not have, or none, keeps the model's."""
    own = (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are SmolLM."
        "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    )
    template, said = legacy_template(own)
    assert template == BUILTIN_TEMPLATES["chatml"] and "chatml" in said
    chat = [{"role": "user", "content": "Hi"}]
    assert render(template, chat) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(own, chat).startswith("<|im_start|>system\nYou are SmolLM.")
    kept, why = legacy_template("<|start_of_role|>user<|end_of_role|>")
    assert kept is None and "'granite'" in why and "does not have" in why
    assert legacy_template("{{ messages }}")[0] is None
    assert legacy_template(None)[0] is None and legacy_template(3)[0] is None

"""llama.cpp's built-in chat templates by name (``--chat-template chatml``), as Jinja.

llama.cpp writes these conversations in C++ (``src/llama-chat.cpp``); here each one
tensorplug has is a Jinja template that renders the same text, so a named template goes
the one way every template goes (:mod:`.template`: message text kept apart from the
markup, tools, a continued final message). ChatML and Gemma are the chat's templates
(Gemma's without its ``bos_token``: llama.cpp's C++ writes none, the tokenizer adds BOS
where the model wants one); the others are written here. A name llama.cpp has and
tensorplug does not is refused naming the ones it has.
"""

from __future__ import annotations

from .chat import CHATML_TEMPLATE, GEMMA_TEMPLATE

__all__ = ["BUILTIN_TEMPLATES", "LLAMA_CPP_TEMPLATE_NAMES", "builtin_template"]


def _turns(head: dict[str, str], tail: str, reply: str, trim: bool = False) -> str:
    """A template that writes each message as ``head[role] + content + tail`` and ends
    with ``reply`` for the model's turn."""
    content = "m['content'] | trim" if trim else "m['content']"
    heads = "".join(
        f"{'{% if' if i == 0 else '{% elif'} m['role'] == '{role}' %}}{text}"
        for i, (role, text) in enumerate(head.items())
    )
    return (
        f"{{% for m in messages %}}{heads}{{% endif %}}{{{{ {content} }}}}{tail}{{% endfor %}}"
        f"{{% if add_generation_prompt %}}{reply}{{% endif %}}"
    )


_LLAMA3 = _turns(
    {r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")},
    "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n", trim=True,
)  # fmt: skip
_COMMAND_R = _turns(
    {r: f"<|START_OF_TURN_TOKEN|><|{t}_TOKEN|>" for r, t in
     (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))},
    "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", trim=True,
)  # fmt: skip
_PHI3 = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_ZEPHYR = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_MISTRAL_V7 = (
    "{% for m in messages %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT] {{ m['content'] }}"
    "[/SYSTEM_PROMPT]{% elif m['role'] == 'user' %}[INST] {{ m['content'] }}[/INST]"
    "{% else %} {{ m['content'] }}</s>{% endif %}{% endfor %}"
)

#: llama.cpp's template names tensorplug has, with their Jinja
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": CHATML_TEMPLATE,
    "llama3": _LLAMA3,
    "gemma": GEMMA_TEMPLATE.removeprefix("{{ bos_token }}"),
    "command-r": _COMMAND_R,
    "phi3": _PHI3,
    "zephyr": _ZEPHYR,
    "mistral-v7": _MISTRAL_V7,
}

#: every name llama.cpp's ``--chat-template`` takes (``llama_chat_builtin_templates``)
LLAMA_CPP_TEMPLATE_NAMES = (
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1",
    "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4",
    "falcon3", "zephyr", "monarch", "gemma", "orion", "openchat", "vicuna", "vicuna-orca",
    "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r", "llama3", "chatglm3",
    "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world",
    "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing",
    "bailing-think", "bailing2", "llama4", "smolvlm", "hunyuan-moe", "gpt-oss",
    "hunyuan-dense", "hunyuan-vl", "kimi-k2", "seed_oss", "grok-2",
)  # fmt: skip


class UnsupportedTemplateName(ValueError):
    """A name of llama.cpp's built-in templates that tensorplug has no Jinja for."""


def builtin_template(name: str) -> str | None:
    """The Jinja of llama.cpp's built-in template ``name``; None for a name llama.cpp
    does not have; :class:`UnsupportedTemplateName` for one it has and tensorplug lacks."""
    if name in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[name]
    if name in LLAMA_CPP_TEMPLATE_NAMES:
        raise UnsupportedTemplateName(
            f"llama.cpp's built-in chat template {name!r} is not one tensorplug has (it has "
            f"{', '.join(BUILTIN_TEMPLATES)}): give the model's Jinja template instead "
            "(--chat-template-file FILE)"
        )
    return None

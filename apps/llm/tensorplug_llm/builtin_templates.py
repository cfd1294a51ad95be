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

__all__ = [
    "BUILTIN_TEMPLATES",
    "LLAMA_CPP_TEMPLATE_NAMES",
    "builtin_template",
    "detected_name",
    "legacy_template",
]


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


#: llm_chat_detect_template's later tests, in its order: a name and the markers that
#: must all be in the template (a test of "a or b" is two rows)
_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("glmedge", ("<|{{ item['role'] }}|>", "<|begin_of_image|>")),
    ("zephyr", ("<|user|>", "<|endoftext|>")),
    ("monarch", ("bos_token + message['role']",)),
    ("gemma", ("<start_of_turn>",)),
    ("orion", ("'\\n\\nAssistant: ' + eos_token",)),
    ("openchat", ("GPT4 Correct ",)),
    ("vicuna-orca", ("USER: ", "ASSISTANT: ", "SYSTEM: ")),
    ("vicuna", ("USER: ", "ASSISTANT: ")),
    ("deepseek", ("### Instruction:", "<|EOT|>")),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>")),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>")),
    ("chatglm3", ("[gMASK]sop",)),
    ("minicpm", ("<用户>",)),
    ("deepseek2", ("'Assistant: ' + message['content'] + eos_token",)),
    ("deepseek3", ("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>")),
    ("exaone4", ("[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]")),
    ("exaone3", ("[|system|]", "[|assistant|]", "[|endofturn|]")),
    ("rwkv-world", ("rwkv-world",)),
    ("rwkv-world", ("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",)),
    # granite: with tools (either marker) 4.0 where it names g4's system message
    ("granite-4.0", ("<|start_of_role|>", "<tool_call>", "g4_default_system_message")),
    ("granite-4.0", ("<|start_of_role|>", "<tools>", "g4_default_system_message")),
    ("granite-4.1", ("<|start_of_role|>", "<tool_call>")),
    ("granite-4.1", ("<|start_of_role|>", "<tools>")),
    ("granite", ("<|start_of_role|>",)),
    ("gigachat", ("message['role'] + additional_special_tokens[0] + message['content'] + "
                  "additional_special_tokens[1]",)),
    ("megrez", ("<|role_start|>",)),
    ("yandex", (" Ассистент:",)),
    ("bailing", ("<role>ASSISTANT</role>", "'HUMAN'")),
    ("bailing-think", ("<role>ASSISTANT</role>", '"HUMAN"', "<think>")),
    ("bailing2", ("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>")),
    ("llama4", ("<|header_start|>", "<|header_end|>")),
    ("dots1", ("<|endofuserprompt|>",)),
    ("hunyuan-moe", ("<|extra_0|>", "<|extra_4|>")),
    ("gpt-oss", ("<|start|>", "<|channel|>")),
    ("hunyuan-vl", ("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>")),
    ("hunyuan-dense", ("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>")),
    ("kimi-k2", ("<|im_assistant|>assistant<|im_middle|>",)),
    ("seed_oss", ("<seed:bos>",)),
    ("grok-2", ("'Assistant: '  + message['content'] + '<|separator|>",)),
    ("pangu-embedded", ("[unused9]系统：[unused10]",)),
    ("solar-open", ("<|begin|>", "<|end|>", "<|content|>")),
)  # fmt: skip


def detected_name(source: str) -> str | None:
    """The built-in template llama.cpp writes a conversation with when it runs without
    Jinja (llama-server's ``--no-jinja``): the name ``source`` is, or the one
    ``llm_chat_detect_template`` finds by the markers in it (the same tests, in the
    same order); None where it finds none (llama-server then refuses chat requests)."""
    if source in LLAMA_CPP_TEMPLATE_NAMES:
        return source

    def has(*markers: str) -> bool:
        return all(m in source for m in markers)

    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else "smolvlm" if has("<end_of_utterance>") else "chatml"
    if source.startswith("mistral") or has("[INST]"):
        if has("[SYSTEM_PROMPT]"):
            return "mistral-v7"
        if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
            if has(" [INST]"):
                return "mistral-v1"
            return "mistral-v3-tekken" if has('"[INST]"') else "mistral-v3"
        if has("content.strip()"):
            return "llama2-sys-strip"
        if has("bos_token + '[INST]"):
            return "llama2-sys-bos"
        return "llama2-sys" if has("<<SYS>>") else "llama2"
    rules: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("phi3", ("<|assistant|>", "<|end|>")),
        ("chatglm4", ("[gMASK]<sop>",)),
    )
    for name, markers in rules:
        if has(*markers):
            return name
    if has("<|assistant|>", "<|user|>"):
        if has("<|tool_declare|>"):
            return "exaone-moe"
        return "falcon3" if has("</s>") else "glmedge"
    # the rest, each name's markers all present, first match wins
    for name, markers in _MARKERS:
        if has(*markers):
            return name
    return None


def legacy_template(source: object) -> tuple[str | None, str]:
    """The template serve renders with under ``--no-jinja``, and what to tell the user:
    the Jinja of the built-in template llama.cpp would detect in the model's ``source``
    (:func:`detected_name`) where tensorplug has it; else None (the model's own template
    stays) with the reason."""
    if not isinstance(source, str):
        return None, "the model has no chat template: --no-jinja changes nothing"
    name = detected_name(source)
    if name is None:
        return None, (
            "llama.cpp finds no built-in template in the model's chat template (llama-server "
            "--no-jinja would refuse chats): its Jinja template is used"
        )
    if name not in BUILTIN_TEMPLATES:
        return None, (
            f"the model's chat template is llama.cpp's built-in {name!r}, which tensorplug "
            f"does not have (it has {', '.join(BUILTIN_TEMPLATES)}): its Jinja template is used"
        )
    return BUILTIN_TEMPLATES[name], f"chat template: llama.cpp's built-in {name!r} (--no-jinja)"

"""Chat formats by name, as llama-cpp-python registers them (``chat_format="chatml"``).

::

    prompt, stop, added_special = format_chat("chatml", messages)
    name = default_chat_format(metadata)            # what chat_format=None means
    prompt, stop, added_special = format_chat(name, messages, templates=template_choices(metadata),
                                              bos_token=bos, eos_token=eos)

Each plain-text format writes exactly the prompt llama-cpp-python's formatter writes for
the same messages, quirks included, because a program tuned on one must read the same
on the other: roles a format does not know are dropped (``alpaca`` drops system
messages, ``saiga`` assistant ones, ``open-orca`` every message, its roles being
capitalised), ``intel`` writes its system template unfilled, ``snoozy`` leaves out its
``### Instruction:`` header. ``stop`` is the format's stop strings (None: none);
``added_special`` says whether the prompt already holds the special tokens the
tokenizer would add (BOS), as a model's own Jinja template does.

The model file's templates (``tokenizer.chat_template`` and ``tokenizer.chat_template.NAME``)
are formats too, named ``chat_template.default`` and ``chat_template.NAME`` as
llama-cpp-python names them, rendered by :mod:`..template`. llama-cpp-python's
function-calling handlers (``functionary*``, ``chatml-function-calling``) are not chat
formats here: tools go through the model's own template.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from tensorplug.errors import InvalidArgumentError

from ..template import render

__all__ = [
    "CHATML_CHAT_TEMPLATE",
    "LLAMA3_INSTRUCT_CHAT_TEMPLATE",
    "MISTRAL_INSTRUCT_CHAT_TEMPLATE",
    "MIXTRAL_INSTRUCT_CHAT_TEMPLATE",
    "ChatPrompt",
    "LlamaChatCompletionHandlerNotFoundException",
    "chat_format_names",
    "default_chat_format",
    "format_chat",
    "guess_chat_format_from_gguf_metadata",
    "template_choices",
]

Message = Mapping[str, Any]


class ChatPrompt(NamedTuple):
    """A conversation written out for a completion."""

    prompt: str
    stop: list[str] | None
    added_special: bool


class LlamaChatCompletionHandlerNotFoundException(InvalidArgumentError):
    """No chat format has that name (llama-cpp-python's exception, a ``ValueError`` here)."""


#: llama-cpp-python's handlers that call functions rather than format text
FUNCTION_CALLING_HANDLERS = ("functionary", "functionary-v1", "functionary-v2",
                             "chatml-function-calling")  # fmt: skip

_FORMATS: dict[str, Callable[[Sequence[Message]], ChatPrompt]] = {}


def chat_format_names() -> tuple[str, ...]:
    """The built-in formats' names, in llama-cpp-python's order of registration."""
    return tuple(_FORMATS)


def format_chat(
    chat_format: str,
    messages: Sequence[Message],
    *,
    templates: Mapping[str, str] | None = None,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
) -> ChatPrompt:
    """``messages`` written in ``chat_format``: one of ``templates`` (the model file's,
    from :func:`template_choices`: looked up first, as llama-cpp-python does), rendered
    with ``bos_token``, ``eos_token`` and ``tools``, or a built-in format. An unknown
    name raises :class:`LlamaChatCompletionHandlerNotFoundException` listing the known."""
    templates = templates or {}
    if not isinstance(chat_format, str):
        raise InvalidArgumentError(f"chat_format must be a name (str), got {chat_format!r}")
    _check_messages(messages)
    if chat_format in templates:
        prompt = render(templates[chat_format], [dict(m) for m in messages], bos_token,
                        eos_token, tools=tools)  # fmt: skip
        return ChatPrompt(prompt, [eos_token], True)
    formatter = _FORMATS.get(chat_format)
    if formatter is not None:
        return formatter(messages)
    known = [*templates, *_FORMATS]
    if chat_format in FUNCTION_CALLING_HANDLERS:
        raise LlamaChatCompletionHandlerNotFoundException(
            f"chat_format {chat_format!r} is llama-cpp-python's function-calling handler, which "
            "tensorplug does not have: pass tools= with the model's own chat template "
            f"(chat_format=None), or use one of the chat formats {known}"
        )
    raise LlamaChatCompletionHandlerNotFoundException(
        f"Invalid chat handler: {chat_format} (valid formats: {known})"
    )


def template_choices(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The model file's chat templates by format name: ``tokenizer.chat_template.NAME`` as
    ``chat_template.NAME``, ``tokenizer.chat_template`` as ``chat_template.default``."""
    choices = {
        key[len("tokenizer.") :]: value
        for key, value in metadata.items()
        if key.startswith("tokenizer.chat_template.") and isinstance(value, str)
    }
    default = metadata.get("tokenizer.chat_template")
    if isinstance(default, str):
        choices["chat_template.default"] = default
    return choices


def guess_chat_format_from_gguf_metadata(metadata: Mapping[str, Any]) -> str | None:
    """The built-in format whose template the file's is, character for character
    (``chatml``, ``mistral-instruct``, ``llama-3``); None for any other template."""
    template = metadata.get("tokenizer.chat_template")
    if template is None:
        return None
    if template == CHATML_CHAT_TEMPLATE:
        return "chatml"
    if template in (MISTRAL_INSTRUCT_CHAT_TEMPLATE, MIXTRAL_INSTRUCT_CHAT_TEMPLATE):
        return "mistral-instruct"
    if template == LLAMA3_INSTRUCT_CHAT_TEMPLATE:
        return "llama-3"
    return None


def default_chat_format(metadata: Mapping[str, Any]) -> str:
    """What ``chat_format=None`` means for a model with this metadata, by
    llama-cpp-python's rule: the built-in format its template is a copy of, else the
    template itself (``chat_template.default``), else ``llama-2`` for a file without one."""
    if not isinstance(metadata.get("tokenizer.chat_template"), str):
        return "llama-2"
    return guess_chat_format_from_gguf_metadata(metadata) or "chat_template.default"


# -- the messages, read as llama-cpp-python's formatters read them ------------------------


def _check_messages(messages: Sequence[Message]) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError(
            f"messages must be a list of {{'role': ..., 'content': ...}}, got "
            f"{type(messages).__name__}"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidArgumentError(
                f"messages[{i}] must be an object with a 'role' (str), got {m!r:.80}"
            )


def _text(messages: Sequence[Message], i: int) -> str | None:
    """Message ``i``'s content where it is text, else None (parts lists, tool calls)."""
    content = messages[i].get("content")
    return content if isinstance(content, str) else None


def _system_message(messages: Sequence[Message]) -> str:
    """The first system message's content ("" when there is none)."""
    for i, m in enumerate(messages):
        if m["role"] == "system":
            content = m.get("content")
            if content is not None and not isinstance(content, str):
                raise InvalidArgumentError(
                    f"messages[{i}]: a system message's content must be text for this chat "
                    f"format, got {type(content).__name__}"
                )
            return content or ""
    return ""


def _map_roles(
    messages: Sequence[Message], role_map: Mapping[str, str]
) -> list[tuple[str, str | None]]:
    """The messages whose role the format knows, as (its role text, content or None)."""
    return [
        (role_map[m["role"]], _text(messages, i))
        for i, m in enumerate(messages)
        if m["role"] in role_map
    ]


Turns = list[tuple[str, str | None]]


def _llama2(system: str, turns: Turns, sep: str, sep2: str) -> str:
    seps = [sep, sep2]
    out = system + sep
    for i, (role, message) in enumerate(turns):
        if system and i == 0:
            out += (message or "") + seps[i % 2]
        elif message:
            out += role + message + " " + seps[i % 2]
        else:
            out += role + " "
    return out


def _add_colon_single(system: str, turns: Turns, sep: str) -> str:
    out = system + sep
    for role, message in turns:
        out += role + ": " + message + sep if message else role + ":"
    return out


def _add_colon_two(system: str, turns: Turns, sep: str, sep2: str) -> str:
    seps = [sep, sep2]
    out = system + seps[0]
    for i, (role, message) in enumerate(turns):
        out += role + ": " + message + seps[i % 2] if message else role + ":"
    return out


def _no_colon_single(system: str, turns: Turns, sep: str) -> str:
    out = system
    for role, message in turns:
        out += role + message + sep if message else role
    return out


def _add_colon_space_single(system: str, turns: Turns, sep: str) -> str:
    out = system + sep
    for role, message in turns:
        out += role + ": " + message + sep if message else role + ": "
    return out


def _chatml(system: str, turns: Turns, sep: str) -> str:
    out = "" if system == "" else system + sep + "\n"
    for role, message in turns:
        out += role + "\n" + message + sep + "\n" if message else role + "\n"
    return out


def _chatglm3(system: str, turns: Turns) -> str:
    out = system
    for role, message in turns:
        out += role + "\n" + " " + message if message else role
    return out


def _register(name: str) -> Callable[[Callable[[Sequence[Message]], ChatPrompt]], Any]:
    def add(f: Callable[[Sequence[Message]], ChatPrompt]) -> Any:
        _FORMATS[name] = f
        return f

    return add


def _prompt(prompt: str, stop: str | None = None) -> ChatPrompt:
    return ChatPrompt(prompt, None if stop is None else [stop], False)


def _reply(messages: Sequence[Message], roles: Mapping[str, str], assistant: str) -> Turns:
    """The known turns, then the assistant's, open."""
    return [*_map_roles(messages, roles), (assistant, None)]


# -- the formats, in llama-cpp-python's order ----------------------------------------------


@_register("llama-2")
def _fmt_llama2(messages: Sequence[Message]) -> ChatPrompt:
    system = _system_message(messages)
    if system:
        system = f"[INST] <<SYS>>\n{system}\n<</SYS>>"
    turns = _map_roles(messages, {"user": "<s>[INST]", "assistant": "[/INST]"})
    return _prompt(_llama2(system, turns, " ", "</s>") + "[/INST]")


@_register("llama-3")
def _fmt_llama3(messages: Sequence[Message]) -> ChatPrompt:
    roles = {
        r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")
    }
    sep = "<|eot_id|>"
    return _prompt(_no_colon_single("", _reply(messages, roles, roles["assistant"]), sep), sep)


@_register("alpaca")
def _fmt_alpaca(messages: Sequence[Message]) -> ChatPrompt:
    system = _system_message(messages)
    turns = _map_roles(messages, {"user": "### Instruction", "assistant": "### Response"})
    return _prompt(_add_colon_two(system, turns, "\n\n", "</s>"))


@_register("qwen")
def _fmt_qwen(messages: Sequence[Message]) -> ChatPrompt:
    system = _system_message(messages) or "You are a helpful assistant."
    roles = {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"}
    turns = _reply(messages, roles, roles["assistant"])
    prompt = _chatml(f"<|im_start|>system\n{system}", turns, "<|im_end|>")
    return _prompt(prompt, "<|endoftext|>")


@_register("vicuna")
def _fmt_vicuna(messages: Sequence[Message]) -> ChatPrompt:
    system = (
        "A chat between a curious user and an artificial intelligence assistant. The "
        "assistant gives helpful, detailed, and polite answers to the user's questions."
    )
    turns = _reply(messages, {"user": "USER", "assistant": "ASSISTANT"}, "ASSISTANT")
    return _prompt(_add_colon_two(system, turns, " ", "</s>"))


@_register("oasst_llama")
def _fmt_oasst_llama(messages: Sequence[Message]) -> ChatPrompt:
    system = f"[INST] <<SYS>>\n{_system_message(messages)}\n<</SYS>>\n\n"
    roles = {"user": "<|prompter|>", "assistant": "<|assistant|>"}
    return _prompt(_no_colon_single(system, _reply(messages, roles, roles["assistant"]), "</s>"))


@_register("baichuan-2")
def _fmt_baichuan2(messages: Sequence[Message]) -> ChatPrompt:
    roles = {"user": "<reserved_106>", "assistant": "<reserved_107>"}
    turns = _reply(messages, roles, roles["assistant"])
    return _prompt(_no_colon_single(_system_message(messages), turns, ""))


@_register("baichuan")
def _fmt_baichuan(messages: Sequence[Message]) -> ChatPrompt:
    roles = {"user": "<reserved_102>", "assistant": "<reserved_103>"}
    turns = _reply(messages, roles, roles["assistant"])
    return _prompt(_no_colon_single(_system_message(messages), turns, ""))


OPENBUDDY_SYSTEM = """You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.
Always answer as helpfully and logically as possible, while being safe. Your answers should not include any harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure that your responses are socially unbiased and positive in nature.
If a question does not make any sense, or is not factually coherent, explain why instead of answering something not correct. If you don't know the answer to a question, please don't share false information.
You can speak fluently in many languages, for example: English, Chinese.
You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.
You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.

"""  # noqa: E501


@_register("openbuddy")
def _fmt_openbuddy(messages: Sequence[Message]) -> ChatPrompt:
    turns = _reply(messages, {"user": "User", "assistant": "Assistant"}, "Assistant")
    return _prompt(_add_colon_single(OPENBUDDY_SYSTEM, turns, "\n"))


@_register("redpajama-incite")
def _fmt_redpajama_incite(messages: Sequence[Message]) -> ChatPrompt:
    turns = _reply(messages, {"user": "<human>", "assistant": "<bot>"}, "<bot>")
    return _prompt(_add_colon_single(_system_message(messages), turns, "\n"), "<human>")


@_register("snoozy")
def _fmt_snoozy(messages: Sequence[Message]) -> ChatPrompt:
    system = _system_message(messages) or (
        "The prompt below is a question to answer, a task to complete, or a conversation "
        "to respond to; decide which and write an appropriate response."
    )
    turns = _reply(messages, {"user": "### Prompt", "assistant": "### Response"}, "### Response")
    return _prompt(_add_colon_single(system, turns, "\n"), "###")


@_register("phind")
def _fmt_phind(messages: Sequence[Message]) -> ChatPrompt:
    system = "### System Prompt\nYou are an intelligent programming assistant."
    roles = {"user": "### User Message", "assistant": "### Assistant"}
    return _prompt(_add_colon_single(system, _reply(messages, roles, roles["assistant"]), "\n\n"))


@_register("intel")
def _fmt_intel(messages: Sequence[Message]) -> ChatPrompt:
    system = "### System:\n{system_message}"  # never filled in, in llama-cpp-python either
    roles = {"user": "### User:", "assistant": "### Assistant:"}
    return _prompt(_add_colon_single(system, _reply(messages, roles, roles["assistant"]), "\n"))


@_register("open-orca")
def _fmt_open_orca(messages: Sequence[Message]) -> ChatPrompt:
    system = (
        "You are a helpful assistant. Please answer truthfully and write out your "
        "thinking step by step to be sure you get the right answer. If you make a mistake or "
        "encounter an error in your thinking, say so out loud and attempt to correct it. If "
        "you don't know or aren't sure about something, say so clearly. You will act as a "
        "professional logician, mathematician, and physicist. You will also act as the most "
        "appropriate type of expert to answer any particular question or solve the relevant "
        "problem; state which expert type your are, if so. Also think of any particular named "
        "expert that would be ideal to answer the relevant question or solve the relevant "
        "problem; name and act as them, if appropriate."
    )
    turns = _reply(messages, {"User": "User", "Assistant": "Assistant"}, "Assistant")
    return _prompt(_add_colon_space_single(system, turns, "<|end_of_turn|>\n"), "User")


@_register("mistrallite")
def _fmt_mistrallite(messages: Sequence[Message]) -> ChatPrompt:
    system = f"<|system|>{_system_message(messages)}</s>"
    roles = {"user": "<|prompter|>", "assistant": "</s>\n<|assistant|>"}
    return _prompt(_no_colon_single(system, _reply(messages, roles, roles["assistant"]), " "))


@_register("zephyr")
def _fmt_zephyr(messages: Sequence[Message]) -> ChatPrompt:
    system = f"<|system|>\n{_system_message(messages)}"
    roles = {"user": "<|user|>\n", "assistant": "<|assistant|>\n"}
    return _prompt(_chatml(system, _reply(messages, roles, roles["assistant"]), "</s>"), "</s>")


@_register("pygmalion")
def _fmt_pygmalion(messages: Sequence[Message]) -> ChatPrompt:
    system = f"<|system|>{_system_message(messages)}"
    roles = {"user": "<|user|>", "assistant": "<|model|>"}
    return _prompt(_chatml(system, _reply(messages, roles, roles["assistant"]), "\n"), "\n")


@_register("chatml")
def _fmt_chatml(messages: Sequence[Message]) -> ChatPrompt:
    system = f"<|im_start|>system\n{_system_message(messages)}"
    roles = {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"}
    sep = "<|im_end|>"
    return _prompt(_chatml(system, _reply(messages, roles, roles["assistant"]), sep), sep)


@_register("mistral-instruct")
def _fmt_mistral_instruct(messages: Sequence[Message]) -> ChatPrompt:
    prompt = ""
    for i, m in enumerate(messages):
        content = m.get("content")
        if m["role"] == "user" and isinstance(content, str):
            prompt += "[INST] " + content
        elif m["role"] == "assistant" and content is not None:
            if not isinstance(content, str):
                raise InvalidArgumentError(
                    f"messages[{i}]: an assistant message's content must be text for "
                    f"mistral-instruct, got {type(content).__name__}"
                )
            prompt += " [/INST]" + content + "</s>"
    return _prompt(prompt + " [/INST]", "</s>")


@_register("chatglm3")
def _fmt_chatglm3(messages: Sequence[Message]) -> ChatPrompt:
    system = f"<|system|>\n{_system_message(messages)}"
    roles = {"user": "<|user|>", "assistant": "<|assistant|>"}
    return _prompt(_chatglm3(system, _reply(messages, roles, roles["assistant"])), "</s>")


@_register("openchat")
def _fmt_openchat(messages: Sequence[Message]) -> ChatPrompt:
    system = f"{_system_message(messages)}<|end_of_turn|>"
    roles = {
        "user": "GPT4 Correct User: ",
        "assistant": "<|end_of_turn|>GPT4 Correct Assistant: ",
    }
    sep = "<|end_of_turn|>"
    return _prompt(_chatml(system, _reply(messages, roles, roles["assistant"]), sep), sep)


@_register("saiga")
def _fmt_saiga(messages: Sequence[Message]) -> ChatPrompt:
    prompt = ""
    for role, content in _map_roles(messages, {"user": "user", "bot": "bot", "system": "system"}):
        prompt += f"<s>{role}\n{content}</s>" if content else f"<s>{role}\n"
    return _prompt((prompt + "<s>bot").strip())


@_register("gemma")
def _fmt_gemma(messages: Sequence[Message]) -> ChatPrompt:
    roles = {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"}
    sep = "<end_of_turn>\n"
    return _prompt(_no_colon_single("", _reply(messages, roles, roles["assistant"]), sep), sep)


# -- templates llama-cpp-python recognises in a model file ---------------------------------

# Source: https://huggingface.co/teknium/OpenHermes-2.5-Mistral-7B/blob/main/tokenizer_config.json
CHATML_CHAT_TEMPLATE = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"  # noqa: E501
CHATML_BOS_TOKEN = "<s>"
CHATML_EOS_TOKEN = "<|im_end|>"

# Source: https://huggingface.co/mistralai/Mistral-7B-Instruct-v0.1/blob/main/tokenizer_config.json
MISTRAL_INSTRUCT_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"  # noqa: E501
MISTRAL_INSTRUCT_BOS_TOKEN = "<s>"
MISTRAL_INSTRUCT_EOS_TOKEN = "</s>"

# Source: https://huggingface.co/mistralai/Mixtral-8x7B-Instruct-v0.1/blob/main/tokenizer_config.json
MIXTRAL_INSTRUCT_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"  # noqa: E501

# Source: https://huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct/blob/main/tokenizer_config.json
LLAMA3_INSTRUCT_CHAT_TEMPLATE = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"  # noqa: E501

"""Chat formats by name: each writes, byte for byte, the prompt llama-cpp-python's
formatter of that name writes (expected strings derived from its llama_chat_format.py),
the model file's templates are formats too, and chat_format=None resolves as there."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest

from tensorplug.errors import InvalidArgumentError
from tensorplug_llm.highlevel.chat_formats import (
    CHATML_CHAT_TEMPLATE,
    LLAMA3_INSTRUCT_CHAT_TEMPLATE,
    MISTRAL_INSTRUCT_CHAT_TEMPLATE,
    MIXTRAL_INSTRUCT_CHAT_TEMPLATE,
    ChatPrompt,
    LlamaChatCompletionHandlerNotFoundException,
    chat_format_names,
    default_chat_format,
    format_chat,
    guess_chat_format_from_gguf_metadata,
    template_choices,
)

SYSTEM = {"role": "system", "content": "Be brief."}
HI = {"role": "user", "content": "Hi there"}
HELLO = {"role": "assistant", "content": "Hello!"}
ASK = {"role": "user", "content": "What is 2+2?"}
CONVERSATION = [SYSTEM, HI, HELLO, ASK]

#: llama-cpp-python's output for CONVERSATION, by format, grouped by the helper that
#: writes it there (its _format_* functions)
EXPECTED: list[tuple[str, str, list[str] | None]] = [
    # llama-2: the system message inside the first [INST], which loses its role prefix
    ("llama-2",
     "[INST] <<SYS>>\nBe brief.\n<</SYS>> Hi there [/INST]Hello! </s><s>[INST]What is 2+2?  "
     "[/INST]",
     None),
    # no colon, one separator
    ("llama-3",
     "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
     "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
     "Hello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n",
     ["<|eot_id|>"]),
    ("oasst_llama",
     "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n<|prompter|>Hi there</s><|assistant|>Hello!</s>"
     "<|prompter|>What is 2+2?</s><|assistant|>",
     None),
    ("baichuan-2",
     "Be brief.<reserved_106>Hi there<reserved_107>Hello!<reserved_106>What is 2+2?<reserved_107>",
     None),
    ("baichuan",
     "Be brief.<reserved_102>Hi there<reserved_103>Hello!<reserved_102>What is 2+2?<reserved_103>",
     None),
    ("mistrallite",
     "<|system|>Be brief.</s><|prompter|>Hi there </s>\n<|assistant|>Hello! <|prompter|>"
     "What is 2+2? </s>\n<|assistant|>",
     None),
    ("gemma",
     "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
     "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
     ["<end_of_turn>\n"]),
    # colon, two alternating separators
    ("alpaca",
     "Be brief.\n\n### Instruction: Hi there\n\n### Response: Hello!</s>### Instruction: "
     "What is 2+2?\n\n",
     None),
    ("vicuna",
     "A chat between a curious user and an artificial intelligence assistant. The assistant "
     "gives helpful, detailed, and polite answers to the user's questions. USER: Hi there "
     "ASSISTANT: Hello!</s>USER: What is 2+2? ASSISTANT:",
     None),
    # colon, one separator
    ("redpajama-incite",
     "Be brief.\n<human>: Hi there\n<bot>: Hello!\n<human>: What is 2+2?\n<bot>:",
     ["<human>"]),
    ("snoozy",
     "Be brief.\n### Prompt: Hi there\n### Response: Hello!\n### Prompt: What is 2+2?\n"
     "### Response:",
     ["###"]),
    ("phind",
     "### System Prompt\nYou are an intelligent programming assistant.\n\n### User Message: "
     "Hi there\n\n### Assistant: Hello!\n\n### User Message: What is 2+2?\n\n### Assistant:",
     None),
    ("intel",
     "### System:\n{system_message}\n### User:: Hi there\n### Assistant:: Hello!\n### User:: "
     "What is 2+2?\n### Assistant::",
     None),
    # chatml's layout
    ("chatml",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
     "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
     "<|im_start|>assistant\n",
     ["<|im_end|>"]),
    ("qwen",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
     "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
     "<|im_start|>assistant\n",
     ["<|endoftext|>"]),
    ("zephyr",
     "<|system|>\nBe brief.</s>\n<|user|>\n\nHi there</s>\n<|assistant|>\n\nHello!</s>\n"
     "<|user|>\n\nWhat is 2+2?</s>\n<|assistant|>\n\n",
     ["</s>"]),
    ("pygmalion",
     "<|system|>Be brief.\n\n<|user|>\nHi there\n\n<|model|>\nHello!\n\n<|user|>\n"
     "What is 2+2?\n\n<|model|>\n",
     ["\n"]),
    ("openchat",
     "Be brief.<|end_of_turn|><|end_of_turn|>\nGPT4 Correct User: \nHi there<|end_of_turn|>\n"
     "<|end_of_turn|>GPT4 Correct Assistant: \nHello!<|end_of_turn|>\nGPT4 Correct User: \n"
     "What is 2+2?<|end_of_turn|>\n<|end_of_turn|>GPT4 Correct Assistant: \n",
     ["<|end_of_turn|>"]),
    # formats of their own
    ("chatglm3",
     "<|system|>\nBe brief.<|user|>\n Hi there<|assistant|>\n Hello!<|user|>\n What is 2+2?"
     "<|assistant|>",
     ["</s>"]),
    ("mistral-instruct",
     "[INST] Hi there [/INST]Hello!</s>[INST] What is 2+2? [/INST]",
     ["</s>"]),
    ("saiga",  # knows "bot", not "assistant": the reply is dropped
     "<s>system\nBe brief.</s><s>user\nHi there</s><s>user\nWhat is 2+2?</s><s>bot",
     None),
]  # fmt: skip

#: the two formats with long fixed system prompts: the prompt's sha256, and its end
LONG: list[tuple[str, str, str, list[str] | None]] = [
    ("openbuddy", "5d8a03da9b03a5cfded7aaf72e6d7136443266110b6a2db69bed6404badb15c4",
     "not related to GPT or OpenAI.\n\n\nUser: Hi there\nAssistant: Hello!\nUser: "
     "What is 2+2?\nAssistant:", None),
    # roles matched case-sensitively against "User"/"Assistant": every message is dropped
    ("open-orca", "f418892020cfa2c4a037ca7e3b0d2fe3f3812b9a03ebdaa7a62d7861d9fde297",
     "name and act as them, if appropriate.<|end_of_turn|>\nAssistant: ", ["User"]),
]  # fmt: skip

#: every name llama-cpp-python registers, plain formats then function-calling handlers
LLAMA_CPP_PYTHON_NAMES = [
    "llama-2", "llama-3", "alpaca", "qwen", "vicuna", "oasst_llama", "baichuan-2", "baichuan",
    "openbuddy", "redpajama-incite", "snoozy", "phind", "intel", "open-orca", "mistrallite",
    "zephyr", "pygmalion", "chatml", "mistral-instruct", "chatglm3", "openchat", "saiga",
    "gemma", "functionary", "functionary-v1", "functionary-v2", "chatml-function-calling",
]  # fmt: skip


@pytest.mark.parametrize(("name", "prompt", "stop"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_each_format_writes_llama_cpp_pythons_prompt(
    name: str, prompt: str, stop: list[str] | None
) -> None:
    assert format_chat(name, CONVERSATION) == ChatPrompt(prompt, stop, False)


@pytest.mark.parametrize(("name", "digest", "tail", "stop"), LONG, ids=[e[0] for e in LONG])
def test_formats_with_long_system_prompts_write_it_exactly(
    name: str, digest: str, tail: str, stop: list[str] | None
) -> None:
    got = format_chat(name, CONVERSATION)
    assert got.prompt.endswith(tail) and got.stop == stop and not got.added_special
    assert hashlib.sha256(got.prompt.encode()).hexdigest() == digest


@pytest.mark.parametrize(
    ("name", "messages", "prompt"),
    [
        ("llama-2", [HI], " <s>[INST]Hi there  [/INST]"),  # no system: the role stays
        ("qwen", [HI], "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
         "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
        ("snoozy", [HI], "The prompt below is a question to answer, a task to complete, or a "
         "conversation to respond to; decide which and write an appropriate response.\n"
         "### Prompt: Hi there\n### Response:"),
        ("alpaca", [HI, HELLO, SYSTEM],  # the first system message, wherever it is
         "Be brief.\n\n### Instruction: Hi there\n\n### Response: Hello!</s>"),
        ("chatml", [{"role": "user", "content": [{"type": "text", "text": "x"}]}, ASK],
         "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_start|>user\nWhat is 2+2?"
         "<|im_end|>\n<|im_start|>assistant\n"),  # parts lists count as empty turns
        ("mistral-instruct", [HI, {"role": "assistant", "content": None}],
         "[INST] Hi there [/INST]"),
    ],
)  # fmt: skip
def test_defaults_and_quirks_are_llama_cpp_pythons(
    name: str, messages: list[dict[str, Any]], prompt: str
) -> None:
    assert format_chat(name, messages).prompt == prompt


def test_every_name_llama_cpp_python_registers_is_known_or_refused_clearly() -> None:
    known = chat_format_names()
    assert len(known) == 23
    assert list(known) == LLAMA_CPP_PYTHON_NAMES[:23]  # in its order of registration
    for name in known:
        assert format_chat(name, [HI]).prompt
    for name in LLAMA_CPP_PYTHON_NAMES[23:]:  # the function-calling handlers
        with pytest.raises(LlamaChatCompletionHandlerNotFoundException) as err:
            format_chat(name, [HI])
        assert "function-calling" in str(err.value) and "'chatml'" in str(err.value)


def test_an_unknown_name_lists_the_valid_ones_as_llama_cpp_python_does() -> None:
    with pytest.raises(LlamaChatCompletionHandlerNotFoundException) as err:
        format_chat("chatlm", [HI], templates={"chat_template.default": CHATML_CHAT_TEMPLATE})
    assert isinstance(err.value, ValueError)
    assert str(err.value).startswith(
        "Invalid chat handler: chatlm (valid formats: ['chat_template.default', 'llama-2', "
    )


def test_the_model_files_templates_are_formats_rendered_with_its_tokens() -> None:
    templates = template_choices(
        {
            "tokenizer.chat_template": CHATML_CHAT_TEMPLATE,
            "tokenizer.chat_template.rag": "{{ bos_token }}{{ messages[-1]['content'] }}",
            "tokenizer.ggml.model": "gpt2",
        }
    )
    assert list(templates) == ["chat_template.rag", "chat_template.default"]
    got = format_chat(
        "chat_template.default", [HI], templates=templates, bos_token="<s>", eos_token="</s>"
    )
    assert got == ChatPrompt(
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", ["</s>"], True
    )
    rag = format_chat("chat_template.rag", [HI], templates=templates, bos_token="<s>")
    assert rag == ChatPrompt("<s>Hi there", [""], True)


@pytest.mark.parametrize(
    ("template", "guess", "default"),
    [
        (CHATML_CHAT_TEMPLATE, "chatml", "chatml"),
        (MISTRAL_INSTRUCT_CHAT_TEMPLATE, "mistral-instruct", "mistral-instruct"),
        (MIXTRAL_INSTRUCT_CHAT_TEMPLATE, "mistral-instruct", "mistral-instruct"),
        (LLAMA3_INSTRUCT_CHAT_TEMPLATE, "llama-3", "llama-3"),
        (CHATML_CHAT_TEMPLATE + " ", None, "chat_template.default"),  # exact copies only
        (None, None, "llama-2"),  # no template at all
    ],
)
def test_chat_format_none_resolves_as_in_llama_cpp_python(
    template: str | None, guess: str | None, default: str
) -> None:
    metadata = {} if template is None else {"tokenizer.chat_template": template}
    assert guess_chat_format_from_gguf_metadata(metadata) == guess
    assert default_chat_format(metadata) == default


def test_the_recognised_templates_are_llama_cpp_pythons() -> None:
    assert CHATML_CHAT_TEMPLATE.startswith("{% for message in messages %}{{'<|im_start|>'")
    assert "{{ message['content'] + eos_token + ' ' }}" in MISTRAL_INSTRUCT_CHAT_TEMPLATE
    assert "{{ message['content'] + eos_token}}" in MIXTRAL_INSTRUCT_CHAT_TEMPLATE
    assert "message['content'] | trim + '<|eot_id|>'" in LLAMA3_INSTRUCT_CHAT_TEMPLATE


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ("Hi there", "messages must be a list"),
        ([{"content": "no role"}], "messages[0] must be an object with a 'role'"),
        ([HI, "text"], "messages[1] must be an object"),
        ([{"role": "system", "content": [{"type": "text"}]}, HI], "messages[0]: a system"),
    ],
)
def test_malformed_messages_are_named(messages: Any, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(says)):
        format_chat("chatml", messages)

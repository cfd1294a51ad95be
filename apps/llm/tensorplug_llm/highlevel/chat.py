"""``Llama.create_chat_completion``: llama-cpp-python's arguments onto the server's chat
layer.

The conversation is rendered by the named ``chat_format`` when one was given
(:mod:`.chat_formats`: llama-cpp-python's formats byte for byte, and the file's named
templates ``chat_template.NAME``), else by the model file's own Jinja template with
tools and control-token checks, as the server renders it. A model with neither is
refused, naming both ways out: llama-cpp-python falls back to the llama-2 format
there, whose markup such a model has never seen. llama-cpp-python's own spellings are
read too: the legacy ``functions``/``function_call``, and ``response_format``
``{"type": "json_object", "schema": {...}}`` beside OpenAI's ``{"type": "json_schema",
"json_schema": {...}}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .direct import CallOptions
from .session import SampleSettings

if TYPE_CHECKING:
    from ..api import LLM
    from .direct import DirectGenerator
    from .tokenizer import LlamaTokenizer

__all__ = ["answer"]


def answer(
    call: dict[str, Any],
    *,
    layer: LLM,
    generator: DirectGenerator,
    chat_format: str | None,
    metadata: Mapping[str, str],
    tokenizer: LlamaTokenizer,
    seed: int,
) -> dict[str, Any] | Iterator[dict[str, Any]]:
    """The reply to one ``create_chat_completion`` call (its arguments in ``call``),
    answered by the server's chat ``layer`` over the model's own sequence
    (``generator``), with ``seed`` unless the call names one."""
    tools, tool_choice = _legacy_functions(call)
    stop = call["stop"]
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    prompt_ids = None
    if chat_format not in (None, "chat_template.default"):
        from .chat_formats import format_chat, template_choices

        templates = template_choices(metadata)
        formatted = format_chat(chat_format, call["messages"], templates=templates)
        prompt_ids = tokenizer.tokenize(
            formatted.prompt.encode("utf-8"), add_bos=not formatted.added_special, special=True
        )
        stops += _list(formatted.stop)
    elif layer.chat_template is None:
        raise ValueError(
            f"{layer.model_name} has no chat template (tokenizer.chat_template): pass "
            "chat_format='chatml' (or another format name) or a chat_handler to Llama(), "
            "or use create_completion"
        )
    settings = SampleSettings(
        typical_p=call["typical_p"],
        tfs_z=call["tfs_z"],
        mirostat_mode=call["mirostat_mode"],
        mirostat_tau=call["mirostat_tau"],
        mirostat_eta=call["mirostat_eta"],
        logits_processor=call["logits_processor"],
        grammar=call["grammar"],
    )
    max_tokens = call["max_tokens"]
    with generator.options(CallOptions(settings)):
        result = layer.create_chat_completion(
            call["messages"],
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens if max_tokens is not None and max_tokens > 0 else None,
            temperature=call["temperature"],
            top_p=call["top_p"],
            top_k=call["top_k"],
            min_p=call["min_p"],
            stop=stops or None,
            stream=call["stream"],
            logprobs=bool(call["logprobs"]),
            top_logprobs=call["top_logprobs"],
            seed=call["seed"] if call["seed"] is not None else seed,
            response_format=_response_format(call["response_format"]),
            repeat_penalty=call["repeat_penalty"],
            frequency_penalty=call["frequency_penalty"],
            presence_penalty=call["presence_penalty"],
            logit_bias=call["logit_bias"],
            prompt_ids=prompt_ids,
        )
    model = call["model"]
    if isinstance(result, dict):
        if model is not None:
            result["model"] = model
        if generator.ended_uncounted:  # llama-cpp-python's count
            result["usage"]["completion_tokens"] -= 1
            result["usage"]["total_tokens"] -= 1
        return result
    return _named(result, model)


def _named(chunks: Iterator[dict[str, Any]], model: str | None) -> Iterator[dict[str, Any]]:
    for chunk in chunks:
        if model is not None:
            chunk["model"] = model
        yield chunk


def _list(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def _legacy_functions(call: Mapping[str, Any]) -> tuple[Any, Any]:
    """OpenAI's legacy ``functions``/``function_call`` as ``tools``/``tool_choice``."""
    tools, choice = call["tools"], call["tool_choice"]
    if call["functions"] is not None:
        tools = [{"type": "function", "function": f} for f in call["functions"]]
    function_call = call["function_call"]
    if function_call in ("none", "auto"):
        choice = function_call
    elif isinstance(function_call, Mapping) and "name" in function_call:
        choice = {"type": "function", "function": {"name": function_call["name"]}}
    return tools, choice


def _response_format(rf: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """llama-cpp-python's ``{"type": "json_object", "schema": S}`` as OpenAI's
    ``json_schema``; OpenAI's own forms pass as they are."""
    if rf is None:
        return None
    if rf.get("type") == "json_object" and rf.get("schema") is not None:
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": rf["schema"]}}
    return rf

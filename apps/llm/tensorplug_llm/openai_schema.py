"""The request bodies of the OpenAI-compatible endpoints, as pydantic models.

Validation happens here, before anything reaches the model, so that a bad field is a
400 naming it (``max_tokens: Input should be greater than or equal to 1``) and never a
500 from deep inside. Fields OpenAI defines that do not apply here (``user``,
``stream_options``...) are accepted and ignored, as llama-server does: clients and
frameworks send them routinely. Sampling defaults are llama.cpp's, not OpenAI's
(temperature 0.8, top_k 40, min_p 0.05), as llama-server's are.

``model`` may be left out or name anything: a server holds one model, and llama-server
answers any name with it. llama-server's top-level ``grammar`` (GBNF or Lark) and
``json_schema`` constrain the reply as ``response_format`` does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "constraint_format",
]


def constraint_format(
    response_format: dict[str, Any] | None, grammar: str | None, json_schema: Any
) -> dict[str, Any] | None:
    """The ``response_format`` a request asks for, from OpenAI's field or llama-server's
    ``grammar`` / ``json_schema`` (one of them at most: 400 naming the second)."""
    given = [
        name
        for name, value in (("response_format", response_format), ("grammar", grammar),
                            ("json_schema", json_schema))
        if value is not None
    ]  # fmt: skip
    if len(given) > 1:
        raise ValueError(f"give one of {' and '.join(given)}: each constrains the whole reply")
    if grammar is not None:
        return {"type": "grammar", "grammar": grammar}
    if json_schema is not None:
        return {"type": "json_object", "schema": json_schema}
    return response_format


#: the API's field names in errors, as llama-server's requests spell them
CONSTRAINT_PARAMS = {"response_format.grammar": "grammar", "response_format.schema": "json_schema"}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: StrictFloat = Field(0.8, ge=0.0, le=100.0)
    top_p: StrictFloat = Field(0.95, ge=0.0, le=1.0)
    top_k: StrictInt = Field(40, ge=0)
    min_p: StrictFloat = Field(0.05, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: StrictBool = False
    seed: StrictInt | None = None
    response_format: dict[str, Any] | None = None
    repeat_penalty: StrictFloat = Field(1.0, ge=0.0)
    frequency_penalty: StrictFloat = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: StrictFloat = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, StrictFloat] | None = None
    #: choices of the prompt, at most the server's -np (the API checks: 400 naming "n")
    n: StrictInt = Field(1, ge=1)
    #: llama-server's: keep generating past the end-of-generation token
    ignore_eos: StrictBool = False
    #: llama-server's: a GBNF (or Lark) grammar the reply follows
    grammar: str | None = None
    #: llama-server's: a JSON schema the reply follows
    json_schema: dict[str, Any] | StrictBool | None = None
    #: llama-server's: the response carries ``__verbose`` (the prompt as the model read it)
    verbose: StrictBool = False
    #: OpenAI's: ``{"include_usage": true}`` ends a stream with a chunk of usage only
    stream_options: dict[str, Any] | None = None
    #: llama-server's: every streamed chunk carries ``timings``
    timings_per_token: StrictBool = False
    #: llama-server's: a stream reports its prompt's evaluation (``prompt_progress``)
    return_progress: StrictBool = False
    #: llama-server's per-request LoRA scales, ``[{"id": 0, "scale": 0.5}]`` (the HTTP
    #: routes take them when they are the server's)
    lora: list[dict[str, Any]] | None = None

    def usage_apart(self) -> bool:
        """Whether a stream ends with its usage in a chunk of its own."""
        return bool(self.stream and (self.stream_options or {}).get("include_usage"))

    @model_validator(mode="after")
    def _one_constraint(self) -> _Sampling:
        constraint_format(self.response_format, self.grammar, self.json_schema)
        return self

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments :class:`~tensorplug_llm.api.LLM` takes."""
        return self.model_dump(
            include={
                "temperature", "top_p", "top_k", "min_p", "stop", "stream", "seed",
                "repeat_penalty", "frequency_penalty", "presence_penalty", "logit_bias",
                "ignore_eos", "n",
            }
        ) | {"response_format": constraint_format(self.response_format, self.grammar,
                                                  self.json_schema)}  # fmt: skip


class CompletionRequest(_Sampling):
    prompt: str | list[StrictInt]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        """OpenAI also takes a list of prompts; a list of one string is that string, and
        several are refused with what to send instead (not a type error on each form)."""
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) == 1:
                return prompt[0]
            raise ValueError(
                f"{len(prompt)} prompts in one request: send one request per prompt (a "
                "string or a list of token ids)"
            )
        return prompt

    max_tokens: StrictInt | None = Field(16, ge=1)
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    echo: StrictBool = False


#: content parts of the media kinds llama-server reads with a multimodal projector, by
#: the word its refusal names them by
MEDIA_PARTS = {"image_url": "image", "image": "image", "input_audio": "audio",
               "input_video": "video"}  # fmt: skip


class MediaInputError(Exception):
    """A message holds an image, audio or video, which these models cannot read.

    Not a ``ValueError``, so pydantic does not make it a field's validation error: the
    server answers it as llama-server does a model without a multimodal projector, a 500
    whose message says which input ``is not supported`` (clients match that text)."""

    def __init__(self, kind: str) -> None:
        super().__init__(
            f"{kind} input is not supported - hint: tensorplug runs a model's text only "
            "(it loads no multimodal projector, mmproj)"
        )


def refuse_media(kind: object) -> None:
    """Raise :class:`MediaInputError` if a content part's ``type`` is a media kind."""
    if isinstance(kind, str) and kind in MEDIA_PARTS:
        raise MediaInputError(MEDIA_PARTS[kind])


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content: Any) -> Any:
        """OpenAI's content parts (``[{"type": "text", "text": ...}]``, what LangChain and
        Open WebUI send) become one text, the parts joined by newlines as llama-server
        joins them; an image, audio or video part is refused as llama-server refuses
        it without a multimodal projector (:class:`MediaInputError`), a part of another
        type by name, since these models read text only."""
        if not isinstance(content, list):
            return content
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            refuse_media(kind)
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"part {i} is not a text part ({{'type': 'text', 'text': ...}}), got "
                    f"type {kind!r}: this server's models read text only"
                )
            texts.append(part["text"])
        return "\n".join(texts)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    #: checked by :func:`~tensorplug_llm.tool_spec.tool_spec`, whose errors name the field
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    #: llama-server's (and vLLM's): end the prompt ready for the reply; a conversation
    #: whose last message is the assistant's continues it instead
    add_generation_prompt: StrictBool = True
    #: vLLM's: continue the last message, the assistant's (with add_generation_prompt false)
    continue_final_message: StrictBool = False
    #: llama-server's: more of the chat template's variables (``{"enable_thinking": false}``)
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _continued_parts(cls, data: Any) -> Any:
        """A final assistant message of text parts, which the reply continues, has its
        parts joined by a blank line, as llama.cpp joins a continued message's parts
        (elsewhere by one newline: :meth:`ChatMessage._text_parts`)."""
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list) or not messages:
            return data
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "assistant" or last.get("tool_calls"):
            return data
        parts = last.get("content")
        if not isinstance(parts, list) or not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in parts
        ):
            return data  # left to ChatMessage, which names what is wrong
        joined = {**last, "content": "\n\n".join(p["text"] for p in parts)}
        return {**data, "messages": [*messages[:-1], joined]}

    @model_validator(mode="after")
    def _one_continuation(self) -> ChatRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "add_generation_prompt and continue_final_message are both true: the prompt "
                "cannot both open a new reply and continue the last one (set "
                "add_generation_prompt to false)"
            )
        if [m.role for m in self.messages[-2:]] == ["assistant", "assistant"]:
            raise ValueError(
                "the conversation ends with two assistant messages: the reply continues the "
                "last one, so join them into one"
            )
        return self

    def continues(self) -> bool:
        """Whether the reply continues the last message, by llama-server's rule: asked
        (``continue_final_message``), or the conversation ends with the assistant's text
        (its "assistant prefill"; a message of tool calls is answered, not continued)."""
        last = self.messages[-1]
        calls = (last.model_extra or {}).get("tool_calls")
        return self.continue_final_message or (last.role == "assistant" and not calls)


def _content_text(item: dict[str, Any], i: int) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if (
        isinstance(content, list)
        and content
        and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
    ):
        return "".join(p["text"] for p in content)
    raise ValueError(
        f"input[{i}] must be a text, token ids, or {{'content': text or text parts "
        "([{'type': 'text', 'text': ...}])}: these models embed text only"
    )


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    #: a text, texts, token ids or lists of token ids (OpenAI takes all four)
    input: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"

    @field_validator("input", mode="before")
    @classmethod
    def _content_objects(cls, value: Any) -> Any:
        """llama-server's ``{"content": TEXT or text parts}`` items in a list of inputs:
        the text, parts joined as they are (``"hello "`` + ``"world"``)."""
        if not isinstance(value, list) or not any(isinstance(v, dict) for v in value):
            return value
        return [_content_text(v, i) if isinstance(v, dict) else v for i, v in enumerate(value)]

    #: OpenAI's shortened embeddings: only the model's own size is served (checked by the route)
    dimensions: StrictInt | None = Field(None, strict=True, ge=1)

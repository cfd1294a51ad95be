"""The request bodies of Anthropic's Messages API (``/v1/messages`` and
``/v1/messages/count_tokens``) as pydantic models, and the conversation they hold turned
into OpenAI's chat messages, tools and tool choice, as llama-server turns them
(``convert_anthropic_to_oai``).

Content blocks are text, ``tool_use`` and ``tool_result``; a ``thinking`` block of an
earlier reply becomes the message's ``reasoning_content``, as llama-server converts it,
which a chat template renders where it keeps earlier reasoning (Qwen 3's, within a turn
of tool calls); an image, in a message or a tool's result, is refused as
llama-server refuses it without a multimodal projector
(:class:`~tensorplug_llm.openai_schema.MediaInputError`), a document by name, since
these models read text only. An empty conversation is accepted, as llama-server
accepts it: the prompt is the system prompt, if any, and the reply's start."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)

from ..openai_schema import refuse_media

__all__ = ["CountTokensRequest", "MessagesRequest"]


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["thinking"]
    thinking: str = ""


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: StrictBool = False

    @field_validator("content", mode="before")
    @classmethod
    def _no_media(cls, content: Any) -> Any:
        if isinstance(content, list):
            for block in content:
                refuse_media(block.get("type") if isinstance(block, dict) else None)
        return content

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content)


Block = Annotated[
    TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")
]
_KNOWN = ("text", "thinking", "tool_use", "tool_result")


def _known_blocks(content: Any) -> Any:
    """A block of another type is refused naming it (pydantic would only say its tag
    does not match)."""
    if isinstance(content, list):
        for i, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            refuse_media(kind)
            if kind not in _KNOWN:
                raise ValueError(
                    f"block {i} has type {kind!r}: this server reads content blocks of type "
                    f"{', '.join(_KNOWN)} (its models read text only)"
                )
    return content


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant"]
    content: str | list[Block]

    _blocks = field_validator("content", mode="before")(_known_blocks)


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool = False


class CountTokensRequest(BaseModel):
    """``/v1/messages/count_tokens``: the conversation without the generation's
    settings."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Message]  # required, and may be empty (llama-server takes both so)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None

    def oai_messages(self) -> list[dict[str, Any]]:
        """The conversation as OpenAI's chat messages: the system prompt first, each
        ``tool_result`` a ``tool`` message after its turn's other blocks."""
        out: list[dict[str, Any]] = []
        if self.system is not None:
            system = self.system
            text = system if isinstance(system, str) else "".join(b.text for b in system)
            out.append({"role": "system", "content": text})
        for m in self.messages:
            if isinstance(m.content, str):
                out.append({"role": m.role, "content": m.content})
                continue
            texts, calls, results, thoughts = [], [], [], []
            for b in m.content:
                if isinstance(b, TextBlock):
                    texts.append(b.text)
                elif isinstance(b, ThinkingBlock) and b.thinking:
                    thoughts.append(b.thinking)
                elif isinstance(b, ToolUseBlock):
                    calls.append({"id": b.id, "type": "function", "function": {
                        "name": b.name, "arguments": json.dumps(b.input)}})  # fmt: skip
                elif isinstance(b, ToolResultBlock):
                    results.append(
                        {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
                    )
            if texts or calls or thoughts:
                text = "\n".join(texts)
                msg: dict[str, Any] = {"role": m.role, "content": text or None if calls else text}
                if calls:
                    msg["tool_calls"] = calls
                if thoughts:  # the template renders it where it keeps earlier reasoning
                    msg["reasoning_content"] = "\n".join(thoughts)
                out.append(msg)
            out += results
        return out

    def oai_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}}
            for t in self.tools
        ]  # fmt: skip

    def oai_tool_choice(self) -> str | dict[str, Any] | None:
        """``auto`` and ``none`` as they are, ``any`` is ``required``, ``tool`` names the
        function (llama-server makes it ``required``, losing the name)."""
        c = self.tool_choice
        if c is None:
            return None
        if c.type == "any":
            return "required"
        if c.type == "tool":
            return {"type": "function", "function": {"name": c.name or ""}}
        return c.type

    def parallel_tool_calls(self) -> bool:
        return not (self.tool_choice and self.tool_choice.disable_parallel_tool_use)


class MessagesRequest(CountTokensRequest):
    """``/v1/messages``: ``max_tokens`` is required, as Anthropic's API has it."""

    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: StrictFloat | None = Field(None, ge=0.0)
    top_p: StrictFloat | None = Field(None, ge=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=0)
    stream: StrictBool = False
    metadata: dict[str, Any] | None = None

"""The request body of OpenAI's Responses API (``/v1/responses``) as a pydantic model,
and its input turned into chat messages and tools, as llama-server turns them
(``convert_responses_to_chatcmpl``): ``instructions`` a system message, ``input`` a
user message or a list of message, ``function_call`` and ``function_call_output``
items."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

__all__ = ["ResponsesRequest"]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: str


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[FunctionCallItem | FunctionCallOutputItem | MessageItem]
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0.0, le=2.0)
    top_p: StrictFloat | None = Field(None, ge=0.0, le=1.0)
    stream: StrictBool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "required", "none"] | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    #: refused: the server keeps no conversations (llama-server refuses it too)
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    #: llama-server's: a stream's events carry ``timings``, the last its whole reply's
    timings_per_token: StrictBool = False
    #: llama-server's: a stream reports its prompt's evaluation (``prompt_progress``) in
    #: ``response.in_progress`` events
    return_progress: StrictBool = False

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.instructions is not None:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*out, {"role": "user", "content": self.input}]
        for item in self.input:
            if isinstance(item, MessageItem):
                out.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        return out

    def chat_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.parameters}}
            for t in self.tools
        ]  # fmt: skip

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        """Responses' ``{"type": "function", "name": ...}`` is the chat route's
        ``{"type": "function", "function": {"name": ...}}``."""
        c = self.tool_choice
        if isinstance(c, dict) and "name" in c:
            return {"type": "function", "function": {"name": c["name"]}}
        return c

"""OpenAI's routes. ``/chat/completions`` and ``/models`` answer with and without
``/v1``; ``/v1/completions`` and ``/v1/embeddings`` only under it, since llama-server's
``/completions`` and ``/embeddings`` are its own native routes (:mod:`native_routes`)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..api import InvalidRequestError, Stream
from ..openai_schema import CONSTRAINT_PARAMS, ChatRequest, CompletionRequest, EmbeddingRequest
from ..tool_spec import ToolSpecError, tool_spec
from .errors import ApiError
from .lora_routes import check_request_lora
from .model_info import model_list
from .oai_extras import Verbose, stamped, template_context
from .relay import Canceller
from .service import ServiceDep

__all__ = ["both", "v1_only"]

#: routes served with and without /v1
both = APIRouter()
#: routes served under /v1 only
v1_only = APIRouter()


@both.get("/models")
async def models(svc: ServiceDep) -> dict[str, Any]:
    return model_list(svc.llm, svc.config.aliases, svc.config.tags)


@v1_only.post("/completions")
async def completions(body: CompletionRequest, request: Request, svc: ServiceDep) -> Response:
    check_request_lora(svc, body.lora)
    kwargs = body.sampling()
    kwargs["stream"] = True  # the server streams internally; non-stream gathers
    given = body.model_fields_set
    kwargs["temperature"] = svc.default("temperature", body.temperature, "temperature" in given)
    kwargs["seed"] = svc.default("seed", body.seed, "seed" in given)
    max_tokens = svc.default("n_predict", body.max_tokens, "max_tokens" in given)
    llm = svc.llm
    verbose = body.verbose or svc.config.verbose

    def start() -> dict[str, Any] | Stream:
        result = llm.create_completion(
            body.prompt, max_tokens=_budget(max_tokens), logprobs=body.logprobs,
            echo=body.echo, **kwargs,
        )  # fmt: skip
        info = None
        if verbose:
            prompt = body.prompt
            info = Verbose.of(llm, llm.tokenize(prompt) if isinstance(prompt, str) else prompt)
        return _stamped(result, info, body)

    return await svc.answer(request, body.stream, start, rename=CONSTRAINT_PARAMS)


@both.post("/chat/completions")
async def chat(body: ChatRequest, request: Request, svc: ServiceDep) -> Response:
    check_request_lora(svc, body.lora)
    if not svc.config.jinja:  # as llama-server --no-jinja: its built-in templates show no tools
        for param, used in (("tools", bool(body.tools)),
                            ("tool_choice", body.tool_choice not in (None, "auto"))):  # fmt: skip
            if used:
                raise InvalidRequestError(
                    f"{param} needs the model's Jinja chat template: the server was started "
                    "with --no-jinja (start it without)",
                    param,
                )
    kwargs = body.sampling()
    kwargs["stream"] = True
    given = body.model_fields_set
    kwargs["temperature"] = svc.default("temperature", body.temperature, "temperature" in given)
    kwargs["seed"] = svc.default("seed", body.seed, "seed" in given)
    asked = body.max_completion_tokens or body.max_tokens
    max_tokens = asked if asked is not None else svc.config.defaults.get("n_predict")
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    llm = svc.llm
    verbose = body.verbose or svc.config.verbose
    continues = body.continues()
    context = template_context(
        svc.config.enable_thinking, body.add_generation_prompt, body.chat_template_kwargs
    )

    def start() -> dict[str, Any] | Stream:
        result = _role_first(
            llm.create_chat_completion(
                messages, tools=body.tools, tool_choice=body.tool_choice,
                parallel_tool_calls=body.parallel_tool_calls, max_tokens=_budget(max_tokens),
                logprobs=body.logprobs, top_logprobs=body.top_logprobs,
                continue_final_message=continues, template_context=context,
                return_progress=body.return_progress and body.stream, **kwargs,
            )
        )  # fmt: skip
        info = None
        if verbose:  # the request was checked above: it renders again as it did
            spec = tool_spec(body.tools, body.tool_choice, body.parallel_tool_calls)
            ids = llm.chat_prompt(messages, spec, continue_final=continues, context=context)
            info = Verbose.of(llm, ids)
        return _stamped(result, info, body)

    return await svc.answer(request, body.stream, start, rename=CONSTRAINT_PARAMS)


@both.post("/chat/completions/input_tokens")
async def chat_input_tokens(body: ChatRequest, svc: ServiceDep) -> dict[str, Any]:
    """llama-server's count of a chat request's prompt tokens, as the chat route would
    render them (tools and a continued final message included)."""
    llm = svc.llm
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    continues = body.continues()
    context = template_context(
        svc.config.enable_thinking, body.add_generation_prompt, body.chat_template_kwargs
    )

    def count() -> int:
        try:
            spec = tool_spec(body.tools, body.tool_choice, body.parallel_tool_calls)
        except ToolSpecError as e:
            raise InvalidRequestError(str(e), e.param) from None
        return len(llm.chat_prompt(messages, spec, continue_final=continues, context=context))

    n: int = await svc.call(count)
    return {"input_tokens": n, "object": "response.input_tokens"}


def _stamped(
    result: dict[str, Any] | Stream, verbose: Verbose | None, body: CompletionRequest | ChatRequest
) -> Stream:
    """The generation's stream with llama-server's additions (:mod:`.oai_extras`)."""
    assert isinstance(result, Stream)  # the routes always ask the API for a stream
    return stamped(
        result, verbose, usage_apart=body.usage_apart(), timings_per_token=body.timings_per_token
    )


def _role_first(result: dict[str, Any] | Stream) -> dict[str, Any] | Stream:
    """A chat stream in llama-server's chunks: the first delta of each choice, the role,
    has ``content`` null (clients test for it), and a choice finishes in a chunk of its
    own whose delta is empty (the text before it in the chunk that carried it)."""
    if isinstance(result, dict):
        return result
    stream = result

    def chunks() -> Iterator[dict[str, Any]]:
        for chunk in stream:
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("role") == "assistant" and delta.get("content") == "":
                    choice["delta"] = {**delta, "content": None}
            yield from _finish_apart(chunk)

    return Stream(chunks(), Canceller(stream))


def _finish_apart(chunk: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``chunk``, or where its one choice both carries text (or calls) and finishes: that
    text with no finish, then the finish with an empty delta (and the chunk's usage)."""
    choices = chunk["choices"]
    said = len(choices) == 1 and any(v for k, v in choices[0]["delta"].items() if k != "role")
    if not said or choices[0]["finish_reason"] is None:
        yield chunk
        return
    choice = choices[0]
    head = {k: v for k, v in chunk.items() if k != "usage"}
    text = {k: v for k, v in choice.items() if k != "stop_sequence"}
    yield {**head, "choices": [{**text, "finish_reason": None}]}
    yield {**chunk, "choices": [{**choice, "delta": {}, "logprobs": None}]}


@v1_only.post("/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request, svc: ServiceDep) -> Response:
    size = svc.llm.llama.config.n_embd
    if body.dimensions is not None and body.dimensions != size:
        raise ApiError(
            400,
            f"dimensions: {svc.llm.model_name}'s embeddings have {size} dimensions and it "
            f"cannot shorten them to {body.dimensions} (it was not trained to): leave "
            "dimensions out",
            param="dimensions",
        )
    result = await svc.call_watched(
        request, lambda stopped: svc.llm.create_embedding(body.input, stopped)
    )
    if body.encoding_format == "base64":
        for item in result["data"]:
            raw = np.asarray(item["embedding"], dtype="<f4").tobytes()
            item["embedding"] = base64.b64encode(raw).decode()
    return JSONResponse(result)


def _budget(n: int | None) -> int | None:
    """A token budget: llama-server's -1 (or any negative) is no limit."""
    return None if n is None or n < 0 else n

"""OpenAI's routes. ``/chat/completions`` and ``/models`` answer with and without
``/v1``; ``/v1/completions`` and ``/v1/embeddings`` only under it, since llama-server's
``/completions`` and ``/embeddings`` are its own native routes (:mod:`native_routes`)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..openai_schema import CONSTRAINT_PARAMS, ChatRequest, CompletionRequest, EmbeddingRequest
from .model_info import model_list
from .service import ServiceDep

__all__ = ["both", "v1_only"]

#: routes served with and without /v1
both = APIRouter()
#: routes served under /v1 only
v1_only = APIRouter()


@both.get("/models")
async def models(svc: ServiceDep) -> dict[str, Any]:
    return model_list(svc.llm)


@v1_only.post("/completions")
async def completions(body: CompletionRequest, request: Request, svc: ServiceDep) -> Response:
    kwargs = body.sampling()
    kwargs["stream"] = True  # the server streams internally; non-stream gathers
    given = body.model_fields_set
    kwargs["temperature"] = svc.default("temperature", body.temperature, "temperature" in given)
    kwargs["seed"] = svc.default("seed", body.seed, "seed" in given)
    max_tokens = svc.default("n_predict", body.max_tokens, "max_tokens" in given)
    llm = svc.llm
    return await svc.answer(
        request,
        body.stream,
        lambda: llm.create_completion(
            body.prompt,
            max_tokens=_budget(max_tokens),
            logprobs=body.logprobs,
            echo=body.echo,
            **kwargs,
        ),
        rename=CONSTRAINT_PARAMS,
    )


@both.post("/chat/completions")
async def chat(body: ChatRequest, request: Request, svc: ServiceDep) -> Response:
    kwargs = body.sampling()
    kwargs["stream"] = True
    given = body.model_fields_set
    kwargs["temperature"] = svc.default("temperature", body.temperature, "temperature" in given)
    kwargs["seed"] = svc.default("seed", body.seed, "seed" in given)
    asked = body.max_completion_tokens or body.max_tokens
    max_tokens = asked if asked is not None else svc.config.defaults.get("n_predict")
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    llm = svc.llm
    return await svc.answer(
        request,
        body.stream,
        lambda: llm.create_chat_completion(
            messages,
            tools=body.tools,
            tool_choice=body.tool_choice,
            parallel_tool_calls=body.parallel_tool_calls,
            max_tokens=_budget(max_tokens),
            logprobs=body.logprobs,
            top_logprobs=body.top_logprobs,
            **kwargs,
        ),
        rename=CONSTRAINT_PARAMS,
    )


@v1_only.post("/embeddings")
async def embeddings(body: EmbeddingRequest, svc: ServiceDep) -> Response:
    result = await svc.call(lambda: svc.llm.create_embedding(body.input))
    if body.encoding_format == "base64":
        for item in result["data"]:
            raw = np.asarray(item["embedding"], dtype="<f4").tobytes()
            item["embedding"] = base64.b64encode(raw).decode()
    return JSONResponse(result)


def _budget(n: int | None) -> int | None:
    """A token budget: llama-server's -1 (or any negative) is no limit."""
    return None if n is None or n < 0 else n

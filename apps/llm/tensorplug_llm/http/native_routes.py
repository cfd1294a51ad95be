"""llama-server's own routes, with its request and response shapes: ``/completion``
(and ``/completions``), ``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props``,
``/health``, ``/slots``, ``/metrics``, ``/embedding`` (and ``/embeddings``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ..api import InvalidRequestError, Stream
from ..openai_schema import CONSTRAINT_PARAMS
from ..request import RequestError
from ..tool_spec import ToolSpecError, tool_spec
from .errors import ApiError
from .lora_routes import check_request_lora
from .model_info import build_info, model_list
from .native_completion import (
    NativeCompletion,
    generation_settings,
    prompt_ids,
    token_piece,
)
from .native_schema import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    NativeCompletionRequest,
    NativeEmbeddingRequest,
    TokenizeRequest,
)
from .oai_extras import template_context
from .relay import Canceller
from .service import Service, ServiceDep

__all__ = ["router"]

#: when this process loaded the server (Unix seconds): /metrics' ``Process-Start-Time-Unix``
PROCESS_START = int(time.time())
router = APIRouter()


def not_supported(message: str) -> ApiError:
    """llama-server's 501 for a route its command line left off."""
    return ApiError(501, message, "not_supported_error")


@router.get("/api/tags")
async def ollama_tags(svc: ServiceDep) -> dict[str, Any]:
    """Ollama's model list, which llama-server serves too (public, as /models)."""
    return model_list(svc.llm, svc.config.aliases, svc.config.tags)


@router.get("/health")
@router.get("/v1/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/completion")
@router.post("/completions")
async def completion(body: NativeCompletionRequest, request: Request, svc: ServiceDep) -> Response:
    check_request_lora(svc, body.lora)
    n_slots = svc.llm.stats().n_parallel
    if body.id_slot >= n_slots:
        raise ApiError(400, f"id_slot {body.id_slot} does not exist: the server has {n_slots} "
                       "slots (0 to -np - 1; -1 for any)", param="id_slot")  # fmt: skip
    prompts = body.prompts()
    jobs = [NativeCompletion(svc.llm, body, svc.config.defaults, p, i)
            for i, p in enumerate(prompts)]  # fmt: skip
    if len(jobs) == 1:
        return await svc.answer(
            request, body.stream, jobs[0].start, merge=lambda chunks: chunks[-1], done=None,
            rename=CONSTRAINT_PARAMS,
        )  # fmt: skip
    return await svc.answer(
        request, body.stream, lambda: _start_all(jobs), merge=_results, done=None,
        rename=CONSTRAINT_PARAMS,
    )  # fmt: skip


def _start_all(jobs: list[NativeCompletion]) -> Stream:
    """Every prompt's generation submitted at once (they run side by side in the
    engine), their chunks one prompt after the other; a prompt refused cancels those
    submitted before it."""
    streams: list[Stream] = []
    try:
        for job in jobs:
            streams.append(job.start())
    except BaseException:
        for stream in streams:
            stream.cancel()
        raise
    chunks = (chunk for stream in streams for chunk in stream)
    return Stream(chunks, [Canceller(s) for s in streams])


def _results(chunks: list[dict[str, Any]]) -> Any:
    """Several prompts' responses: a list, in the prompts' order."""
    return sorted((c for c in chunks if c["stop"]), key=lambda c: int(c["index"]))


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, svc: ServiceDep) -> dict[str, Any]:
    llm = svc.llm

    def run() -> list[int]:
        llm.check_fits(body.content, "content")
        add_bos = None if body.add_special else False
        return llm.tokenize(body.content, add_bos, parse_special=body.parse_special)

    ids: list[int] = await svc.call(run)
    if not body.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": token_piece(llm, t)} for t in ids]}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, svc: ServiceDep) -> dict[str, Any]:
    n_vocab = len(svc.llm.vocab.tokens)
    for i, t in enumerate(body.tokens):
        if not 0 <= t < n_vocab:
            raise ApiError(400, f"token id {t} is outside the vocabulary (0 to {n_vocab - 1})",
                           param=f"tokens[{i}]")  # fmt: skip
    return {"content": svc.llm.vocab.decode(body.tokens)}


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, svc: ServiceDep) -> dict[str, Any]:
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    llm = svc.llm
    continues = body.continues()
    context = template_context(
        svc.config.enable_thinking, body.add_generation_prompt, body.chat_template_kwargs
    )

    def run() -> list[int]:
        try:
            spec = tool_spec(body.tools, body.tool_choice, body.parallel_tool_calls)
        except ToolSpecError as e:
            raise InvalidRequestError(str(e), e.param) from None
        return llm.chat_prompt(messages, spec, continue_final=continues, context=context)

    ids: list[int] = await svc.call(run)
    return {"prompt": llm.vocab.decode(ids, special=True)}


def _defaults(svc: Service) -> NativeCompletionRequest:
    """A request of nothing, with the server's defaults in it (``-n``, ``--temp``)."""
    d = svc.config.defaults
    fields = {k: d[k] for k in ("n_predict", "temperature", "seed") if k in d}
    return NativeCompletionRequest(**fields)


@router.get("/props")
async def props(svc: ServiceDep) -> dict[str, Any]:
    llm = svc.llm
    stats = llm.stats()
    vocab = llm.vocab
    return {
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": llm.n_ctx,
            "speculative": False,
            "is_processing": False,
            "params": generation_settings(llm, _defaults(svc)),
            "prompt": "",
            "next_token": _next_token(),
        },
        "total_slots": stats.n_parallel,
        "model_alias": llm.model_name,
        "model_path": str(llm.llama.file.path),
        "chat_template": llm.chat_template or "",
        "chat_template_caps": {},
        "bos_token": vocab.tokens[vocab.bos] if vocab.bos is not None else "",
        "eos_token": vocab.tokens[vocab.eos] if vocab.eos is not None else "",
        "modalities": {"vision": False, "audio": False},
        "build_info": build_info(),
        "is_sleeping": svc.asleep,
    }


@router.post("/props")
async def change_props(svc: ServiceDep) -> dict[str, Any]:
    if not svc.config.props_writable:
        raise not_supported(
            "this server does not change its properties: start it with --props to allow POST /props"
        )
    return {"success": True}


def _next_token() -> list[dict[str, Any]]:
    """An idle slot's ``next_token``, as llama-server lists it: no budget left over."""
    return [{"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]


@router.get("/slots")
async def slots(svc: ServiceDep, fail_on_no_slot: bool = False) -> list[dict[str, Any]]:
    """Each slot's state; ``?fail_on_no_slot=1``: 503 when every slot is busy (a load
    balancer's probe, as llama-server's)."""
    if not svc.config.slots:
        raise not_supported("this server does not list its slots: start it without --no-slots")
    llm = svc.llm
    busy = _busy_slots(svc)
    if fail_on_no_slot and all(busy):
        raise ApiError(503, "no slot available: every slot runs a request", "unavailable_error")
    return [
        {
            "id": i,
            "id_task": -1,
            "n_ctx": llm.n_ctx,
            "speculative": False,
            "is_processing": processing,
            "next_token": _next_token(),
        }
        for i, processing in enumerate(busy)
    ]


def _busy_slots(svc: Service) -> list[bool]:
    """Whether each slot runs a request: the engine's own slots where the generator has
    an engine, else the first ``running`` of ``n_parallel``."""
    engine = svc.engine
    if engine is not None:
        return [s.job is not None for s in engine.slots]
    s = svc.llm.stats()
    return [i < s.running for i in range(s.n_parallel)]


@router.post("/slots/{id_slot}")
async def slot_action(
    id_slot: int, request: Request, svc: ServiceDep, action: str | None = None
) -> dict[str, Any]:
    """llama-server's slot actions under ``--slot-save-path``: ``save`` a slot's tokens
    and K/V rows to ``{"filename"}`` in that folder, ``restore`` them into a slot,
    ``erase`` a slot (each once the slot is idle)."""
    folder = svc.config.slot_save_path
    if folder is None:
        raise not_supported(
            "This server does not support slots action. Start it with `--slot-save-path`"
        )
    if action not in ("save", "restore", "erase"):
        raise ApiError(400, f"Invalid action {action!r}: save, restore or erase", param="action")
    engine = svc.engine
    if engine is None:
        raise not_supported("slot actions need the server's engine")

    async def run(fn: Callable[[], Any], failed: str) -> Any:
        try:
            return await svc.call(fn)
        except RequestError as e:
            raise ApiError(400, f"{failed}: {e}") from None

    if action == "erase":
        n = await run(lambda: engine.erase_slot(id_slot), "Unable to erase slot")
        return {"id_slot": id_slot, "n_erased": n}
    filename = await _slot_filename(request)
    path = folder / filename
    started = time.perf_counter()
    if action == "save":
        n, size = await run(lambda: engine.save_slot(id_slot, path), "Unable to save slot")
        ms = (time.perf_counter() - started) * 1000
        return {"id_slot": id_slot, "filename": filename, "n_saved": n, "n_written": size,
                "timings": {"save_ms": ms}}  # fmt: skip
    if not path.is_file():
        raise ApiError(400, f"Unable to restore slot: no file {filename!r} in the save folder",
                       param="filename")  # fmt: skip
    n, size = await run(lambda: engine.restore_slot(id_slot, path), "Unable to restore slot")
    ms = (time.perf_counter() - started) * 1000
    return {"id_slot": id_slot, "filename": filename, "n_restored": n, "n_read": size,
            "timings": {"restore_ms": ms}}  # fmt: skip


async def _slot_filename(request: Request) -> str:
    """The body's ``filename``: a plain name in the save folder (no folder part, no
    ``..``, no control character), as llama-server's ``fs_validate_filename``."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    name = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, 'give the file as {"filename": "NAME"}', param="filename")
    if (
        not name.strip()
        or name in (".", "..")
        or len(name.encode()) > 255
        or any(c in name for c in "/\\:")
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or name.startswith(".")
    ):
        raise ApiError(400, f"Invalid filename {name[:80]!r}: a plain file name, no folder",
                       param="filename")  # fmt: skip
    return name


@router.get("/metrics")
async def metrics(svc: ServiceDep) -> PlainTextResponse:
    if not svc.config.metrics:
        raise not_supported("this server does not export metrics: start it with --metrics")
    return PlainTextResponse(
        svc.metrics.exposition(),
        media_type="text/plain; version=0.0.4; charset=utf-8",
        # as llama-server's: when the process started (a restart resets the counters)
        headers={"Process-Start-Time-Unix": str(PROCESS_START)},
    )


@router.post("/embedding")
@router.post("/embeddings")
async def embedding(body: NativeEmbeddingRequest, request: Request, svc: ServiceDep) -> Response:
    llm = svc.llm

    def run(stopped: Callable[[], bool]) -> list[np.ndarray]:
        items = body.items()
        ids = [prompt_ids(llm, item, f"content[{i}]") for i, item in enumerate(items)]
        return llm.embed_tokens(ids, stopped=stopped)

    vectors = await svc.call_watched(request, run)
    out = []
    for i, v in enumerate(vectors):
        rows = np.atleast_2d(np.asarray(v, dtype=np.float64))
        if llm.pooling != "none":  # per-token rows are given as the model made them
            rows = _normalize(rows, body.embd_normalize)
        out.append({"index": i, "embedding": rows.tolist()})
    return JSONResponse(out)


def _normalize(rows: np.ndarray, kind: int) -> np.ndarray:
    """llama.cpp's ``common_embd_normalize``: -1 none, 0 max absolute (to int16's
    range), 1 taxicab, 2 Euclidean, p > 2 the p-norm."""
    if kind < 0:
        return rows
    if kind == 0:
        norm = np.abs(rows).max(axis=-1, keepdims=True) / 32760.0
    else:
        norm = (np.abs(rows) ** kind).sum(axis=-1, keepdims=True) ** (1.0 / kind)
    return rows / np.where(norm > 0, norm, 1.0)

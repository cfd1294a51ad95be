"""llama-server's ``/lora-adapters``: ``GET`` lists the server's LoRA adapters (``--lora``,
``--lora-scaled``) with their scales, ``POST [{"id": 0, "scale": 0.5}, ...]`` sets them
(an adapter left out goes to 0, as llama-server's) for the requests admitted from then
on; ``{"success": true}`` once done.

A request's own ``lora`` field (llama-server's per-request scales) is taken when it asks
for the scales the server runs with, and refused with a 400 otherwise: one step of the
engine computes every running sequence's product with one set of scales."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, ValidationError

from ..request import RequestError
from .errors import ApiError
from .service import Service, ServiceDep

__all__ = ["LoraScale", "check_request_lora", "router"]

router = APIRouter()


class LoraScale(BaseModel):
    """One adapter's scale, by its index in the server's list."""

    model_config = ConfigDict(extra="ignore")

    id: StrictInt
    scale: StrictFloat | StrictInt = 0.0


def _scales(n: int, entries: list[LoraScale], param: str) -> list[float]:
    """llama-server's list: each adapter at the scale given for its id, else 0."""
    given: dict[int, float] = {}
    for i, entry in enumerate(entries):
        if not 0 <= entry.id < n:
            raise ApiError(400, f"lora adapter id {entry.id} does not exist: the server has {n} "
                           f"(0..{n - 1})", param=f"{param}[{i}].id")  # fmt: skip
        given[entry.id] = float(entry.scale)
    return [given.get(i, 0.0) for i in range(n)]


@router.get("/lora-adapters")
async def list_adapters(svc: ServiceDep) -> list[dict[str, Any]]:
    return [
        {"id": i, "path": str(a.path), "scale": a.scale, "task_name": "", "prompt_prefix": ""}
        for i, a in enumerate(svc.llm.llama.adapters)
    ]


@router.post("/lora-adapters")
async def set_adapters(request: Request, svc: ServiceDep) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, list):
        raise ApiError(400, 'Request body must be an array of {"id", "scale"}')
    scales = _scales(len(svc.llm.llama.adapters), _entries(body, "body"), "body")
    engine = svc.engine
    if engine is None:
        raise ApiError(501, "LoRA scales change on the server's engine only",
                       "not_supported_error")  # fmt: skip
    try:
        await svc.call(lambda: engine.set_lora_scales(scales))
    except RequestError as e:
        raise ApiError(503, str(e), "unavailable_error") from None
    return {"success": True}


def _entries(raw: list[Any], param: str) -> list[LoraScale]:
    try:
        return [LoraScale.model_validate(e) for e in raw]
    except ValidationError:
        raise ApiError(
            400, 'each LoRA entry is {"id": INT, "scale": NUMBER}', param=param
        ) from None


def check_request_lora(svc: Service, raw: list[dict[str, Any]] | None) -> None:
    """A request's ``lora`` field: taken if it asks for the server's scales, else 400."""
    if raw is None:
        return
    adapters = svc.llm.llama.adapters
    asked = _scales(len(adapters), _entries(raw, "lora"), "lora")
    if asked != [a.scale for a in adapters]:
        raise ApiError(
            400,
            "per-request LoRA scales are not supported: the server runs its adapters at "
            f"{[a.scale for a in adapters]}; set them with POST /lora-adapters",
            param="lora",
        )

"""The serving engine: a scheduler (the policy), an executor (the model) and an update
(the results), behind :class:`Engine` (see :mod:`.engine`)."""

from ..request import (
    Constraint,
    GreedySampler,
    Request,
    RequestError,
    RequestHandle,
    SampledToken,
    TokenEvent,
    TokenSampler,
)
from .engine import Engine
from .executor import StepExecutor, StepOutput
from .scheduler import Chunk, Scheduler, StepPlan
from .state import EngineStats
from .update import StepUpdate

__all__ = [
    "Chunk",
    "Constraint",
    "Engine",
    "EngineStats",
    "GreedySampler",
    "Request",
    "RequestError",
    "RequestHandle",
    "SampledToken",
    "Scheduler",
    "StepExecutor",
    "StepOutput",
    "StepPlan",
    "StepUpdate",
    "TokenEvent",
    "TokenSampler",
]

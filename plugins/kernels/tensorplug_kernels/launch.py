"""Kernel launches: how a tensor becomes kernel arguments and how work is laid out.

A :class:`Launch` is everything a runtime needs to run one kernel: its name, the grid
(``global_size`` work-items per dimension, a multiple of ``local_size``, as in OpenCL;
CUDA's grid is their quotient) and the arguments by name, packed by the kernel's
:class:`~tensorplug_kernels.abi.KernelABI`. Encoders (:mod:`.encode`) turn graph nodes
into launches; they know nothing of the runtime.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorplug.errors import ShapeError
from tensorplug.tensor import Tensor
from tensorplug.types import Type

from .abi import TensorArg
from .limits import Limits

__all__ = [
    "Launch",
    "Limits",
    "dummy_arg",
    "nrows",
    "round_up",
    "row_launch",
    "scratch_bytes",
    "scratch_capacity",
    "tensor_arg",
]

#: Upper bound on row work-groups per launch; kernels stride over any further rows.
MAX_ROW_GROUPS = 8192

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Launch:
    """One kernel launch. ``scratch``: bytes of the runtime's scratch buffer the kernel
    uses (its ``scratch`` buffer parameter must be bound to at least that much device
    memory). Scratch carries data from one launch of a node to the next on the same
    queue and means nothing afterwards, so one buffer per backend (or per graph plan)
    serves every node; see :func:`scratch_bytes`."""

    kernel: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    args: Mapping[str, Any]
    scratch: int = 0


def scratch_bytes(launches: Iterable[Launch]) -> int:
    """The scratch buffer ``launches`` need together: what a runtime sizes its buffer to
    before binding them (graph plans and captured CUDA graphs need addresses that do not
    move afterwards)."""
    return max((ln.scratch for ln in launches), default=0)


def scratch_capacity(need: int, have: int) -> int:
    """The size of a runtime's scratch buffer of ``have`` bytes once launches needing
    ``need`` bytes are bound: ``have`` when it is enough, else at least double, so that a
    run of ever larger needs (a model's first decode steps, then batches of 2, 3, …
    tokens) reallocates a few times rather than at every step. Every runtime grows its
    buffer by this rule, so they reallocate at the same moments."""
    return have if need <= have else max(need, 2 * have)


@functools.lru_cache(maxsize=4096)
def _geometry(
    ne: tuple[int, ...], nb: tuple[int, ...]
) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]] | None:
    """``ne`` and ``nb`` as kernel arguments (strides of extent-1 axes zeroed), or None
    when an extent passes the kernels' 32-bit range. Cached: graphs repeat a few shapes."""
    if max(ne) > _INT32_MAX:
        return None
    zeroed = tuple(0 if n == 1 else s for n, s in zip(ne, nb, strict=True))
    return (ne[0], ne[1], ne[2], ne[3]), (zeroed[0], zeroed[1], zeroed[2], zeroed[3])


def tensor_arg(
    t: Tensor,
    *,
    ne: Sequence[int] | None = None,
    offset: int = 0,
    type: Type | None = None,
) -> TensorArg:
    """``t`` as a kernel operand (optionally re-described: other extents, a byte
    offset into it, another type)."""
    geometry = _geometry(t.ne() if ne is None else tuple(ne), t.nb())
    if geometry is None:
        raise ShapeError(f"extents of {t.describe()} exceed the kernels' 32-bit range")
    return TensorArg(
        t, t.offset + offset, (t.type if type is None else type).value, geometry[0], geometry[1]
    )


def dummy_arg(like: Tensor) -> TensorArg:
    """An absent optional operand (never read by the kernel), in ``like``'s buffer so
    that every buffer parameter is bound to real memory."""
    return TensorArg(like, 0, Type.F32.value, (1, 1, 1, 1), (0, 0, 0, 0))


def row_launch(kernel: str, rows: int, limits: Limits, **args: Any) -> list[Launch]:
    """One work-group per row (kernels loop when rows exceed MAX_ROW_GROUPS)."""
    if rows <= 0:
        return []
    groups = min(rows, MAX_ROW_GROUPS)
    return [Launch(kernel, (limits.wg, groups), (limits.wg, 1), args)]


def nrows(t: Tensor) -> int:
    ne = t.ne()
    return ne[1] * ne[2] * ne[3]


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m

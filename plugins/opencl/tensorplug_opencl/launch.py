"""Kernel launches: how a tensor becomes kernel arguments and how work is laid out.

A :class:`Launch` is everything needed to enqueue one kernel: its name, the NDRange
and the argument tuple. Encoders (:mod:`.encode`) turn graph nodes into launches; the
backend enqueues them, and a graph plan binds their arguments to kernel objects once.

A tensor is passed as five arguments matching the ``TENSOR(x)`` macro of
``common.cl``: the ``cl.Buffer``, the byte offset, the ggml type id, ``ne`` and ``nb``
(innermost first). The stride of every axis of extent 1 is passed as 0, which makes
an operand broadcast along it with no modulo in the kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorplug.errors import NotAllocatedError, ShapeError, UnsupportedError
from tensorplug.tensor import Tensor
from tensorplug.types import Type

from .buffer import OpenCLBuffer

__all__ = ["Launch", "Limits", "arg_dtypes", "dummy_args", "row_launch", "tensor_args"]

#: Upper bound on row work-groups per launch; kernels stride over any further rows.
MAX_ROW_GROUPS = 8192

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Limits:
    """What encoders need to know about a device.

    ``wg``: work-group size the program was built with (``-DWG``, a power of two);
    ``local_mem``: bytes of local memory per work-group; ``context``: the cl.Context
    whose buffers the kernels may touch; ``gpu``: use the kernels written for GPUs
    (local-memory tiles, a work-group per matrix-vector output) rather than the ones
    for CPUs (long per-work-item dot products that rely on caches).
    """

    wg: int
    local_mem: int
    context: Any
    gpu: bool = False


@dataclass(frozen=True)
class Launch:
    kernel: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    args: tuple[Any, ...]


def arg_dtypes(args: Sequence[Any]) -> list[Any]:
    """The argument types to declare on a kernel object (``set_scalar_arg_dtypes``).

    Declared, pyopencl packs scalars and the ``int4``/``ulong4`` geometry with a
    generated setter in a few microseconds; undeclared, it probes every argument's type,
    which costs about 15 µs per argument and dominated small graphs.
    """
    import pyopencl.cltypes as clt

    vectors = {np.dtype(np.int32): clt.int4, np.dtype(np.uint64): clt.ulong4}
    out: list[Any] = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(vectors[a.dtype])
        elif isinstance(a, np.generic):
            out.append(a.dtype)
        else:  # cl.Buffer, cl.LocalMemory: pyopencl's generic path
            out.append(None)
    return out


def cl_buffer(t: Tensor, limits: Limits) -> Any:
    """The ``cl.Buffer`` holding ``t``, refusing tensors this device cannot reach."""
    buf = t.buffer
    if buf is None:
        raise NotAllocatedError(
            f"OpenCL: tensor {t.describe()} has no memory; allocate the graph before computing"
        )
    buf._check_live()
    if not isinstance(buf, OpenCLBuffer) or buf.context != limits.context:
        raise UnsupportedError(
            f"OpenCL: tensor {t.describe()} lives in buffer {buf.name!r}, which this device's "
            "kernels cannot read; allocate it in the device's buffer type "
            "(backend.buffer_type()) or let the scheduler copy it"
        )
    return buf.cl_buffer


@functools.lru_cache(maxsize=4096)
def _geometry(ne: tuple[int, ...], nb: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """``ne`` and ``nb`` as kernel arguments (strides of extent-1 axes zeroed), or None
    when an extent passes the kernels' 32-bit range. Cached: graphs repeat a few shapes,
    and building the arrays was most of the cost of encoding a node. The arrays are
    shared, hence read-only."""
    if max(ne) > _INT32_MAX:
        return None
    ne_arr = np.array(ne, np.int32)
    nb_arr = np.array([0 if n == 1 else s for n, s in zip(ne, nb, strict=True)], np.uint64)
    ne_arr.flags.writeable = nb_arr.flags.writeable = False
    return ne_arr, nb_arr


_TYPE_IDS = {t: np.int32(t.value) for t in Type}


def tensor_args(
    t: Tensor,
    limits: Limits,
    *,
    ne: Sequence[int] | None = None,
    offset: int = 0,
    type: Type | None = None,
) -> tuple[Any, ...]:
    """The five ``TENSOR(x)`` arguments for ``t`` (optionally re-described)."""
    geometry = _geometry(t.ne() if ne is None else tuple(ne), t.nb())
    if geometry is None:
        raise ShapeError(f"OpenCL: extents of {t.describe()} exceed the kernels' 32-bit range")
    return (
        cl_buffer(t, limits),
        np.uint64(t.offset + offset),
        _TYPE_IDS[t.type if type is None else type],
        *geometry,
    )


def dummy_args(like: Tensor, limits: Limits) -> tuple[Any, ...]:
    """``TENSOR`` arguments for an absent optional operand (never read by the kernel)."""
    return (
        cl_buffer(like, limits),
        np.uint64(0),
        np.int32(Type.F32.value),
        np.ones(4, np.int32),
        np.zeros(4, np.uint64),
    )


def row_launch(kernel: str, rows: int, limits: Limits, *args: Any) -> list[Launch]:
    """One work-group per row (kernels loop when rows exceed MAX_ROW_GROUPS)."""
    if rows <= 0:
        return []
    groups = min(rows, MAX_ROW_GROUPS)
    return [Launch(kernel, (limits.wg, groups), (limits.wg, 1), tuple(args))]


def nrows(t: Tensor) -> int:
    ne = t.ne()
    return ne[1] * ne[2] * ne[3]


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m

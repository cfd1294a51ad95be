"""Binding a launch of the shared kernel library to an OpenCL kernel object.

The encoder (:mod:`tensorplug_kernels.encode`) says which kernel runs with which
arguments; here they become what ``clSetKernelArg`` takes: the arguments struct as raw
bytes, then one ``cl.Buffer`` per buffer parameter (a tensor's buffer, or one of the
backend's own: the error word, the scratch buffer).
"""

from __future__ import annotations

from typing import Any

from tensorplug.errors import NotAllocatedError, UnsupportedError
from tensorplug.tensor import Tensor
from tensorplug_kernels import Launch, TensorArg, kernel_abis

from .buffer import OpenCLBuffer

__all__ = ["cl_args", "cl_buffer"]


def cl_buffer(t: Tensor, context: Any) -> Any:
    """The ``cl.Buffer`` holding ``t``, refusing tensors this device cannot reach."""
    buf = t.buffer
    if buf is None:
        raise NotAllocatedError(
            f"OpenCL: tensor {t.describe()} has no memory; allocate the graph before computing"
        )
    buf.check_live()
    if not isinstance(buf, OpenCLBuffer) or buf.context != context:
        raise UnsupportedError(
            f"OpenCL: tensor {t.describe()} lives in buffer {buf.name!r}, which this device's "
            "kernels cannot read; allocate it in the device's buffer type "
            "(backend.buffer_type()) or let the scheduler copy it"
        )
    return buf.cl_buffer


def cl_args(launch: Launch, context: Any, extra: dict[str, Any]) -> tuple[Any, ...]:
    """The kernel arguments of ``launch``: the packed struct, then its buffers (``extra``
    supplies the runtime's own buffers by name: ``err``, ``scratch``)."""
    data, buffers = kernel_abis()[launch.kernel].pack(launch.args)
    missing = [b for b in buffers if isinstance(b, str) and b not in extra]
    if missing:
        raise UnsupportedError(
            f"OpenCL: {launch.kernel} takes the runtime buffer(s) {missing}, which were not "
            "provided"
        )
    return (
        data,
        *(cl_buffer(b.tensor, context) if isinstance(b, TensorArg) else extra[b] for b in buffers),
    )

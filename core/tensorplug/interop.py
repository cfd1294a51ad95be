"""Tensors that view another library's host memory (the consumer side of DLPack).

:func:`from_dlpack` wraps a numpy array, a CPU torch tensor or jax array, or any DLPack
producer in a :class:`~tensorplug.Tensor` without copying. The producer side
(``Tensor.__dlpack__``) is :mod:`tensorplug.dlpack`; keeping the two apart means the
module ``Tensor`` itself calls never needs to construct one.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .dlpack import KDL_CPU, DLPackError
from .errors import TypeMismatchError
from .host import host_buffer_type
from .tensor import Tensor
from .transfer import tensor_alloc
from .types import Type

__all__ = ["from_dlpack"]

_FROM_NUMPY = {
    np.dtype(np.float32): Type.F32,
    np.dtype(np.float16): Type.F16,
    np.dtype(np.int8): Type.I8,
    np.dtype(np.int16): Type.I16,
    np.dtype(np.int32): Type.I32,
    np.dtype(np.int64): Type.I64,
}


def from_dlpack(obj: Any, name: str = "") -> Tensor:
    """A tensor viewing the host memory of ``obj`` (a numpy array, a CPU torch tensor or
    jax array, any DLPack producer), without copying: writes through either are seen by
    both, and the tensor keeps ``obj``'s memory alive. F32, F16 and I8 to I64 elements;
    any non-negative strides."""
    what = type(obj).__name__
    if not hasattr(obj, "__dlpack__"):
        named = "None" if obj is None else f"a {what}"
        raise TypeMismatchError(
            f"from_dlpack: {named} is not a DLPack producer (it has no __dlpack__ method); "
            "pass an array (np.asarray(x) makes one of a list or a numpy scalar) or a CPU "
            "torch tensor or jax array"
        )
    try:
        dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (KDL_CPU, 0)
        kind, _ = (int(d) for d in dev)  # a (device type, device id) pair of ints
    except Exception as e:
        raise DLPackError(
            f"from_dlpack: {what} cannot say where it lives: its __dlpack_device__ must "
            f"return a (device type, device id) pair of ints ({type(e).__name__}: {e})"
        ) from e
    if kind != KDL_CPU:
        raise DLPackError(
            f"from_dlpack: {what} lives on DLPack device {tuple(dev)}, not host "
            "memory; copy it to the host first (or use the device's backend plugin)"
        )
    try:
        arr = np.from_dlpack(obj)
    except Exception as e:  # numpy's errors for a bad capsule are bare ValueError/TypeError
        raise DLPackError(
            f"from_dlpack: numpy cannot view {what} ({type(e).__name__}: {e}): its "
            "__dlpack__ must return a DLPack capsule of host memory; BF16 and complex types "
            "have no tensorplug equivalent: convert to float32 first"
        ) from e
    type_ = _FROM_NUMPY.get(arr.dtype)
    if type_ is None:
        known = ", ".join(str(d) for d in _FROM_NUMPY)
        raise TypeMismatchError(f"from_dlpack: elements of {arr.dtype} are not one of {known}")
    if any(s < 0 for s in arr.strides):
        raise DLPackError("from_dlpack: negative strides cannot be viewed; pass a copy")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    span = (
        0
        if arr.size == 0
        else arr.itemsize + sum((n - 1) * s for n, s in zip(arr.shape, arr.strides, strict=True))
    )
    memory = (ctypes.c_uint8 * span).from_address(arr.ctypes.data) if span else bytearray(1)
    buf = host_buffer_type().buffer_from_host_memory(memory)
    buf.owner = (memory, arr)  # the consumer's memory lives as long as the buffer
    if arr.size * arr.itemsize != span:  # gaps: the producer's other elements
        buf.elements = arr
    if not arr.flags.writeable:
        buf.data.flags.writeable = False
    t = Tensor(type_, arr.shape, strides=arr.strides, name=name)
    tensor_alloc(buf, t, 0)
    return t

"""Placing tensors in buffers and moving their bytes (ggml's ``ggml_backend_tensor_*``).

Raw-byte functions (:func:`tensor_set`, :func:`tensor_get`, :func:`tensor_memset`)
follow ggml exactly: they address ``size`` bytes from a byte ``offset`` inside the
tensor's span. :func:`set_array` and :func:`get_array` are the numpy-level
conveniences most users want; they understand shapes, dtypes and strides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

import numpy as np

from .errors import (
    AllocationError,
    LayoutMismatchError,
    NotAllocatedError,
    OutOfBoundsError,
    ShapeError,
    TypeMismatchError,
    UnsupportedError,
)
from .host import strided_array, tensor_array

#: What raw tensor bytes may be given as (``collections.abc.Buffer`` needs Python 3.12).
BytesLike = Union[bytes, bytearray, memoryview]  # noqa: UP007 (runtime alias)

if TYPE_CHECKING:
    from .backend import Backend
    from .buffer import Buffer
    from .tensor import Tensor

__all__ = [
    "get_array",
    "same_layout",
    "set_array",
    "tensor_alloc",
    "tensor_copy",
    "tensor_copy_async",
    "tensor_get",
    "tensor_get_async",
    "tensor_memset",
    "tensor_set",
    "tensor_set_async",
    "view_init",
]


def _bytes_view(data: BytesLike | np.ndarray) -> memoryview:
    mv = memoryview(data)  # type: ignore[arg-type]
    if mv.nbytes == 0:  # a memoryview with a 0 in its shape cannot be cast
        return memoryview(bytearray(0))
    if not mv.c_contiguous:
        raise LayoutMismatchError(
            "tensor data must be C-contiguous bytes; pass np.ascontiguousarray(data)"
        )
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def tensor_alloc(buffer: Buffer, tensor: Tensor, offset: int) -> None:
    """Place ``tensor`` at byte ``offset`` of ``buffer`` (``ggml_backend_tensor_alloc``)."""
    if tensor.buffer is not None:
        raise AllocationError(
            f"tensor {tensor.describe()} is already allocated in buffer {tensor.buffer.name!r}"
        )
    if tensor.view_src is not None:
        raise AllocationError(
            f"tensor {tensor.describe()} is a view; allocate its base and call view_init()"
        )
    buffer.check_live()
    align = buffer.alignment
    if offset < 0 or offset % align:
        raise AllocationError(
            f"offset {offset} for tensor {tensor.describe()} must be a non-negative multiple of "
            f"the buffer's alignment {align}"
        )
    need = buffer.alloc_size(tensor)
    if offset + need > buffer.size:
        raise AllocationError(
            f"tensor {tensor.describe()} needs {need} bytes at offset {offset}, past the end of "
            f"buffer {buffer.name!r} ({buffer.size} bytes)"
        )
    tensor.buffer = buffer
    tensor.offset = offset
    try:
        buffer.init_tensor(tensor)
    except BaseException:  # a buffer that refuses the tensor leaves it unallocated
        tensor.buffer, tensor.offset = None, 0
        raise


def view_init(tensor: Tensor) -> None:
    """Give a view the memory of its base (``ggml_backend_view_init``)."""
    base = tensor.view_src
    if base is None:
        raise ShapeError(f"view_init: tensor {tensor.describe()} is not a view")
    if base.buffer is None:
        raise NotAllocatedError(
            f"view_init: the base {base.describe()} of view {tensor.describe()} is not allocated"
        )
    tensor.buffer = base.buffer
    tensor.offset = base.offset + tensor.view_offs
    try:
        base.buffer.init_tensor(tensor)
    except BaseException:  # a buffer that refuses the view leaves it unallocated
        tensor.buffer, tensor.offset = None, 0
        raise


def tensor_set(tensor: Tensor, data: BytesLike | np.ndarray, offset: int = 0) -> None:
    """Write raw bytes into a tensor's span starting at byte ``offset``."""
    tensor.require_allocated().set_tensor(tensor, _bytes_view(data), offset)


def tensor_get(tensor: Tensor, offset: int = 0, size: int | None = None) -> bytes:
    """Read ``size`` raw bytes (default: to the end of the tensor) from byte ``offset``."""
    buf = tensor.require_allocated()
    n = tensor.nbytes - offset if size is None else size
    if n < 0:
        raise OutOfBoundsError(
            f"tensor_get: size {n} is negative (offset {offset}, tensor {tensor.describe()} "
            f"spans {tensor.nbytes} bytes)"
        )
    out = bytearray(n)
    buf.get_tensor(tensor, memoryview(out), offset)
    return bytes(out)


def tensor_memset(tensor: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
    """Fill ``size`` bytes (default: to the end of the tensor) from byte ``offset`` with
    the byte ``value``; a negative size or offset raises :class:`OutOfBoundsError`."""
    tensor.require_allocated().memset_tensor(tensor, value, offset, size)


def tensor_set_async(
    backend: Backend, tensor: Tensor, data: BytesLike | np.ndarray, offset: int = 0
) -> None:
    """Queue a write on ``backend``'s stream; ``data`` must stay alive until it syncs."""
    backend.set_tensor_async(tensor, _bytes_view(data), offset)


def tensor_get_async(backend: Backend, tensor: Tensor, out: np.ndarray, offset: int = 0) -> None:
    """Queue a read into ``out``; its contents are valid after ``backend.synchronize()``."""
    backend.get_tensor_async(tensor, _bytes_view(out), offset)


def same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.shape == b.shape and a.strides == b.strides


def tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy ``src`` into ``dst``, wherever each lives (``ggml_backend_tensor_copy``).

    Host-to-any and any-to-host go direct; otherwise the destination buffer's own
    device-to-device copy is tried, then a round trip through host memory.
    """
    if not same_layout(src, dst):
        raise LayoutMismatchError(
            f"tensor_copy: {src.describe()} strides {src.strides} and {dst.describe()} strides "
            f"{dst.strides} must have the same type, shape and strides"
        )
    if src is dst:
        return
    sbuf, dbuf = src.require_allocated(), dst.require_allocated()
    n = src.nbytes
    if sbuf.is_host:
        mem = sbuf.host_array()[src.offset : src.offset + n]
        dbuf.set_tensor(dst, mem.data, 0)
    elif dbuf.is_host:
        mem = dbuf.host_array()[dst.offset : dst.offset + n]
        sbuf.get_tensor(src, mem.data, 0)
    elif not dbuf.cpy_tensor(src, dst):
        tmp = bytearray(n)
        sbuf.get_tensor(src, memoryview(tmp), 0)
        dbuf.set_tensor(dst, memoryview(tmp), 0)


def tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """Copy between backends without blocking when the destination backend can."""
    if not same_layout(src, dst):
        raise LayoutMismatchError(
            f"tensor_copy_async: {src.describe()} and {dst.describe()} differ in layout"
        )
    if src is dst:
        return
    src.require_allocated()  # a freed buffer must not reach a backend's copy
    dst.require_allocated()
    if backend_dst.cpy_tensor_async(backend_src, src, dst):
        return
    # ggml's fallback: finish what both streams have queued, then copy synchronously
    backend_src.synchronize()
    backend_dst.synchronize()
    tensor_copy(src, dst)


def _array_geometry(tensor: Tensor) -> tuple[tuple[int, ...], np.dtype]:
    t = tensor.type
    if t.is_quantized:
        return (*tensor.shape[:-1], tensor.row_bytes), np.dtype(np.uint8)
    return tensor.shape, t.numpy_dtype


def set_array(tensor: Tensor, values: np.ndarray) -> None:
    """Write a numpy array holding all of the tensor's values, honouring its strides.

    The array must have the tensor's shape and dtype (BF16: ``uint16``; a quantized
    tensor takes its raw rows, ``uint8`` of shape ``(*shape[:-1], row_bytes)``) —
    convert with :mod:`tensorplug.quants` first. Nothing is written when it does not fit.
    """
    shape, dtype = _array_geometry(tensor)
    values = np.asarray(values)
    if values.shape != shape:
        raise ShapeError(
            f"set_array: array shape {values.shape} does not match {tensor.describe()}"
        )
    if values.dtype != dtype:
        raise TypeMismatchError(
            f"set_array: array dtype {values.dtype} does not match {tensor.describe()} "
            f"(expected {dtype}; use values.astype(...) or tensorplug.quants.quantize)"
        )
    buf = tensor.require_allocated()
    if values.size == 0:  # nothing to write (and a memoryview of it cannot be cast)
        return
    if tensor.is_contiguous:
        buf.set_tensor(tensor, _bytes_view(np.ascontiguousarray(values)), 0)
        return
    if buf.is_host:
        view = tensor_array(tensor)
        if not view.flags.writeable:  # as set_tensor says it, not numpy's bare ValueError
            raise UnsupportedError(
                f"set_array: {tensor.describe()} is in read-only memory (buffer "
                f"{buf.name!r}); share a writable array with it to write to it"
            )
        view[...] = values.reshape(view.shape)
        return
    # a strided tensor on a device: read its span, scatter the values, write it back
    span = np.frombuffer(bytearray(tensor_get(tensor)), dtype=np.uint8)
    view = strided_array(tensor, span)
    view[...] = values.reshape(view.shape)
    buf.set_tensor(tensor, span.data, 0)


def get_array(tensor: Tensor) -> np.ndarray:
    """A new C-contiguous numpy array with the tensor's values (raw rows if quantized)."""
    shape, dtype = _array_geometry(tensor)
    buf = tensor.require_allocated()
    if buf.is_host:
        # always a copy: a view would change under the caller when the memory is reused
        return np.array(tensor_array(tensor), order="C").reshape(shape)
    if tensor.is_contiguous:
        out = np.empty(shape, dtype=dtype)
        buf.get_tensor(tensor, _bytes_view(out), 0)  # (no zero-element cast TypeError)
        return out
    span = np.frombuffer(bytearray(tensor_get(tensor)), dtype=np.uint8)
    return np.ascontiguousarray(strided_array(tensor, span)).reshape(shape)

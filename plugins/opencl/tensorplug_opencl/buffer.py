"""Device memory: a buffer type per device over ``cl.Buffer``.

Tensors are addressed by buffer plus byte offset (kernels take both), never by
sub-buffers, so any offset the allocator picks works. Synchronous transfers go through
the device's transfer queue and complete before returning; a backend's asynchronous
transfers use its own queue (:mod:`.backend`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.buffer import Buffer, BufferType
from tensorplug.errors import AllocationError

from .errors import translate

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .device import OpenCLDevice

__all__ = ["OpenCLBuffer", "OpenCLBufferType"]


class OpenCLBufferType(BufferType):
    """Memory of one OpenCL device; alignment and size limits come from the driver."""

    device: OpenCLDevice

    def __init__(self, device: OpenCLDevice) -> None:
        super().__init__(device)
        self.device = device

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def alignment(self) -> int:
        return self.device.info.alignment

    @property
    def max_size(self) -> int:
        return self.device.info.max_alloc

    def _alloc_buffer(self, size: int) -> OpenCLBuffer:
        import pyopencl as cl

        dev = self.device
        free, total = dev.memory()
        if size > free:  # drivers like PoCL allocate lazily and would say yes to anything
            raise AllocationError(
                f"{self.name}: {size} bytes requested but only {free} of the device's {total} "
                "bytes are free; free other buffers, use smaller tensors or place part of the "
                "model on another device"
            )
        try:
            # OpenCL refuses empty buffers; a zero-size tensorplug buffer still gets one
            mem = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, max(size, self.alignment))
        except cl.Error as e:
            raise AllocationError(
                f"{self.name}: could not allocate {size} bytes of device memory "
                f"({e}); free other buffers or use smaller tensors"
            ) from e
        dev.track_allocation(mem.size)
        return OpenCLBuffer(self, size, mem)


class OpenCLBuffer(Buffer):
    """A ``cl.Buffer``; tensors live at byte offsets inside it."""

    buft: OpenCLBufferType

    def __init__(self, buft: OpenCLBufferType, size: int, mem: Any) -> None:
        super().__init__(buft, size)
        self.cl_buffer = mem
        self.context = buft.device.context

    @property
    def _queue(self) -> Any:
        return self.buft.device.transfer_queue

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        if not len(data):
            return
        import pyopencl as cl

        try:
            cl.enqueue_copy(
                self._queue,
                self.cl_buffer,
                data,
                dst_offset=tensor.offset + offset,
                is_blocking=True,
            )
        except cl.Error as e:
            raise translate(e, f"{self.name}: writing {tensor.describe()}") from e

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        if not len(out):
            return
        import pyopencl as cl

        try:
            cl.enqueue_copy(
                self._queue,
                out,
                self.cl_buffer,
                src_offset=tensor.offset + offset,
                is_blocking=True,
            )
        except cl.Error as e:
            raise translate(e, f"{self.name}: reading {tensor.describe()}") from e

    def _fill(self, value: int, offset: int, size: int, what: str) -> None:
        if size <= 0:
            return
        import pyopencl as cl

        try:
            cl.enqueue_fill_buffer(
                self._queue, self.cl_buffer, np.uint8(value), offset, size
            ).wait()
        except cl.Error as e:
            raise translate(e, f"{self.name}: {what}") from e

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._fill(value, tensor.offset + offset, size, f"filling {tensor.describe()}")

    def _clear(self, value: int) -> None:
        self._fill(value, 0, self.size, "clearing the buffer")

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Device-side copy when ``src`` is in a buffer of the same context."""
        sbuf = src.buffer
        if not isinstance(sbuf, OpenCLBuffer) or sbuf.context != self.context:
            return False
        n = src.nbytes
        if n == 0:
            return True
        if sbuf is self and src.offset < dst.offset + n and dst.offset < src.offset + n:
            return False  # overlapping ranges: OpenCL refuses, the host round trip does not
        import pyopencl as cl

        try:
            cl.enqueue_copy(
                self._queue,
                self.cl_buffer,
                sbuf.cl_buffer,
                byte_count=n,
                src_offset=src.offset,
                dst_offset=dst.offset,
            ).wait()
        except cl.Error as e:
            raise translate(e, f"{self.name}: copying {src.describe()} to {dst.describe()}") from e
        return True

    def _free(self) -> None:
        self.buft.device.track_allocation(-self.cl_buffer.size)
        self.cl_buffer.release()

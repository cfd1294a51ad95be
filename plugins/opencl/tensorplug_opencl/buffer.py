"""Device memory: a ``cl.Buffer`` per tensorplug buffer, over the runtime base.

Tensors are addressed by buffer plus byte offset (kernels take both), never by
sub-buffers, so any offset the allocator picks works. These synchronous transfers go
through the device's transfer queue and complete before returning; a backend's
asynchronous ones use its own queue (:mod:`.backend`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug_kernels.runtime import DeviceBuffer, GPUBufferType

if TYPE_CHECKING:
    from .device import OpenCLDevice

__all__ = ["OpenCLBuffer"]


class OpenCLBuffer(DeviceBuffer):
    """A ``cl.Buffer``; what it holds counts against the device's free memory."""

    device: OpenCLDevice

    def __init__(self, buft: GPUBufferType, size: int, mem: Any) -> None:
        super().__init__(buft, size, mem)
        self.device.track_allocation(mem.size)

    def _write(self, offset: int, data: memoryview) -> None:
        import pyopencl as cl

        queue = self.device.transfer_queue
        cl.enqueue_copy(queue, self.mem, data, dst_offset=offset, is_blocking=True)

    def _read(self, offset: int, out: memoryview) -> None:
        import pyopencl as cl

        queue = self.device.transfer_queue
        cl.enqueue_copy(queue, out, self.mem, src_offset=offset, is_blocking=True)

    def _fill(self, offset: int, size: int, value: int) -> None:
        import pyopencl as cl

        queue = self.device.transfer_queue
        cl.enqueue_fill_buffer(queue, self.mem, np.uint8(value), offset, size).wait()

    def _copy_in(self, offset: int, src: DeviceBuffer, src_offset: int, size: int) -> None:
        import pyopencl as cl

        cl.enqueue_copy(
            self.device.transfer_queue, self.mem, src.mem, byte_count=size,
            src_offset=src_offset, dst_offset=offset,
        ).wait()  # fmt: skip

    def _release(self) -> None:
        self.device.track_allocation(-self.mem.size)
        self.mem.release()

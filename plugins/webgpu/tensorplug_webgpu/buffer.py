"""Device memory: one WebGPU storage buffer per tensorplug buffer, over the runtime base.

WebGPU copies whole 32-bit words (offsets and sizes multiples of 4) and binds at most
``maxStorageBufferBindingSize`` bytes of a buffer (128 MiB on lavapipe), so:

* transfers that start or end inside a word read the edge words first and write them
  back patched (the synchronous transfer path; tensors are 256-byte aligned, so only
  views and partial writes land here);
* a buffer larger than one binding is bound per tensor: a window of the binding size
  starting at the tensor's first byte (rounded down to the binding alignment), with the
  tensor's offset shifted into it. Any tensor up to the binding size less the alignment
  fits (the device refuses larger ones in ``supports_op``, so the scheduler places
  them elsewhere); a WebGPU binding is only (buffer, offset, size), so unlike Metal's
  views of a mapped file there is nothing to make per window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.errors import UnsupportedError
from tensorplug_kernels.runtime import DeviceBuffer, GPUBufferType

if TYPE_CHECKING:
    from .device import WebGPUDevice

__all__ = ["WebGPUBuffer", "Window", "word_span"]

#: What a launch binds: (buffer, first byte, size) of a ``wgpu.GPUBuffer``.
Window = tuple[Any, int, int]


def word_span(offset: int, size: int) -> tuple[int, int]:
    """The whole words covering bytes ``[offset, offset + size)``: (first byte, size)."""
    lo = offset & ~3
    hi = (offset + size + 3) & ~3
    return lo, hi - lo


class WebGPUBuffer(DeviceBuffer):
    """A ``wgpu.GPUBuffer`` (STORAGE | COPY_SRC | COPY_DST); its size is counted against
    the device's free memory."""

    device: WebGPUDevice

    def __init__(self, buft: GPUBufferType, size: int, mem: Any) -> None:
        super().__init__(buft, size, mem)
        self.device.track_allocation(mem.size)

    def _write(self, offset: int, data: memoryview) -> None:
        self.device.write(self.mem, offset, data)

    def _read(self, offset: int, out: memoryview) -> None:
        self.device.read(self.mem, offset, out)

    def _fill(self, offset: int, size: int, value: int) -> None:
        lo, n = word_span(offset, size)
        if value == 0 and (lo, n) == (offset, size):
            self.device.clear(self.mem, offset, size)
        else:
            self.device.write(self.mem, offset, np.full(size, value, np.uint8).data)

    def _copy_in(self, offset: int, src: DeviceBuffer, src_offset: int, size: int) -> None:
        self.device.copy_bytes(src.mem, src_offset, self.mem, offset, size)

    def _release(self) -> None:
        self.device.track_allocation(-self.mem.size)
        self.mem.destroy()

    def binding(self, offset: int, nbytes: int) -> tuple[Window, int]:
        """The window of this buffer a launch binds for bytes ``[offset, offset +
        nbytes)``, and minus its start (what to add to offsets inside it)."""
        full = self.mem.size
        window = self.device.binding_window
        if full <= window:
            return (self.mem, 0, full), 0
        start = offset - offset % self.device.binding_alignment
        if offset + nbytes > start + window:
            raise UnsupportedError(
                f"{self.device.name}: a tensor of {nbytes} bytes does not fit one binding of "
                f"this device (maxStorageBufferBindingSize {window} bytes); place it on "
                "another device (supports_op refuses such nodes)"
            )
        return (self.mem, start, min(window, full - start)), -start

"""Device memory, written once: the buffer type of a GPU and buffers over its allocator.

:class:`GPUBufferType` is every runtime's buffer type: named after its device, its
alignment and largest buffer from the device, and its ``_alloc_buffer`` refusing what
the device has no room for before asking the driver (drivers such as PoCL allocate
lazily and say yes to anything), then wrapping the memory the device's ``_alloc`` hook
returns in the device's buffer class.

:class:`DeviceBuffer` is a buffer of memory the host cannot address (OpenCL, CUDA):
tensorplug's buffer methods become five small hooks over byte offsets (``_write``,
``_read``, ``_fill``, ``_copy_in``, ``_release``), each called with the device current
and its driver errors translated into an exception that says what was being done. A
runtime whose memory the host can address (Metal's shared storage) makes its buffers
host buffers instead and mixes in :class:`DeviceMemory` so that kernels can bind them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from tensorplug.buffer import Buffer, BufferType

from .errors import DeviceOutOfMemoryError

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .device import GPUDevice

__all__ = ["DeviceBuffer", "DeviceMemory", "GPUBufferType", "overlapping"]


def overlapping(src: Tensor, dst: Tensor) -> bool:
    """True when the two tensors share bytes of one buffer (a device copy between them
    is undefined or refused; the caller then copies through the host)."""
    n = src.nbytes
    return src.buffer is dst.buffer and src.offset < dst.offset + n and dst.offset < src.offset + n


class GPUBufferType(BufferType):
    """Memory of one GPU device."""

    device: GPUDevice

    def __init__(self, device: GPUDevice) -> None:
        super().__init__(device)
        self.device = device

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def alignment(self) -> int:
        return self.device.alignment

    @property
    def max_size(self) -> int:
        return self.device.max_alloc

    @property
    def is_host(self) -> bool:
        return self.device.host_memory

    def _alloc_buffer(self, size: int) -> Buffer:
        dev = self.device
        free, total = dev.memory()
        if size > free:
            raise DeviceOutOfMemoryError(
                f"{self.name}: out of memory: {size} bytes requested but only {free} of the "
                f"device's {total} bytes are free; free other buffers, use smaller tensors or "
                "place part of the model on another device"
            )
        # drivers refuse empty buffers; a zero-size tensorplug buffer still gets one
        mem = dev.alloc(max(size, self.alignment), f"allocating {size} bytes")
        return dev.buffer_class(self, size, mem)


class DeviceMemory(ABC):
    """What kernels bind: every buffer of a GPU device has ``device`` and ``binding``."""

    device: GPUDevice

    @abstractmethod
    def binding(self, offset: int, nbytes: int) -> tuple[Any, int]:
        """``(handle, shift)``: what a launch passes for the bytes ``[offset, offset +
        nbytes)`` of this buffer, and what to add to their offset inside that handle
        (non-zero where a buffer is seen through several views: Metal's mapped files)."""


class DeviceBuffer(DeviceMemory, Buffer):
    """One device allocation (``mem``); tensors live at byte offsets inside it.

    A runtime fills in ``_write``, ``_read``, ``_fill`` and ``_copy_in`` (synchronous:
    done when they return), and ``_release`` where dropping ``mem`` is not enough.
    """

    buft: GPUBufferType

    def __init__(self, buft: GPUBufferType, size: int, mem: Any) -> None:
        super().__init__(buft, size)
        self.device = buft.device
        self.mem = mem
        self.arg = self.device.kernel_arg(mem)

    # -- hooks ---------------------------------------------------------------------------

    @abstractmethod
    def _write(self, offset: int, data: memoryview) -> None:
        """Copy host bytes into this buffer from byte ``offset``."""

    @abstractmethod
    def _read(self, offset: int, out: memoryview) -> None:
        """Copy ``len(out)`` bytes from byte ``offset`` of this buffer to the host."""

    @abstractmethod
    def _fill(self, offset: int, size: int, value: int) -> None:
        """Set ``size`` bytes from ``offset`` to the byte ``value``."""

    @abstractmethod
    def _copy_in(self, offset: int, src: DeviceBuffer, src_offset: int, size: int) -> None:
        """Copy ``size`` bytes of ``src`` (a buffer the device ``reaches``) to ``offset``."""

    def _release(self) -> None:
        """Give the memory back (default: nothing; it goes with the last reference)."""

    # -- what tensorplug calls, with context ---------------------------------------------

    def binding(self, offset: int, nbytes: int) -> tuple[Any, int]:
        return self.arg, 0

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        if len(data):
            with self.device.driver(f"writing {tensor.describe()}"):
                self._write(tensor.offset + offset, data)

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        if len(out):
            with self.device.driver(f"reading {tensor.describe()}"):
                self._read(tensor.offset + offset, out)

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        if size > 0:
            with self.device.driver(f"filling {tensor.describe()}"):
                self._fill(tensor.offset + offset, size, value)

    def _clear(self, value: int) -> None:
        if self.size > 0:
            with self.device.driver("clearing the buffer"):
                self._fill(0, self.size, value)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """A device-side copy when the device reaches ``src``'s memory and the two do
        not overlap (else False: the caller copies through the host)."""
        sbuf = src.buffer
        if not (isinstance(sbuf, DeviceBuffer) and self.device.reaches(sbuf)):
            return False
        if overlapping(src, dst):
            return False
        if src.nbytes:
            with self.device.driver(f"copying {src.describe()} to {dst.describe()}"):
                self._copy_in(dst.offset, sbuf, src.offset, src.nbytes)
        return True

    def _free(self) -> None:
        self.device.buffer_freed(self)  # backends drop plans that refer to it first
        with self.device.driver("freeing a buffer"):
            self._release()
        self.mem = self.arg = None

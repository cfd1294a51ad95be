"""Host memory a GPU reads in place: shared buffers, and mapped files seen through views.

Where the CPU and the GPU share memory (Apple GPUs' shared storage), a device buffer is
host memory too (``GPUDevice.host_memory``): set/get are memory copies, and the CPU
backend computes straight from it when the scheduler puts a node there. The one rule
shared memory adds: the host must not touch bytes the GPU may still be using, so every
host access of a :class:`HostMemoryBuffer` first waits for the device's queued work
(``GPUDevice.wait_idle``).

Memory someone else owns — an mmap'ed GGUF file — is wrapped without a copy where the
API imports a host pointer (Metal's ``newBufferWithBytesNoCopy``), into device buffers
that start on a boundary the API sets (a page) and are no longer than its largest
buffer. A longer run is covered by several overlapping *views*, each starting where the
last one ends less the largest tensor (:func:`view_ranges`, ggml-metal's scheme), so
every tensor lies whole inside one view; a kernel binds the view holding its tensor, at
its offset inside that view (:class:`MappedBuffer`, :func:`map_host_memory`). A device
buffer larger than what one binding may cover (WebGPU's
``maxStorageBufferBindingSize``) is seen through views the same way.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tensorplug.buffer import BufferUsage
from tensorplug.errors import UnsupportedError
from tensorplug.host import HostBuffer

from ..launch import round_up
from .memory import DeviceMemory, GPUBufferType

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .device import GPUDevice

__all__ = ["HostMemoryBuffer", "MappedBuffer", "View", "map_host_memory", "view_ranges"]


class HostMemoryBuffer(DeviceMemory, HostBuffer):
    """Memory both the host and the device address (``data``: its bytes, as numpy); host
    accesses wait for the device's queued work first. A runtime fills in ``binding``."""

    def __init__(self, buft: GPUBufferType, data: np.ndarray, owner: Any = None) -> None:
        super().__init__(buft, data, owner=owner)
        self.device = buft.device

    def host_array(self) -> np.ndarray:
        self.device.wait_idle()
        return super().host_array()

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        self.device.wait_idle()
        super()._set_tensor(tensor, data, offset)

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        self.device.wait_idle()
        super()._get_tensor(tensor, out, offset)

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.device.wait_idle()
        super()._memset_tensor(tensor, value, offset, size)

    def _clear(self, value: int) -> None:
        self.device.wait_idle()
        super()._clear(value)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        self.device.wait_idle()
        return super()._cpy_tensor(src, dst)

    def _free(self) -> None:
        self.device.wait_idle()  # the GPU may still be reading it
        self.device.buffer_freed(self)  # backends drop plans that refer to it first
        super()._free()


@dataclass(frozen=True)
class View:
    """Bytes ``[start, end)`` of a buffer as one handle a kernel binds: a tensor at byte
    ``offset`` of the buffer is at ``offset + shift`` in ``handle``. ``memory``: what the
    handle was made from, kept alive with it."""

    start: int
    end: int
    handle: Any
    shift: int
    memory: Any = None


def view_ranges(size: int, max_len: int, max_tensor: int, align: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of views covering ``size`` bytes, each at most ``max_len``
    bytes once widened to ``align`` boundaries, overlapping by at least ``max_tensor``
    bytes so that every tensor lies whole in one of them."""
    usable = (max_len - align) // align * align  # room for the aligning pad
    if size <= usable:
        return [(0, size)]
    step = (usable - max_tensor) // align * align
    if step <= 0:
        raise UnsupportedError(
            f"tensors of {max_tensor} bytes do not fit the device's {max_len}-byte buffers"
        )
    ranges, start = [], 0
    while True:
        end = min(start + usable, size)
        ranges.append((start, end))
        if end == size:
            return ranges
        start += step


class MappedBuffer(HostMemoryBuffer):
    """Host memory someone else owns (an mmap'ed model), seen by the device through one
    or more views. Read-only when the memory is; a queued copy never writes it."""

    def __init__(
        self, buft: GPUBufferType, data: np.ndarray, owner: Any, views: list[View]
    ) -> None:
        super().__init__(buft, data, owner=owner)
        self.views = views

    def binding(self, offset: int, nbytes: int) -> tuple[Any, int]:
        for view in self.views:
            if view.start <= offset and offset + nbytes <= view.end:
                return view.handle, view.shift
        raise UnsupportedError(
            f"{self.name}: bytes [{offset}, {offset + nbytes}) of a mapped buffer lie in no "
            f"single {self.device.reg.name} view; the tensor is larger than the "
            "max_tensor_size the buffer was made with"
        )

    def _free(self) -> None:
        super()._free()
        self.views = []


#: ``wrap(memory, length)``: a device buffer over ``length`` bytes of host memory at an
#: aligned address (``memory``: a ctypes array over them), None when the API refuses.
Wrap = Callable[[Any, int], Any]


def map_host_memory(
    device: GPUDevice, obj: Any, max_tensor_size: int, max_len: int, align: int, wrap: Wrap
) -> HostBuffer:
    """A buffer over ``obj`` (anything with the buffer protocol) that ``device`` (whose
    buffers are host memory) reads in place, through views ``wrap`` makes. Where the API
    refuses to wrap the memory, its bytes are copied into a new buffer of the device
    instead, and a log line says so."""
    try:
        data = np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError) as e:
        raise UnsupportedError(
            f"{device.name}: cannot wrap {type(obj).__name__} as host memory: it must support "
            f"the buffer protocol and be C-contiguous ({e})"
        ) from e
    base = int(data.ctypes.data)
    views: list[View] = []
    for start, end in view_ranges(data.size, max_len, max_tensor_size, align):
        first = (base + start) // align * align  # the view starts ``pad`` bytes before
        pad = base + start - first
        length = round_up(pad + end - start, align)
        memory = (ctypes.c_char * length).from_address(first)
        handle = wrap(memory, length)
        if handle is None:
            logging.getLogger(type(device).__module__).info(
                "%s: %s would not wrap %d bytes at %#x without a copy; copying them",
                device.name, device.reg.name, data.size, base,
            )  # fmt: skip
            return _copied(device, data)
        views.append(View(start, end, handle, pad - start, memory))
    buf = MappedBuffer(device.buffer_type(), data, obj, views)
    buf.usage = BufferUsage.WEIGHTS
    return buf


def _copied(device: GPUDevice, data: np.ndarray) -> HostBuffer:
    buf = cast(HostBuffer, device.buffer_type().alloc_buffer(data.size))
    buf.data[...] = data
    buf.usage = BufferUsage.WEIGHTS
    return buf

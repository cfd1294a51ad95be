"""Metal memory: shared-storage ``MTLBuffer``\\ s the host reads and writes in place.

On Apple GPUs the CPU and the GPU share memory. A buffer here is one ``MTLBuffer``
in shared storage, and its bytes are also a numpy array over ``contents()`` — so the
buffer *is* a host buffer (``is_host``): set/get are memory copies, and the CPU
backend computes straight from it when the scheduler puts a node there. The one rule
shared memory adds: the host must not touch bytes the GPU may still be using, so every
host access first waits for the device's committed work (``MetalDevice.wait_idle``).
The buffer type is the runtime base's (:class:`~tensorplug_kernels.runtime.GPUBufferType`,
``host_memory`` set); what kernels bind is :meth:`binding`, as in every runtime.

Mapped weights (:func:`wrap_host_memory`) wrap an mmap'ed GGUF file with
``newBufferWithBytesNoCopy``, which wants a page-aligned start and a whole number of
pages, and no longer than ``maxBufferLength``. A longer run is covered by several
overlapping views, each starting a page before where the last one ends less the
largest tensor, so every tensor lies whole inside one view (ggml-metal's scheme); a
kernel gets the view holding its tensor and the offset inside that view.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tensorplug.buffer import BufferUsage
from tensorplug.errors import AllocationError, UnsupportedError
from tensorplug.host import HostBuffer
from tensorplug_kernels.runtime import DeviceMemory, GPUBufferType

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .device import MetalDevice

__all__ = ["MappedView", "MetalBuffer", "MetalMappedBuffer", "SHARED_STORAGE", "wrap_host_memory"]

log = logging.getLogger(__name__)

#: MTLResourceStorageModeShared (with the default CPU cache mode): one copy of the
#: bytes, visible to the CPU and the GPU.
SHARED_STORAGE = 0

#: Tensors start on this boundary; the kernels' widest loads need 16 bytes.
ALIGNMENT = 256


def shared_buffer(dev: MetalDevice, nbytes: int, what: str) -> Any:
    """A new shared-storage ``MTLBuffer`` of ``nbytes``, or :class:`AllocationError`."""
    mtl = dev.mtl.newBufferWithLength_options_(nbytes, SHARED_STORAGE)
    if mtl is None:
        raise AllocationError(
            f"{dev.name}: Metal could not allocate {what}; free other buffers or use smaller "
            "tensors (nothing already stored was changed)"
        )
    return mtl


def contents_array(mtl: Any, nbytes: int) -> np.ndarray:
    """The bytes of a shared ``MTLBuffer`` as a writable numpy ``uint8`` array."""
    return np.frombuffer(mtl.contents().as_buffer(nbytes), dtype=np.uint8)


class _WaitsForTheGPU(DeviceMemory, HostBuffer):
    """Host access to memory the device's queued kernels may be using waits for them."""

    device: MetalDevice

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


class MetalBuffer(_WaitsForTheGPU):
    """One shared-storage ``MTLBuffer``; tensors live at byte offsets inside it."""

    def __init__(self, buft: GPUBufferType, size: int, mtl: Any) -> None:
        super().__init__(buft, contents_array(mtl, max(size, ALIGNMENT))[:size])
        self.device = cast("MetalDevice", buft.device)
        self.mtl = mtl

    def binding(self, offset: int, nbytes: int) -> tuple[Any, int]:
        """``(MTLBuffer, shift)``: the buffer a kernel binds for bytes at ``offset``, and
        what to add to that offset inside it."""
        return self.mtl, 0

    def _free(self) -> None:
        self.device.wait_idle()  # the GPU may still be reading it
        self.device.buffer_freed(self)
        super()._free()
        self.mtl = None  # pyobjc releases it (its new* selector is registered as owned)


@dataclass(frozen=True)
class MappedView:
    """One ``newBufferWithBytesNoCopy`` view: buffer bytes ``[start, end)`` of the
    wrapped memory, the view beginning ``pad`` bytes before ``start`` (a page boundary)."""

    start: int
    end: int
    pad: int
    mtl: Any
    memory: Any  # the ctypes array the view was made from, kept alive with it


class MetalMappedBuffer(_WaitsForTheGPU):
    """Host memory someone else owns (an mmap'ed model), seen by the GPU through one or
    more no-copy views. Read-only when the memory is."""

    def __init__(
        self, buft: GPUBufferType, data: np.ndarray, owner: Any, views: list[MappedView]
    ) -> None:
        super().__init__(buft, data, owner=owner)
        self.device = cast("MetalDevice", buft.device)
        self.views = views

    def binding(self, offset: int, nbytes: int) -> tuple[Any, int]:
        for view in self.views:
            if view.start <= offset and offset + nbytes <= view.end:
                return view.mtl, view.pad - view.start
        raise UnsupportedError(
            f"{self.name}: bytes [{offset}, {offset + nbytes}) of a mapped buffer lie in no "
            "single Metal view; the tensor is larger than the max_tensor_size the buffer "
            "was made with"
        )

    def _free(self) -> None:
        self.device.wait_idle()
        self.device.buffer_freed(self)
        super()._free()
        self.views = []


def page_size() -> int:
    return mmap.PAGESIZE


def view_ranges(size: int, max_len: int, max_tensor: int, page: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of views covering ``size`` bytes, each at most ``max_len``
    bytes once widened to whole pages, overlapping by at least ``max_tensor`` bytes so
    that every tensor lies whole in one of them."""
    usable = (max_len - page) // page * page  # room for the page-aligning pad
    if size <= usable:
        return [(0, size)]
    step = (usable - max_tensor) // page * page
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


def wrap_host_memory(dev: MetalDevice, obj: Any, max_tensor_size: int) -> HostBuffer:
    """A buffer over ``obj`` (anything with the buffer protocol) that the GPU reads in
    place. Where Metal refuses to wrap the memory (not from ``mmap``/``vm_allocate``),
    the bytes are copied into a new shared buffer instead, and a log line says so."""
    try:
        data = np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError) as e:
        raise UnsupportedError(
            f"{dev.name}: cannot wrap {type(obj).__name__} as host memory: it must support "
            f"the buffer protocol and be C-contiguous ({e})"
        ) from e
    buft = dev.buffer_type()
    page = page_size()
    base = int(data.ctypes.data)
    views: list[MappedView] = []
    for start, end in view_ranges(data.size, dev.info.max_buffer, max_tensor_size, page):
        first = (base + start) // page * page
        pad = base + start - first
        length = -(-(pad + end - start) // page) * page
        memory = (ctypes.c_char * length).from_address(first)
        mtl = dev.mtl.newBufferWithBytesNoCopy_length_options_deallocator_(
            memory, length, SHARED_STORAGE, None
        )
        if mtl is None:
            log.info(
                "%s: Metal would not wrap %d bytes at %#x without a copy; copying them",
                dev.name, data.size, base,
            )  # fmt: skip
            return _copied(buft, data)
        views.append(MappedView(start, end, pad, mtl, memory))
    buf = MetalMappedBuffer(buft, data, obj, views)
    buf.usage = BufferUsage.WEIGHTS
    return buf


def _copied(buft: GPUBufferType, data: np.ndarray) -> MetalBuffer:
    buf = buft.alloc_buffer(data.size)
    assert isinstance(buf, MetalBuffer)
    buf.data[...] = data
    buf.usage = BufferUsage.WEIGHTS
    return buf

"""Metal memory: shared-storage ``MTLBuffer``\\ s the host reads and writes in place.

On Apple GPUs the CPU and the GPU share memory. A buffer here is one ``MTLBuffer``
in shared storage, and its bytes are also a numpy array over ``contents()`` — so the
buffer *is* a host buffer (``is_host``), one of the runtime base's
:class:`~tensorplug_kernels.runtime.mapped.HostMemoryBuffer`\\ s: host accesses wait
for the device's committed work first (``MetalDevice.wait_idle``). The buffer type is
the base's (``host_memory`` set); what kernels bind is :meth:`MetalBuffer.binding`.

Mapped weights (:func:`wrap_host_memory`) wrap an mmap'ed GGUF file with
``newBufferWithBytesNoCopy``, which wants a page-aligned start and a whole number of
pages, and no longer than ``maxBufferLength``: the base's
:func:`~tensorplug_kernels.runtime.mapped.map_host_memory` covers a longer run with
overlapping views (ggml-metal's scheme) and binds each tensor to the view holding it.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.errors import AllocationError
from tensorplug.host import HostBuffer
from tensorplug_kernels.runtime import GPUBufferType
from tensorplug_kernels.runtime.mapped import HostMemoryBuffer, map_host_memory

if TYPE_CHECKING:
    from .device import MetalDevice

__all__ = [
    "MetalBuffer", "SHARED_STORAGE", "wrap_host_memory",
]  # fmt: skip

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


class MetalBuffer(HostMemoryBuffer):
    """One shared-storage ``MTLBuffer``; tensors live at byte offsets inside it."""

    def __init__(self, buft: GPUBufferType, size: int, mtl: Any) -> None:
        super().__init__(buft, contents_array(mtl, max(size, ALIGNMENT))[:size])
        self.mtl = mtl

    def binding(self, offset: int, nbytes: int) -> tuple[Any, int]:
        """``(MTLBuffer, 0)``: the buffer a kernel binds, at the tensor's own offset."""
        return self.mtl, 0

    def _free(self) -> None:
        super()._free()
        self.mtl = None  # pyobjc releases it (its new* selector is registered as owned)


def wrap_host_memory(dev: MetalDevice, obj: Any, max_tensor_size: int) -> HostBuffer:
    """A buffer over ``obj`` (anything with the buffer protocol) that the GPU reads in
    place, through no-copy views over whole pages; where Metal refuses to wrap the memory
    (not from ``mmap``/``vm_allocate``), its bytes are copied into a new shared buffer."""

    def no_copy(memory: Any, length: int) -> Any:
        return dev.mtl.newBufferWithBytesNoCopy_length_options_deallocator_(
            memory, length, SHARED_STORAGE, None
        )

    return map_host_memory(dev, obj, max_tensor_size, dev.info.max_buffer, mmap.PAGESIZE, no_copy)

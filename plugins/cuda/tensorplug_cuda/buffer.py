"""GPU memory and pinned host memory.

Device buffers are plain ``cudaMalloc`` allocations (``cupy.cuda.Memory``), not cupy's
caching pool: tensorplug places its tensors inside a few large buffers itself, and a
freed buffer must show up as free memory. Tensors are addressed by the allocation's
base pointer plus a byte offset, which the kernels receive in their arguments struct.
Synchronous transfers go through the device's transfer stream and wait for it, as
ggml's do (a pageable copy may otherwise still be in flight when a kernel reads).

``CUDA_Host`` is pinned (page-locked) host memory from ``cudaHostAlloc``: it is host
memory in every respect (``is_host``: the CPU backend computes on it in place) and the
GPU copies to and from it asynchronously at full speed.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.buffer import BufferType
from tensorplug.errors import AllocationError
from tensorplug.host import HostBuffer
from tensorplug_kernels.runtime import DeviceBuffer, GPUBufferType

from .errors import cuda_errors, is_out_of_memory, translate

if TYPE_CHECKING:
    from .device import CUDADevice

__all__ = ["ALIGNMENT", "CUDABuffer", "CUDAHostBufferType", "host_address"]

#: cudaMalloc returns 256-byte aligned memory; tensors start at multiples of it too.
ALIGNMENT = 256

# cudaMemcpyKind
H2D, D2H, D2D = 1, 2, 3


def host_address(data: memoryview | np.ndarray) -> int:
    """The address of the first byte of host memory (read-only memory too)."""
    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)


class CUDABuffer(DeviceBuffer):
    """One ``cudaMalloc`` allocation; ``ptr`` is its base address."""

    device: CUDADevice

    def __init__(self, buft: GPUBufferType, size: int, mem: Any) -> None:
        super().__init__(buft, size, mem)
        self.ptr = int(mem.ptr)

    def _write(self, offset: int, data: memoryview) -> None:
        self.device.copy(self.ptr + offset, host_address(data), len(data), H2D)

    def _read(self, offset: int, out: memoryview) -> None:
        self.device.copy(host_address(out), self.ptr + offset, len(out), D2H)

    def _fill(self, offset: int, size: int, value: int) -> None:
        stream = self.device.transfer_stream
        self.device.cp.cuda.runtime.memsetAsync(self.ptr + offset, value, size, stream.ptr)
        stream.synchronize()

    def _copy_in(self, offset: int, src: DeviceBuffer, src_offset: int, size: int) -> None:
        """From a buffer of this or another GPU (through peer access where the two GPUs
        have it, else the driver stages it)."""
        assert isinstance(src, CUDABuffer)
        self.device.copy_from(src.device, self.ptr + offset, src.ptr + src_offset, size)


class CUDAHostBufferType(BufferType):
    """Pinned host memory, usable from every GPU (``cudaHostAllocPortable``)."""

    def __init__(self, cp: Any) -> None:
        super().__init__(None)
        self.cp = cp

    @property
    def name(self) -> str:
        return "CUDA_Host"

    @property
    def alignment(self) -> int:
        return ALIGNMENT

    @property
    def is_host(self) -> bool:
        return True

    def _alloc_buffer(self, size: int) -> PinnedHostBuffer:
        cp = self.cp
        runtime = cp.cuda.runtime
        try:
            ptr = int(runtime.hostAlloc(max(size, 1), runtime.hostAllocPortable))
        except cuda_errors(cp) as e:
            what = f"{self.name}: allocating {size} bytes of pinned memory"
            if is_out_of_memory(cp, e):
                raise translate(cp, e, what) from e
            raise AllocationError(f"{what}: {e}") from e
        data = np.ctypeslib.as_array((ctypes.c_uint8 * max(size, 1)).from_address(ptr))[:size]
        return PinnedHostBuffer(self, data, ptr)


class PinnedHostBuffer(HostBuffer):
    """Host memory the GPU can reach by DMA; freed with ``cudaFreeHost``."""

    buft: CUDAHostBufferType

    def __init__(self, buft: CUDAHostBufferType, data: np.ndarray, ptr: int) -> None:
        super().__init__(buft, data)
        self.ptr = ptr

    def _free(self) -> None:
        super()._free()
        self.buft.cp.cuda.runtime.freeHost(self.ptr)

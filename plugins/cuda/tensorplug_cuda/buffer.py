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

from tensorplug.buffer import Buffer, BufferType
from tensorplug.errors import AllocationError
from tensorplug.host import HostBuffer

from .errors import is_out_of_memory, translate

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .device import CUDADevice

__all__ = ["ALIGNMENT", "CUDABuffer", "CUDABufferType", "CUDAHostBufferType", "host_address"]

#: cudaMalloc returns 256-byte aligned memory; tensors start at multiples of it too.
ALIGNMENT = 256

# cudaMemcpyKind
H2D, D2H, D2D = 1, 2, 3


def host_address(data: memoryview | np.ndarray) -> int:
    """The address of the first byte of host memory (read-only memory too)."""
    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)


def cuda_errors(cp: Any) -> tuple[type[BaseException], ...]:
    """Every exception type cupy raises for a failed CUDA call."""
    return (
        cp.cuda.runtime.CUDARuntimeError,
        cp.cuda.driver.CUDADriverError,
        cp.cuda.memory.OutOfMemoryError,
    )


def _alloc_error(cp: Any, err: BaseException, what: str) -> Exception:
    if is_out_of_memory(cp, err):
        return translate(cp, err, what)
    return AllocationError(f"{what}: {err}")


class CUDABufferType(BufferType):
    """Memory of one GPU."""

    device: CUDADevice

    def __init__(self, device: CUDADevice) -> None:
        super().__init__(device)
        self.device = device

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def alignment(self) -> int:
        return ALIGNMENT

    @property
    def max_size(self) -> int:
        return self.device.info.memory_total

    def _alloc_buffer(self, size: int) -> CUDABuffer:
        dev = self.device
        cp = dev.cp
        try:
            with dev.context():
                mem = cp.cuda.Memory(size) if size else None
        except cuda_errors(cp) as e:
            free, total = dev.memory()
            raise _alloc_error(
                cp, e, f"{self.name}: allocating {size} bytes ({free} of {total} bytes free)"
            ) from e
        return CUDABuffer(self, size, mem)


class CUDABuffer(Buffer):
    """One ``cudaMalloc`` allocation; tensors live at byte offsets inside it."""

    buft: CUDABufferType

    def __init__(self, buft: CUDABufferType, size: int, mem: Any) -> None:
        super().__init__(buft, size)
        self.device = buft.device
        self.mem = mem
        self.ptr = int(mem.ptr) if mem is not None else 0
        # what a kernel launch passes for this buffer: a pointer cupy understands
        cp = self.device.cp
        self.kernel_arg: Any = cp.cuda.MemoryPointer(mem, 0) if mem is not None else np.uint64(0)

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        if len(data):
            self.device.copy(
                self.ptr + tensor.offset + offset, host_address(data), len(data), H2D,
                f"{self.name}: writing {tensor.describe()}",
            )  # fmt: skip

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        if len(out):
            self.device.copy(
                host_address(out), self.ptr + tensor.offset + offset, len(out), D2H,
                f"{self.name}: reading {tensor.describe()}",
            )  # fmt: skip

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.device.fill(self.ptr + tensor.offset + offset, value, size, tensor.describe())

    def _clear(self, value: int) -> None:
        self.device.fill(self.ptr, value, self.size, "the whole buffer")

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """GPU-side copy from a buffer of this or another GPU (through peer access where
        the two GPUs have it, else the driver stages it)."""
        sbuf = src.buffer
        n = src.nbytes
        if not isinstance(sbuf, CUDABuffer) or overlapping(src, dst):
            return False
        if n:
            self.device.copy_from(
                sbuf.device, self.ptr + dst.offset, sbuf.ptr + src.offset, n,
                f"{self.name}: copying {src.describe()} to {dst.describe()}",
            )  # fmt: skip
        return True

    def _free(self) -> None:
        self.device.buffer_freed(self)  # cached CUDA graphs let go of it first
        self.mem = None  # cupy frees the allocation with its last reference
        self.kernel_arg = np.uint64(0)


def overlapping(src: Tensor, dst: Tensor) -> bool:
    """True when the two tensors share bytes of one buffer (a memcpy would be undefined)."""
    n = src.nbytes
    return src.buffer is dst.buffer and src.offset < dst.offset + n and dst.offset < src.offset + n


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
            raise _alloc_error(cp, e, what) from e
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

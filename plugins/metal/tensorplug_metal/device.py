"""One tensorplug device per Metal device (``MTLDevice``), over the runtime base.

What Metal says about a device is read once, into :class:`DeviceInfo`. Apple GPUs
share memory with the CPU: the device's buffers are ``MTLBuffer``\\ s in shared
storage, which the host reads and writes in place (:mod:`.buffer`), and GGUF weights
mapped from disk are wrapped without a copy (``buffer_from_host_ptr``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from tensorplug.backend import Event
from tensorplug.device import DeviceCaps, DeviceType
from tensorplug.errors import UnsupportedError
from tensorplug_kernels import Limits
from tensorplug_kernels.runtime import GPUDevice

from .backend import MetalBackend, MetalEvent
from .buffer import ALIGNMENT, MetalBuffer, shared_buffer, wrap_host_memory
from .probe import UNVERIFIED
from .program import KernelProgram

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .reg import MetalReg

__all__ = ["DeviceInfo", "MetalDevice", "read_device_info"]

#: Threads per threadgroup of the row kernels: a multiple of the 32-wide simdgroup.
DEFAULT_WG = 128


@dataclass(frozen=True)
class DeviceInfo:
    """What Metal reports about a device, read once at discovery."""

    name: str
    unified_memory: bool
    memory_total: int  # recommendedMaxWorkingSetSize: what Metal lets a process keep resident
    max_buffer: int
    local_mem: int
    max_threads: int
    registry_id: int

    @property
    def wg(self) -> int:
        return min(DEFAULT_WG, self.max_threads)


def read_device_info(mtl: Any) -> DeviceInfo:
    return DeviceInfo(
        name=str(mtl.name()),
        unified_memory=bool(mtl.hasUnifiedMemory()),
        memory_total=int(mtl.recommendedMaxWorkingSetSize()),
        max_buffer=int(mtl.maxBufferLength()),
        local_mem=int(mtl.maxThreadgroupMemoryLength()),
        max_threads=int(mtl.maxThreadsPerThreadgroup().width),
        registry_id=int(mtl.registryID()),
    )


class MetalDevice(GPUDevice):
    """A Metal device seen as ``Metal<index>``."""

    reg: MetalReg
    backend_class = MetalBackend
    buffer_class = MetalBuffer
    host_memory = True  # shared storage: the CPU reads and writes the buffers in place

    def __init__(self, reg: MetalReg, index: int, mtl: Any) -> None:
        super().__init__(reg, index)
        self.mtl = mtl
        self.metal, self.objc = reg.metal, reg.objc
        self.info = info = read_device_info(mtl)
        # scratch: the backend binds its scratch buffer (the 8-bit integer mat-vec path)
        self.limits = Limits(wg=info.wg, local_mem=info.local_mem, gpu=True, scratch=True)
        self.alignment, self.max_alloc = ALIGNMENT, info.max_buffer

    @property
    def description(self) -> str:
        return f"{self.info.name} ({UNVERIFIED})"

    @property
    def type(self) -> DeviceType:
        """An Apple GPU shares the host's memory (an integrated GPU); a discrete AMD GPU
        in an Intel Mac does not."""
        return DeviceType.IGPU if self.info.unified_memory else DeviceType.GPU

    @property
    def device_id(self) -> str | None:
        # Apple's OpenCL shows no PCI address to match, so no duplicate can be found
        return None

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(asynchronous=True, buffer_from_host_ptr=True, events=True)

    def memory(self) -> tuple[int, int]:
        """``(free, total)``: the working set Metal recommends, less what this process
        has allocated on the device."""
        total = self.info.memory_total
        return max(total - int(self.mtl.currentAllocatedSize()), 0), total

    def wait_idle(self) -> None:
        """Wait until every command buffer committed on this device has completed, so
        the host can touch shared memory the GPU may be using. Errors are left for the
        backend's ``synchronize`` to raise."""
        for backend in self.backends():
            cast(MetalBackend, backend).wait_committed()

    def buffer_from_host_ptr(self, obj: Any, max_tensor_size: int = 0) -> Buffer:
        """Wrap host memory (an mmap'ed GGUF file) as Metal buffers without a copy;
        see :func:`.buffer.wrap_host_memory`."""
        if max_tensor_size > self.info.max_buffer:
            raise UnsupportedError(
                f"{self.name}: a tensor of {max_tensor_size} bytes exceeds the device's "
                f"largest buffer ({self.info.max_buffer} bytes); run that tensor elsewhere"
            )
        return wrap_host_memory(self, obj, max_tensor_size)

    # -- the runtime base's hooks --------------------------------------------------------

    def _alloc(self, nbytes: int) -> Any:
        return shared_buffer(self, nbytes, f"a buffer of {nbytes} bytes")

    def _build_program(self) -> KernelProgram:
        return KernelProgram(self)

    def _event_new(self) -> Event:
        return Event(self, MetalEvent(self.mtl.newSharedEvent()))

    def _event_synchronize(self, event: Event) -> None:
        marker = event.context
        if marker is not None and marker.command_buffer is not None:
            marker.command_buffer.waitUntilCompleted()

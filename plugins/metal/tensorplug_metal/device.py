"""One tensorplug device per Metal device (``MTLDevice``).

What Metal says about a device is read once, into :class:`DeviceInfo`. Apple GPUs
share memory with the CPU: the device's buffers are ``MTLBuffer``\\ s in shared
storage, which the host reads and writes in place (:mod:`.buffer`), and GGUF weights
mapped from disk are wrapped without a copy (``buffer_from_host_ptr``).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorplug.backend import Event
from tensorplug.device import Device, DeviceCaps, DeviceType
from tensorplug.errors import UnsupportedError
from tensorplug.opcodes import Op
from tensorplug.tensor import Tensor
from tensorplug_kernels import Limits, supports

from .buffer import MetalBufferType, wrap_host_memory
from .probe import UNVERIFIED

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer, BufferType

    from .backend import MetalBackend
    from .program import KernelProgram
    from .reg import MetalReg

__all__ = ["DeviceInfo", "MetalDevice", "read_device_info"]

#: Threads per threadgroup of the row kernels: a multiple of the 32-wide simdgroup.
DEFAULT_WG = 128

#: ggml's rule for GPU backends: ops over at least this many rows pay for the hand-over.
OFFLOAD_MIN_BATCH = 32


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


class MetalDevice(Device):
    """A Metal device seen as ``Metal<index>``."""

    reg: MetalReg

    def __init__(self, reg: MetalReg, index: int, mtl: Any) -> None:
        super().__init__(reg)
        self.index = index
        self.mtl = mtl
        self.metal, self.objc = reg.metal, reg.objc
        self.info = read_device_info(mtl)
        # scratch: the backend binds its scratch buffer (the 8-bit integer mat-vec path)
        self.limits = Limits(wg=self.info.wg, local_mem=self.info.local_mem, gpu=True, scratch=True)
        self._buft = MetalBufferType(self)
        self._program: KernelProgram | None = None
        self._lock = threading.Lock()
        self._backends: weakref.WeakSet[MetalBackend] = weakref.WeakSet()

    # -- identity ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"Metal{self.index}"

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

    # -- program -------------------------------------------------------------------------

    @property
    def program(self) -> KernelProgram:
        """The kernel library, compiled on first use (once per device)."""
        if self._program is None:
            from .program import KernelProgram

            with self._lock:
                if self._program is None:
                    self._program = KernelProgram(self)
        return self._program

    # -- work in flight --------------------------------------------------------------------

    def track_backend(self, backend: MetalBackend) -> None:
        self._backends.add(backend)

    def wait_idle(self) -> None:
        """Wait until every command buffer committed on this device has completed, so
        the host can touch shared memory the GPU may be using. Errors are left for the
        backend's ``synchronize`` to raise."""
        for backend in list(self._backends):
            backend.wait_committed()

    # -- backends, buffers, ops ------------------------------------------------------------

    def _init_backend(self, params: str | None) -> MetalBackend:
        from .backend import MetalBackend

        return MetalBackend(self)

    def buffer_type(self) -> MetalBufferType:
        return self._buft

    def buffer_from_host_ptr(self, obj: Any, max_tensor_size: int = 0) -> Buffer:
        """Wrap host memory (an mmap'ed GGUF file) as Metal buffers without a copy;
        see :func:`.buffer.wrap_host_memory`."""
        if max_tensor_size > self.info.max_buffer:
            raise UnsupportedError(
                f"{self.name}: a tensor of {max_tensor_size} bytes exceeds the device's "
                f"largest buffer ({self.info.max_buffer} bytes); run that tensor elsewhere"
            )
        return wrap_host_memory(self, obj, max_tensor_size)

    def supports_op(self, op: Tensor) -> bool:
        return supports(op, self.limits)

    def supports_buft(self, buft: BufferType) -> bool:
        return isinstance(buft, MetalBufferType) and buft.device is self

    def offload_op(self, op: Tensor) -> bool:
        """Worth moving a large batch here (ggml: at least 32 rows; not a row lookup)."""
        return op.op is not Op.GET_ROWS and op.ne()[1] >= OFFLOAD_MIN_BATCH

    # -- events ------------------------------------------------------------------------------

    def event_new(self) -> Event:
        from .backend import MetalEvent

        return Event(self, MetalEvent(self.mtl.newSharedEvent()))

    def event_synchronize(self, event: Event) -> None:
        marker = event.context
        if marker is not None and marker.command_buffer is not None:
            marker.command_buffer.waitUntilCompleted()

    def event_free(self, event: Event) -> None:
        event.context = None

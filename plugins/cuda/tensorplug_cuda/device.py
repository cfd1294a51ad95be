"""One tensorplug device per NVIDIA GPU: ``CUDA0``, ``CUDA1``, …

Everything the driver says about a GPU is read once into :class:`DeviceInfo`. Each
device owns its buffer type, a transfer stream for synchronous buffer operations, and
the kernel program, compiled by NVRTC on first use. Every CUDA call is made with the
device current (``with device.context():``): cupy compiles, allocates and launches
for the current device, which is per-thread state.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorplug.backend import Event
from tensorplug.device import Device, DeviceCaps, DeviceType
from tensorplug.opcodes import Op
from tensorplug.tensor import Tensor
from tensorplug_kernels import Limits, supports

from .buffer import D2D, CUDABufferType, cuda_errors
from .errors import translate

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer, BufferType

    from .backend import CUDABackend
    from .buffer import CUDAHostBufferType
    from .program import KernelProgram
    from .reg import CUDAReg

__all__ = ["DeviceInfo", "CUDADevice", "pci_address", "read_device_info"]

#: Threads per block of the row kernels (a multiple of the warp, as the CUDA prelude's
#: reductions need); the kernel gate compiles with the same value.
DEFAULT_WG = 128

#: ggml's rule for GPU backends: ops over at least this many rows pay for the transfer.
OFFLOAD_MIN_BATCH = 32


@dataclass(frozen=True)
class DeviceInfo:
    """What the driver reports about a GPU, read once at discovery."""

    index: int
    name: str
    major: int
    minor: int
    multiprocessors: int
    memory_total: int
    shared_mem_per_block: int
    max_threads_per_block: int
    integrated: bool
    device_id: str
    bandwidth: float  # bytes/s: memory clock x 2 (double data rate) x bus width

    @property
    def compute_capability(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def arch(self) -> str:
        return f"sm_{self.major}{self.minor}"

    @property
    def wg(self) -> int:
        wg = DEFAULT_WG
        while wg > self.max_threads_per_block and wg > 32:
            wg //= 2
        return wg


def pci_address(domain: int, bus: int, device: int, function: int = 0) -> str:
    """``dddd:bb:dd.f`` in lower-case hex: the form the OpenCL plugin reports, so the
    registry sees one GPU reached through both backends as one device."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def read_device_info(cp: Any, index: int) -> DeviceInfo:
    props = cp.cuda.runtime.getDeviceProperties(index)
    name = props["name"]
    return DeviceInfo(
        index=index,
        name=(name.decode(errors="replace") if isinstance(name, bytes) else str(name)).strip(),
        major=int(props["major"]),
        minor=int(props["minor"]),
        multiprocessors=int(props["multiProcessorCount"]),
        memory_total=int(props["totalGlobalMem"]),
        shared_mem_per_block=int(props["sharedMemPerBlock"]),
        max_threads_per_block=int(props["maxThreadsPerBlock"]),
        integrated=bool(props.get("integrated", 0)),
        device_id=pci_address(
            int(props["pciDomainID"]), int(props["pciBusID"]), int(props["pciDeviceID"])
        ),
        bandwidth=2.0 * props.get("memoryClockRate", 0) * 1e3 * props.get("memoryBusWidth", 0) / 8,
    )


class CUDADevice(Device):
    """An NVIDIA GPU seen as ``CUDA<index>``."""

    reg: CUDAReg

    def __init__(self, reg: CUDAReg, index: int, cp: Any) -> None:
        super().__init__(reg)
        self.cp = cp
        self.index = index
        self.info = read_device_info(cp, index)
        self.limits = Limits(
            wg=self.info.wg, local_mem=self.info.shared_mem_per_block, gpu=True, scratch=True
        )
        self._buft = CUDABufferType(self)
        self._program: KernelProgram | None = None
        self._lock = threading.Lock()
        self._peers: set[int] = set()
        # the backends of this GPU, whose cached CUDA graphs a freed buffer must leave
        self._backends: weakref.WeakSet[CUDABackend] = weakref.WeakSet()
        with self.context():
            self.transfer_stream = cp.cuda.Stream(non_blocking=True)

    @contextmanager
    def context(self) -> Iterator[None]:
        """This GPU as the calling thread's current device."""
        with self.cp.cuda.Device(self.index):
            yield

    # -- identity --------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"CUDA{self.index}"

    @property
    def description(self) -> str:
        info = self.info
        cc, sms = info.compute_capability, info.multiprocessors
        return f"{info.name} (compute capability {cc}, {sms} SMs)"

    @property
    def type(self) -> DeviceType:
        return DeviceType.IGPU if self.info.integrated else DeviceType.GPU

    @property
    def device_id(self) -> str:
        return self.info.device_id

    @property
    def caps(self) -> DeviceCaps:
        # weights are uploaded rather than mapped: a kernel reading host memory over
        # PCIe for every token would be many times slower than reading its own memory
        return DeviceCaps(asynchronous=True, host_buffer=True, events=True)

    def memory(self) -> tuple[int, int]:
        """``(free, total)`` bytes, as the driver counts them now."""
        cp = self.cp
        try:
            with self.context():
                free, total = cp.cuda.runtime.memGetInfo()
        except cuda_errors(cp) as e:
            raise translate(cp, e, f"{self.name}: reading free memory") from e
        return int(free), int(total)

    # -- program ---------------------------------------------------------------------------

    @property
    def program(self) -> KernelProgram:
        """The kernel program, compiled on first use (once per device)."""
        if self._program is None:
            from .program import KernelProgram

            with self._lock:
                if self._program is None:
                    self._program = KernelProgram(self)
        return self._program

    # -- transfers the buffers use -------------------------------------------------------------

    def copy(self, dst: int, src: int, n: int, kind: int, what: str) -> None:
        """Copy ``n`` bytes between this GPU and the host (or within it) and wait."""
        cp = self.cp
        stream = self.transfer_stream
        try:
            with self.context():
                cp.cuda.runtime.memcpyAsync(dst, src, n, kind, stream.ptr)
                stream.synchronize()
        except cuda_errors(cp) as e:
            raise translate(cp, e, what) from e

    def copy_from(self, src_dev: CUDADevice, dst: int, src: int, n: int, what: str) -> None:
        """Copy ``n`` bytes from memory of ``src_dev`` (maybe this GPU) here, and wait."""
        if src_dev is self:
            self.copy(dst, src, n, D2D, what)
            return
        cp = self.cp
        stream = self.transfer_stream
        try:
            self.enable_peer_access(src_dev)
            with self.context():
                cp.cuda.runtime.memcpyPeerAsync(dst, self.index, src, src_dev.index, n, stream.ptr)
                stream.synchronize()
        except cuda_errors(cp) as e:
            raise translate(cp, e, what) from e

    def fill(self, ptr: int, value: int, n: int, what: str) -> None:
        if n <= 0:
            return
        cp = self.cp
        stream = self.transfer_stream
        try:
            with self.context():
                cp.cuda.runtime.memsetAsync(ptr, value, n, stream.ptr)
                stream.synchronize()
        except cuda_errors(cp) as e:
            raise translate(cp, e, f"{self.name}: filling {what}") from e

    def enable_peer_access(self, other: CUDADevice) -> bool:
        """Let this GPU reach ``other``'s memory directly, once per pair; False when the
        hardware cannot (copies between them then go through host memory)."""
        if other.index in self._peers:
            return True
        runtime = self.cp.cuda.runtime
        if not runtime.deviceCanAccessPeer(self.index, other.index):
            return False
        with self.context():
            try:
                runtime.deviceEnablePeerAccess(other.index)
            except runtime.CUDARuntimeError as e:
                if getattr(e, "status", None) != _PEER_ACCESS_ALREADY_ENABLED:
                    raise
        self._peers.add(other.index)
        return True

    # -- backends, buffers, ops ----------------------------------------------------------------

    def backend_created(self, backend: CUDABackend) -> None:
        self._backends.add(backend)

    def buffer_freed(self, buffer: Buffer) -> None:
        """``buffer`` is being freed: no backend may keep a plan that refers to it (the
        plan would keep its memory allocated, and its captured graph would be stale)."""
        for backend in list(self._backends):
            backend.graphs.forget(buffer)

    def _init_backend(self, params: str | None) -> CUDABackend:
        from .backend import CUDABackend

        return CUDABackend(self)

    def buffer_type(self) -> CUDABufferType:
        return self._buft

    def host_buffer_type(self) -> CUDAHostBufferType:
        return self.reg.host_buffer_type

    def supports_op(self, op: Tensor) -> bool:
        return supports(op, self.limits)

    def supports_buft(self, buft: BufferType) -> bool:
        return isinstance(buft, CUDABufferType) and buft.device is self

    def offload_op(self, op: Tensor) -> bool:
        """Worth moving a large batch here (ggml: at least 32 rows; not a row lookup)."""
        return op.op is not Op.GET_ROWS and op.ne()[1] >= OFFLOAD_MIN_BATCH

    # -- events ----------------------------------------------------------------------------------

    def event_new(self) -> Event:
        cp = self.cp
        with self.context():
            return Event(self, cp.cuda.Event(disable_timing=True))

    def event_synchronize(self, event: Event) -> None:
        cp = self.cp
        try:
            event.context.synchronize()
        except cuda_errors(cp) as e:
            raise translate(cp, e, f"{self.name}: waiting for an event") from e

    def event_free(self, event: Event) -> None:
        event.context = None


#: cudaErrorPeerAccessAlreadyEnabled: another part of the process enabled it first.
_PEER_ACCESS_ALREADY_ENABLED = 704

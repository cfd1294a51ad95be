"""One tensorplug device per NVIDIA GPU: ``CUDA0``, ``CUDA1``, … over the runtime base.

Everything the driver says about a GPU is read once into :class:`DeviceInfo`. Each
device has a transfer stream for synchronous buffer operations. Every CUDA call is
made with the device current (``current``, which the base enters around driver
calls): cupy compiles, allocates and launches for the current device, which is
per-thread state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorplug.backend import Event
from tensorplug.device import DeviceCaps, DeviceType
from tensorplug_kernels import Limits
from tensorplug_kernels.runtime import GPUDevice, pci_address

from .backend import CUDABackend
from .buffer import ALIGNMENT, D2D, CUDABuffer
from .errors import cuda_errors, translate
from .program import KernelProgram

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .buffer import CUDAHostBufferType
    from .reg import CUDAReg

__all__ = ["DeviceInfo", "CUDADevice", "pci_address", "read_device_info"]

#: Threads per block of the row kernels (a multiple of the warp, as the CUDA prelude's
#: reductions need); the kernel gate compiles with the same value.
DEFAULT_WG = 128


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


class CUDADevice(GPUDevice):
    """An NVIDIA GPU seen as ``CUDA<index>``."""

    reg: CUDAReg
    backend_class = CUDABackend
    buffer_class = CUDABuffer

    def __init__(self, reg: CUDAReg, index: int, cp: Any) -> None:
        super().__init__(reg, index)
        self.cp = cp
        self.info = info = read_device_info(cp, index)
        self.limits = Limits(
            wg=info.wg, local_mem=info.shared_mem_per_block, gpu=True, scratch=True
        )
        self.alignment, self.max_alloc = ALIGNMENT, info.memory_total
        self.driver_errors = cuda_errors(cp)
        self._peers: set[int] = set()
        with self.current():
            self.transfer_stream = cp.cuda.Stream(non_blocking=True)

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
        with self.driver("reading free memory"):
            free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def host_buffer_type(self) -> CUDAHostBufferType:
        return self.reg.host_buffer_type

    # -- the runtime base's hooks --------------------------------------------------------

    def current(self) -> Any:
        """This GPU as the calling thread's current device."""
        return self.cp.cuda.Device(self.index)

    def _alloc(self, nbytes: int) -> Any:
        return self.cp.cuda.Memory(nbytes)

    def kernel_arg(self, mem: Any) -> Any:
        return self.cp.cuda.MemoryPointer(mem, 0)  # what cupy passes as a pointer

    def _build_program(self) -> KernelProgram:
        return KernelProgram(self)

    def translate(self, err: BaseException, what: str, kernel: str | None = None) -> Exception:
        return translate(self.cp, err, what, kernel=kernel)

    def reaches(self, buf: Buffer) -> bool:
        """Every GPU's buffers: copies go peer to peer, or the driver stages them."""
        return isinstance(buf, CUDABuffer)

    def _event_new(self) -> Event:
        with self.current():
            return Event(self, self.cp.cuda.Event(disable_timing=True))

    def _event_synchronize(self, event: Event) -> None:
        with self.driver("waiting for an event"):
            event.context.synchronize()

    # -- transfers the buffers use (called inside ``driver``) ------------------------------

    def copy(self, dst: int, src: int, n: int, kind: int) -> None:
        """Copy ``n`` bytes between this GPU and the host (or within it) and wait."""
        stream = self.transfer_stream
        self.cp.cuda.runtime.memcpyAsync(dst, src, n, kind, stream.ptr)
        stream.synchronize()

    def copy_from(self, src_dev: CUDADevice, dst: int, src: int, n: int) -> None:
        """Copy ``n`` bytes from memory of ``src_dev`` (maybe this GPU) here, and wait."""
        if src_dev is self:
            self.copy(dst, src, n, D2D)
            return
        self.enable_peer_access(src_dev)
        stream = self.transfer_stream
        self.cp.cuda.runtime.memcpyPeerAsync(dst, self.index, src, src_dev.index, n, stream.ptr)
        stream.synchronize()

    def enable_peer_access(self, other: CUDADevice) -> bool:
        """Let this GPU reach ``other``'s memory directly, once per pair; False when the
        hardware cannot (copies between them then go through host memory)."""
        if other.index in self._peers:
            return True
        runtime = self.cp.cuda.runtime
        if not runtime.deviceCanAccessPeer(self.index, other.index):
            return False
        with self.current():
            try:
                runtime.deviceEnablePeerAccess(other.index)
            except runtime.CUDARuntimeError as e:
                if getattr(e, "status", None) != _PEER_ACCESS_ALREADY_ENABLED:
                    raise
        self._peers.add(other.index)
        return True


#: cudaErrorPeerAccessAlreadyEnabled: another part of the process enabled it first.
_PEER_ACCESS_ALREADY_ENABLED = 704

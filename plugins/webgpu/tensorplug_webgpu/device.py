"""One tensorplug device per WebGPU adapter, over the runtime base's :class:`GPUDevice`.

Each adapter gets its own ``wgpu.GPUDevice`` with the adapter's largest buffer and
binding limits (WebGPU's defaults are lower than most hardware). A device is described
by the record the plugin's device list keeps between processes (:mod:`.listing`): its
adapter's info and features and its device's limits; the adapter and device are
requested when it is first used. WebGPU does not say
how much memory a device has: a CPU adapter (lavapipe) computes in host memory, so it
reports the host's; a GPU reports the host's memory too, as the bound the API gives
(no adapter may hold more than the machine can address), less what this plugin holds.

The device type follows the adapter's: a software adapter (type "CPU") is a CPU-type
device, which ``init_best()`` and ``-ngl`` never choose over the host CPU backend (as
for PoCL); it is used when named (``--device WebGPU0``).
"""

from __future__ import annotations

import builtins
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tensorplug.device import DeviceCaps, DeviceType
from tensorplug.host import host_memory
from tensorplug.tensor import Tensor
from tensorplug.types import Type
from tensorplug_kernels import Limits
from tensorplug_kernels.runtime import OFFLOAD_MIN_BATCH, GPUDevice
from tensorplug_kernels.runtime.probe import Record

from .buffer import WebGPUBuffer, word_span
from .errors import translate

if TYPE_CHECKING:
    from .backend import WebGPUBackend
    from .program import WgslProgram
    from .reg import WebGPUReg

__all__ = ["WebGPUDevice", "adapter_type"]

#: Work-group size of the row kernels (reductions), a power of two.
WG = 64

_ADAPTER_TYPES = {
    "DiscreteGPU": DeviceType.GPU,
    "IntegratedGPU": DeviceType.IGPU,
    "VirtualGPU": DeviceType.GPU,
    "CPU": DeviceType.CPU,
}


def adapter_type(info: dict[str, Any]) -> DeviceType:
    """The tensorplug device type of an adapter (unknown kinds are used only when named)."""
    return _ADAPTER_TYPES.get(str(info.get("adapter_type")), DeviceType.ACCEL)


#: Types the shared kernel text decodes but the WGSL ports do not yet (IQ4_NL and IQ4_XS
#: came to the library after the port): nodes reading them run on another backend.
NOT_PORTED = frozenset({Type.IQ4_NL, Type.IQ4_XS})


class _Opened(NamedTuple):
    adapter: Any
    gpu: Any
    fence: Any


class WebGPUDevice(GPUDevice):
    """A WebGPU adapter seen as ``WebGPU<index>``, described by its record and opened
    (adapter and device requested) when first used."""

    reg: WebGPUReg
    buffer_class = WebGPUBuffer
    noun = "device"

    def __init__(self, reg: WebGPUReg, index: int, record: Record) -> None:
        super().__init__(reg, index)
        self._describe(record)
        self._allocated = 0
        self._alloc_lock = threading.Lock()

    def _describe(self, record: Record) -> None:
        """Take ``record`` (as listed, then as the driver says once opened) as this
        device's description."""
        self.info: dict[str, Any] = dict(record["info"])
        self.features: frozenset[str] = frozenset(record["features"])
        self.wgpu_limits: dict[str, int] = dict(record["limits"])
        self.limits = Limits(
            wg=min(WG, self.wgpu_limits["max-compute-invocations-per-workgroup"]),
            local_mem=self.wgpu_limits["max-compute-workgroup-storage-size"],
        )
        self.alignment = max(256, self.wgpu_limits["min-storage-buffer-offset-alignment"])
        self.max_alloc = self.wgpu_limits["max-buffer-size"] & ~3  # buffers are whole words
        # the largest binding, in whole 256-byte units, and where bindings may start
        self.binding_window = self.wgpu_limits["max-storage-buffer-binding-size"] & ~255
        self.binding_alignment = self.wgpu_limits["min-storage-buffer-offset-alignment"]

    def _open_driver(self) -> _Opened:
        """The adapter, its device and the fence word."""
        import wgpu

        from .listing import DEVICES

        self.driver_errors = (wgpu.GPUError,)
        adapter, gpu = DEVICES.open(self.index)
        self._describe(DEVICES.record_now(self.index))
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        return _Opened(adapter, gpu, gpu.create_buffer(size=4, usage=usage))

    @property
    def adapter(self) -> Any:
        """wgpu's adapter (the device is opened if it was not)."""
        return self.handle.adapter

    @property
    def gpu(self) -> Any:
        """wgpu's device (opened if it was not)."""
        return self.handle.gpu

    @property
    def description(self) -> str:
        i = self.info
        return f"{i.get('device')} ({i.get('backend_type')}, {i.get('adapter_type')}; " \
               f"{i.get('description')})"  # fmt: skip

    @property
    def type(self) -> DeviceType:
        return adapter_type(self.info)

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(asynchronous=True)

    def memory(self) -> tuple[int, int]:
        """``(free, total)``: the host's memory (WebGPU reports none of its own), the free
        part less what this plugin holds."""
        free, total = host_memory()
        with self._alloc_lock:
            return max(min(free, total - self._allocated), 0), total

    def track_allocation(self, nbytes: int) -> None:
        with self._alloc_lock:
            self._allocated += nbytes

    def offload_op(self, op: Tensor) -> bool:
        """Worth moving a large batch to a GPU; never to a software adapter."""
        return self.type in (DeviceType.GPU, DeviceType.IGPU) and op.ne()[1] >= OFFLOAD_MIN_BATCH

    def _supports_op(self, op: Tensor) -> bool:
        """The shared kernels' support, for tensors that fit one binding (a kernel sees a
        tensor through one storage binding of at most maxStorageBufferBindingSize)."""
        fits = self.binding_window - self.binding_alignment
        if any(t.type in NOT_PORTED for t in (op, *op.src)):
            return False
        return all(t.nbytes <= fits for t in (op, *op.src)) and super()._supports_op(op)

    # -- the runtime base's hooks --------------------------------------------------------

    def _alloc(self, nbytes: int) -> Any:
        import wgpu

        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return self.gpu.create_buffer(size=(nbytes + 3) & ~3, usage=usage)

    # the backend and the program import the kernel library's encoders and the WGSL
    # ports: only when a device computes, not when discovery describes the devices

    @property
    def backend_class(self) -> builtins.type[WebGPUBackend]:  # (the class has a `type` property)
        from .backend import WebGPUBackend

        return WebGPUBackend

    def _build_program(self) -> WgslProgram:
        from .program import WgslProgram

        return WgslProgram(self.name, self.gpu, self.limits.wg)

    def translate(self, err: BaseException, what: str, kernel: str | None = None) -> Exception:
        return translate(err, what, kernel=kernel)

    # -- synchronous transfers (queue-ordered, waited for) ---------------------------------

    def write(self, mem: Any, offset: int, data: memoryview) -> None:
        """Host bytes into ``mem`` from ``offset``; edge words are read and patched."""
        size = len(data)
        lo, n = word_span(offset, size)
        if (lo, n) == (offset, size):
            self.gpu.queue.write_buffer(mem, offset, data)
            return
        words = np.empty(n, np.uint8)
        self.read(mem, lo, words.data[:4])
        self.read(mem, lo + n - 4, words.data[n - 4 :])
        words[offset - lo : offset - lo + size] = np.frombuffer(data, np.uint8)
        self.gpu.queue.write_buffer(mem, lo, words)

    def read(self, mem: Any, offset: int, out: memoryview) -> None:
        """``len(out)`` bytes of ``mem`` from ``offset`` (waits for queued work)."""
        size = len(out)
        lo, n = word_span(offset, size)
        got = np.frombuffer(self.gpu.queue.read_buffer(mem, lo, n), np.uint8)
        np.frombuffer(out, np.uint8)[:] = got[offset - lo : offset - lo + size]

    def wait_queue(self) -> None:
        """Wait until the queue has finished what was submitted: by reading a word back,
        which completes after it (wgpu 0.32's on_submitted_work_done_sync does not work
        with the wgpu-native it ships)."""
        self.gpu.queue.read_buffer(self.handle.fence, 0, 4)

    def clear(self, mem: Any, offset: int, size: int) -> None:
        """Zero whole words of ``mem``."""
        enc = self.gpu.create_command_encoder()
        enc.clear_buffer(mem, offset, size)
        self.gpu.queue.submit([enc.finish()])

    def copy_bytes(self, src: Any, src_offset: int, dst: Any, dst_offset: int, size: int) -> None:
        """``size`` bytes from ``src`` to ``dst``: on the device's queue when whole words,
        else through the host (WebGPU copies only whole words)."""
        if src_offset % 4 or dst_offset % 4 or size % 4:
            staged = np.empty(size, np.uint8)
            self.read(src, src_offset, staged.data)
            self.write(dst, dst_offset, staged.data)
            return
        enc = self.gpu.create_command_encoder()
        enc.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size)
        self.gpu.queue.submit([enc.finish()])

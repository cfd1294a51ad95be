"""One tensorplug device per OpenCL device, over the runtime base's :class:`GPUDevice`.

Everything the driver says about a device is read once, into :class:`DeviceInfo`,
which the plugin's device list keeps between processes (:mod:`.listing`): a device is
described without asking the driver. It is opened when first used: its context (so its
buffers and its program belong to it alone) and a transfer queue for synchronous buffer
operations. PoCL and other drivers allocate lazily, so free memory is the total less
what this plugin holds, unless the driver can say (AMD).
"""

from __future__ import annotations

import builtins
import dataclasses
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from tensorplug.backend import Event
from tensorplug.device import DeviceCaps, DeviceType
from tensorplug.tensor import Tensor
from tensorplug_kernels import Limits
from tensorplug_kernels.runtime import OFFLOAD_MIN_BATCH, GPUDevice, pci_address
from tensorplug_kernels.runtime.probe import Record

from .buffer import OpenCLBuffer
from .errors import translate

if TYPE_CHECKING:
    from .backend import OpenCLBackend
    from .program import KernelProgram
    from .reg import OpenCLReg

__all__ = ["DeviceInfo", "OpenCLDevice", "build_options", "read_device_info"]

#: Work-group size of the row kernels (reductions): a power of two, capped per device.
DEFAULT_WG = 64


@dataclass(frozen=True)
class DeviceInfo:
    """What the driver reports about a device, read once at discovery."""

    name: str
    platform: str
    vendor: str
    version: str
    driver_version: str
    type: DeviceType
    memory_total: int
    max_alloc: int
    alignment: int
    local_mem: int
    max_work_group: int
    device_id: str | None
    correctly_rounded_div: bool
    denormals: bool
    free_memory_query: bool

    @property
    def wg(self) -> int:
        wg = DEFAULT_WG
        while wg > self.max_work_group:
            wg //= 2
        return max(wg, 1)

    def record(self) -> Record:
        """The info as JSON values (the device type by its value)."""
        return {**dataclasses.asdict(self), "type": self.type.value}

    @classmethod
    def from_record(cls, record: Record) -> DeviceInfo:
        """The info a :meth:`record` holds; a KeyError, TypeError or ValueError where it
        holds other fields or values of other types (another plugin version wrote it)."""
        hints = typing.get_type_hints(cls)
        if set(record) != set(hints):
            raise KeyError(f"fields {sorted(set(record) ^ set(hints))}")
        values = {**record, "type": DeviceType(record["type"])}
        for name, value in values.items():
            kind = hints[name]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(f"{name}: {value!r} is not {kind}")
        return cls(**values)


def _device_type(dev: Any) -> DeviceType:
    import pyopencl as cl

    kind = dev.type
    if kind & cl.device_type.GPU:
        # an integrated GPU shares host memory: the driver says so
        return DeviceType.IGPU if _info(dev, "host_unified_memory", False) else DeviceType.GPU
    if kind & cl.device_type.CPU:
        return DeviceType.CPU
    return DeviceType.ACCEL


def _info(dev: Any, attr: str, default: Any) -> Any:
    try:
        return getattr(dev, attr)
    except Exception:
        return default


def _pci_bus_id(dev: Any) -> str | None:
    """PCI address ``dddd:bb:dd.f`` from whichever vendor extension the driver has."""
    ext = _info(dev, "extensions", "")
    if "cl_khr_pci_bus_info" in ext:
        info = _info(dev, "pci_bus_info_khr", None)
        if info is not None:
            d, b, s, f = (
                getattr(info, k, 0) for k in ("pci_domain", "pci_bus", "pci_device", "pci_function")
            )
            return pci_address(d, b, s, f)
    if "cl_nv_device_attribute_query" in ext:
        bus, slot = _info(dev, "pci_bus_id_nv", None), _info(dev, "pci_slot_id_nv", None)
        if bus is not None and slot is not None:
            domain = _info(dev, "pci_domain_id_nv", 0)
            return pci_address(domain, bus, slot >> 3, slot & 7)
    if "cl_amd_device_attribute_query" in ext:
        topo = _info(dev, "topology_amd", None)
        if topo is not None and hasattr(topo, "bus"):
            return pci_address(0, topo.bus, topo.device, topo.function)
    uuid = _info(dev, "uuid_khr", None) if "cl_khr_device_uuid" in ext else None
    if uuid:
        h = bytes(uuid).hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return None


def read_device_info(dev: Any) -> DeviceInfo:
    import pyopencl as cl

    fp_config = _info(dev, "single_fp_config", 0)
    return DeviceInfo(
        name=dev.name.strip(),
        platform=dev.platform.name.strip(),
        vendor=dev.vendor.strip(),
        version=dev.version.strip(),
        driver_version=dev.driver_version.strip(),
        type=_device_type(dev),
        memory_total=int(dev.global_mem_size),
        max_alloc=int(dev.max_mem_alloc_size),
        alignment=max(int(dev.mem_base_addr_align) // 8, 16),
        local_mem=int(dev.local_mem_size),
        max_work_group=int(dev.max_work_group_size),
        device_id=_pci_bus_id(dev),
        correctly_rounded_div=bool(fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT),
        denormals=bool(fp_config & cl.device_fp_config.DENORM),
        free_memory_query="cl_amd_device_attribute_query" in _info(dev, "extensions", ""),
    )


def build_options(info: DeviceInfo) -> list[str]:
    """Compiler options: the work-group size, IEEE division where the device has it
    (quantization must divide exactly as the reference does), and whether single
    precision keeps denormals (a faster f16 conversion relies on it)."""
    opts = [f"-DWG={info.wg}"]
    if info.denormals:
        opts.append("-DTP_DENORMS")
    if info.correctly_rounded_div:
        opts.append("-cl-fp32-correctly-rounded-divide-sqrt")
    return opts


class _Opened(NamedTuple):
    cl_device: Any
    context: Any
    transfer_queue: Any


class OpenCLDevice(GPUDevice):
    """An OpenCL device seen as ``OpenCL<index>``, described by its :class:`DeviceInfo`
    and opened (asked of the driver) when first used."""

    reg: OpenCLReg
    buffer_class = OpenCLBuffer
    noun = "device"

    def __init__(self, reg: OpenCLReg, index: int, info: DeviceInfo) -> None:
        super().__init__(reg, index)
        self._describe(info)
        self._allocated = 0

    def _describe(self, info: DeviceInfo) -> None:
        """Take ``info`` (as listed, then as the driver says once opened) as this device's."""
        self.info = info
        self.limits = Limits(
            wg=info.wg,
            local_mem=info.local_mem,
            gpu=info.type is not DeviceType.CPU
            and info.max_work_group >= 256
            and info.local_mem >= 32 * 1024,
            scratch=True,
        )
        self.alignment, self.max_alloc = info.alignment, info.max_alloc

    def _open_driver(self) -> _Opened:
        """The driver's device, a context and a transfer queue."""
        import pyopencl as cl

        from .listing import DEVICES

        # TypeError, ValueError: what pyopencl raises for arguments it cannot set
        self.driver_errors = (cl.Error, TypeError, ValueError)
        cl_device = DEVICES.open(self.index)
        self._describe(DeviceInfo.from_record(DEVICES.record_now(self.index)))
        context = cl.Context([cl_device])
        return _Opened(cl_device, context, cl.CommandQueue(context, cl_device))

    @property
    def cl_device(self) -> Any:
        """pyopencl's device (the device is opened if it was not)."""
        return self.handle.cl_device

    @property
    def context(self) -> Any:
        """The device's own context (the device is opened if it was not)."""
        return self.handle.context

    @property
    def transfer_queue(self) -> Any:
        """The queue of synchronous buffer operations (the device is opened if it was
        not)."""
        return self.handle.transfer_queue

    @property
    def description(self) -> str:
        return f"{self.info.name} ({self.info.platform})"

    @property
    def type(self) -> DeviceType:
        return self.info.type

    @property
    def device_id(self) -> str | None:
        return self.info.device_id

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(asynchronous=True, events=True)

    def memory(self) -> tuple[int, int]:
        """``(free, total)``: the driver's free memory where it reports it (AMD), else the
        total less what this plugin has allocated on the device."""
        total = self.info.memory_total
        if self.info.free_memory_query:
            import pyopencl as cl

            try:
                free_kib = self.cl_device.get_info(cl.device_info.GLOBAL_FREE_MEMORY_AMD)
                return int(free_kib[0]) * 1024, total
            except Exception:  # an older driver or pyopencl: fall back to our own count
                pass
        with self._lock:
            return max(total - self._allocated, 0), total

    def track_allocation(self, nbytes: int) -> None:
        with self._lock:
            self._allocated += nbytes

    def offload_op(self, op: Tensor) -> bool:
        """Worth moving a large batch to a discrete or integrated GPU; never to a device
        that is the host CPU itself."""
        return self.type in (DeviceType.GPU, DeviceType.IGPU) and op.ne()[1] >= OFFLOAD_MIN_BATCH

    # -- the runtime base's hooks --------------------------------------------------------

    def _alloc(self, nbytes: int) -> Any:
        import pyopencl as cl

        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)

    # the backend and the program import the kernel library's encoders and texts: only
    # when a device computes, not when discovery describes the devices

    @property
    def backend_class(self) -> builtins.type[OpenCLBackend]:  # (the class has a `type` property)
        from .backend import OpenCLBackend

        return OpenCLBackend

    def _build_program(self) -> KernelProgram:
        from .program import KernelProgram

        return KernelProgram(self.context, self.cl_device, build_options(self.info))

    def translate(self, err: BaseException, what: str, kernel: str | None = None) -> Exception:
        return translate(err, what, kernel=kernel)

    def _event_new(self) -> Event:
        return Event(self, None)

    def _event_synchronize(self, event: Event) -> None:
        if event.context is not None:
            with self.driver("waiting for an event"):
                event.context.wait()

"""Devices and backend registrations (ggml's ``ggml_backend_dev`` and ``ggml_backend_reg``).

A :class:`Reg` is what a plugin hands the registry: a named collection of devices.
A :class:`Device` describes one piece of hardware, creates backends (streams) on it,
owns its buffer types and answers which ops and buffers it can work with.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import OutOfBoundsError, UnsupportedError
from .version import API_VERSION

if TYPE_CHECKING:
    from .backend import Backend, Event
    from .buffer import Buffer, BufferType
    from .tensor import Tensor

__all__ = ["Device", "DeviceCaps", "DeviceProps", "DeviceType", "Reg", "is_host_cpu"]


class DeviceType(enum.Enum):
    """What kind of hardware a device is, which decides when it is used by default.

    * ``CPU``: the host CPU backend (one per process, computing in host memory), or a
      CPU-type device with its own buffers (OpenCL on PoCL). Never an offload target.
    * ``GPU`` / ``IGPU``: discrete / integrated GPUs, the only devices ``init_best``
      and the runner's default placement (``-ngl``) pick, GPU before IGPU.
    * ``ACCEL``: helps the CPU from the host or beside it (BLAS, AMX, JAX on the CPU):
      placed only when named (``--device``), as in llama.cpp. Declare this for a
      backend that runs on the host cores; declaring GPU would take work from the CPU
      backend by default.

    ``tensorplug.priority.by_priority`` orders devices for the scheduler: GPU, IGPU,
    ACCEL, CPU-type devices with their own memory, then the host CPU last.
    """

    CPU = "cpu"
    GPU = "gpu"
    IGPU = "igpu"
    ACCEL = "accel"


@dataclass(frozen=True)
class DeviceCaps:
    asynchronous: bool = False
    host_buffer: bool = False
    buffer_from_host_ptr: bool = False
    events: bool = False


@dataclass(frozen=True)
class DeviceProps:
    name: str
    description: str
    memory_free: int
    memory_total: int
    type: DeviceType
    device_id: str | None = None
    caps: DeviceCaps = field(default_factory=DeviceCaps)


class Device(ABC):
    """One device (``ggml_backend_dev``). Required members are abstract; optional ones
    default as in ggml.

    For plugin authors — required: ``name``, ``description``, ``type`` (see
    :class:`DeviceType`: it decides when the device is used by default), ``memory()``,
    ``_init_backend(params)`` (a new :class:`~tensorplug.Backend`; ``init_backend`` is
    the public wrapper), ``buffer_type()``, ``supports_op(op)``, ``supports_buft(buft)``.
    Optional, with defaults: ``device_id`` (None; a PCI bus id or UUID lets the registry
    spot the same GPU seen by two plugins), ``caps`` (derived), ``host_buffer_type()``
    (None), ``buffer_from_host_ptr`` (UnsupportedError), ``offload_op`` (False),
    ``event_new/free/synchronize`` (UnsupportedError). See docs/writing-a-backend.md.
    """

    def __init__(self, reg: Reg | None = None) -> None:
        self.reg = reg

    # -- required -----------------------------------------------------------------------

    @property
    @abstractmethod
    def name(self) -> str:
        """Short identifier, unique in the registry: ``"CPU"``, ``"OpenCL0"``."""

    @property
    @abstractmethod
    def description(self) -> str:
        """Human description, typically the hardware's model name."""

    @property
    @abstractmethod
    def type(self) -> DeviceType:
        """What kind of device this is; see :class:`DeviceType` for how it is placed."""

    @abstractmethod
    def memory(self) -> tuple[int, int]:
        """``(free, total)`` bytes of device memory."""

    @abstractmethod
    def _init_backend(self, params: str | None) -> Backend:
        """A new backend (stream) on this device; ``params`` is the user's optional
        string (``init_by_name("X0", "threads=4")``), None when not given. Applications
        call :meth:`init_backend`."""

    @abstractmethod
    def buffer_type(self) -> BufferType:
        """The preferred buffer type for tensors this device computes on."""

    @abstractmethod
    def supports_op(self, op: Tensor) -> bool:
        """True when this device can compute ``op`` with its sources' types and layouts."""

    @abstractmethod
    def supports_buft(self, buft: BufferType) -> bool:
        """True when this device's kernels can read and write tensors in ``buft``."""

    # -- optional, with ggml's defaults -------------------------------------------------

    @property
    def device_id(self) -> str | None:
        """A stable id of the physical device (PCI bus id, UUID) to spot duplicates."""
        return None

    @property
    def caps(self) -> DeviceCaps:
        """What the device can do beyond the basics (async, host buffers, events...)."""
        return DeviceCaps(host_buffer=self.host_buffer_type() is not None)

    def props(self) -> DeviceProps:
        """Everything ``ggml_backend_dev_get_props`` reports, in one snapshot (memory is
        read now)."""
        free, total = self.memory()
        return DeviceProps(
            name=self.name,
            description=self.description,
            memory_free=free,
            memory_total=total,
            type=self.type,
            device_id=self.device_id,
            caps=self.caps,
        )

    def host_buffer_type(self) -> BufferType | None:
        """Pinned host memory for fast transfers to this device, if it has any."""
        return None

    def buffer_from_host_ptr(self, obj: Any, max_tensor_size: int = 0) -> Buffer:
        """A buffer over existing host memory (an mmap'ed model, a numpy array)."""
        raise UnsupportedError(f"device {self.name!r} cannot wrap host memory as a buffer")

    def offload_op(self, op: Tensor) -> bool:
        """True when ``op`` is worth running here even if its weights live elsewhere."""
        return False

    def event_new(self) -> Event:
        """A new event for this device's backends (optional: declare caps.events)."""
        raise UnsupportedError(f"device {self.name!r} does not support events")

    def event_free(self, event: Event) -> None:
        """Release an event's resources."""

    def event_synchronize(self, event: Event) -> None:
        raise UnsupportedError(f"device {self.name!r} does not support events")

    # -- public -------------------------------------------------------------------------

    def init_backend(self, params: str | None = None) -> Backend:
        """A new stream on this device (``ggml_backend_dev_init``)."""
        return self._init_backend(params)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.type.value})>"


def is_host_cpu(dev: Device) -> bool:
    """The CPU backend proper: a CPU computing in host memory (not, say, OpenCL on PoCL,
    which is a CPU-type device with its own device buffers).

    The registry's ``init_best`` and the scheduler's device order both ask it, so it
    lives with the device protocol rather than with either of them.
    """
    return dev.type is DeviceType.CPU and dev.buffer_type().is_host


class Reg(ABC):
    """A backend registration: a named family of devices plus optional extensions."""

    #: The plugin API this reg was written against; checked when it is registered.
    api_version: tuple[int, int] = API_VERSION

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def devices(self) -> Sequence[Device]: ...

    def get_proc(self, name: str) -> Callable[..., Any] | None:
        """A named extension function (``ggml_backend_reg_get_proc_address``), or None."""
        return None

    def features(self) -> dict[str, str]:
        """Build and hardware features worth showing (``ggml_backend_get_features``)."""
        return {}

    @property
    def device_count(self) -> int:
        return len(self.devices())

    def device(self, index: int) -> Device:
        devs = self.devices()
        if not 0 <= index < len(devs):
            raise OutOfBoundsError(
                f"{self.name} has {len(devs)} devices; index {index} is out of range"
            )
        return devs[index]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

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

__all__ = ["Device", "DeviceCaps", "DeviceProps", "DeviceType", "Reg"]


class DeviceType(enum.Enum):
    """What kind of hardware a device is; ``init_best`` prefers GPU, then IGPU, then CPU."""

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
    """One device. Required members are abstract; optional ones default as in ggml."""

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
    def type(self) -> DeviceType: ...

    @abstractmethod
    def memory(self) -> tuple[int, int]:
        """``(free, total)`` bytes of device memory."""

    @abstractmethod
    def _init_backend(self, params: str | None) -> Backend: ...

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
        return DeviceCaps(host_buffer=self.host_buffer_type() is not None)

    def props(self) -> DeviceProps:
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

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
from .hooknames import Guard, adopt_old_names, public
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
    the public wrapper), ``buffer_type()``, ``_supports_op(op)`` (``supports_op`` is
    the public wrapper, which applies the op contract first), ``supports_buft(buft)``.
    Optional, with defaults: ``device_id`` (None; a PCI bus id or UUID lets the registry
    spot the same GPU seen by two plugins), ``caps`` (derived), ``host_buffer_type()``
    (None), ``buffer_from_host_ptr`` (UnsupportedError), ``offload_op`` (False),
    ``_event_new/_event_free/_event_synchronize`` (UnsupportedError). Underscore hooks
    are what a plugin implements, public methods what applications call
    (:mod:`tensorplug.hooknames`; API 1.0's names still work, with a warning). See
    docs/writing-a-backend.md.
    """

    def __init__(self, reg: Reg | None = None) -> None:
        self.reg = reg

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_old_names(cls, _DEVICE_RENAMED)

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

    def _supports_op(self, op: Tensor) -> bool:
        """Required: True when this device can compute ``op`` with its sources' types and
        layouts. Applications call :meth:`supports_op`, which asks this only for nodes
        within the op contract the plugin declares. (Not abstract only so that API 1.0
        plugins defining ``supports_op`` instead still type-check; the registry refuses
        a device defining neither.)"""
        raise NotImplementedError(
            f"{type(self).__qualname__} does not implement _supports_op(op), which every "
            "tensorplug Device must (say which nodes it computes)"
        )

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

    def _event_new(self) -> Event:
        """A new event for this device's backends (optional: declare caps.events)."""
        raise UnsupportedError(f"device {self.name!r} does not support events")

    def _event_free(self, event: Event) -> None:
        """Release an event's resources."""

    def _event_synchronize(self, event: Event) -> None:
        """Wait until ``event`` has happened."""
        raise UnsupportedError(f"device {self.name!r} does not support events")

    # -- public -------------------------------------------------------------------------

    @property
    def api_version(self) -> tuple[int, int]:
        """The plugin API, and so the op contract, that this device's plugin declares:
        its Reg's (the registry sets it from the plugin's Registration), or the running
        core's for a device without a Reg."""
        return self.reg.api_version if self.reg is not None else API_VERSION

    def init_backend(self, params: str | None = None) -> Backend:
        """A new stream on this device (``ggml_backend_dev_init``)."""
        return self._init_backend(params)

    @public
    def supports_op(self, op: Tensor) -> bool:
        """True when this device computes ``op``: never when ``op`` needs an op-contract
        feature newer than its plugin declares (:func:`tensorplug.contract.missing_feature`),
        otherwise the plugin's answer (``_supports_op``). The scheduler, the meta device
        and the conformance kit all ask here, so an old plugin is never handed a node
        whose meaning changed after it was written."""
        return _within_contract(self, op) and self._supports_op(op)

    @public
    def event_new(self) -> Event:
        """A new event for this device's backends (``ggml_backend_event_new``)."""
        return self._event_new()

    @public
    def event_free(self, event: Event) -> None:
        """Release ``event`` (``ggml_backend_event_free``)."""
        self._event_free(event)

    @public
    def event_synchronize(self, event: Event) -> None:
        """Wait until ``event`` has happened (``ggml_backend_event_synchronize``)."""
        self._event_synchronize(event)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.type.value})>"


def _within_contract(dev: Device, op: Tensor, *_: Any) -> bool:
    # imported here: `python -m tensorplug.contract` must find it not yet imported
    from .contract import missing_feature

    return missing_feature(op, dev.api_version) is None


#: API 1.0's hook names and (hook, guard) in 1.3: see :mod:`tensorplug.hooknames`.
_DEVICE_RENAMED: dict[str, tuple[str, Guard | None]] = {
    "supports_op": ("_supports_op", _within_contract),
    "event_new": ("_event_new", None),
    "event_free": ("_event_free", None),
    "event_synchronize": ("_event_synchronize", None),
}


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

"""A minimal backend on host memory: concrete Device, Reg and Backend for registry tests.

The other test plugins build their Regs with :func:`make_reg` so that each test
distribution stays a few lines long.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tensorplug.backend import Backend, Status
from tensorplug.buffer import BufferType
from tensorplug.device import Device, DeviceType, Reg
from tensorplug.graph import Graph
from tensorplug.hooks import hookimpl
from tensorplug.host import HostBufferType, host_buffer_type
from tensorplug.tensor import Tensor

#: How many times create_reg() ran in this process (the thread-safety test reads it).
INIT_CALLS = 0


class TestBackend(Backend):
    def _graph_compute(self, graph: Graph) -> Status:
        return Status.SUCCESS


class RepackBufferType(HostBufferType):
    """An "extra" buffer type offered through the tensorplug_extra_buffer_types hook."""

    @property
    def name(self) -> str:
        return "TEST_REPACK"


class TestDevice(Device):
    def __init__(self, name: str, type: DeviceType, device_id: str | None = None) -> None:
        super().__init__()
        self._name, self._type, self._device_id = name, type, device_id

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return f"test device {self._name}"

    @property
    def type(self) -> DeviceType:
        return self._type

    @property
    def device_id(self) -> str | None:
        return self._device_id

    def memory(self) -> tuple[int, int]:
        return 1 << 30, 2 << 30

    def _init_backend(self, params: str | None) -> Backend:
        return TestBackend(self)

    def buffer_type(self) -> BufferType:
        return host_buffer_type()

    def _supports_op(self, op: Tensor) -> bool:
        return False

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host


class TestReg(Reg):
    def __init__(self, name: str, devices: Sequence[Device], features: dict[str, str]) -> None:
        self._name, self._devices, self._features = name, list(devices), features
        for dev in self._devices:
            dev.reg = self
        self._repack = RepackBufferType()

    @property
    def name(self) -> str:
        return self._name

    def devices(self) -> Sequence[Device]:
        return self._devices

    def features(self) -> dict[str, str]:
        return dict(self._features)

    def get_proc(self, name: str) -> Callable[..., Any] | None:
        return self.features if name == "test_features" else None

    @hookimpl
    def tensorplug_extra_buffer_types(self, device: Device) -> list[BufferType] | None:
        if device.reg is self and device.type is DeviceType.CPU:
            return [self._repack]
        return None

    @hookimpl
    def tensorplug_get_proc(self, reg: Reg, name: str) -> Callable[..., Any] | None:
        if name == f"hello_from_{self._name.lower()}":
            return lambda: f"hello from {self._name} to {reg.name}"
        return None


def make_reg(
    name: str,
    devices: Sequence[tuple[str, DeviceType, str | None]],
    reg_class: type[TestReg] = TestReg,
    **features: str,
) -> TestReg:
    return reg_class(name, [TestDevice(*spec) for spec in devices], features)


def create_reg() -> TestReg:
    global INIT_CALLS
    INIT_CALLS += 1
    return make_reg(
        "TEST",
        [("TEST0", DeviceType.CPU, None), ("TEST1", DeviceType.IGPU, "test-gpu-0")],
        variant="good",
    )

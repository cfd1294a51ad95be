"""The OpenCL registration: every device of every platform, numbered in order."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from tensorplug.device import Reg

from .device import OpenCLDevice

__all__ = ["OpenCLReg", "create_reg", "discover_devices"]


def discover_devices() -> list[Any]:
    """All OpenCL devices, platform by platform; platforms that list none are skipped."""
    import pyopencl as cl

    devices: list[Any] = []
    for platform in cl.get_platforms():
        try:
            devices.extend(platform.get_devices())
        except cl.Error:  # DEVICE_NOT_FOUND on a platform with no usable device
            continue
    return devices


class OpenCLReg(Reg):
    """Devices ``OpenCL0``, ``OpenCL1``, … across all platforms."""

    def __init__(self) -> None:
        self._devices = [OpenCLDevice(self, i, d) for i, d in enumerate(discover_devices())]

    @property
    def name(self) -> str:
        return "OpenCL"

    def devices(self) -> Sequence[OpenCLDevice]:
        return tuple(self._devices)

    def features(self) -> dict[str, str]:
        import pyopencl as cl

        feats = {"pyopencl": cl.VERSION_TEXT}
        for dev in self._devices:
            info = dev.info
            feats[dev.name] = (
                f"{info.name} on {info.platform}; {info.version}; driver {info.driver_version}"
            )
        return feats


_REG: OpenCLReg | None = None
_LOCK = threading.Lock()


def create_reg() -> OpenCLReg:
    """The process-wide registration (contexts and built programs are shared)."""
    global _REG
    with _LOCK:
        if _REG is None:
            _REG = OpenCLReg()
        return _REG

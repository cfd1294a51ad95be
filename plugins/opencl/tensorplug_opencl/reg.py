"""The OpenCL registration: every device of every platform, numbered in order."""

from __future__ import annotations

from typing import Any

from tensorplug_kernels.runtime import GPUReg, process_wide

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


class OpenCLReg(GPUReg):
    """Devices ``OpenCL0``, ``OpenCL1``, … across all platforms."""

    runtime = "OpenCL"
    _devices: list[OpenCLDevice]

    def __init__(self) -> None:
        self._devices = [OpenCLDevice(self, i, d) for i, d in enumerate(discover_devices())]

    def features(self) -> dict[str, str]:
        import pyopencl as cl

        feats = {"pyopencl": cl.VERSION_TEXT}
        for dev in self._devices:
            info = dev.info
            feats[dev.name] = (
                f"{info.name} on {info.platform}; {info.version}; driver {info.driver_version}"
            )
        return feats


#: The process-wide registration (contexts and built programs are shared).
create_reg = process_wide(OpenCLReg)

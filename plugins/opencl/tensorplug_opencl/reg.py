"""The OpenCL registration: every device of every platform (the host CPU once), numbered in
order."""

from __future__ import annotations

from tensorplug_kernels.opencl_devices import opencl_devices
from tensorplug_kernels.runtime import GPUReg, process_wide

from .device import DeviceInfo, OpenCLDevice
from .listing import DEVICES

__all__ = ["OpenCLReg", "create_reg", "discover_devices"]


#: the devices the registration numbers (:func:`tensorplug_kernels.opencl_devices.opencl_devices`)
discover_devices = opencl_devices


class OpenCLReg(GPUReg):
    """Devices ``OpenCL0``, ``OpenCL1``, … across all platforms."""

    runtime = "OpenCL"
    _devices: list[OpenCLDevice]

    def __init__(self) -> None:
        records = DEVICES.records()
        self._devices = [
            OpenCLDevice(self, i, DeviceInfo.from_record(r)) for i, r in enumerate(records)
        ]

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

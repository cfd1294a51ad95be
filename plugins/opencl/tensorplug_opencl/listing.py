"""The OpenCL devices, kept between processes (a
:class:`~tensorplug_kernels.runtime.probe.DeviceProbe`).

Asking for OpenCL's platforms loads every installed driver: with PoCL, LLVM, tens of
megabytes of memory and a visible share of a launch, in every process that loads the
plugins, although PoCL's device is the host CPU, which no default placement puts a model
on. :data:`DEVICES` describes the devices from the kept list while nothing a driver
depends on has changed (the ICD files and the libraries they name, pyopencl's and the
PoCL wheel's versions, the device nodes, the boot, the driver variables); a device is
opened when first used.
"""

from __future__ import annotations

import os
from typing import Any

from tensorplug_kernels.opencl_devices import opencl_devices
from tensorplug_kernels.runtime.probe import DeviceProbe, Record, driver_key

from .device import DeviceInfo, read_device_info

__all__ = ["DEVICES", "ICD_FOLDERS", "VARIABLES", "identity", "probe"]

#: Where ICD loaders find OpenCL drivers (Khronos' and ocl-icd's defaults).
ICD_FOLDERS = ("/etc/OpenCL/vendors", "/usr/local/etc/OpenCL/vendors")

#: The packages whose versions decide what the drivers give.
_DISTRIBUTIONS = ("pyopencl", "pocl-binary-distribution")

#: Variables OpenCL's ICD loaders and drivers read (which drivers, which of their devices).
VARIABLES = (
    "OCL_", "OPENCL_", "POCL_", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ZE_", "SYCL_",
)  # fmt: skip


def probe() -> list[tuple[Record, Any]]:
    """Every device the drivers give (the host CPU once), as a record and pyopencl's
    device."""
    return [(read_device_info(d).record(), d) for d in opencl_devices()]


def _key() -> str:
    folders = [*ICD_FOLDERS]
    for variable in ("OCL_ICD_VENDORS", "OPENCL_VENDOR_PATH", "OCL_ICD_FILENAMES"):
        folders.extend(p for p in os.environ.get(variable, "").split(os.pathsep) if p)
    return driver_key("OpenCL", _DISTRIBUTIONS, folders, VARIABLES)


def identity(record: Record) -> object:
    """Which device a record describes: what else it says may change between processes
    (PoCL's memory total and largest allocation follow the host's free memory)."""
    return [record.get(k) for k in ("name", "platform", "vendor", "type", "device_id")]


#: The process's OpenCL device list.
DEVICES: DeviceProbe[Any] = DeviceProbe(
    "OpenCL", probe, _key, check=DeviceInfo.from_record, identity=identity
)

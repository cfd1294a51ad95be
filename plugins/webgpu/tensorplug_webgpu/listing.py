"""The WebGPU devices, kept between processes (a
:class:`~tensorplug_kernels.runtime.probe.DeviceProbe`).

Listing wgpu's adapters imports wgpu-native (slowly: cffi parses wgpu's C declarations)
and starts every Vulkan driver; requesting a device of each, to learn its limits, starts
the device. Done in every process that loads the plugins, that would be a large share of
a launch's time and tens of megabytes, although on most machines without a GPU the one
adapter is lavapipe, a software device no default placement uses. :data:`DEVICES`
describes the devices from the kept list while nothing the drivers depend on has changed
(the Vulkan manifests and the libraries they name, wgpu's version, the device nodes, the
boot, the driver variables); a device is opened, its adapter and device requested again,
when first used.
"""

from __future__ import annotations

import os
from typing import Any

from tensorplug_kernels.runtime.probe import DeviceProbe, Record, driver_key

from .adapters import compute_adapters

__all__ = [
    "DEVICES", "RAISED_LIMITS", "VARIABLES", "VULKAN_FOLDERS", "check", "identity", "probe",
    "request_device",
]  # fmt: skip

#: Limits asked of the device at the adapter's own values (WebGPU starts at defaults).
RAISED_LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroups-per-dimension",
)

#: Where Vulkan's loader finds drivers and the layers that reorder or hide them.
VULKAN_FOLDERS = tuple(
    f"{base}/vulkan/{kind}"
    for base in ("/etc", "/usr/share", "/usr/local/share")
    for kind in ("icd.d", "implicit_layer.d")
)


#: Variables Vulkan's loader, Mesa, NVIDIA's driver and wgpu read (which drivers and
#: layers load, which GPU is shown), and the one the device-select layer is skipped by.
VARIABLES = (
    "VK_", "MESA_", "LP_", "NODEVICE_SELECT", "DRI_PRIME", "WGPU_", "XDG_RUNTIME_DIR",
    "__NV_", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip


def request_device(adapter: Any, label: str) -> Any:
    """The adapter's device, with :data:`RAISED_LIMITS` at the adapter's values."""
    limits = adapter.limits
    return adapter.request_device_sync(
        required_limits={k: limits[k] for k in RAISED_LIMITS if k in limits}, label=label
    )


def probe() -> list[tuple[Record, Any]]:
    """Each compute adapter as a record (its info, features and its device's limits) and
    ``(adapter, device)``."""
    found = []
    for index, adapter in enumerate(compute_adapters()):
        gpu = request_device(adapter, f"tensorplug WebGPU{index}")
        record = {
            "info": dict(adapter.info),
            "features": sorted(adapter.features),
            "limits": dict(gpu.limits),
        }
        found.append((record, (adapter, gpu)))
    return found


#: The limits a device reads from its record (:class:`~.device.WebGPUDevice`).
_USED_LIMITS = (
    *RAISED_LIMITS,
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-storage-size",
    "min-storage-buffer-offset-alignment",
)


def check(record: Record) -> None:
    """Raise where a kept record is not what :func:`probe` writes."""
    info, features, limits = record["info"], record["features"], record["limits"]
    if not (
        isinstance(info, dict)
        and all(isinstance(info.get(k), str) for k in ("device", "backend_type", "adapter_type"))
        and isinstance(features, list)
        and all(isinstance(f, str) for f in features)
        and isinstance(limits, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in limits.values())
        and all(limits.get(k, -1) >= 0 for k in _USED_LIMITS)
    ):
        raise TypeError(
            "a WebGPU record holds info (device, backend_type, adapter_type), features "
            f"(a list) and limits (counts, with {', '.join(_USED_LIMITS)})"
        )


def _key() -> str:
    home = os.path.expanduser("~/.local/share/vulkan")
    data = os.environ.get("XDG_DATA_DIRS", "").split(os.pathsep)
    folders = [*VULKAN_FOLDERS, f"{home}/icd.d", f"{home}/implicit_layer.d"]
    folders += [f"{d}/vulkan/icd.d" for d in data if d]
    return driver_key("WebGPU", ("wgpu",), folders, VARIABLES)


def identity(record: Record) -> object:
    """Which adapter a record describes (its limits and driver strings may change)."""
    info = record["info"]
    return [info.get(k) for k in ("vendor", "device", "backend_type", "adapter_type")]


#: The process's WebGPU device list.
DEVICES: DeviceProbe[Any] = DeviceProbe("WebGPU", probe, _key, check=check, identity=identity)

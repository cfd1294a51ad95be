"""The WebGPU registration: a device per Vulkan, Metal or Direct3D 12 adapter."""

from __future__ import annotations

from tensorplug_kernels.runtime import GPUReg, process_wide

from .device import WebGPUDevice
from .listing import DEVICES

__all__ = ["WebGPUReg", "create_reg"]


class WebGPUReg(GPUReg):
    """Devices ``WebGPU0``, ``WebGPU1``, … in the order wgpu lists the adapters."""

    runtime = "WebGPU"
    _devices: list[WebGPUDevice]

    def __init__(self) -> None:
        self._devices = [WebGPUDevice(self, i, r) for i, r in enumerate(DEVICES.records())]

    def features(self) -> dict[str, str]:
        import wgpu

        feats = {"wgpu": wgpu.__version__}
        for dev in self._devices:
            lim = dev.wgpu_limits
            feats[dev.name] = (
                f"{dev.description}; max buffer {lim['max-buffer-size']} bytes, max binding "
                f"{lim['max-storage-buffer-binding-size']} bytes; shader-f16 "
                f"{'yes' if 'shader-f16' in dev.features else 'no'} (not needed)"
            )
        return feats


#: The process-wide registration (devices and compiled kernels are shared).
create_reg = process_wide(WebGPUReg)

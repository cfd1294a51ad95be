"""The adapters tensorplug computes on: wgpu's, on the APIs with full compute support.

wgpu also offers OpenGL adapters (on Linux, the same llvmpipe or GPU once more, through
EGL); their compute support is partial and they would list every device twice, so only
Vulkan, Metal and Direct3D 12 adapters become devices. The list is made once per
process: enumerating starts every backend's driver.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["COMPUTE_BACKENDS", "compute_adapters"]

#: The wgpu backends whose adapters become tensorplug devices.
COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")


@functools.cache
def compute_adapters() -> tuple[Any, ...]:
    """wgpu's adapters on Vulkan, Metal and Direct3D 12, in the order wgpu lists them."""
    import wgpu

    try:  # only the primary APIs: probing OpenGL prints EGL noise and finds nothing new
        from wgpu.backends.wgpu_native.extras import set_instance_extras

        set_instance_extras(backends=["Primary"])
    except Exception:  # another wgpu backend, or the instance exists already: list them all
        pass
    return tuple(
        a
        for a in wgpu.gpu.enumerate_adapters_sync()
        if a.info.get("backend_type") in COMPUTE_BACKENDS
    )

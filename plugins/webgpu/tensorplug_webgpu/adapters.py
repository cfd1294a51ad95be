"""The adapters tensorplug computes on: wgpu's, on the APIs with full compute support.

wgpu also offers OpenGL adapters (on Linux, the same llvmpipe or GPU once more, through
EGL); their compute support is partial and they would list every device twice, so only
Vulkan, Metal and Direct3D 12 adapters become devices. The list is made once per
process: enumerating starts every backend's driver.

Headless machines (containers, services, CI) have no ``XDG_RUNTIME_DIR``. There Mesa's
Vulkan device-select layer, which orders GPUs by asking a Wayland display which one
draws it, makes libwayland print "error: XDG_RUNTIME_DIR is invalid or not set" for
every process that lists adapters: every tensorplug command. The order it would give is
not used (every adapter becomes a device), so on such machines the layer is skipped,
unless the user chose a device through Mesa's own variables.
"""

from __future__ import annotations

import functools
import os
from collections.abc import MutableMapping
from typing import Any

__all__ = ["COMPUTE_BACKENDS", "MESA_SELECTION_VARIABLES", "compute_adapters", "skip_device_select"]

#: The wgpu backends whose adapters become tensorplug devices.
COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")

#: Mesa's variables for choosing a GPU: where one is set, the device-select layer runs.
MESA_SELECTION_VARIABLES = ("NODEVICE_SELECT", "MESA_VK_DEVICE_SELECT", "DRI_PRIME")


def skip_device_select(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set ``NODEVICE_SELECT=1`` where Mesa's device-select layer could only print noise.

    That is where ``XDG_RUNTIME_DIR`` names no directory (so no Wayland display can be
    found) and the user set none of :data:`MESA_SELECTION_VARIABLES`. Returns whether it
    set it. The variable reaches only Mesa's layer, in this process and its children.
    """
    runtime_dir = environ.get("XDG_RUNTIME_DIR", "")
    if runtime_dir and os.path.isdir(runtime_dir):
        return False
    if any(name in environ for name in MESA_SELECTION_VARIABLES):
        return False
    environ["NODEVICE_SELECT"] = "1"
    return True


@functools.cache
def compute_adapters() -> tuple[Any, ...]:
    """wgpu's adapters on Vulkan, Metal and Direct3D 12, in the order wgpu lists them."""
    skip_device_select()
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

"""tensorplug-webgpu: a tensorplug backend for every WebGPU adapter, through wgpu.

WebGPU (wgpu-native, through the ``wgpu`` package) runs on Vulkan (NVIDIA, AMD, Intel,
and Mesa's software lavapipe), Metal and Direct3D 12, so one plugin reaches every GPU
vendor. Importing this module is cheap: it defines the registration the
``tensorplug.backends`` entry point names. :func:`score` reads the device list kept
from an earlier process where the drivers are unchanged, else asks wgpu; a device
requests its adapter when it is first used (:mod:`.listing`).
"""

from __future__ import annotations

import importlib.util

from tensorplug.registration import Registration

__all__ = ["registration", "score"]

_NO_ADAPTER_HINT = (
    "install a Vulkan driver (on Debian or Ubuntu `apt-get install mesa-vulkan-drivers` "
    "gives lavapipe, a software Vulkan device), or run on a machine with Metal or Direct3D 12"
)


def score() -> tuple[int, str]:
    """How well WebGPU can run here: 0 with the reason when wgpu or adapters are missing,
    else the adapters found, each with its API and kind."""
    if importlib.util.find_spec("wgpu") is None:
        return 0, "wgpu is not installed (pip install wgpu)"
    try:
        from .listing import DEVICES

        adapters = [record["info"] for record in DEVICES.records()]
    except Exception as e:  # wgpu-native could not load or start: no usable driver
        return 0, f"wgpu could not list adapters ({type(e).__name__}: {e}); {_NO_ADAPTER_HINT}"
    if not adapters:
        return 0, f"wgpu found no Vulkan, Metal or Direct3D 12 adapter; {_NO_ADAPTER_HINT}"
    found = "; ".join(f"{a['device']} ({a['backend_type']}, {a['adapter_type']})" for a in adapters)
    return 10, f"{len(adapters)} WebGPU adapter(s): {found}"


registration = Registration(
    name="WebGPU",
    api_version=(1, 3),
    init="tensorplug_webgpu.reg:create_reg",
    score=score,
    description="WebGPU adapters through wgpu (Vulkan, Metal, Direct3D 12; lavapipe in CI)",
)

"""tensorplug-opencl: a tensorplug backend for every OpenCL device, through pyopencl.

Importing this module is cheap: it defines the registration the ``tensorplug.backends``
entry point names and nothing else. pyopencl is imported only by :func:`score` (to ask
the driver whether any device exists) and by the backend itself once it is chosen.
"""

from __future__ import annotations

import importlib.util

from tensorplug.registration import Registration

__all__ = ["registration", "score"]

_NO_DRIVER_HINT = (
    "install an OpenCL driver; with no system packages, `pip install "
    "pocl-binary-distribution` provides a CPU OpenCL device"
)


def score() -> tuple[int, str]:
    """How well OpenCL can run here: 0 with the reason when pyopencl or devices are missing."""
    if importlib.util.find_spec("pyopencl") is None:
        return 0, "pyopencl is not installed (pip install pyopencl)"
    try:
        import pyopencl as cl

        platforms = cl.get_platforms()
    except Exception as e:  # no ICD loader, no platform: the driver is missing
        return 0, f"no OpenCL platform found ({e}); {_NO_DRIVER_HINT}"
    count = 0
    for platform in platforms:
        try:
            count += len(platform.get_devices())
        except Exception:
            continue
    if count == 0:
        return 0, f"OpenCL platforms found but no devices; {_NO_DRIVER_HINT}"
    names = ", ".join(p.name.strip() for p in platforms)
    return 10, f"{count} OpenCL device(s) on {names}"


registration = Registration(
    name="OpenCL",
    api_version=(1, 3),
    init="tensorplug_opencl.reg:create_reg",
    score=score,
    description="OpenCL devices through pyopencl (GPUs, and CPUs via PoCL)",
)

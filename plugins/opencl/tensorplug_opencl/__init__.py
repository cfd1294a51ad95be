"""tensorplug-opencl: a tensorplug backend for every OpenCL device, through pyopencl.

Importing this module is cheap: it defines the registration the ``tensorplug.backends``
entry point names and nothing else. :func:`score` reads the device list kept from an
earlier process where the drivers are unchanged, else asks them (importing pyopencl);
a device asks its driver when it is first used (:mod:`.listing`).
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
        from .listing import DEVICES

        devices = DEVICES.records()
    except Exception as e:  # no ICD loader, no platform: the driver is missing
        return 0, f"no OpenCL platform found ({e}); {_NO_DRIVER_HINT}"
    if not devices:
        return 0, f"no devices on any OpenCL platform; {_NO_DRIVER_HINT}"
    names = ", ".join(dict.fromkeys(str(d["platform"]) for d in devices))
    return 10, f"{len(devices)} OpenCL device(s) on {names}"


registration = Registration(
    name="OpenCL",
    api_version=(1, 3),
    init="tensorplug_opencl.reg:create_reg",
    score=score,
    description="OpenCL devices through pyopencl (GPUs, and CPUs via PoCL)",
)

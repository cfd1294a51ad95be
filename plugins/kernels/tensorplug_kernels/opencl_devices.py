"""The OpenCL devices to use: every device of every platform, the host CPU once.

Shared by the OpenCL plugin (its devices) and the kernel library's build gate
(:func:`tensorplug_kernels.check.check_opencl`), so that both build for the same devices.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["POCL", "opencl_devices", "pocl_version"]

#: the platform name every PoCL build reports (pyopencl's bundled one, a distribution's)
POCL = "Portable Computing Language"


def pocl_version(platform: Any) -> tuple[int, ...]:
    """PoCL's version from a platform's version text (``"OpenCL 3.0 PoCL 3.1+debian …"``:
    ``(3, 1)``), ``(0,)`` where it names none."""
    found = re.search(r"PoCL (\d+)\.(\d+)", str(platform.version))
    return (int(found[1]), int(found[2])) if found else (0,)


def opencl_devices() -> list[Any]:
    """All OpenCL devices, platform by platform; platforms that list none are skipped.

    The host CPU reached through two PoCL platforms is one device, listed once: through
    the newest PoCL (the platforms' other devices, PoCL's GPU drivers, all stay).
    pyopencl's wheel bundles PoCL 3.0 on LLVM 14, which refuses to build for a CPU newer
    than that LLVM knows, and the distribution's PoCL beside it can; listing both,
    a model placed on OpenCL took the bundled one and failed, and two devices on the same
    cores only add copies."""
    import pyopencl as cl

    listed: list[tuple[Any, Any]] = []
    for platform in cl.get_platforms():
        try:
            listed.extend((platform, d) for d in platform.get_devices())
        except cl.Error:  # DEVICE_NOT_FOUND on a platform with no usable device
            continue
    cpu = cl.device_type.CPU
    pocl = {id(p): p for p, d in listed if p.name.strip() == POCL and d.type & cpu}
    if len(pocl) > 1:
        newest = max(pocl.values(), key=pocl_version)  # the first listed of the newest
        listed = [(p, d) for p, d in listed
                  if p is newest or id(p) not in pocl or not d.type & cpu]  # fmt: skip
    return [d for _, d in listed]

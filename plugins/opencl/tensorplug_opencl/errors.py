"""pyopencl's failures as tensorplug exceptions (the runtime base's hierarchy).

pyopencl reports everything as ``pyopencl.Error`` with a status code; :func:`translate`
turns one into a :class:`DeviceOutOfResourcesError` (an
:class:`~tensorplug.AllocationError`: recoverable, free memory or use smaller batches)
when the device ran out of memory or resources, else a :class:`KernelLaunchError`
naming the driver's status. Build failures carry the compiler log
(:class:`KernelBuildError`, raised by :mod:`.program`).
"""

from __future__ import annotations

from typing import Any

from tensorplug.errors import TensorplugError
from tensorplug_kernels.runtime import (
    DeviceOutOfMemoryError,
    KernelBuildError,
    KernelLaunchError,
)

__all__ = ["DeviceOutOfResourcesError", "KernelBuildError", "KernelLaunchError", "translate"]

#: OpenCL says "out of resources" as often as "out of memory": the same exception.
DeviceOutOfResourcesError = DeviceOutOfMemoryError

#: Status names (``pyopencl.status_code``) that mean the device ran out of something.
_OUT_OF_RESOURCES = frozenset(
    {"MEM_OBJECT_ALLOCATION_FAILURE", "OUT_OF_RESOURCES", "OUT_OF_HOST_MEMORY"}
)


def status_name(err: Any) -> str:
    """The symbolic status (``"OUT_OF_RESOURCES"``) of a pyopencl error, or ``"unknown"``."""
    code = getattr(err, "code", None)
    if code is None:
        return "unknown"
    import pyopencl as cl

    # at run time a class with a static to_string; pyopencl's stubs call it an IntEnum
    to_string: Any = getattr(cl.status_code, "to_string")  # noqa: B009
    return str(to_string(code, "<unknown status %d>"))


def translate(err: BaseException, what: str, *, kernel: str | None = None) -> TensorplugError:
    """A tensorplug exception for a pyopencl error raised while doing ``what``."""
    status = status_name(err)
    if status in _OUT_OF_RESOURCES:
        return DeviceOutOfResourcesError(
            f"{what}: the OpenCL device is out of resources ({status}); free buffers, "
            f"use smaller tensors or batches, or pick another device",
            kernel=kernel,
        )
    return KernelLaunchError(f"{what}: OpenCL error {status}: {err}", kernel=kernel)

"""Exceptions for driver failures, each naming the kernel involved.

pyopencl reports everything as ``pyopencl.Error`` with a status code; the plugin turns
those into tensorplug exceptions so that callers catch one hierarchy: a failed build
carries the compiler log, a launch that runs out of device resources is an
:class:`~tensorplug.AllocationError` (recoverable: free memory, use smaller batches),
and anything else names the kernel, the node and the driver's code.
"""

from __future__ import annotations

from typing import Any

from tensorplug.errors import AllocationError, PluginError, TensorplugError

__all__ = ["DeviceOutOfResourcesError", "KernelBuildError", "KernelLaunchError", "translate"]

#: Status names (``pyopencl.status_code``) that mean the device ran out of something.
_OUT_OF_RESOURCES = frozenset(
    {"MEM_OBJECT_ALLOCATION_FAILURE", "OUT_OF_RESOURCES", "OUT_OF_HOST_MEMORY"}
)


class KernelBuildError(PluginError):
    """The OpenCL compiler rejected the kernel sources; ``log`` has its full output."""

    def __init__(self, message: str, *, kernel: str | None, log: str) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.log = log


class KernelLaunchError(TensorplugError, RuntimeError):
    """The driver refused to enqueue or failed to run a kernel."""

    def __init__(self, message: str, *, kernel: str | None = None) -> None:
        super().__init__(message)
        self.kernel = kernel


class DeviceOutOfResourcesError(AllocationError):
    """The device had no memory or resources left for a buffer or a kernel launch."""

    def __init__(self, message: str, *, kernel: str | None = None) -> None:
        super().__init__(message)
        self.kernel = kernel


def status_name(err: Any) -> str:
    """The symbolic status (``"OUT_OF_RESOURCES"``) of a pyopencl error, or ``"unknown"``."""
    code = getattr(err, "code", None)
    if code is None:
        return "unknown"
    import pyopencl as cl

    # at run time a class with a static to_string; pyopencl's stubs call it an IntEnum
    to_string: Any = getattr(cl.status_code, "to_string")  # noqa: B009
    return str(to_string(code, "<unknown status %d>"))


def translate(err: Exception, what: str, *, kernel: str | None = None) -> TensorplugError:
    """A tensorplug exception for a pyopencl error raised while doing ``what``."""
    status = status_name(err)
    if status in _OUT_OF_RESOURCES:
        return DeviceOutOfResourcesError(
            f"{what}: the OpenCL device is out of resources ({status}); free buffers, "
            f"use smaller tensors or batches, or pick another device",
            kernel=kernel,
        )
    return KernelLaunchError(f"{what}: OpenCL error {status}: {err}", kernel=kernel)

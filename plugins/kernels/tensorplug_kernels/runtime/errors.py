"""The exceptions every GPU runtime raises, so callers catch one hierarchy.

A runtime turns its driver's failures into these (its ``translate``): a compiler that
refuses the kernels is a :class:`KernelBuildError` carrying the compiler's whole log;
a device out of memory or resources is a :class:`DeviceOutOfMemoryError`, an
:class:`~tensorplug.AllocationError` (recoverable: free buffers, use smaller batches);
anything else a launch or a copy hit is a :class:`KernelLaunchError` naming the kernel
and the driver's status where there is one.
"""

from __future__ import annotations

from tensorplug.errors import AllocationError, PluginError, TensorplugError

__all__ = ["BuildFailed", "DeviceOutOfMemoryError", "KernelBuildError", "KernelLaunchError"]


class KernelBuildError(PluginError):
    """A compiler rejected the kernel sources; ``log`` has its full output, ``kernel``
    the kernel (or prelude) its first error points into."""

    def __init__(self, message: str, *, kernel: str | None, log: str) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.log = log


class KernelLaunchError(TensorplugError, RuntimeError):
    """The driver refused a launch or a transfer, or a kernel failed while running;
    ``status`` is the driver's code where it gives one."""

    def __init__(
        self, message: str, *, kernel: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.status = status


class DeviceOutOfMemoryError(AllocationError):
    """The device had no memory or resources left for a buffer, a launch or its
    temporaries; nothing already stored was changed and the process can go on."""

    def __init__(self, message: str, *, kernel: str | None = None) -> None:
        super().__init__(message)
        self.kernel = kernel


class BuildFailed(Exception):
    """Raised by a runtime's compile hook when its compiler refuses a text: ``log`` is
    what the compiler said. :meth:`KernelProgram.compile` turns it into a
    :class:`KernelBuildError` that names the kernel the log points into."""

    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log

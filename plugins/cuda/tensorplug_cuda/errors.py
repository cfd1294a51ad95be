"""CUDA failures as tensorplug exceptions, each naming what was being done.

cupy reports the runtime's and the driver's status codes as ``CUDARuntimeError`` /
``CUDADriverError`` (with ``.status``), its memory pool's exhaustion as
``cupy.cuda.memory.OutOfMemoryError``, and NVRTC's refusal as ``CompileException``.
Callers here catch one hierarchy instead: running out of device memory is an
:class:`OutOfMemoryError` (an :class:`~tensorplug.AllocationError`, so a ``MemoryError``)
that leaves everything already stored intact; a refused launch is a
:class:`KernelLaunchError` naming the kernel, the grid, the block and the node.
"""

from __future__ import annotations

from typing import Any

from tensorplug.errors import AllocationError, PluginError, TensorplugError

__all__ = [
    "KernelBuildError",
    "KernelLaunchError",
    "OutOfMemoryError",
    "is_out_of_memory",
    "translate",
]

#: Status codes meaning "out of memory": cudaErrorMemoryAllocation (runtime) and
#: CUDA_ERROR_OUT_OF_MEMORY (driver) are both 2.
_OUT_OF_MEMORY = frozenset({2})
#: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many registers or threads for one block.
LAUNCH_OUT_OF_RESOURCES = 701


class KernelBuildError(PluginError):
    """NVRTC rejected the kernel sources; ``log`` has the compiler's full output."""

    def __init__(self, message: str, *, kernel: str | None, log: str) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.log = log


class KernelLaunchError(TensorplugError, RuntimeError):
    """The driver refused a launch or a transfer, or a kernel failed while running."""

    def __init__(self, message: str, *, kernel: str | None = None, status: int | None = None):
        super().__init__(message)
        self.kernel = kernel
        self.status = status


class OutOfMemoryError(AllocationError):
    """The GPU had no memory left; nothing stored was changed and the process can go
    on (free buffers, use smaller batches, or place part of the model elsewhere)."""

    def __init__(self, message: str, *, kernel: str | None = None) -> None:
        super().__init__(message)
        self.kernel = kernel


def is_out_of_memory(cp: Any, err: BaseException) -> bool:
    """True for every way cupy says the device memory ran out."""
    if isinstance(err, cp.cuda.memory.OutOfMemoryError):
        return True
    errors = (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError)
    return isinstance(err, errors) and getattr(err, "status", None) in _OUT_OF_MEMORY


def translate(cp: Any, err: BaseException, what: str, *, kernel: str | None = None) -> Exception:
    """A tensorplug exception for a cupy error raised while doing ``what``."""
    if isinstance(err, TensorplugError):
        return err
    if is_out_of_memory(cp, err):
        return OutOfMemoryError(
            f"{what}: the GPU is out of memory ({err}); free buffers, use smaller tensors "
            "or batches, or place part of the model on another device",
            kernel=kernel,
        )
    status = getattr(err, "status", None)
    hint = ""
    if status == LAUNCH_OUT_OF_RESOURCES:
        hint = "; the kernel needs more registers or threads per block than the GPU has"
    return KernelLaunchError(f"{what}: CUDA error: {err}{hint}", kernel=kernel, status=status)

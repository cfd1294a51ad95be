"""CUDA failures as tensorplug exceptions (the runtime base's hierarchy).

cupy reports the runtime's and the driver's status codes as ``CUDARuntimeError`` /
``CUDADriverError`` (with ``.status``), its memory pool's exhaustion as
``cupy.cuda.memory.OutOfMemoryError``, and NVRTC's refusal as ``CompileException``.
:func:`translate` turns the first three into an :class:`OutOfMemoryError` (an
:class:`~tensorplug.AllocationError`, so a ``MemoryError``, that leaves everything
already stored intact) or a :class:`KernelLaunchError` with the driver's status;
NVRTC's log becomes a :class:`KernelBuildError` (:mod:`.program`).
"""

from __future__ import annotations

from typing import Any

from tensorplug.errors import TensorplugError
from tensorplug_kernels.runtime import (
    DeviceOutOfMemoryError,
    KernelBuildError,
    KernelLaunchError,
)

__all__ = [
    "KernelBuildError",
    "KernelLaunchError",
    "OutOfMemoryError",
    "cuda_errors",
    "is_out_of_memory",
    "translate",
]

#: The GPU ran out of memory: the runtime base's exception under the name CUDA users know.
OutOfMemoryError = DeviceOutOfMemoryError

#: Status codes meaning "out of memory": cudaErrorMemoryAllocation (runtime) and
#: CUDA_ERROR_OUT_OF_MEMORY (driver) are both 2.
_OUT_OF_MEMORY = frozenset({2})
#: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many registers or threads for one block.
LAUNCH_OUT_OF_RESOURCES = 701


def cuda_errors(cp: Any) -> tuple[type[BaseException], ...]:
    """Every exception type cupy raises for a failed CUDA call."""
    return (
        cp.cuda.runtime.CUDARuntimeError,
        cp.cuda.driver.CUDADriverError,
        cp.cuda.memory.OutOfMemoryError,
    )


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

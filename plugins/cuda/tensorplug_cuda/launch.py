"""A launch of the shared kernel library, bound to a cupy kernel.

The encoder (:func:`tensorplug_kernels.encode`) says which kernel runs over which grid
with which arguments. Here that becomes what cupy's ``RawKernel`` takes: the grid in
blocks and the block in threads (OpenCL-style sizes divided), then the arguments —
the packed arguments struct, passed **by value**, and one pointer per buffer parameter.

Passing a C struct by value: cupy's launcher (``cupy/cuda/function.pyx``, ``_pointer``)
hands a ``numpy.ndarray`` of exactly one element to ``cuLaunchKernel`` as a pointer to
its data, which the driver copies as the parameter's bytes (cupy PR for issue #4828,
in every release since v10.0.0). A one-element array of the kernel's struct dtype —
the exact C layout, parsed from the kernel source by :mod:`tensorplug_kernels.abi` —
is therefore the struct itself. Buffers are the allocations' base pointers (as
``MemoryPointer``); tensor byte offsets live in the struct. The backend's own buffers
(the error word, the scratch memory some launches ask for) are passed by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.errors import NotAllocatedError, UnsupportedError
from tensorplug.tensor import Tensor
from tensorplug_kernels import Launch, TensorArg, kernel_abis

from .buffer import CUDABuffer
from .errors import KernelLaunchError

if TYPE_CHECKING:
    from .device import CUDADevice

__all__ = ["BoundLaunch", "bind", "kernel_pointer"]

#: CUDA's limits on grid extents (y and z) and threads per block.
_MAX_GRID_YZ = 65535
_MAX_GRID_X = 2**31 - 1


@dataclass(frozen=True)
class BoundLaunch:
    """Everything one kernel launch needs, ready to be issued again and again."""

    kernel: str
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Any, ...]
    node: Tensor
    watches_errors: bool  # the kernel may report a bad index in the error word

    def geometry(self) -> str:
        return f"grid {self.grid} x block {self.block}"


def kernel_pointer(t: Tensor, device: CUDADevice) -> Any:
    """What a launch passes for ``t``'s buffer, refusing memory this GPU cannot use."""
    buf = t.buffer
    if buf is None:
        raise NotAllocatedError(
            f"{device.name}: tensor {t.describe()} has no memory; allocate the graph before "
            "computing"
        )
    buf.check_live()
    if not isinstance(buf, CUDABuffer) or buf.device is not device:
        raise UnsupportedError(
            f"{device.name}: tensor {t.describe()} lives in buffer {buf.name!r}, which this "
            "GPU's kernels cannot read; allocate it in the device's buffer type "
            "(backend.buffer_type()) or let the scheduler copy it"
        )
    return buf.kernel_arg


def _sizes(launch: Launch) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    g = (*launch.global_size, 1, 1)[:3]
    b = (*launch.local_size, 1, 1)[:3]
    if any(x % y for x, y in zip(g, b, strict=True)):
        raise KernelLaunchError(
            f"{launch.kernel}: global size {launch.global_size} is not a multiple of the "
            f"block {launch.local_size}",
            kernel=launch.kernel,
        )
    grid = (g[0] // b[0], g[1] // b[1], g[2] // b[2])
    if grid[0] > _MAX_GRID_X or max(grid[1:]) > _MAX_GRID_YZ:
        raise KernelLaunchError(
            f"{launch.kernel}: grid {grid} exceeds CUDA's limits (x < 2^31, y and z <= 65535)",
            kernel=launch.kernel,
        )
    return grid, (b[0], b[1], b[2])


def bind(
    launch: Launch, device: CUDADevice, runtime: Mapping[str, Any], node: Tensor
) -> BoundLaunch:
    """``launch`` ready to issue on ``device``; ``runtime`` holds the backend's own
    buffers by name (``err``, and ``scratch`` sized for the launch)."""
    abi = kernel_abis()[launch.kernel]
    data, buffers = abi.pack(launch.args)
    struct = np.frombuffer(data, dtype=abi.dtype)  # one element: cupy passes it by value
    for b in buffers:
        if isinstance(b, str) and b not in runtime:
            raise KernelLaunchError(
                f"{launch.kernel} takes the runtime buffer {b!r}, which was not provided "
                f"for {node.describe()}",
                kernel=launch.kernel,
            )
    pointers = tuple(
        kernel_pointer(b.tensor, device) if isinstance(b, TensorArg) else runtime[b]
        for b in buffers
    )
    grid, block = _sizes(launch)
    return BoundLaunch(
        launch.kernel,
        device.program.kernel(launch.kernel),
        grid,
        block,
        (struct, *pointers),
        node,
        watches_errors="err" in buffers,
    )

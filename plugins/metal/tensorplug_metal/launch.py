"""A launch of the shared kernel library, bound to a Metal pipeline.

The encoder (:func:`tensorplug_kernels.encode`) says which kernel runs over which grid
with which arguments. Here that becomes what a compute command encoder takes: the
pipeline, the packed arguments struct as bytes for buffer index 0 (``setBytes``; the
MSL prelude declares it ``constant T &args [[buffer(0)]]``), one ``(MTLBuffer,
offset)`` per buffer index from 1, and the grid in threadgroups with the threadgroup
size (OpenCL-style sizes divided). Binding happens once per node for a graph plan and
the result is replayed, so per-compute work is the encoder calls alone.

A tensor in a mapped buffer is bound to the no-copy view holding it, and its byte
offset in the struct is moved into that view (:meth:`MetalMappedBuffer.binding`). The
backend's own buffers (the error word, the scratch memory some launches ask for) are
passed by name, as the CUDA and OpenCL runtimes pass theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorplug.errors import NotAllocatedError, UnsupportedError
from tensorplug.tensor import Tensor
from tensorplug_kernels import Launch, TensorArg, kernel_abis

from .buffer import MetalBuffer, MetalMappedBuffer
from .errors import KernelLaunchError

if TYPE_CHECKING:
    from .device import MetalDevice

__all__ = ["BoundDispatch", "bind"]


@dataclass(frozen=True)
class BoundDispatch:
    """Everything one dispatch needs, ready to be encoded again and again."""

    kernel: str
    pipeline: Any
    args: bytes
    buffers: tuple[tuple[Any, int], ...]  # (MTLBuffer, offset) for indices 1, 2, ...
    groups: Any  # MTLSize: threadgroups per grid
    threads: Any  # MTLSize: threads per threadgroup
    node: Tensor
    watches_errors: bool  # the kernel may report a bad index in the error word

    def geometry(self) -> str:
        g, t = self.groups, self.threads
        return f"{g.width}x{g.height}x{g.depth} groups of {t.width}x{t.height}x{t.depth}"


def _placed(arg: TensorArg, device: MetalDevice) -> tuple[TensorArg, tuple[Any, int]]:
    """``arg`` with its offset inside the MTLBuffer it is bound to, and that binding."""
    t = arg.tensor
    buf = t.buffer
    if buf is None:
        raise NotAllocatedError(
            f"{device.name}: tensor {t.describe()} has no memory; allocate the graph before "
            "computing"
        )
    buf.check_live()
    if not isinstance(buf, (MetalBuffer, MetalMappedBuffer)) or buf.device is not device:
        raise UnsupportedError(
            f"{device.name}: tensor {t.describe()} lives in buffer {buf.name!r}, which this "
            "GPU's kernels cannot read; allocate it in the device's buffer type "
            "(backend.buffer_type()) or let the scheduler copy it"
        )
    mtl, shift = buf.binding(t.offset, t.nbytes)
    if shift:
        arg = dataclasses.replace(arg, offset=arg.offset + shift)
    return arg, (mtl, 0)


def bind(
    launch: Launch, device: MetalDevice, runtime: Mapping[str, Any], node: Tensor
) -> BoundDispatch:
    """``launch`` ready to encode on ``device``; ``runtime`` holds the backend's own
    ``MTLBuffer``\\ s by name (``err``, and ``scratch`` sized for the launch)."""
    abi = kernel_abis()[launch.kernel]
    args: dict[str, Any] = {}
    bindings: dict[int, tuple[Any, int]] = {}
    for name, value in launch.args.items():
        if isinstance(value, TensorArg):
            value, bindings[id(value.tensor)] = _placed(value, device)
        args[name] = value
    data, buffers = abi.pack(args)
    missing = [b for b in buffers if isinstance(b, str) and b not in runtime]
    if missing:
        raise KernelLaunchError(
            f"{launch.kernel} takes the runtime buffer(s) {missing}, which were not provided "
            f"for {node.describe()}",
            kernel=launch.kernel,
        )
    bound = tuple(
        bindings[id(b.tensor)] if isinstance(b, TensorArg) else (runtime[b], 0) for b in buffers
    )
    g = (*launch.global_size, 1, 1)[:3]
    t = (*launch.local_size, 1, 1)[:3]
    if any(x % y for x, y in zip(g, t, strict=True)):
        raise KernelLaunchError(
            f"{launch.kernel}: global size {launch.global_size} is not a multiple of the "
            f"threadgroup {launch.local_size}",
            kernel=launch.kernel,
        )
    pipeline = device.program.pipeline(launch.kernel)
    if t[0] * t[1] * t[2] > pipeline.max_threads:
        raise KernelLaunchError(
            f"{device.name}: {launch.kernel} needs threadgroups of {t[0] * t[1] * t[2]} "
            f"threads for {node.describe()}, but its pipeline allows {pipeline.max_threads} "
            "on this GPU",
            kernel=launch.kernel,
        )
    size = device.metal.MTLSize
    return BoundDispatch(
        launch.kernel,
        pipeline.state,
        bytes(data),
        bound,
        size(g[0] // t[0], g[1] // t[1], g[2] // t[2]),
        size(t[0], t[1], t[2]),
        node,
        watches_errors="err" in buffers,
    )

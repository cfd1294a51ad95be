"""A backend is one WebGPU queue, over the runtime base.

Launches are the shared encoder's (the WGSL kernels have the library's names, arguments
and work layout), except matrix products: on a CPU adapter (lavapipe) a barrier-free
kernel with a work-item per output value; on a GPU the library's generic kernel, or for
decode a work-group per output value. Issuing a launch appends a dispatch to a list;
the list is encoded into one compute pass and submitted when the work must reach the
queue (a transfer, a synchronize, or a long list). WebGPU orders every dispatch after
the previous one's writes, so one pass holds a whole graph.

What binding costs — an arguments buffer and a bind group per launch — is made once
and cached by (kernel, packed arguments, bound windows): a graph plan binds its
launches once, and computing the same graph again (a decode step with the same
shapes and offsets) finds them in the cache. WebGPU command buffers are single-use, so
what is replayed is the bound pipelines and bind groups, encoded afresh into a pass
each time (a few µs per dispatch), not a recorded command buffer.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, cast

from tensorplug.backend import Event
from tensorplug.device import DeviceType
from tensorplug.errors import UnsupportedError
from tensorplug.opcodes import Op
from tensorplug.tensor import Tensor
from tensorplug.types import Type
from tensorplug_kernels.abi import KernelABI, kernel_abis
from tensorplug_kernels.encode import encode
from tensorplug_kernels.launch import (
    MAX_ROW_GROUPS,
    Launch,
    nrows,
    round_up,
    row_launch,
    tensor_arg,
)
from tensorplug_kernels.runtime import BoundLaunch, GPUBackend

from .program import ATOMIC, Pipeline
from .wgsl import args_types, wgsl_kernels

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .buffer import WebGPUBuffer
    from .device import WebGPUDevice

__all__ = ["WebGPUBackend"]

#: Bind groups (with their arguments buffers) kept per backend, least recently used out.
BIND_GROUP_CACHE = 4096
#: Dispatches gathered before they are submitted without being asked to.
MAX_PENDING = 512

#: Rows of b up to which a matrix product runs a work-group per output value.
MATVEC_MAX_ROWS = 8

#: Element types a kernel stores whole words of (others need the atomic variant).
_WORD_TYPES = frozenset({Type.F32.value, Type.I32.value})


def _mem(buf: Buffer) -> Any:
    return cast("WebGPUBuffer", buf).mem


class WebGPUBackend(GPUBackend):
    device: WebGPUDevice

    def __init__(self, device: WebGPUDevice) -> None:
        self._pending: list[tuple[Pipeline, Any, tuple[int, int, int]]] = []
        #: bind groups by (kernel variant, packed arguments, bound windows), LRU order
        self.bind_groups: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        super().__init__(device)

    # -- launches ------------------------------------------------------------------------

    def launches(self, node: Tensor) -> list[Launch]:
        """The shared encoder's launches; a matrix product is the generic kernel, or for
        a few rows of b (decode) the WGSL matrix-vector one (a work-group per output)."""
        if node.op is Op.MUL_MAT and node.nelements:
            a, b = node.src
            ane, dne = a.ne(), node.ne()
            args = {"a": tensor_arg(a), "b": tensor_arg(b), "d": tensor_arg(node),
                    "r2": dne[2] // ane[2], "r3": dne[3] // ane[3]}  # fmt: skip
            rows, lim = nrows(node), self.device.limits
            if self.device.type is DeviceType.CPU:  # no barriers: see k_mul_mat_cols
                grid = (round_up(dne[0], lim.wg), min(rows, MAX_ROW_GROUPS))
                return [Launch("k_mul_mat_cols", grid, (lim.wg, 1), args)]
            if rows <= MATVEC_MAX_ROWS:
                return row_launch("k_mul_mat_vec", rows * dne[0], lim, **args)
            return row_launch("k_mul_mat", rows, lim, **args)
        if node.op is Op.ARGSORT:  # the stage-per-launch network (no local-memory sort yet)
            return encode(node, dataclasses.replace(self.device.limits, local_mem=0))
        return super().launches(node)

    def _variant(self, bound: BoundLaunch) -> str:
        """The kernel's atomic variant when a tensor it writes is narrower than a word."""
        writes = wgsl_kernels()[bound.kernel].writes
        if not writes:
            return bound.kernel
        abi = self.abi(bound.kernel)
        types = args_types(abi, bound.data, tuple(w for w in abi.buffers if w in writes))
        return bound.kernel if all(t in _WORD_TYPES for t in types) else bound.kernel + ATOMIC

    def abi(self, kernel: str) -> KernelABI:
        """A WGSL-only kernel has the calling convention of the library kernel it names."""
        found = wgsl_kernels().get(kernel)
        return kernel_abis()[found.abi if found else kernel]

    def _prepare(self, bound: BoundLaunch, replayed: bool) -> Any:
        import wgpu

        if bound.kernel not in wgsl_kernels():
            raise UnsupportedError(
                f"{self.name}: {bound.kernel} for {bound.node.describe()} has no WGSL kernel "
                "yet; let the scheduler place the node on another backend"
            )
        pipe = cast(Pipeline, self.device.program.kernel(self._variant(bound)))
        key = (pipe.name, bound.data, bound.buffers)
        group = self.bind_groups.get(key)
        if group is not None:
            self.bind_groups.move_to_end(key)
            return pipe, group
        gpu = self.device.gpu
        args = gpu.create_buffer_with_data(data=bound.data, usage=wgpu.BufferUsage.STORAGE)
        entries = [{"binding": 0, "resource": {"buffer": args, "offset": 0, "size": args.size}}]
        for i, (mem, start, size) in enumerate(bound.buffers, start=1):
            entries.append(
                {"binding": i, "resource": {"buffer": mem, "offset": start, "size": size}}
            )
        group = gpu.create_bind_group(layout=pipe.layout, entries=entries)
        self.bind_groups[key] = group
        if len(self.bind_groups) > BIND_GROUP_CACHE:
            self.bind_groups.popitem(last=False)
        return pipe, group

    def _issue(self, bound: BoundLaunch) -> None:
        pipe, group = bound.call
        self._pending.append((pipe, group, bound.grid))
        if len(self._pending) >= MAX_PENDING:
            self.flush()

    def flush(self) -> None:
        """Submit the gathered dispatches, in order, as one compute pass."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        gpu = self.device.gpu
        with self.device.driver(f"submitting {len(pending)} kernel launches"):
            enc = gpu.create_command_encoder()
            cpass = enc.begin_compute_pass()
            for pipe, group, grid in pending:
                cpass.set_pipeline(pipe.pipeline)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*grid)
            cpass.end()
            gpu.queue.submit([enc.finish()])

    def _synchronize(self) -> None:
        self.flush()
        self.device.wait_queue()

    # -- transfers: the queue orders them after the dispatches submitted first --------------

    def _write_async(self, buf: Buffer, offset: int, data: memoryview) -> None:
        self.flush()
        self.device.write(_mem(buf), offset, data)

    def _read_async(self, buf: Buffer, offset: int, out: memoryview) -> None:
        self.flush()
        self.device.read(_mem(buf), offset, out)

    def _copy_async(
        self, src_backend: GPUBackend, src: Buffer, src_offset: int, dst: Buffer,
        dst_offset: int, size: int,
    ) -> None:  # fmt: skip
        cast(WebGPUBackend, src_backend).flush()
        self.flush()
        self.device.copy_bytes(_mem(src), src_offset, _mem(dst), dst_offset, size)

    def _record(self, event: Event) -> None:
        raise UnsupportedError(f"{self.name}: WebGPU devices have no events here")

    def _wait(self, event: Event) -> None:
        raise UnsupportedError(f"{self.name}: WebGPU devices have no events here")

    # -- lifetime ------------------------------------------------------------------------

    def forget(self, buffer: Buffer) -> None:
        """Drop cached bind groups that bind ``buffer`` (it is being freed)."""
        mem = _mem(buffer)
        for key in [k for k in self.bind_groups if any(h[0] is mem for h in k[2])]:
            del self.bind_groups[key]

    def _free(self) -> None:
        self._pending.clear()
        self.bind_groups.clear()

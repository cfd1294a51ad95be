"""A backend is one Metal command queue, over the runtime base.

Everything it does is encoded into command buffers and committed at once: graph
computation, asynchronous transfers (blits through staging buffers), copies between
Metal backends, event signals and waits. Only ``synchronize`` (and the blocking
``graph_compute``) waits, and only there do failures of the GPU surface: a command
buffer that ended in error is a :class:`CommandBufferError` naming the nodes it held.
Binding, plans, the scratch buffer (one shared ``MTLBuffer``: a queue's dispatches run
one after another, so one serves every node) and the error word (read in place, in
shared memory) are the base's (:mod:`tensorplug_kernels.runtime.backend`).

A bound launch is encoded as a compute command encoder takes it: the pipeline, the
packed arguments struct as bytes for buffer index 0 (``setBytes``; the MSL prelude
declares it ``constant T &args [[buffer(0)]]``), one ``MTLBuffer`` per buffer index
from 1 (a tensor in a mapped file bound to the view holding it, its offset in the
struct moved into that view), and the grid in threadgroups. A graph is encoded into a
few command buffers rather than one (ggml's ``n_cb``): the first holds a few
dispatches and is committed at once, so the GPU starts while Python encodes the rest.
Each command buffer is made inside an autorelease pool (``commandBuffer`` and the
encoders are autoreleased objects; without a run loop nothing else drains them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tensorplug.backend import Event
from tensorplug.errors import UnsupportedError
from tensorplug_kernels.runtime import BoundLaunch, DeviceMemory, GPUBackend, Step

from .buffer import MetalBuffer, contents_array, shared_buffer
from .errors import CommandBufferError, KernelLaunchError, describe_nserror

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .device import MetalDevice

__all__ = ["MetalBackend", "MetalEvent"]

#: Dispatches in the first command buffer of a graph (committed at once, so the GPU
#: starts early) and in each one after it.
FIRST_COMMAND_BUFFER, COMMAND_BUFFER = 32, 256

#: MTLCommandBufferStatusError.
STATUS_ERROR = 5


@dataclass
class MetalEvent:
    """An ``MTLSharedEvent`` and the value the last record signals, with the command
    buffer that signals it (waited on by ``Event.synchronize``)."""

    shared_event: Any
    value: int = 0
    command_buffer: Any = None


class MetalBackend(GPUBackend):
    device: MetalDevice

    def __init__(self, device: MetalDevice) -> None:
        self.objc = device.objc
        self.queue = device.mtl.newCommandQueue()
        if self.queue is None:
            raise CommandBufferError(f"{device.name}: Metal could not create a command queue")
        self._committed: list[tuple[Any, str]] = []  # since the last synchronize
        self._reads: list[tuple[np.ndarray, memoryview]] = []  # staging -> host, at sync
        self._timeline = device.mtl.newSharedEvent()  # other queues wait on it
        self._tick = 0
        super().__init__(device)

    # -- command buffers ---------------------------------------------------------------------

    def _commit(self, what: str, encode: Callable[[Any], None]) -> Any:
        """A command buffer made in an autorelease pool, filled by ``encode`` and committed."""
        with self.objc.autorelease_pool():
            cb = self.queue.commandBuffer()
            encode(cb)
            cb.commit()
        self._committed.append((cb, what))
        return cb

    def _blit(
        self, what: str, src: Any, src_offset: int, dst: Any, dst_offset: int, n: int
    ) -> None:
        def encode(cb: Any) -> None:
            blit = cb.blitCommandEncoder()
            blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size_(
                src, src_offset, dst, dst_offset, n
            )
            blit.endEncoding()

        self._commit(what, encode)

    def run(self, steps: Sequence[Step]) -> None:
        """Encode bound launches (Metal claims no node) in order into command buffers."""
        start, size = 0, FIRST_COMMAND_BUFFER
        while start < len(steps):
            chunk = cast(Sequence[BoundLaunch], steps[start : start + size])

            def encode(cb: Any, chunk: Sequence[BoundLaunch] = chunk) -> None:
                enc = cb.computeCommandEncoder()
                for d in chunk:
                    state, groups, threads = d.call
                    enc.setComputePipelineState_(state)
                    enc.setBytes_length_atIndex_(d.data, len(d.data), 0)
                    for index, mtl in enumerate(d.buffers, 1):
                        enc.setBuffer_offset_atIndex_(mtl, 0, index)
                    enc.dispatchThreadgroups_threadsPerThreadgroup_(groups, threads)
                enc.endEncoding()

            first, last = chunk[0].node, chunk[-1].node
            self._commit(f"{first.op.value} {first.name!r} … {last.op.value} {last.name!r}", encode)
            if any(d.watches_errors for d in chunk):
                self.note_error_word()
            start, size = start + size, COMMAND_BUFFER

    def wait_committed(self) -> None:
        """Wait for everything committed so far (a queue completes in order)."""
        if self._committed:
            self._committed[-1][0].waitUntilCompleted()

    def _wait_for(self, other: MetalBackend) -> None:
        """Later work here waits until ``other``'s queued work is done (on the GPU)."""
        other._tick += 1
        tick = other._tick
        other._commit("signal", lambda cb: cb.encodeSignalEvent_value_(other._timeline, tick))
        self._commit(
            f"wait for {other.name}", lambda cb: cb.encodeWaitForEvent_value_(other._timeline, tick)
        )

    # -- the runtime base's hooks --------------------------------------------------------------

    def _prepare(self, bound: BoundLaunch, replayed: bool) -> Any:
        pipeline = self.device.program.kernel(bound.kernel)
        threads = math.prod(bound.block)
        if threads > pipeline.max_threads:
            raise KernelLaunchError(
                f"{self.name}: {bound.kernel} needs threadgroups of {threads} threads for "
                f"{bound.node.describe()}, but its pipeline allows {pipeline.max_threads} on "
                "this GPU",
                kernel=bound.kernel,
            )
        size = self.device.metal.MTLSize
        return pipeline.state, size(*bound.grid), size(*bound.block)

    def _issue(self, bound: BoundLaunch) -> None:
        self.run([bound])

    def _synchronize(self) -> None:
        self.wait_committed()
        failed = [(cb, what) for cb, what in self._committed if cb.status() == STATUS_ERROR]
        self._committed.clear()
        for staging, out in self._reads:
            np.frombuffer(out, dtype=np.uint8)[...] = staging
        self._reads.clear()
        if failed:
            cb, what = failed[0]
            raise CommandBufferError(
                f"{self.name}: the GPU failed a command buffer ({what}): "
                f"{describe_nserror(cb.error())}; results of this work are not valid",
                labels=tuple(w for _, w in failed),
            )

    def _write_async(self, buf: Buffer, offset: int, data: memoryview) -> None:
        n = len(data)
        # copied now, into memory the queue owns: the caller's bytes may change at once
        staging = self.device.mtl.newBufferWithBytes_length_options_(bytes(data), n, 0)
        if staging is None:
            staging = shared_buffer(self.device, n, f"{n} bytes of staging memory")
            contents_array(staging, n)[...] = np.frombuffer(data, dtype=np.uint8)
        self.keep(staging)
        self._blit(f"a write of {n} bytes", staging, 0, cast(MetalBuffer, buf).mtl, offset, n)

    def _read_async(self, buf: Buffer, offset: int, out: memoryview) -> None:
        n = len(out)
        src, shift = cast(DeviceMemory, buf).binding(offset, n)
        staging = shared_buffer(self.device, n, f"{n} bytes of staging memory")
        self.keep(staging)
        self._reads.append((contents_array(staging, n), out))
        self._blit(f"a read of {n} bytes", src, offset + shift, staging, 0, n)

    def _copy_async(
        self, src_backend: GPUBackend, src: Buffer, src_offset: int, dst: Buffer,
        dst_offset: int, size: int,
    ) -> None:  # fmt: skip
        if src_backend is not self:
            self._wait_for(cast(MetalBackend, src_backend))
        smtl, shift = cast(DeviceMemory, src).binding(src_offset, size)
        dmtl = cast(MetalBuffer, dst).mtl
        self._blit(f"a copy of {size} bytes", smtl, src_offset + shift, dmtl, dst_offset, size)

    def _record(self, event: Event) -> None:
        marker = event.context
        if not isinstance(marker, MetalEvent):
            raise UnsupportedError(f"{self.name}: the event was freed; make another")
        marker.value += 1
        value = marker.value
        marker.command_buffer = self._commit(
            "event", lambda cb: cb.encodeSignalEvent_value_(marker.shared_event, value)
        )

    def _waits_on_device(self, event: Event) -> bool:
        return event.device is self.device and isinstance(event.context, MetalEvent)

    def _wait(self, event: Event) -> None:
        marker = event.context
        if marker.command_buffer is None:
            return  # never recorded: nothing to wait for
        value = marker.value
        self._commit(
            "event wait", lambda cb: cb.encodeWaitForEvent_value_(marker.shared_event, value)
        )

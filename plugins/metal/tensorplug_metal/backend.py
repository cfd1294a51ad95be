"""A backend is one Metal command queue.

Everything it does is encoded into command buffers and committed at once:
graph computation, asynchronous transfers (blits through staging buffers), copies
between Metal backends, event signals and waits. Only :meth:`MetalBackend.synchronize`
(and the blocking ``graph_compute``) waits, and only there do failures of the GPU
surface: a command buffer that ended in error is a :class:`CommandBufferError`
naming the nodes it held.

A graph is encoded into a few command buffers rather than one (ggml's ``n_cb``): the
first holds a few dispatches and is committed at once, so the GPU starts while Python
encodes the rest. Each command buffer is made inside an autorelease pool (``commandBuffer``
and the encoders are autoreleased objects; without a run loop nothing else drains
them).

Kernels that index by data (get_rows, set_rows, mul_mat_id) report an out-of-range
index in the backend's error word, 8 bytes of shared memory read at ``synchronize``,
which then raises :class:`~tensorplug.OutOfBoundsError` (set_rows checks every index
before it writes, so a bad index writes nothing).

Launches that ask for scratch memory (``Launch.scratch``: the 8-bit integer mat-vec
products keep their Q8_1-quantized activations there) get the backend's scratch
buffer, one shared-storage ``MTLBuffer`` sized, before a graph is bound, to what the
whole graph needs. Binding once per graph rather than per node is what Metal's
encoding already does, and it is what a graph plan needs: its bound dispatches hold
the buffer, so when the backend later grows its scratch for other work the plan keeps
reading and writing its own. One buffer serves every node because a queue's dispatches
run one after another (serial compute encoders, command buffers in commit order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.backend import Backend, Event, GraphPlan, Status
from tensorplug.errors import OutOfBoundsError, UnsupportedError
from tensorplug.graph import Graph
from tensorplug.tensor import Tensor
from tensorplug_kernels import encode, scratch_bytes, scratch_capacity

from .buffer import MetalBuffer, MetalMappedBuffer, contents_array, shared_buffer
from .errors import CommandBufferError, describe_nserror
from .launch import BoundDispatch, bind

if TYPE_CHECKING:
    from .device import MetalDevice

__all__ = ["MetalBackend", "MetalEvent", "MetalGraphPlan"]

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


class MetalGraphPlan(GraphPlan):
    """A graph's dispatches bound once (pipelines, argument bytes, buffers, sizes);
    computing encodes them. After re-allocating the graph, ``graph_plan_update``.

    The scratch buffer bound is the backend's at bind time, sized for the whole graph;
    the plan keeps it (its dispatches hold it) when the backend grows its own later."""

    backend: MetalBackend

    def __init__(self, backend: MetalBackend, graph: Graph) -> None:
        super().__init__(backend, graph)
        self.dispatches: list[BoundDispatch] = []
        self.bind(graph)

    def bind(self, graph: Graph) -> None:
        self.graph, self.dispatches = graph, self.backend.bind_graph(graph)
        self.buffers = graph.buffers()


class MetalBackend(Backend):
    device: MetalDevice

    def __init__(self, device: MetalDevice) -> None:
        super().__init__(device)
        self.objc = device.objc
        self.queue = device.mtl.newCommandQueue()
        if self.queue is None:
            raise CommandBufferError(f"{device.name}: Metal could not create a command queue")
        self._err = shared_buffer(device, 8, "the error word")
        self._err_word = contents_array(self._err, 8).view(np.int32)
        self._err_word[:] = 0
        self._scratch: Any = None  # shared MTLBuffer, once a launch asks for scratch
        self._scratch_size = 0
        self._err_watched = False  # a kernel that may report into the error word ran
        self._committed: list[tuple[Any, str]] = []  # since the last synchronize
        self._reads: list[tuple[np.ndarray, memoryview]] = []  # staging -> host, at sync
        self._staging: list[Any] = []  # buffers queued work uses, kept until sync
        self._timeline = device.mtl.newSharedEvent()  # other queues wait on it
        self._tick = 0
        device.track_backend(self)

    # -- encoding --------------------------------------------------------------------------

    def runtime_buffers(self, scratch: int) -> dict[str, Any]:
        """The backend's own buffers for launches needing ``scratch`` bytes of scratch
        together: the error word, and the scratch buffer, grown first if it is smaller
        (:func:`~tensorplug_kernels.scratch_capacity`). A buffer grown out of is kept
        until the next synchronize, for the command buffers already committed on it
        (Metal retains what they bind too; this does not rely on it)."""
        runtime = {"err": self._err}
        if scratch <= 0:
            return runtime
        size = scratch_capacity(scratch, self._scratch_size)
        if size > self._scratch_size:
            mtl = shared_buffer(self.device, size, f"{size} bytes of scratch memory")
            if self._scratch is not None:
                self._staging.append(self._scratch)
            self._scratch, self._scratch_size = mtl, size
        runtime["scratch"] = self._scratch
        return runtime

    def bind_graph(self, graph: Graph) -> list[BoundDispatch]:
        """Every launch of ``graph`` bound, the scratch buffer sized once for all of
        them (so none of the dispatches moves when a later one needs more)."""
        dev = self.device
        encoded = [(node, encode(node, dev.limits)) for node in graph.nodes]
        runtime = self.runtime_buffers(scratch_bytes(ln for _, ls in encoded for ln in ls))
        return [bind(launch, dev, runtime, node) for node, ls in encoded for launch in ls]

    def _commit(self, cb: Any, what: str) -> None:
        cb.commit()
        self._committed.append((cb, what))

    def submit(self, dispatches: Sequence[BoundDispatch]) -> None:
        """Encode ``dispatches`` in order into command buffers and commit them."""
        start, size = 0, FIRST_COMMAND_BUFFER
        while start < len(dispatches):
            chunk = dispatches[start : start + size]
            with self.objc.autorelease_pool():
                cb = self.queue.commandBuffer()
                enc = cb.computeCommandEncoder()
                for d in chunk:
                    enc.setComputePipelineState_(d.pipeline)
                    enc.setBytes_length_atIndex_(d.args, len(d.args), 0)
                    for index, (mtl, offset) in enumerate(d.buffers, 1):
                        enc.setBuffer_offset_atIndex_(mtl, offset, index)
                    enc.dispatchThreadgroups_threadsPerThreadgroup_(d.groups, d.threads)
                enc.endEncoding()
                first, last = chunk[0].node, chunk[-1].node
                self._commit(cb, f"{first.op.value} {first.name!r} … {last.op.value} {last.name!r}")
            self._err_watched |= any(d.watches_errors for d in chunk)
            start, size = start + size, COMMAND_BUFFER

    def _blit(self, what: str, encode_blit: Any) -> None:
        with self.objc.autorelease_pool():
            cb = self.queue.commandBuffer()
            blit = cb.blitCommandEncoder()
            encode_blit(blit)
            blit.endEncoding()
            self._commit(cb, what)

    def _graph_compute(self, graph: Graph) -> Status:
        for buf in graph.buffers():
            buf.check_live()
        self.submit(self.bind_graph(graph))
        return Status.SUCCESS

    # -- graph plans -----------------------------------------------------------------------

    def graph_plan_create(self, graph: Graph) -> MetalGraphPlan:
        return MetalGraphPlan(self, graph)

    def graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        self._own_plan(plan).bind(graph)

    def graph_plan_compute(self, plan: GraphPlan) -> Status:
        own = self._own_plan(plan)
        for buf in own.buffers:
            buf.check_live()  # never hand a freed buffer to a kernel
        self.submit(own.dispatches)
        return Status.SUCCESS

    def graph_plan_free(self, plan: GraphPlan) -> None:
        self._own_plan(plan).dispatches = []

    def _own_plan(self, plan: GraphPlan) -> MetalGraphPlan:
        if not isinstance(plan, MetalGraphPlan) or plan.backend is not self:
            raise UnsupportedError(f"{self.name}: this graph plan was made by another backend")
        return plan

    # -- synchronisation ---------------------------------------------------------------------

    def wait_committed(self) -> None:
        """Wait for everything committed so far (a queue completes in order)."""
        if self._committed:
            self._committed[-1][0].waitUntilCompleted()

    def synchronize(self) -> None:
        self.wait_committed()
        failed = [(cb, what) for cb, what in self._committed if cb.status() == STATUS_ERROR]
        self._committed.clear()
        for staging, out in self._reads:
            np.frombuffer(out, dtype=np.uint8)[...] = staging
        self._reads.clear()
        self._staging.clear()
        if failed:
            cb, what = failed[0]
            raise CommandBufferError(
                f"{self.name}: the GPU failed a command buffer ({what}): "
                f"{describe_nserror(cb.error())}; results of this work are not valid",
                labels=tuple(w for _, w in failed),
            )
        if self._err_watched:
            self._err_watched = False
            self._raise_reported_error()

    def _raise_reported_error(self) -> None:
        if self._err_word[0] == 0:
            return
        index = int(self._err_word[1])
        self._err_word[:] = 0
        raise OutOfBoundsError(
            f"{self.name}: an index was out of range (index {index}) in get_rows, set_rows "
            "or mul_mat_id; indices must lie in [0, rows of the table) or [0, n_expert). "
            "set_rows wrote nothing; the other results of this graph are not valid"
        )

    # -- transfers ----------------------------------------------------------------------------

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        buf = tensor.buffer
        if not isinstance(buf, MetalBuffer) or buf.device is not self.device:
            super()._set_tensor_async(tensor, data, offset)
            return
        n = len(data)
        if not n:
            return
        # copied now, into memory the queue owns: the caller's bytes may change at once
        staging = self.device.mtl.newBufferWithBytes_length_options_(bytes(data), n, 0)
        if staging is None:
            staging = shared_buffer(self.device, n, f"staging for {tensor.describe()}")
            contents_array(staging, n)[...] = np.frombuffer(data, dtype=np.uint8)
        dst = buf.mtl
        self._staging.append(staging)
        self._blit(
            f"write of {tensor.name!r}",
            lambda blit: blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size_(
                staging, 0, dst, tensor.offset + offset, n
            ),
        )

    def _get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        buf = tensor.buffer
        if not isinstance(buf, (MetalBuffer, MetalMappedBuffer)) or buf.device is not self.device:
            super()._get_tensor_async(tensor, out, offset)
            return
        n = len(out)
        if not n:
            return
        src, shift = buf.binding(tensor.offset, tensor.nbytes)
        staging = shared_buffer(self.device, n, f"staging for {tensor.describe()}")
        self._staging.append(staging)
        self._reads.append((contents_array(staging, n), out))
        self._blit(
            f"read of {tensor.name!r}",
            lambda blit: blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size_(
                src, tensor.offset + offset + shift, staging, 0, n
            ),
        )

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Within one device, queued here after ``backend_src``'s queued work."""
        sbuf, dbuf = src.buffer, dst.buffer
        if not (
            isinstance(backend_src, MetalBackend)
            and isinstance(sbuf, (MetalBuffer, MetalMappedBuffer))
            and isinstance(dbuf, MetalBuffer)
            and sbuf.device is dbuf.device is self.device
        ):
            return False
        n = src.nbytes
        if n == 0:
            return True
        if sbuf is dbuf and src.offset < dst.offset + n and dst.offset < src.offset + n:
            return False  # overlapping ranges: Metal's blit refuses them
        if backend_src is not self:
            self._wait_for(backend_src)
        smtl, shift = sbuf.binding(src.offset, n)
        dmtl = dbuf.mtl
        self._blit(
            f"copy of {src.name!r} to {dst.name!r}",
            lambda blit: blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size_(
                smtl, src.offset + shift, dmtl, dst.offset, n
            ),
        )
        return True

    def _wait_for(self, other: MetalBackend) -> None:
        """Later work here waits until ``other``'s queued work is done (on the GPU)."""
        other._tick += 1
        tick = other._tick
        with other.objc.autorelease_pool():
            cb = other.queue.commandBuffer()
            cb.encodeSignalEvent_value_(other._timeline, tick)
            other._commit(cb, "signal")
        with self.objc.autorelease_pool():
            cb = self.queue.commandBuffer()
            cb.encodeWaitForEvent_value_(other._timeline, tick)
            self._commit(cb, f"wait for {other.name}")

    # -- events ----------------------------------------------------------------------------------

    def event_record(self, event: Event) -> None:
        if event.device is not self.device or not isinstance(event.context, MetalEvent):
            raise UnsupportedError(
                f"{self.name}: the event belongs to device {event.device.name!r}; record it "
                "on a backend of that device"
            )
        marker = event.context
        marker.value += 1
        with self.objc.autorelease_pool():
            cb = self.queue.commandBuffer()
            cb.encodeSignalEvent_value_(marker.shared_event, marker.value)
            self._commit(cb, "event")
        marker.command_buffer = cb

    def event_wait(self, event: Event) -> None:
        """Later work here waits for ``event``: on the GPU for an event of this device,
        otherwise by blocking the host until it has happened."""
        marker = event.context
        if event.device is self.device and isinstance(marker, MetalEvent):
            if marker.command_buffer is None:
                return  # never recorded: nothing to wait for
            with self.objc.autorelease_pool():
                cb = self.queue.commandBuffer()
                cb.encodeWaitForEvent_value_(marker.shared_event, marker.value)
                self._commit(cb, "event wait")
        else:
            event.synchronize()

    def free(self) -> None:
        self.synchronize()
        self._scratch, self._scratch_size = None, 0  # plans still bound to it hold it

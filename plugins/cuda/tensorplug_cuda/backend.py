"""A backend is one non-blocking CUDA stream.

Everything it does is queued on the stream and returns at once: transfers, copies
between GPUs, kernels (one launch per encoded launch of each node, or a cuBLAS GEMM),
event records and waits. Only :meth:`CUDABackend.synchronize` (and the blocking
``graph_compute``) waits. Host memory handed to an asynchronous transfer must stay
alive and unchanged until then; the backend holds a reference to it meanwhile.

Kernels that index by data (get_rows, set_rows, mul_mat_id) report an out-of-range
index in the backend's error word, 8 bytes of device memory read at
:meth:`CUDABackend.synchronize`, which then raises :class:`~tensorplug.OutOfBoundsError`
(set_rows checks every index before writing, so a bad index writes nothing).

Launches that ask for scratch memory (``Launch.scratch``: the 8-bit integer mat-vec
products keep their quantized activations there) get the backend's scratch buffer,
which grows to what a node, or a whole graph plan at bind time, needs. A plan keeps the
buffer it was bound to (its bound launches hold the pointer), so growing later for
other work never moves memory a captured CUDA graph refers to.

``graph_compute`` replays decode steps as CUDA graphs too, without a plan from the
caller: a graph seen again with the same signature is computed through a cached plan
(:mod:`.replay`), so the scheduler's and the model runner's steps get captured graphs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.backend import Backend, Event, GraphPlan, Status
from tensorplug.errors import OutOfBoundsError, UnsupportedError
from tensorplug.graph import Graph
from tensorplug.tensor import Tensor
from tensorplug_kernels import Launch, encode, scratch_bytes, scratch_capacity

from .buffer import D2D, D2H, H2D, CUDABuffer, cuda_errors, host_address, overlapping
from .errors import translate
from .launch import BoundLaunch, bind
from .matmul import CublasMatmul
from .plan import CUDAGraphPlan
from .replay import GraphCache

if TYPE_CHECKING:
    from .device import CUDADevice

__all__ = ["CUDABackend"]


class CUDABackend(Backend):
    device: CUDADevice

    def __init__(self, device: CUDADevice) -> None:
        super().__init__(device)
        cp = device.cp
        self.cp = cp
        with device.context():
            self.stream = cp.cuda.Stream(non_blocking=True)
            self._err = cp.cuda.Memory(8)
            cp.cuda.runtime.memsetAsync(self._err.ptr, 0, 8, self.stream.ptr)
        self.err_arg = cp.cuda.MemoryPointer(self._err, 0)
        self._scratch: Any = None  # MemoryPointer to the scratch buffer, once asked for
        self._scratch_size = 0
        self._err_watched = False  # a kernel that may report into the error word ran
        self._host_refs: list[Any] = []  # host memory of queued transfers, retired scratch
        self.matmul = CublasMatmul(self)
        self.graphs = GraphCache(self)  # graph_compute's plans, by graph signature
        device.backend_created(self)

    # -- kernels -----------------------------------------------------------------------------

    def issue(self, bound: BoundLaunch) -> None:
        """Queue one bound launch on the stream (the device must be current)."""
        try:
            bound.function(bound.grid, bound.block, bound.args, stream=self.stream)
        except cuda_errors(self.cp) as e:
            node = bound.node
            raise translate(
                self.cp, e,
                f"{self.name}: launching {bound.kernel} ({bound.geometry()}) for "
                f"{node.op.value} node {node.describe()}",
                kernel=bound.kernel,
            ) from e  # fmt: skip
        self._err_watched |= bound.watches_errors

    def note_error_word(self) -> None:
        """Kernels that may report into the error word were queued (read it at sync)."""
        self._err_watched = True

    def runtime_buffers(self, scratch: int) -> dict[str, Any]:
        """The backend's own buffers for launches needing ``scratch`` bytes of scratch
        together (the device must be current): the error word, and the scratch buffer,
        grown first if it is smaller. A buffer grown out of stays alive until the next
        synchronize, for the work already queued on it."""
        runtime = {"err": self.err_arg}
        if scratch <= 0:
            return runtime
        size = scratch_capacity(scratch, self._scratch_size)
        if size > self._scratch_size:
            try:
                mem = self.cp.cuda.Memory(size)
            except cuda_errors(self.cp) as e:
                what = f"{self.name}: allocating {size} bytes of scratch memory"
                raise translate(self.cp, e, what) from e
            self._host_refs.append(self._scratch)
            self._scratch, self._scratch_size = self.cp.cuda.MemoryPointer(mem, 0), size
        runtime["scratch"] = self._scratch
        return runtime

    def launch(self, launch: Launch, node: Tensor) -> None:
        self.issue(bind(launch, self.device, self.runtime_buffers(launch.scratch), node))

    def compute_node(self, node: Tensor) -> None:
        """Queue ``node``'s work: cuBLAS where it takes the node, else the kernels."""
        if self.matmul.takes(node) and self.matmul.run(node):
            return
        launches = encode(node, self.device.limits)
        runtime = self.runtime_buffers(scratch_bytes(launches))
        for launch in launches:
            self.issue(bind(launch, self.device, runtime, node))

    def _graph_compute(self, graph: Graph) -> Status:
        for buf in graph.buffers():
            buf.check_live()
        if self.graphs.compute(graph):  # a graph seen before: replayed as a CUDA graph
            return Status.SUCCESS
        with self.device.context():
            for node in graph.nodes:
                self.compute_node(node)
        return Status.SUCCESS

    # -- graph plans -----------------------------------------------------------------------------

    def graph_plan_create(self, graph: Graph) -> CUDAGraphPlan:
        return CUDAGraphPlan(self, graph)

    def graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        self._own_plan(plan).bind(graph)

    def graph_plan_compute(self, plan: GraphPlan) -> Status:
        return self._own_plan(plan).compute()

    def graph_plan_free(self, plan: GraphPlan) -> None:
        self._own_plan(plan).release()

    def _own_plan(self, plan: GraphPlan) -> CUDAGraphPlan:
        if not isinstance(plan, CUDAGraphPlan) or plan.backend is not self:
            raise UnsupportedError(f"{self.name}: this graph plan was made by another backend")
        return plan

    # -- synchronisation and transfers -------------------------------------------------------------

    def synchronize(self) -> None:
        cp = self.cp
        try:
            with self.device.context():
                self.stream.synchronize()
        except cuda_errors(cp) as e:
            raise translate(cp, e, f"{self.name}: waiting for queued work") from e
        self._host_refs.clear()
        if self._err_watched:
            self._err_watched = False
            self._raise_reported_error()

    def _raise_reported_error(self) -> None:
        """Raise what a kernel reported in the error word since it was last read, and
        clear it for the next graph."""
        word = np.zeros(2, np.int32)
        runtime = self.cp.cuda.runtime
        with self.device.context():
            runtime.memcpyAsync(word.ctypes.data, self._err.ptr, 8, D2H, self.stream.ptr)
            self.stream.synchronize()
            if word[0] == 0:
                return
            runtime.memsetAsync(self._err.ptr, 0, 8, self.stream.ptr)
            self.stream.synchronize()
        raise OutOfBoundsError(
            f"{self.name}: an index was out of range (index {int(word[1])}) in get_rows, "
            "set_rows or mul_mat_id; indices must lie in [0, rows of the table) or "
            "[0, n_expert). set_rows wrote nothing; the other results of this graph are "
            "not valid"
        )

    def _queue_copy(self, dst: int, src: int, n: int, kind: int, keep: Any, what: str) -> None:
        cp = self.cp
        try:
            with self.device.context():
                cp.cuda.runtime.memcpyAsync(dst, src, n, kind, self.stream.ptr)
        except cuda_errors(cp) as e:
            raise translate(cp, e, f"{self.name}: {what}") from e
        self._host_refs.append(keep)

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        buf = tensor.buffer
        if not isinstance(buf, CUDABuffer):  # pinned host memory: the plain copy
            super()._set_tensor_async(tensor, data, offset)
            return
        if len(data):
            dst = buf.ptr + tensor.offset + offset
            what = f"queueing a write of {tensor.describe()}"
            self._queue_copy(dst, host_address(data), len(data), H2D, data, what)

    def _get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        buf = tensor.buffer
        if not isinstance(buf, CUDABuffer):
            super()._get_tensor_async(tensor, out, offset)
            return
        if len(out):
            src = buf.ptr + tensor.offset + offset
            what = f"queueing a read of {tensor.describe()}"
            self._queue_copy(host_address(out), src, len(out), D2H, out, what)

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """GPU to GPU, on ``backend_src``'s stream after its queued work; this stream
        waits for the copy (ggml's order). Peer access is enabled where the GPUs have it."""
        sbuf, dbuf = src.buffer, dst.buffer
        if not (
            isinstance(backend_src, CUDABackend)
            and isinstance(sbuf, CUDABuffer)
            and isinstance(dbuf, CUDABuffer)
            and dbuf.device is self.device
            and not overlapping(src, dst)
        ):
            return False
        n = src.nbytes
        if n == 0:
            return True
        cp = self.cp
        s_dev, s_stream = backend_src.device, backend_src.stream
        dst_ptr, src_ptr = dbuf.ptr + dst.offset, sbuf.ptr + src.offset
        try:
            if s_dev is not self.device:
                s_dev.enable_peer_access(self.device)
            with s_dev.context():
                if s_dev is self.device:
                    cp.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, n, D2D, s_stream.ptr)
                else:
                    cp.cuda.runtime.memcpyPeerAsync(
                        dst_ptr, self.device.index, src_ptr, s_dev.index, n, s_stream.ptr
                    )
                if backend_src is not self:
                    done = cp.cuda.Event(disable_timing=True)
                    done.record(s_stream)
            if backend_src is not self:
                with self.device.context():
                    self.stream.wait_event(done)
        except cuda_errors(cp) as e:
            what = f"{self.name}: copying {src.describe()} to {dst.describe()}"
            raise translate(cp, e, what) from e
        return True

    # -- events ---------------------------------------------------------------------------------

    def event_record(self, event: Event) -> None:
        if event.device is not self.device:
            raise UnsupportedError(
                f"{self.name}: the event belongs to device {event.device.name!r}; record it "
                "on a backend of that device"
            )
        with self.device.context():
            event.context.record(self.stream)

    def event_wait(self, event: Event) -> None:
        """Later work on this stream waits for ``event``: on the GPU for an event of any
        GPU of this process, otherwise by blocking the host until it has happened."""
        if getattr(event.device, "cp", None) is self.cp and event.context is not None:
            with self.device.context():
                self.stream.wait_event(event.context)
        else:
            event.synchronize()

    def free(self) -> None:
        self.synchronize()
        self.graphs.clear()
        self.matmul.free()

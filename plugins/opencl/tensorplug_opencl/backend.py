"""A backend is one in-order OpenCL command queue (a stream).

Everything it does is enqueued and returns at once: transfers, copies between OpenCL
backends, graph computation (every kernel of every node), event markers. Only
:meth:`OpenCLBackend.synchronize` and the blocking base-class ``graph_compute`` wait.
Host memory handed to an asynchronous transfer must stay alive until then.

Kernels that index by data (get_rows, set_rows) report an out-of-range index in the
backend's error word, a small buffer read at :meth:`OpenCLBackend.synchronize`, which
then raises :class:`~tensorplug.OutOfBoundsError`; set_rows checks every index before it
writes, so a scatter with a bad index leaves the destination as it was.

Launches that ask for scratch memory (``Launch.scratch``) get the backend's scratch
buffer, grown to what a node, or a whole graph plan when it is bound, needs; a plan
keeps the buffer it was bound to, so later growth never pulls memory from under it.

pyopencl returns a transfer's event as a "nanny" that owns a reference to the host
memory and, when it is garbage-collected, waits for the transfer to finish. Dropping
it at once would make every asynchronous transfer synchronous (and, behind an
unsatisfied event, deadlock), so the backend keeps those events until the transfer
is known to be complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorplug.backend import Backend, Event, GraphPlan, Status
from tensorplug.errors import OutOfBoundsError, UnsupportedError
from tensorplug.graph import Graph
from tensorplug.tensor import Tensor
from tensorplug_kernels import Launch, encode, scratch_bytes, scratch_capacity

from .buffer import OpenCLBuffer
from .errors import translate
from .launch import cl_args, cl_buffer

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .device import OpenCLDevice

__all__ = ["OpenCLBackend", "OpenCLGraphPlan"]


class OpenCLGraphPlan(GraphPlan):
    """A graph's launches with their arguments bound, once, to their own kernel objects.

    Computing the plan only enqueues. The plan refers to the tensors' memory as it
    was when the plan was made: after re-allocating the graph, call
    ``graph_plan_update``.
    """

    def __init__(self, backend: OpenCLBackend, graph: Graph) -> None:
        super().__init__(backend, graph)
        self.bound: list[tuple[Any, Launch, Tensor]] = []
        self.buffers: list[Buffer] = []
        self.runtime: dict[str, Any] = {}  # the backend's buffers the plan is bound to
        self.watches_errors = False
        self.bind(graph)

    def bind(self, graph: Graph) -> None:
        backend: OpenCLBackend = self.backend  # type: ignore[assignment]
        encoded = [(node, encode(node, backend.device.limits)) for node in graph.nodes]
        runtime = backend.runtime_buffers(scratch_bytes(ln for _, ls in encoded for ln in ls))
        bound, watches = [], False
        for node, launches in encoded:
            for launch in launches:
                kernel = backend.device.program.kernel(launch.kernel)
                watches |= backend.set_args(kernel, launch, node, runtime)
                bound.append((kernel, launch, node))
        self.graph, self.bound, self.watches_errors = graph, bound, watches
        self.runtime = runtime
        # the buffers the bound arguments point into: a kernel given a freed cl.Buffer
        # crashes the process, so computing checks them first
        self.buffers = graph.buffers()

    def check_live(self) -> None:
        for buf in self.buffers:
            buf.check_live()


class OpenCLBackend(Backend):
    device: OpenCLDevice

    def __init__(self, device: OpenCLDevice) -> None:
        import pyopencl as cl

        super().__init__(device)
        self.queue = cl.CommandQueue(device.context, device.cl_device)
        self._kernels: dict[str, Any] = {}
        self._in_flight: list[Any] = []  # transfer events, kept so they do not block
        self._err = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 8)
        cl.enqueue_fill_buffer(self.queue, self._err, b"\0", 0, 8)
        self._scratch: Any = None  # the scratch buffer, once a launch asks for one
        self._err_watched = False  # a kernel that may report into the error word ran

    def _keep(self, event: Any) -> None:
        """Hold a transfer's event until it completes (see the module docstring)."""
        import pyopencl as cl

        if len(self._in_flight) >= 64:  # a long run without synchronize: drop finished ones
            done = cl.command_execution_status.COMPLETE
            self._in_flight = [e for e in self._in_flight if e.command_execution_status != done]
        self._in_flight.append(event)

    # -- kernels ---------------------------------------------------------------------------

    def runtime_buffers(self, scratch: int) -> dict[str, Any]:
        """The backend's own buffers for launches needing ``scratch`` bytes of scratch
        together: the error word and the scratch buffer, grown first if it is smaller
        (OpenCL frees a replaced buffer only once the work queued on it is done)."""
        import pyopencl as cl

        runtime = {"err": self._err}
        if scratch <= 0:
            return runtime
        have = 0 if self._scratch is None else self._scratch.size
        size = scratch_capacity(scratch, have)
        if size > have:
            try:
                self._scratch = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size)
            except cl.Error as e:
                raise translate(e, f"{self.name}: allocating {size} bytes of scratch memory") from e
        runtime["scratch"] = self._scratch
        return runtime

    def set_args(self, kernel: Any, launch: Launch, node: Tensor, runtime: dict[str, Any]) -> bool:
        """Bind the launch's arguments (``runtime``: the backend's own buffers, from
        :meth:`runtime_buffers`); True when the kernel may report into the error word
        (which synchronize must then read)."""
        import pyopencl as cl

        try:
            args = cl_args(launch, self.device.context, runtime)
            kernel.set_args(*args)
            return any(a is self._err for a in args[1:])
        except (cl.Error, TypeError, ValueError, KeyError) as e:
            raise translate(
                e, f"{self.name}: {launch.kernel} for {node.describe()}", kernel=launch.kernel
            ) from e

    def _enqueue(self, kernel: Any, launch: Launch, node: Tensor) -> None:
        import pyopencl as cl

        try:
            cl.enqueue_nd_range_kernel(self.queue, kernel, launch.global_size, launch.local_size)
        except cl.Error as e:
            raise translate(
                e,
                f"{self.name}: enqueuing {launch.kernel} (global {launch.global_size}, local "
                f"{launch.local_size}) for {node.op.value} node {node.describe()}",
                kernel=launch.kernel,
            ) from e

    def _kernel(self, launch: Launch) -> Any:
        """This backend's kernel object for the launch's kernel (one per name, its
        arguments set again for every launch)."""
        kernel = self._kernels.get(launch.kernel)
        if kernel is None:
            kernel = self._kernels[launch.kernel] = self.device.program.kernel(launch.kernel)
        return kernel

    def _graph_compute(self, graph: Graph) -> Status:
        limits = self.device.limits
        for buf in graph.buffers():
            buf.check_live()
        for node in graph.nodes:
            launches = encode(node, limits)
            runtime = self.runtime_buffers(scratch_bytes(launches))
            for launch in launches:
                kernel = self._kernel(launch)
                self._err_watched |= self.set_args(kernel, launch, node, runtime)
                self._enqueue(kernel, launch, node)
        return Status.SUCCESS

    # -- graph plans -------------------------------------------------------------------------

    def graph_plan_create(self, graph: Graph) -> OpenCLGraphPlan:
        return OpenCLGraphPlan(self, graph)

    def graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        self._own_plan(plan).bind(graph)

    def graph_plan_compute(self, plan: GraphPlan) -> Status:
        own = self._own_plan(plan)
        own.check_live()  # raises BufferFreedError instead of handing a freed buffer to a kernel
        for kernel, launch, node in own.bound:
            self._enqueue(kernel, launch, node)
        if own.watches_errors:
            self._err_watched = True
        return Status.SUCCESS

    def graph_plan_free(self, plan: GraphPlan) -> None:
        self._own_plan(plan).bound = []

    def _own_plan(self, plan: GraphPlan) -> OpenCLGraphPlan:
        if not isinstance(plan, OpenCLGraphPlan) or plan.backend is not self:
            raise UnsupportedError(f"{self.name}: this graph plan was made by another backend")
        return plan

    # -- synchronisation and transfers --------------------------------------------------------

    def synchronize(self) -> None:
        import pyopencl as cl

        try:
            self.queue.finish()
        except cl.Error as e:
            raise translate(e, f"{self.name}: waiting for queued work") from e
        self._in_flight.clear()
        if self._err_watched:
            self._err_watched = False
            self._raise_reported_error()

    def _raise_reported_error(self) -> None:
        """Raise what a kernel reported in the error word since it was last read (and
        clear it for the next graph)."""
        import numpy as np
        import pyopencl as cl

        word = np.zeros(2, np.int32)
        cl.enqueue_copy(self.queue, word, self._err, is_blocking=True)
        if word[0] == 0:
            return
        cl.enqueue_fill_buffer(self.queue, self._err, b"\0", 0, 8).wait()
        raise OutOfBoundsError(
            f"{self.name}: an index was out of range (index {int(word[1])}) in get_rows, "
            "set_rows or mul_mat_id's expert ids; indices must lie in [0, rows of the "
            "table) / [0, n_expert). Nothing was written by set_rows; get_rows and "
            "mul_mat_id results of this graph are not valid"
        )

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        if not len(data):
            return
        import pyopencl as cl

        mem = cl_buffer(tensor, self.device.context)
        try:
            self._keep(
                cl.enqueue_copy(
                    self.queue, mem, data, dst_offset=tensor.offset + offset, is_blocking=False
                )
            )
        except cl.Error as e:
            raise translate(e, f"{self.name}: queueing a write of {tensor.describe()}") from e

    def _get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        if not len(out):
            return
        import pyopencl as cl

        mem = cl_buffer(tensor, self.device.context)
        try:
            self._keep(
                cl.enqueue_copy(
                    self.queue, out, mem, src_offset=tensor.offset + offset, is_blocking=False
                )
            )
        except cl.Error as e:
            raise translate(e, f"{self.name}: queueing a read of {tensor.describe()}") from e

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Device-to-device within one context, ordered after ``backend_src``'s queued work."""
        sbuf, dbuf = src.buffer, dst.buffer
        if not (
            isinstance(backend_src, OpenCLBackend)
            and isinstance(sbuf, OpenCLBuffer)
            and isinstance(dbuf, OpenCLBuffer)
            and sbuf.context == dbuf.context == self.device.context
        ):
            return False
        n = src.nbytes
        if sbuf is dbuf and src.offset < dst.offset + n and dst.offset < src.offset + n:
            return False
        if n == 0:
            return True
        import pyopencl as cl

        try:
            wait = [] if backend_src is self else [cl.enqueue_marker(backend_src.queue)]
            cl.enqueue_copy(
                self.queue,
                dbuf.cl_buffer,
                sbuf.cl_buffer,
                byte_count=n,
                src_offset=src.offset,
                dst_offset=dst.offset,
                wait_for=wait,
            )
        except cl.Error as e:
            raise translate(e, f"{self.name}: copying {src.describe()} to {dst.describe()}") from e
        return True

    # -- events --------------------------------------------------------------------------------

    def event_record(self, event: Event) -> None:
        import pyopencl as cl

        self._own_event(event)
        event.context = cl.enqueue_marker(self.queue)

    def event_wait(self, event: Event) -> None:
        """Later work on this queue waits for ``event``: on the device when the event is
        from this context, otherwise by blocking the host until it has happened."""
        import pyopencl as cl

        if getattr(event.device, "context", None) == self.device.context:
            if event.context is not None:
                cl.enqueue_barrier(self.queue, wait_for=[event.context])
        else:
            event.synchronize()

    def _own_event(self, event: Event) -> None:
        dev = event.device
        if getattr(dev, "context", None) != self.device.context:
            raise UnsupportedError(
                f"{self.name}: the event belongs to device {dev.name!r}; record it on a "
                "backend of that device"
            )

    def free(self) -> None:
        self.synchronize()
        self._kernels.clear()

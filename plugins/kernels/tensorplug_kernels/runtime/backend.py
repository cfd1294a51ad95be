"""A GPU backend, written once: from graph nodes to issued launches, plans, the scratch
buffer, the error word, transfers and events around a runtime's few hooks.

A backend is one queue (a stream). Computing a graph binds every node's launches —
the node -> launches step is :meth:`GPUBackend.launches`, the shared encoder for the
shared kernel library, replaceable by a runtime with kernels of its own — into
:class:`BoundLaunch`\\ es (packed arguments struct, a handle per buffer parameter, the
grid), then issues them in order. A graph plan is the same bound launches kept.

Written here, once: the buffer checks a launch needs (allocated, not freed, memory this
device can read); binding, with the scratch buffer sized for a whole graph before
anything is bound, so a plan keeps addresses that do not move and keeps its buffer when
the backend grows its own later (:func:`~tensorplug_kernels.scratch_capacity`); the
error word — eight bytes that kernels indexing by data (get_rows, set_rows,
mul_mat_id) report a bad index in — read at ``synchronize`` after such kernels ran,
and raised as :class:`~tensorplug.OutOfBoundsError`; plan ownership (a plan of another
backend is a :class:`~tensorplug.TypeMismatchError`, a freed plan an
:class:`~tensorplug.UnsupportedError`); which transfers and copies the runtime can
queue and which go through the buffer's own copy; host memory kept alive until
``synchronize``; the context of every error.

A runtime fills in: ``_prepare`` (its form of a bound launch), ``_issue`` (queue one),
``_synchronize``, ``_write_async``/``_read_async``/``_copy_async``, ``_record`` and
``_wait`` for events; and where it has more to do, ``library_ops`` (nodes a vendor
library computes: CUDA's cuBLAS, :mod:`.library`), ``run`` (Metal encodes many launches
into one command buffer), ``forget``, ``_free``. A runtime that captures plans and
replays them (CUDA graphs) derives from :class:`~.replay.ReplayingBackend`.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from tensorplug.backend import Backend, Event, GraphPlan, Status
from tensorplug.errors import (
    NotAllocatedError,
    OutOfBoundsError,
    TypeMismatchError,
    UnsupportedError,
)
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.transfer import tensor_alloc
from tensorplug.types import Type

from ..abi import KernelABI, TensorArg, kernel_abis
from ..encode import encode
from ..launch import Launch, scratch_bytes, scratch_capacity
from .errors import KernelLaunchError
from .memory import DeviceMemory, overlapping

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer
    from tensorplug.graph import Graph

    from .device import GPUDevice
    from .library import LibraryOp

__all__ = ["BoundLaunch", "GPUBackend", "GPUGraphPlan", "Step"]


@dataclass(eq=False, slots=True)
class BoundLaunch:
    """One launch with everything resolved, ready to be issued again and again.

    ``buffers``: per buffer parameter of the kernel, the handle a launch passes (a
    tensor's buffer, or the backend's error word or scratch buffer); ``grid`` and
    ``block``: the work in groups and a group in items (OpenCL's sizes divided);
    ``call``: what the runtime's ``_prepare`` made of it (a kernel with its arguments
    set, a pipeline...).
    """

    kernel: str
    node: Tensor
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    data: bytes  # the packed arguments struct
    buffers: tuple[Any, ...]
    watches_errors: bool  # the kernel may report a bad index in the error word
    call: Any = None

    def geometry(self) -> str:
        return f"grid {self.grid} x block {self.block}"


#: A graph's work in order: bound launches, and the nodes a runtime computes itself.
Step = BoundLaunch | Tensor


class GPUGraphPlan(GraphPlan):
    """A graph's launches bound once; computing issues them.

    The plan refers to the tensors' memory as it was when it was bound: after
    re-allocating the graph, call ``graph_plan_update``. It keeps the scratch buffer it
    was bound to (sized for the whole graph) when the backend later grows its own.
    """

    backend: GPUBackend

    def __init__(self, backend: GPUBackend, graph: Graph) -> None:
        super().__init__(backend, graph)
        self.steps: list[Step] = []
        self.buffers: list[Buffer] = []
        self.watches_errors = False
        self.freed = False
        self.bind(graph)

    def bind(self, graph: Graph) -> None:
        """Bind ``graph``'s launches (again, after its memory moved)."""
        self.steps = self.backend.bind_graph(graph, replayed=True)
        # the buffers the bound launches point into: computing checks them first, as a
        # kernel handed freed memory crashes the process or writes someone else's
        self.graph, self.buffers, self.freed = graph, graph.buffers(), False
        self.watches_errors = any(
            isinstance(s, BoundLaunch) and s.watches_errors for s in self.steps
        )

    def compute(self) -> None:
        """Queue the plan's work on its backend (the caller checked its buffers)."""
        self._compute()
        if self.watches_errors:
            self.backend.note_error_word()

    def _compute(self) -> None:
        """Issue the bound steps (a runtime that replays plans otherwise overrides it)."""
        self.backend.run(self.steps)

    def release(self) -> None:
        self.steps, self.freed = [], True


class GPUBackend(Backend):
    """One queue (stream) of a GPU runtime; the hooks it leaves to the runtime are the
    abstract methods below (see the module docstring for what is written here)."""

    device: GPUDevice
    plan_class: ClassVar[type[GPUGraphPlan]] = GPUGraphPlan
    #: vendor-library paths, tried in order before the kernels (set by the runtime)
    library_ops: Sequence[LibraryOp] = ()

    def __init__(self, device: GPUDevice) -> None:
        super().__init__(device)
        self._kept: list[Any] = []  # what queued work uses, until synchronize
        self._scratch: Any = None  # the scratch buffer's handle, once a launch asks for one
        self._scratch_size = 0
        self._err_watched = False  # a kernel that may report into the error word ran
        self._err_buf = device.buffer_type().alloc_buffer(8)
        self._err_word = new_tensor(Type.I32, (2,), "error word")
        tensor_alloc(self._err_buf, self._err_word, 0)
        self._err_buf.clear(0)
        self._err_arg = cast(DeviceMemory, self._err_buf).binding(0, 8)[0]
        device.track_backend(self)

    # -- hooks ---------------------------------------------------------------------------

    @abstractmethod
    def _prepare(self, bound: BoundLaunch, replayed: bool) -> Any:
        """What ``_issue`` needs beyond ``bound`` (kept as ``bound.call``). ``replayed``:
        the launch will be issued many times (a graph plan)."""

    @abstractmethod
    def _issue(self, bound: BoundLaunch) -> None:
        """Queue one bound launch."""

    @abstractmethod
    def _synchronize(self) -> None:
        """Wait until everything queued has finished."""

    @abstractmethod
    def _write_async(self, buf: Buffer, offset: int, data: memoryview) -> None:
        """Queue a copy of host ``data`` to byte ``offset`` of ``buf`` (``keep`` what
        must live until then)."""

    @abstractmethod
    def _read_async(self, buf: Buffer, offset: int, out: memoryview) -> None:
        """Queue a copy from byte ``offset`` of ``buf`` into host ``out``."""

    @abstractmethod
    def _copy_async(
        self, src_backend: GPUBackend, src: Buffer, src_offset: int, dst: Buffer,
        dst_offset: int, size: int,
    ) -> None:  # fmt: skip
        """Queue a device copy here, after ``src_backend``'s queued work."""

    @abstractmethod
    def _record(self, event: Event) -> None:
        """Mark the current end of this queue in ``event`` (an event of this device)."""

    @abstractmethod
    def _wait(self, event: Event) -> None:
        """Make later work here wait, on the device, for ``event``."""

    def _waits_on_device(self, event: Event) -> bool:
        """True when this queue can wait for ``event`` on the device (default: an event
        of this device); otherwise ``event_wait`` blocks the host until it happened."""
        return event.device is self.device

    def forget(self, buffer: Buffer) -> None:
        """``buffer`` is being freed: drop work bound to it kept beyond a compute."""

    def _free(self) -> None:
        """Release what the runtime keeps beyond the base's (at ``free``)."""

    # -- node -> launches ----------------------------------------------------------------

    def launches(self, node: Tensor) -> list[Launch]:
        """The launches computing ``node``: the shared encoder's, for the shared library."""
        return encode(node, self.device.limits)

    def abi(self, kernel: str) -> KernelABI:
        """How to call ``kernel`` (its arguments struct and buffer parameters)."""
        return kernel_abis()[kernel]

    def library_for(self, node: Tensor) -> LibraryOp | None:
        """The library op that computes ``node``, None for the kernels."""
        return next((op for op in self.library_ops if op.takes(node)), None)

    def claims(self, node: Tensor) -> bool:
        """True for a node the runtime computes itself in ``compute_node`` (a library's)."""
        return self.library_for(node) is not None

    # -- binding -------------------------------------------------------------------------

    def memory_of(self, t: Tensor) -> tuple[Any, int]:
        """``(handle, shift)`` of ``t``'s memory for a launch, refusing tensors with no
        memory, freed memory, and memory this device's kernels cannot read."""
        buf = t.buffer
        if buf is None:
            raise NotAllocatedError(
                f"{self.name}: tensor {t.describe()} has no memory; allocate the graph before "
                "computing"
            )
        buf.check_live()
        if not self.device.owns(buf):
            raise UnsupportedError(
                f"{self.name}: tensor {t.describe()} lives in buffer {buf.name!r}, which this "
                f"{self.device.noun}'s kernels cannot read; allocate it in the device's buffer "
                "type (backend.buffer_type()) or let the scheduler copy it"
            )
        return cast(DeviceMemory, buf).binding(t.offset, t.nbytes)

    def arguments(
        self, launch: Launch, node: Tensor, runtime: dict[str, Any]
    ) -> tuple[bytes, tuple[Any, ...]]:
        """The packed arguments struct of ``launch`` and, per buffer parameter, the
        handle a launch passes (``runtime``: the backend's own, by name)."""
        args, handles = launch.args, {}
        for name, value in launch.args.items():
            if isinstance(value, TensorArg):
                handles[id(value.tensor)], shift = self.memory_of(value.tensor)
                if shift:  # the tensor's offset inside the view it is bound to
                    args = {**args, name: dataclasses.replace(value, offset=value.offset + shift)}
        data, params = self.abi(launch.kernel).pack(args)
        missing = [p for p in params if isinstance(p, str) and p not in runtime]
        if missing:
            raise KernelLaunchError(
                f"{self.name}: {launch.kernel} takes the runtime buffer(s) {missing}, which "
                f"were not provided for {node.describe()}",
                kernel=launch.kernel,
            )
        buffers = tuple(
            handles[id(p.tensor)] if isinstance(p, TensorArg) else runtime[p] for p in params
        )
        return data, buffers

    def runtime_buffers(self, scratch: int) -> dict[str, Any]:
        """The backend's own buffers for launches needing ``scratch`` bytes of scratch
        together: the error word, and the scratch buffer, grown first if it is smaller.
        The buffer grown out of is kept until ``synchronize`` for the work queued on it;
        plans bound to it keep it as long as they live."""
        self._err_buf.check_live()  # freed with the backend
        runtime = {"err": self._err_arg}
        if scratch <= 0:
            return runtime
        size = scratch_capacity(scratch, self._scratch_size)
        if size > self._scratch_size:
            mem = self.device.alloc(size, f"allocating {size} bytes of scratch memory")
            if self._scratch is not None:
                self.keep(self._scratch)
            self._scratch, self._scratch_size = self.device.kernel_arg(mem), size
        runtime["scratch"] = self._scratch
        return runtime

    def bind(
        self, launch: Launch, node: Tensor, runtime: dict[str, Any], replayed: bool = False
    ) -> BoundLaunch:
        """``launch`` (of ``node``) ready to issue on this backend; ``replayed``: it will
        be issued many times (a graph plan)."""
        data, buffers = self.arguments(launch, node, runtime)
        g = (*launch.global_size, 1, 1)[:3]
        b = (*launch.local_size, 1, 1)[:3]
        if any(x % y for x, y in zip(g, b, strict=True)):
            raise KernelLaunchError(
                f"{self.name}: {launch.kernel} for {node.op.value} node {node.describe()}: "
                f"global size {launch.global_size} is not a multiple of the work-group "
                f"{launch.local_size}",
                kernel=launch.kernel,
            )
        bound = BoundLaunch(
            launch.kernel, node, launch.global_size, launch.local_size,
            (g[0] // b[0], g[1] // b[1], g[2] // b[2]), (b[0], b[1], b[2]), data, buffers,
            "err" in self.abi(launch.kernel).buffers,
        )  # fmt: skip
        try:
            bound.call = self._prepare(bound, replayed)
        except self.device.driver_errors as e:
            what = f"binding {launch.kernel} for {node.op.value} node {node.describe()}"
            raise self.device.translate(e, f"{self.name}: {what}", launch.kernel) from e
        return bound

    def bind_graph(self, graph: Graph, replayed: bool = False) -> list[Step]:
        """Every launch of ``graph`` bound, the scratch buffer sized once for all of them
        (so none moves when a later one needs more); nodes the runtime claims stay nodes."""
        encoded = [(n, None if self.claims(n) else self.launches(n)) for n in graph.nodes]
        with self.device.current():
            runtime = self.runtime_buffers(
                scratch_bytes(ln for _, ls in encoded for ln in ls or ())
            )
            steps: list[Step] = []
            for node, launches in encoded:
                if launches is None:
                    steps.append(node)
                else:
                    steps += [self.bind(ln, node, runtime, replayed) for ln in launches]
        return steps

    # -- issuing -------------------------------------------------------------------------

    def issue(self, bound: BoundLaunch) -> None:
        """Queue one bound launch (the device current)."""
        try:
            self._issue(bound)
        except self.device.driver_errors as e:
            node = bound.node
            what = (
                f"{self.name}: launching {bound.kernel} ({bound.geometry()}) for "
                f"{node.op.value} node {node.describe()}"
            )
            raise self.device.translate(e, what, bound.kernel) from e
        if bound.watches_errors:
            self._err_watched = True

    def run(self, steps: Sequence[Step]) -> None:
        """Issue ``steps`` in order (the device current); claimed nodes are computed."""
        for step in steps:
            if isinstance(step, BoundLaunch):
                self.issue(step)
            else:
                self.compute_node(step)

    def compute_node(self, node: Tensor) -> None:
        """Queue ``node``'s work now (the device current): through the library that takes
        it, or, when there is none or it cannot after all, by kernels bound as they go."""
        library = self.library_for(node)
        if library is not None and library.run(node):
            return
        launches = self.launches(node)
        runtime = self.runtime_buffers(scratch_bytes(launches))
        for launch in launches:
            self.issue(self.bind(launch, node, runtime))

    def compute_graph(self, graph: Graph) -> None:
        """Queue ``graph``'s work (its buffers checked, the device current)."""
        self.run(self.bind_graph(graph))

    def _graph_compute(self, graph: Graph) -> Status:
        for buf in graph.buffers():
            buf.check_live()
        with self.device.current():
            self.compute_graph(graph)
        return Status.SUCCESS

    # -- graph plans ---------------------------------------------------------------------

    def _graph_plan_create(self, graph: Graph) -> GPUGraphPlan:
        return self.plan_class(self, graph)

    def _graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        self._own_plan(plan).bind(graph)

    def _graph_plan_compute(self, plan: GraphPlan) -> Status:
        own = self._own_plan(plan)
        if own.freed:
            raise UnsupportedError(f"{self.name}: this graph plan was freed; create a new one")
        for buf in own.buffers:
            buf.check_live()  # never hand a freed buffer to a kernel
        with self.device.current():
            own.compute()
        return Status.SUCCESS

    def _graph_plan_free(self, plan: GraphPlan) -> None:
        self._own_plan(plan).release()

    def _own_plan(self, plan: GraphPlan) -> GPUGraphPlan:
        if not isinstance(plan, GPUGraphPlan) or plan.backend is not self:
            raise TypeMismatchError(
                f"{self.name}: this graph plan was made by another backend "
                f"({plan.backend.name!r}); compute it there, or make one here with "
                "graph_plan_create"
            )
        return plan

    # -- synchronisation and the error word ------------------------------------------------

    def keep(self, obj: Any) -> None:
        """Keep ``obj`` (host memory of a queued copy, a retired buffer) until synchronize."""
        self._kept.append(obj)

    def note_error_word(self) -> None:
        """Kernels that may report into the error word were queued: read it at sync."""
        self._err_watched = True

    def synchronize(self) -> None:
        try:
            with self.device.driver("waiting for queued work"):
                self._synchronize()
        finally:
            self._kept.clear()
        if self._err_watched:
            self._err_watched = False
            self._raise_reported_error()

    def _raise_reported_error(self) -> None:
        """Raise what a kernel reported in the error word since it was last read, and
        clear it for the next graph."""
        word = np.zeros(2, np.int32)
        self._err_buf.get_tensor(self._err_word, word.data.cast("B"))
        if word[0] == 0:
            return
        self._err_buf.clear(0)
        raise OutOfBoundsError(
            f"{self.name}: an index was out of range (index {int(word[1])}) in get_rows, "
            "set_rows or mul_mat_id; indices must lie in [0, rows of the table) or "
            "[0, n_expert). Nothing was written by set_rows; the other results of this "
            "graph are not valid"
        )

    # -- transfers -----------------------------------------------------------------------

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        buf = tensor.buffer
        if not self.device.owns(buf, write=True):  # other memory: the buffer's own copy
            super()._set_tensor_async(tensor, data, offset)
        elif len(data):
            with self.device.driver(f"queueing a write of {tensor.describe()}"):
                self._write_async(cast("Buffer", buf), tensor.offset + offset, data)

    def _get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        buf = tensor.buffer
        if not self.device.owns(buf):
            super()._get_tensor_async(tensor, out, offset)
        elif len(out):
            with self.device.driver(f"queueing a read of {tensor.describe()}"):
                self._read_async(cast("Buffer", buf), tensor.offset + offset, out)

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Device to device, queued here after ``backend_src``'s queued work; False when
        the runtime cannot (other memory, overlapping bytes): the caller copies."""
        sbuf, dbuf = src.buffer, dst.buffer
        if not (
            isinstance(backend_src, type(self))
            and sbuf is not None
            and dbuf is not None
            and self.device.owns(dbuf, write=True)
            and self.device.reaches(sbuf)
            and not overlapping(src, dst)
        ):
            return False
        if src.nbytes:
            with self.device.driver(f"copying {src.describe()} to {dst.describe()}"):
                self._copy_async(backend_src, sbuf, src.offset, dbuf, dst.offset, src.nbytes)
        return True

    # -- events --------------------------------------------------------------------------

    def _event_record(self, event: Event) -> None:
        if event.device is not self.device:
            raise UnsupportedError(
                f"{self.name}: the event belongs to device {event.device.name!r}; record it "
                "on a backend of that device"
            )
        with self.device.driver("recording an event"):
            self._record(event)

    def _event_wait(self, event: Event) -> None:
        """Later work here waits for ``event``: on the device where the runtime can,
        otherwise by blocking the host until it has happened."""
        if self._waits_on_device(event):
            with self.device.driver("waiting for an event"):
                self._wait(event)
        else:
            event.synchronize()

    def free(self) -> None:
        self.synchronize()
        self._free()
        for library in self.library_ops:
            library.free()
        self._scratch, self._scratch_size = None, 0  # plans still bound to it hold it
        self._err_buf.free()

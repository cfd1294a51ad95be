"""The multi-backend scheduler (``ggml_backend_sched``): one graph over several backends.

A :class:`Scheduler` takes backends in priority order, the last one a CPU device. For
each graph it decides where every node runs (:mod:`tensorplug.sched_split`: weights
pull their ops to where they live, unsupported ops fall back to a backend that can
run them), cuts the graph into splits of consecutive nodes on one backend, plans one
compute buffer per buffer type with the :class:`~tensorplug.GraphAllocator`, and runs
the splits in order, copying each split's inputs from wherever they were computed.

Typical use, as in ggml::

    sched = Scheduler([gpu, cpu])
    sched.reserve(build_graph(max_batch))     # size the compute buffers once
    graph = build_graph(batch)
    sched.alloc_graph(graph)                  # place this graph's tensors
    set_array(tokens, ...)                    # write its inputs
    sched.graph_compute(graph)                # run it (again and again if you like)
    sched.reset()                             # before the next graph

Where ggml aborts, this raises: an op no backend can run, a pre-allocated tensor in a
buffer no backend can use, out of memory (:class:`~tensorplug.AllocationError`,
recoverable). The eval callback cancels the whole compute (ggml only stops the current
split), split inputs have no fixed limit, and the number of pipeline copies is a
setting (``TENSORPLUG_SCHED_COPIES``). ``TENSORPLUG_SCHED_DEBUG=1`` prints each
assignment to stderr, as ``GGML_SCHED_DEBUG`` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import collector
from .alloc import GraphAllocator
from .backend import Backend, Event, Status
from .device import DeviceType
from .errors import GraphError, InvalidArgumentError, TypeMismatchError, UnsupportedError
from .sched_split import VIEW_LIKE, SplitContext, split_graph
from .settings import MAX_COPIES, SCHED_COPIES, SCHED_DEBUG
from .tensor import Tensor, TensorFlag
from .transfer import tensor_copy

if TYPE_CHECKING:
    from .alloc_plan import AllocPlan
    from .buffer import BufferType
    from .graph import Graph
    from .sched_split import Split, SplitResult

__all__ = ["SCHED_COPIES", "SCHED_DEBUG", "EvalCallback", "Scheduler"]

#: ``callback(tensor, ask)``: with ``ask=True`` answer whether you want to see ``tensor``
#: after it is computed; with ``ask=False`` look at it and return False to cancel.
EvalCallback = Callable[[Tensor, bool], bool]


_INPUT = TensorFlag.INPUT.value
_NO_FLAGS = TensorFlag.NONE


class Scheduler:
    """Runs graphs over several backends (``ggml_backend_sched``).

    ``backends`` are in priority order and the last must be a CPU device.
    ``buffer_types`` (one per backend, default each backend's own) are where compute
    buffers are allocated. ``graph_size`` is accepted for ggml parity; graphs of any
    size work. ``parallel=True`` enables pipeline parallelism with ``n_copies`` (default
    ``TENSORPLUG_SCHED_COPIES``, 4) copies of every split input. ``op_offload=False``
    stops higher-priority backends from taking ops whose weights are in host memory.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        buffer_types: Sequence[BufferType] | None = None,
        graph_size: int | None = None,
        parallel: bool = False,
        *,
        n_copies: int | None = None,
        op_offload: bool = True,
    ) -> None:
        backends = tuple(backends)
        for be in backends:
            if not isinstance(be, Backend):
                raise TypeMismatchError(
                    f"Scheduler: {be!r} ({type(be).__name__}) is not a Backend; pass "
                    "backends, e.g. tensorplug.init_by_name('CPU')"
                )
        if not backends:
            raise InvalidArgumentError("Scheduler needs at least one backend (the last one a CPU)")
        if len({id(b) for b in backends}) != len(backends):
            raise InvalidArgumentError(f"Scheduler: a backend is listed twice in {list(backends)}")
        if backends[-1].device.type is not DeviceType.CPU:
            raise InvalidArgumentError(
                f"Scheduler: the last backend must be a CPU device (inputs and fallback ops "
                f"run there), got {backends[-1].name!r} ({backends[-1].device.type.value}); "
                "append a CPU backend, e.g. tensorplug.registry.init_by_name('CPU')"
            )
        bufts = (
            tuple(b.buffer_type() for b in backends)
            if buffer_types is None
            else tuple(buffer_types)
        )
        if len(bufts) != len(backends):
            raise InvalidArgumentError(
                f"Scheduler: {len(bufts)} buffer types given for {len(backends)} backends"
            )
        for be, bt in zip(backends, bufts, strict=True):
            if not be.supports_buft(bt):
                raise InvalidArgumentError(
                    f"Scheduler: backend {be.name!r} cannot use buffer type {bt.name!r}; "
                    "give each backend a buffer type it supports (or None for its default)"
                )
        if n_copies is not None and not parallel:
            raise InvalidArgumentError("n_copies is the pipeline depth: pass parallel=True with it")
        if graph_size is not None and graph_size < 0:
            raise InvalidArgumentError(f"graph_size must be positive, got {graph_size}")
        self.backends: tuple[Backend, ...] = backends
        self.buffer_types: tuple[BufferType, ...] = bufts
        copies = (SCHED_COPIES.get() if n_copies is None else n_copies) if parallel else 1
        if parallel and not 2 <= copies <= MAX_COPIES:
            raise InvalidArgumentError(
                f"pipeline parallelism needs 2 <= n_copies <= {MAX_COPIES}, got {copies} "
                "(each copy holds every split input and an event per backend)"
            )
        self._n_copies = copies
        self._ctx = SplitContext(backends, bufts, copies)
        self._ctx.op_offload = op_offload
        self._galloc = GraphAllocator(bufts)
        self._events: list[list[Event | None]] = []
        if copies > 1:
            self._events = [[_new_event(be) for _ in range(copies)] for be in backends]
        self._split: SplitResult | None = None
        self._allocated: Graph | None = None
        self._allocated_size = (0, 0)
        self._next_copy = 0
        self.eval_callback: EvalCallback | None = None

    # -- configuration ------------------------------------------------------------------

    @property
    def n_backends(self) -> int:
        return len(self.backends)

    @property
    def n_copies(self) -> int:
        """Copies kept of each split input: 1, or the pipeline depth with parallel=True."""
        return self._n_copies

    def backend(self, i: int) -> Backend:
        return self.backends[i]

    @property
    def op_offload(self) -> bool:
        return self._ctx.op_offload

    @op_offload.setter
    def op_offload(self, value: bool) -> None:
        self._ctx.op_offload = bool(value)

    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        """Observe nodes as they are computed (``ggml_backend_sched_set_eval_callback``).

        Nodes the callback does not ask for are computed together in one call; after
        an asked-for node the backend is synchronized and the callback sees it.
        Returning False then cancels the whole compute, which returns
        :attr:`~tensorplug.Status.ABORTED`.
        """
        self.eval_callback = callback

    def set_tensor_backend(self, tensor: Tensor, backend: Backend) -> None:
        """Pin ``tensor`` to ``backend`` for the next graphs, until :meth:`reset`."""
        self._ctx.user[tensor] = self._index(backend)

    def get_tensor_backend(self, tensor: Tensor) -> Backend | None:
        """Where ``tensor`` runs in the current split graph (or was pinned), else None."""
        if self._split is not None:
            b = self._split.ids.get(tensor)
            if b is not None:
                return self.backends[b]
        pinned = self._ctx.user.get(tensor)
        return self.backends[pinned] if pinned is not None else None

    # -- what the last graph looks like -------------------------------------------------

    @property
    def allocated(self) -> Graph | None:
        """The graph :meth:`alloc_graph` last allocated, while it still holds its memory
        (None after :meth:`reset`, :meth:`reserve` or a failed allocation): computing it
        again splits and allocates nothing."""
        return self._allocated

    @property
    def n_splits(self) -> int:
        return len(self._split.splits) if self._split is not None else 0

    @property
    def splits(self) -> tuple[Split, ...]:
        return tuple(self._split.splits) if self._split is not None else ()

    @property
    def n_split_inputs(self) -> int:
        """How many tensors the current graph copies between backends per compute."""
        return sum(len(s.inputs) for s in self.splits)

    def buffer_size(self, backend: Backend) -> int:
        """Bytes of compute buffer allocated for ``backend`` (0 if it shares another's)."""
        return self._galloc.buffer_size(self._index(backend))

    @property
    def plan(self) -> AllocPlan | None:
        """The memory plan of the last graph reserved or allocated."""
        return self._galloc.last_plan

    # -- the ggml flow: reserve, alloc, compute, reset ---------------------------------

    def reserve(self, graph: Graph) -> None:
        """Size the compute buffers for ``graph`` (the largest you will run); places nothing.

        Raises :class:`~tensorplug.AllocationError` if they cannot be allocated.
        """
        res = self._split_graph(graph, self._next_copy)
        try:
            self._galloc.reserve_n(
                res.alloc_nodes, res.alloc_leafs, res.alloc_node_ids, res.alloc_leaf_ids,
                self.synchronize,
            )  # fmt: skip
        finally:
            res.restore()
            self._split = None
            self._allocated = None
        self.synchronize()

    def alloc_graph(self, graph: Graph) -> None:
        """Split ``graph`` and give its tensors memory, growing the buffers if needed.

        Afterwards write the inputs (they live where :meth:`get_tensor_backend` says)
        and call :meth:`graph_compute`. Nodes that read tensors from another backend
        now read their copies: :meth:`reset` or the next graph restores them.
        """
        cur_copy = self._next_copy
        self._next_copy = (cur_copy + 1) % self._n_copies
        with collector.paused():  # what splitting and allocating make stays with the graph
            res = self._split_graph(graph, cur_copy)
            try:
                self._galloc.alloc_n(
                    res.alloc_nodes, res.alloc_leafs, res.alloc_node_ids, res.alloc_leaf_ids,
                    self.synchronize,
                )  # fmt: skip
            except BaseException:
                res.restore()
                self._split = None
                raise
        self._allocated = graph
        self._allocated_size = (len(graph.nodes), len(graph.leafs))

    def prepare(self, graph: Graph) -> None:
        """Allocate ``graph`` and let each backend do, without computing, what its first
        compute of a graph of this shape would do first (``Backend.graph_prepare``: the
        CPU binds its plan and makes ready every kernel the plan calls). A later
        :meth:`graph_compute` of this graph, or of another of the same shape, finds that
        done; its inputs need no values yet."""
        if self._allocated is not graph:
            self.alloc_graph(graph)
        assert self._split is not None
        for split in self._split.splits:
            assert split.graph is not None
            self.backends[split.backend_id].graph_prepare(split.graph)

    def graph_compute(self, graph: Graph) -> Status:
        """Compute ``graph`` (allocating it first if needed) and wait for it."""
        status = self.graph_compute_async(graph)
        self.synchronize()
        return status

    def graph_compute_async(self, graph: Graph) -> Status:
        """Start computing ``graph``; results are ready after :meth:`synchronize`."""
        if self._allocated is not graph:
            self.alloc_graph(graph)
        elif (len(graph.nodes), len(graph.leafs)) != self._allocated_size:
            n, m = self._allocated_size
            raise GraphError(
                f"the graph changed after alloc_graph ({n} nodes and {m} leafs then, "
                f"{len(graph.nodes)} and {len(graph.leafs)} now): call alloc_graph(graph) "
                "again, then set its inputs, before computing it"
            )
        return self._compute_splits()

    def synchronize(self) -> None:
        for be in self.backends:
            be.synchronize()

    def reset(self) -> None:
        """Forget the current graph, all assignments and pins; its tensors lose their memory.

        Call it before building or allocating the next graph, as in ggml.
        """
        if self._split is not None:
            self._split.restore()
        self._split = None
        self._allocated = None
        self._ctx.user.clear()
        self._galloc.release_tensors()

    def free(self) -> None:
        """Release the compute buffers and events."""
        self.reset()
        self._galloc.free()
        for per_backend in self._events:
            for ev in per_backend:
                if ev is not None:
                    ev.free()
        self._events = []

    # -- internals ------------------------------------------------------------------------

    def _index(self, backend: Backend) -> int:
        for i, be in enumerate(self.backends):
            if be is backend:
                return i
        raise InvalidArgumentError(
            f"backend {backend.name!r} is not one of this scheduler's backends "
            f"{[b.name for b in self.backends]}"
        )

    def _split_graph(self, graph: Graph, cur_copy: int) -> SplitResult:
        if self._split is not None:
            self._split.restore()
            self._split = None
        self._allocated = None
        res = split_graph(graph, self._ctx, cur_copy)
        self._split = res
        if SCHED_DEBUG.get():
            print(self.describe(), file=sys.stderr)
        return res

    def _compute_splits(self) -> Status:
        res = self._split
        assert res is not None
        backends, events, cc = self.backends, self._events, res.cur_copy
        callback = self.eval_callback
        for split in res.splits:
            b = split.backend_id
            be = backends[b]
            ev = events[b][cc] if events else None
            for inp in split.inputs:
                cpy = res.copy_of(inp, b)
                if inp.flags is not _NO_FLAGS and inp.flags & _INPUT:
                    # the application may overwrite its input as soon as we return
                    _wait_slot(be, ev)
                    tensor_copy(inp, cpy)
                    continue
                # the split backend must be done with this copy slot before it is rewritten
                if ev is not None:
                    be.event_wait(ev)
                else:
                    be.synchronize()
                src_be = backends[res.ids[inp]]
                if not be.cpy_tensor_async(src_be, inp, cpy):
                    src_be.synchronize()
                    _wait_slot(be, ev)
                    tensor_copy(inp, cpy)
            assert split.graph is not None
            if callback is None:
                status = be.graph_compute_async(split.graph)
            else:
                status = _compute_observed(be, split.graph, callback)
            if status is not Status.SUCCESS:
                return status
            if split.inputs and ev is not None:
                be.event_record(ev)
        return Status.SUCCESS

    def describe(self) -> str:
        """The current assignment, as ``ggml_backend_sched_print_assignments`` prints it."""
        res = self._split
        if res is None:
            return "no graph has been split"
        names = [be.name for be in self.backends]
        lines: list[str] = []
        nodes = res.graph.nodes
        splits = res.splits
        k = 0

        def where(t: Tensor) -> str:
            b = res.ids.get(t)
            return names[b] if b is not None else "NULL"

        for i, node in enumerate(nodes):
            if k < len(splits) and i == splits[k].start:
                sp = splits[k]
                inputs = " ".join(f"[{t.name or t.op.value} ({_fmt(t.nbytes)})]" for t in sp.inputs)
                lines.append(
                    f"## SPLIT #{k}: {names[sp.backend_id]} # {len(sp.inputs)} inputs: {inputs}"
                )
                k += 1
            if node.op in VIEW_LIKE:
                continue
            srcs = " ".join(
                f"{s.name or s.op.value} ({_fmt(s.nbytes)}) [{where(s)}]" for s in node.src
            )
            lines.append(
                f"node #{i:3d} ({node.op.value:>10.10}): {node.name or '-':>20.20} "
                f"({_fmt(node.nbytes)}) [{where(node)}]: {srcs}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<Scheduler backends={[b.name for b in self.backends]} splits={self.n_splits} "
            f"copies={self.n_copies}>"
        )


def _new_event(backend: Backend) -> Event | None:
    try:
        return backend.device.event_new()
    except UnsupportedError:
        return None


def _wait_slot(backend: Backend, event: Event | None) -> None:
    """Block until ``backend`` no longer reads the copy slot ``event`` guards."""
    if event is not None:
        event.synchronize()
    else:
        backend.synchronize()


def _compute_observed(backend: Backend, graph: Graph, callback: EvalCallback) -> Status:
    """Compute in runs of unobserved nodes, showing each asked-for node to the callback."""
    nodes = graph.nodes
    n = len(nodes)
    j0 = 0
    while j0 < n:
        j1 = j0
        need = callback(nodes[j1], True)
        while not need and j1 < n - 1:
            j1 += 1
            need = callback(nodes[j1], True)
        run = graph.view(j0, j1 + 1)
        if need:
            run.keep(nodes[j1])  # the callback reads it
        status = backend.graph_compute_async(run)
        if status is not Status.SUCCESS:
            return status
        backend.synchronize()
        if need and not callback(nodes[j1], False):
            return Status.ABORTED
        j0 = j1 + 1
    return Status.SUCCESS


def _fmt(size: int) -> str:
    return f"{size // (1 << 20)}M" if size >= 1 << 20 else f"{size // 1024}K"

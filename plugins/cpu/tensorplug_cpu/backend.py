"""The CPU backend: graph plans that bind kernels to memory once, and ggml's extensions.

A :class:`CpuGraphPlan` holds one prepared step per node that does work (views and
reshapes need none). Computing the plan is a loop of calls. ``graph_compute`` keeps
the plans of the last :data:`PLAN_CACHE` graphs it saw and reuses one while the graph's
nodes, sources and their placement in buffers are the same objects at the same
offsets (a model runner alternates prompt and token graphs); anything else builds a
new plan. Plans bind op parameters when they are built: after changing a
node's ``op_params`` in place, call ``graph_plan_update`` (or compute a new graph).

Extensions (``get_proc`` names, as in ggml): ``set_n_threads``,
``set_abort_callback`` and ``get_features``, also under their ``ggml_backend_`` names,
and ``set_batch_invariant`` and ``keep_plans`` (tensorplug's own).

Arithmetic order: by default a backend sums as ggml's CPU code does, llama.cpp's bits
to the last one, and like ggml's some of those orders depend on how many rows a step
multiplies (a prompt's rows and a generated token's differ). An application that
batches independent requests into one step (the LLM server's engine) asks for
``set_batch_invariant(True)``: every row is then summed as if it were alone, so a
request's numbers never depend on the others beside it (``settings.GGML_PRODUCT_ORDER``
overrides both ways).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug import collector
from tensorplug.backend import Backend, GraphPlan, Status
from tensorplug.errors import (
    BufferFreedError,
    ComputeAbortedError,
    InvalidArgumentError,
    TensorplugError,
    TypeMismatchError,
    UnsupportedError,
)
from tensorplug.opcodes import VIEW_OPS
from tensorplug.tensor import placement_epoch

from .kernels import BuildContext, Step, build_step, supports
from .kernels.jit_steps import settle
from .kernels.matmul import build_sibling_products
from .kernels.numpy_kernels import NUMPY_KERNELS
from .kernels.program import Program, programs, rows_regions
from .kernels.siblings import sibling_groups
from .repack_buffer import RepackBuffer
from .settings import GGML_PRODUCT_ORDER
from .thread_control import ThreadControl

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer
    from tensorplug.device import Device
    from tensorplug.graph import Graph
    from tensorplug.tensor import Tensor

    from .kernels.provider import CompiledKernels, Kernels

__all__ = ["BACKEND_CALLS", "CpuBackend", "CpuGraphPlan", "AbortCallback"]

#: Called between nodes; a true result cancels the computation.
AbortCallback = Callable[[], bool]
#: Plans ``graph_compute`` keeps, most recent first: building one costs about as much as
#: computing a small language model's generation step, and without a cache it would be
#: paid again at every prompt/token switch. A server cycles through more: its decode
#: steps (one size per number of running requests), its padded prompt-step sizes, each at
#: a few context lengths (the LLM server runs 26 graphs for 4 slots after its warm-up, 34
#: for 8). A plan holds views and its nodes' scratch, and only graphs that were computed
#: have one.
PLAN_CACHE = 40


class GraphKey:
    """:func:`graph_key`'s items with their hash computed once. A key is ~1,000 items
    for a small language model's step, and an ``OrderedDict`` hashes its keys again to
    iterate (its last value is the last plan run, asked at every compute): with a plain
    tuple that rehashing is a visible share of a generation step."""

    __slots__ = ("_hash", "items")

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items = items
        self._hash = hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, GraphKey) and self._hash == other._hash
                and self.items == other.items)  # fmt: skip


def graph_key(nodes: Sequence[Tensor]) -> GraphKey:
    """What a plan depends on: every node and source, and where each one lives.

    Tensors are held (not their ids), so none can be collected and its id reused while
    a cached plan refers to it; comparing is by identity, element by element.
    """
    key: list[Any] = []
    add = key.append
    for n in nodes:
        add(n)
        add(n.buffer)
        add(n.offset)
        for s in n.src:
            add(s.buffer)
            add(s.offset)
    return GraphKey(tuple(key))


class CpuGraphPlan(GraphPlan):
    """A graph with each node's kernel bound to numpy views of its operands."""

    def __init__(self, backend: CpuBackend, graph: Graph, key: GraphKey | None = None) -> None:
        super().__init__(backend, graph)
        self.steps: list[Step] = []
        #: what a compute calls without an abort callback: the steps, with each run of job
        #: steps as one :class:`~.kernels.program.Program`, and the index of its first step
        self.runs: list[tuple[Step, int]] = []
        #: whether the runs are all programs: compiled code, which leaves numpy's error
        #: state alone (a program that falls back to its steps sets it itself)
        self.compiled = False
        self.nodes: list[Tensor] = []
        self.buffers: tuple[Buffer, ...] = ()
        self.key = GraphKey(())
        # the graph's node list and the placement epoch when the key last matched:
        # while both are unchanged, the key cannot have changed either
        self.node_list: list[Tensor] = []
        self.epoch = -1
        self.freed = False
        #: whether a step calls numpy's BLAS (:attr:`BuildContext.uses_blas`)
        self.uses_blas = False
        #: the kernel calls its steps make only as they run (``CompiledKernels.expect``): what
        #: ``graph_prepare`` makes ready, where the first compute would load them
        self.first_calls: list[Any] = []
        self.bind(graph, backend.kernels, backend.ggml_order, key)

    def bind(
        self, graph: Graph, kernels: Kernels, ggml_order: bool, key: GraphKey | None = None
    ) -> None:
        """(Re)build every step for ``graph`` with the provider ``kernels``; views and
        scratch are made here, once. ``ggml_order``: the backend's arithmetic order
        (:attr:`CpuBackend.ggml_order`); ``key``: ``graph_key(graph.nodes)`` when the
        caller has it (it walks every node: once is enough)."""
        ctx = BuildContext(kernels, ggml_order)
        jit = kernels.compiled  # the paths only compiled kernels have: siblings, programs
        if jit is not None:
            jit.take_expected()  # what a binding that raised noted: not this plan's
        steps: list[Step] = []
        nodes: list[Tensor] = []
        buffers: dict[int, Buffer] = {}
        groups = {} if jit is None else sibling_groups(graph.nodes, jit.max_siblings)
        # products computed with an earlier one of their group → what is left at their place
        joined: dict[int, Step | None] = {}
        for i, node in enumerate(graph.nodes):
            for t in (node, *node.src):
                buf = t.require_allocated()
                if not buf.is_host and not isinstance(buf, RepackBuffer):
                    raise UnsupportedError(
                        f"CPU cannot compute {node.describe()}: {t.describe()} lives in "
                        f"buffer {buf.name!r}, which is not host memory; copy it to a CPU "
                        "buffer first (the scheduler does this for you)"
                    )
                buffers[id(buf)] = buf
            if node.op not in VIEW_OPS:
                _check_writable(node)
            if not supports(node):
                types = ", ".join(f"{s.type.name}{list(s.shape)}" for s in node.src)
                raise UnsupportedError(
                    f"CPU has no kernel for {node.op.value} {node.describe()} with sources "
                    f"({types}); check backend.supports_op(node) before computing"
                )
            if node.nelements == 0:
                continue
            step: Step | None = None
            if i in joined:
                step = joined[i]
            elif jit is not None and i in groups:
                indices, staged = zip(*groups[i], strict=True)
                built = build_sibling_products([graph.nodes[j] for j in indices], staged,
                                               ctx, jit)  # fmt: skip
                if built is not None:
                    step, places = built
                    joined.update(zip(indices[1:], places[1:], strict=True))
            if step is None and i not in joined:
                step = build_step(node, ctx)
            if step is not None:
                steps.append(step)
                nodes.append(node)
        if jit is not None:  # a prompt's row steps shared out over threads
            steps = rows_regions(steps, jit)
        # runs of job steps as one compiled call each (where the runner and jobs are ready)
        self.runs = [(s, k) for k, s in enumerate(steps)] if jit is None else programs(steps, jit)
        self.compiled = all(isinstance(s, Program) for s, _ in self.runs)
        if jit is not None:  # what numba lacks of the last steps' kernels, meanwhile
            jit.compile_ahead()
            self.first_calls = jit.take_expected()
        self.graph = graph
        self.steps, self.nodes = steps, nodes
        self.uses_blas = ctx.uses_blas
        self.buffers = tuple(buffers.values())
        self.key = graph_key(graph.nodes) if key is None else key
        self.node_list, self.epoch = list(graph.nodes), placement_epoch()
        self.freed = False

    def free(self) -> None:
        self.steps, self.nodes, self.buffers, self.node_list = [], [], (), []
        self.runs, self.first_calls = [], []
        self.freed = True


def _check_writable(node: Tensor) -> None:
    """Refuse a node whose memory is read-only (``from_dlpack`` of a read-only array as a
    set_rows or cpy destination) here, by name: a kernel would fail on it with numba's
    TypingError about ``setitem`` or numpy's "assignment destination is read-only"."""
    buf = node.require_allocated()
    if buf.is_host and not buf.host_array().flags.writeable:
        base = node.base
        raise UnsupportedError(
            f"CPU cannot compute {node.describe()}: it writes into "
            f"{'its own memory' if base is node else base.describe()}, which is read-only "
            f"(buffer {buf.name!r}); make that memory writable (from_dlpack of a writable "
            "array: np.array(x) copies one) or compute into a tensor of your own"
        )


class CpuBackend(Backend):
    """A CPU stream: synchronous, computes graphs with the kernels of the provider it is
    given (``kernels``, :mod:`.kernels.provider`: numba's where the device has them,
    numpy's otherwise)."""

    def __init__(
        self, device: Device, *, kernels: Kernels = NUMPY_KERNELS, n_threads: int | None = None
    ) -> None:
        super().__init__(device)
        self.kernels = kernels
        #: the provider's compiled kernels (None: numpy's paths alone)
        self.jit: CompiledKernels | None = kernels.compiled
        self.n_threads: int | None = None
        self.abort_callback: AbortCallback | None = None
        self.batch_invariant = False  # as an application asked (set_batch_invariant)
        #: how many plans ``graph_compute`` keeps (:data:`PLAN_CACHE`, or what
        #: :meth:`keep_plans` asked)
        self.plan_cache = PLAN_CACHE
        # graph_compute's plans by graph_key, the one it ran last at the end
        self._plans: OrderedDict[GraphKey, CpuGraphPlan] = OrderedDict()
        self._last: CpuGraphPlan | None = None  # that plan, while it is not freed
        if n_threads is not None:
            self.set_n_threads(n_threads)

    # -- extensions -----------------------------------------------------------------------

    def set_n_threads(self, n_threads: int) -> None:
        """Threads for the JIT kernels and the worker pool while this backend computes
        (BLAS itself runs on one thread then: the pool splits its products)."""
        if not isinstance(n_threads, int) or isinstance(n_threads, bool) or n_threads < 1:
            raise InvalidArgumentError(
                f"set_n_threads: n_threads must be an int >= 1, got {n_threads!r}"
            )
        self.n_threads = n_threads
        ThreadControl.apply(n_threads, self.jit)

    def set_abort_callback(self, callback: AbortCallback | None) -> None:
        """Call ``callback()`` before each node; a true result aborts the compute."""
        if callback is not None and not callable(callback):
            raise TypeMismatchError(
                f"set_abort_callback: expected a callable or None, got {callback!r}"
            )
        self.abort_callback = callback

    def keep_plans(self, n: int) -> None:
        """Keep the plans of at least ``n`` graphs (:data:`PLAN_CACHE` at the least): an
        application that cycles through more step shapes than that (a server's many
        slots) would otherwise bind a plan again at each shape it comes back to."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidArgumentError(f"keep_plans: n must be an int >= 1, got {n!r}")
        self.plan_cache = max(PLAN_CACHE, n)

    def set_batch_invariant(self, invariant: bool) -> None:
        """Whether a row's bits may depend on the rows computed beside it: False (the
        default) sums as ggml does, llama.cpp's bits; True sums every row as if it were
        alone (see the module docstring). The plans built in the other order are freed."""
        if not isinstance(invariant, bool):
            raise TypeMismatchError(
                f"set_batch_invariant: expected True or False, got {invariant!r}"
            )
        if invariant != self.batch_invariant:
            self.batch_invariant = invariant
            for plan in self._plans.values():
                plan.free()
            self._plans.clear()
            self._last = None

    @property
    def ggml_order(self) -> bool:
        """Whether plans built now sum in ggml's orders: the backend's choice
        (:meth:`set_batch_invariant`) unless ``TENSORPLUG_CPU_GGML_PRODUCT_ORDER`` is set."""
        forced = GGML_PRODUCT_ORDER.get()
        return not self.batch_invariant if forced is None else forced

    # -- graphs ----------------------------------------------------------------------------

    def _graph_plan_create(self, graph: Graph) -> CpuGraphPlan:
        return CpuGraphPlan(self, graph)

    def _graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        self._own(plan).bind(graph, self.kernels, self.ggml_order)

    def _graph_plan_compute(self, plan: GraphPlan) -> Status:
        return self._run(self._own(plan))

    def _graph_plan_free(self, plan: GraphPlan) -> None:
        own = self._own(plan)
        if self._plans.get(own.key) is own:
            del self._plans[own.key]
        own.free()

    @property
    def _cached(self) -> CpuGraphPlan | None:
        """The plan ``graph_compute`` ran or ``graph_prepare`` bound last (None before
        the first, or after free). Kept as ``_last`` too: the ``OrderedDict``'s last
        value, asked at every compute, walks the dict's links, which a model's step has
        pushed out of the CPU's caches, where an attribute is one lookup. Every plan leaves
        ``_plans`` freed, so ``_last`` is the last value while it is not."""
        last = self._last
        if last is not None and not last.freed:
            return last
        self._last = last = next(reversed(self._plans.values()), None)
        return last

    def _graph_compute(self, graph: Graph) -> Status:
        return self._run(self._plan_for(graph))

    def _graph_prepare(self, graph: Graph) -> None:
        plan = self._plan_for(graph)  # bound and kept, as its first compute would bind it
        if self.jit is not None and plan.first_calls:  # and what its steps call as they run
            self.jit.load_expected(plan.first_calls)
            plan.first_calls = []
            self.jit.settle()
        if self.jit is not None:  # their calls go straight to the code: a first compute
            for step in plan.steps:  # as fast as the next
                settle(step, self.jit.called)

    def _plan_for(self, graph: Graph) -> CpuGraphPlan:
        """The kept plan of ``graph``'s shape, bound now if none is kept."""
        plan = self._cached
        epoch = placement_epoch()
        if plan is not None and plan.epoch == epoch and plan.node_list == graph.nodes:
            return plan  # nothing was placed or rewired since it last matched
        key = graph_key(graph.nodes)
        if plan is None or plan.key != key:  # the cached hashes, then element by element
            self._drop_stale_plans()
            plan = self._plans.get(key)
            if plan is None:
                with collector.paused():  # its steps' views and kernels stay with it
                    plan = CpuGraphPlan(self, graph, key)  # kept only once built
                self._plans[key] = plan
                if len(self._plans) > self.plan_cache:
                    self._plans.popitem(last=False)[1].free()
            else:
                self._plans.move_to_end(key)
        plan.node_list, plan.epoch = list(graph.nodes), epoch
        self._last = plan
        return plan

    def _drop_stale_plans(self) -> None:
        """Forget kept plans that read a freed buffer: they can never run again, and
        their views would keep the freed memory alive."""
        for key, plan in list(self._plans.items()):
            if any(buf.is_freed for buf in plan.buffers):
                del self._plans[key]
                plan.free()

    def free(self) -> None:
        """Forget the kept plans (and with them their views of buffers and scratch)."""
        for plan in self._plans.values():
            plan.free()
        self._plans.clear()
        self._last = None

    def _own(self, plan: GraphPlan) -> CpuGraphPlan:
        if not isinstance(plan, CpuGraphPlan) or plan.backend is not self:
            raise TypeMismatchError(
                f"{plan!r} was not created by this CPU backend; use "
                "backend.graph_plan_create(graph) on the backend that computes it"
            )
        return plan

    def _run(self, plan: CpuGraphPlan) -> Status:
        if plan.freed:
            raise UnsupportedError("this graph plan was freed; create a new one")
        for buf in plan.buffers:
            if buf.is_freed:
                raise BufferFreedError(
                    f"buffer {buf.name!r} used by the graph was freed; re-allocate the "
                    "graph's tensors and create a new plan"
                )
        ThreadControl.apply(self.n_threads, self.jit)
        abort, steps, runs = self.abort_callback, plan.steps, plan.runs
        i = 0
        # ggml's kernels produce inf/NaN silently; numpy's warnings would only be noise
        # (setting numpy's error state and back is a visible share of a generated token,
        # whose graph is one program: its compiled code needs none).
        # BLAS on one thread where a step calls it: the worker pool splits products instead.
        quiet = plan.compiled and abort is None
        errors = nullcontext() if quiet else np.errstate(all="ignore")
        blas = ThreadControl.blas_single() if plan.uses_blas else nullcontext()
        with errors, blas:
            try:
                if abort is None:
                    for step, i in runs:  # noqa: B007  (i is read on error)
                        step()
                else:
                    for i, step in enumerate(steps):
                        if abort():
                            raise self._aborted(plan, i)
                        step()
            except Exception as e:
                # our own errors already name the node; add it to anything else (3.11+)
                if not isinstance(e, TensorplugError) and hasattr(e, "add_note"):
                    e.add_note(f"while the CPU computed node {i} {plan.nodes[i].describe()}")
                raise
            finally:
                if self.jit is not None:
                    self.jit.settle()
        return Status.SUCCESS

    @staticmethod
    def _aborted(plan: CpuGraphPlan, i: int) -> ComputeAbortedError:
        node = plan.nodes[i]
        return ComputeAbortedError(
            f"CPU graph compute aborted by the abort callback before node {i} of "
            f"{len(plan.nodes)} ({node.op.value} {node.describe()}); the nodes before it "
            "were computed and every buffer is intact, so the graph can be computed again"
        )


# -- get_proc functions -----------------------------------------------------------------------


def _backend(backend: Any, what: str) -> CpuBackend:
    if not isinstance(backend, CpuBackend):
        raise TypeMismatchError(f"{what}: expected a CPU backend, got {type(backend).__name__}")
    return backend


def set_n_threads(backend: Backend, n_threads: int) -> None:
    """``ggml_backend_set_n_threads``: BLAS/JIT threads used by ``backend``."""
    _backend(backend, "set_n_threads").set_n_threads(n_threads)


def set_abort_callback(backend: Backend, callback: AbortCallback | None) -> None:
    """``ggml_backend_set_abort_callback``: checked between nodes; True aborts."""
    _backend(backend, "set_abort_callback").set_abort_callback(callback)


def set_batch_invariant(backend: Backend, invariant: bool) -> None:
    """tensorplug's own: a row's bits never depend on the rows beside it (True), or
    ggml's orders, llama.cpp's bits (False, the default)."""
    _backend(backend, "set_batch_invariant").set_batch_invariant(invariant)


def keep_plans(backend: Backend, n: int) -> None:
    """tensorplug's own: keep the plans of at least ``n`` graphs."""
    _backend(backend, "keep_plans").keep_plans(n)


#: the backend's calls by name (``get_proc_address``), ggml's names beside its own
BACKEND_CALLS: dict[str, Callable[..., Any]] = {}
for _fn in (set_n_threads, set_abort_callback):
    BACKEND_CALLS[_fn.__name__] = _fn
    BACKEND_CALLS["ggml_backend_" + _fn.__name__] = _fn
BACKEND_CALLS.update(set_batch_invariant=set_batch_invariant, keep_plans=keep_plans)  # not ggml's

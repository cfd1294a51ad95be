"""Plans captured once and replayed: CUDA graphs, and what WebGPU's command buffers will be.

A :class:`CapturedPlan` is the base's graph plan (every node encoded, every launch bound
once) with a lifecycle on top. Its first compute issues the launches one by one (a
warm-up, as ggml's: kernels load, and a plan computed once gains nothing from capture).
The next one *captures* them into a handle the API replays (a CUDA graph from a stream
capture; a recorded command buffer), and every compute after that *replays* the handle:
the Python and driver cost of hundreds of launches becomes one call, which is what
decode steps, the same small graph every token, need. A runtime fills in three hooks on
the plan — ``_capture() -> handle`` (record ``self.steps``), ``_replay(handle)`` and
``_release(handle)`` — and one on its backend, ``capture_refused()`` (why it never
captures: a setting, a GPU too old; "" when it may).

Capture needs stable addresses and values that come from memory, not from arguments: a
plan refers to the tensors' memory as it was when it was bound (re-allocating means
``graph_plan_update``, which rebinds and releases the captured handle), and positions or
cache rows are read from tensors by the kernels. A plan is launched eagerly, never
captured, when its backend refuses capture, when it holds nodes the runtime computes
itself (a library call such as cuBLAS is not a launch that a capture records), when it
launches nothing, and, with the reason logged under the runtime's logger, when a capture
fails: the work is then launched eagerly at once, so a compute never fails because of
capture.

:class:`ReplayingBackend` gives ``graph_compute`` the same plans without a caller making
one. The scheduler and the model runner call ``graph_compute`` with every step's graph
(often the very same object, sometimes rebuilt with the same shapes); ggml-cuda compares
each node with the graph it captured last (``is_cuda_graph_update_required``). Here a
graph's :func:`signature` keys a small cache of plans (:class:`GraphCache`), so a graph
seen again is the plan computed again — launched eagerly the first time, captured the
second, replayed from then on.

The signature holds, per node in order, everything a bound launch is made from (see
``tensorplug_kernels.encode`` and ``GPUBackend.bind``): the op and its parameters, and
for the node and each source the type, shape, strides, buffer and byte offset. Values
the kernels read from memory (token ids, positions, masks, cache rows) are not in it: a
replay reads them anew, which is what lets one captured plan serve every step.

Memory safety. A cached plan holds its buffers (``plan.buffers``) and its launches hold
the allocations, so nothing a cached plan refers to is given back while it is cached,
and no other buffer can appear at its addresses: an equal signature always means the
same memory. Freeing one of those buffers drops every cached plan that refers to it at
once (:meth:`GraphCache.forget`, through the base's ``forget``), so freed device memory
is really free again. The backend's scratch buffer may grow for later work; a plan keeps
the one it was bound to. At most :data:`CACHE_SIZE` plans are kept, least recently used
dropped first: enough for a decode graph, a few prompt shapes and the splits a scheduler
hands one backend. Graphs with nodes the runtime computes itself are launched node by
node and not cached, and a failed capture turns the cache off for the backend (as ggml
disables CUDA graphs after a failed capture).
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tensorplug.tensor import Tensor

from .backend import GPUBackend, GPUGraphPlan
from .errors import KernelLaunchError

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer
    from tensorplug.graph import Graph

    from .device import GPUDevice

__all__ = ["CACHE_SIZE", "CapturedPlan", "GraphCache", "ReplayingBackend", "signature"]

#: Plans ``graph_compute`` keeps per backend.
CACHE_SIZE = 8

#: Op parameter dicts kept frozen per backend before the memo starts afresh. A dict is
#: kept by identity (op parameters cannot change) together with its frozen form, so
#: that its identity cannot be reused by another dict while it is there.
_PARAMS_MEMO = 4096

#: How a failed capture's reason starts (``CapturedPlan.capture_failed``).
_FAILED = "capture failed"

Signature = list[Hashable]


def _frozen(value: Any) -> Hashable:
    """An op parameter as a hashable value that is equal only for equal launches
    (floats by their bits: 0.0 and -0.0 differ in what a kernel computes)."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, Hashable):
        return value
    return repr(value)


def signature(graph: Graph, memo: dict[int, tuple[Any, Hashable]] | None = None) -> Signature:
    """What decides ``graph``'s bound launches, flat: equal signatures, equal launches.

    Per node: op, parameters, and the type, shape, strides, buffer and byte offset of
    the node and of each source (buffers by identity: a cached plan holds the buffers
    it was bound to, so their identities are not reused meanwhile, and a buffer's
    memory never moves while it lives). Built as one flat list, compared with ``==``
    (no hashing): this runs at every compute, and per node it costs about as much as
    one dictionary lookup more than nothing, far less than binding the node again.
    ``memo`` keeps frozen op parameters between calls (op parameters cannot change).
    """
    memo = {} if memo is None else memo
    if len(memo) > _PARAMS_MEMO:
        memo.clear()
    out: Signature = []
    extend = out.extend
    for node in graph.nodes:
        p = node.op_params
        frozen = memo.get(id(p))
        if frozen is None:
            frozen = memo[id(p)] = (p, tuple((k, _frozen(v)) for k, v in p.items()))
        src = node.src
        extend((
            node.op, frozen[1], node.type, node.shape, node.strides, id(node.buffer),
            node.offset, len(src),
        ))  # fmt: skip
        for t in src:
            extend((t.type, t.shape, t.strides, id(t.buffer), t.offset))
    return out


class CapturedPlan(GPUGraphPlan):
    """A graph bound for repeated computes on one backend, captured once warm.

    ``captured`` is the runtime's handle once captured (None before, and after a rebind);
    ``not_captured`` says why the plan is launched eagerly ("" while it may be
    captured); ``replays`` counts computes that were one replay. ``label`` names what
    the plan serves in the log line of a failed capture: a user's graph plan, or
    ``graph_compute``'s own cache of plans.
    """

    backend: ReplayingBackend
    #: what a capture makes, in messages ("launched without a CUDA graph")
    captured_as: ClassVar[str] = "a captured plan"
    #: what a refused capture raises, beyond the driver's errors
    capture_errors: ClassVar[tuple[type[BaseException], ...]] = (KernelLaunchError,)
    #: computes launched eagerly before the plan is captured
    warm_up: ClassVar[int] = 1

    def __init__(self, backend: ReplayingBackend, graph: Graph, label: str = "graph plan") -> None:
        self.label = label
        self.replays = 0
        self.captured: Any = None
        super().__init__(backend, graph)

    # -- hooks ---------------------------------------------------------------------------

    @abstractmethod
    def _capture(self) -> Any:
        """Record ``self.steps`` into a handle ``_replay`` issues; raise (a driver error,
        or one of ``capture_errors``) when the API refuses, leaving nothing half-recorded."""

    @abstractmethod
    def _replay(self, handle: Any) -> None:
        """Queue the captured work again on the backend's queue."""

    def _release(self, handle: Any) -> None:
        """Give the handle's resources back (default: nothing; it goes with its reference)."""

    # -- written once ----------------------------------------------------------------------

    def bind(self, graph: Graph) -> None:
        self._drop()  # what was captured refers to the memory as it was
        super().bind(graph)
        self.computes = 0
        self.not_captured = self._capture_refused()

    def _capture_refused(self) -> str:
        if why := self.backend.capture_refused():
            return why
        claimed = next((s for s in self.steps if isinstance(s, Tensor)), None)
        if claimed is not None:
            library = self.backend.library_for(claimed)
            who = library.library if library is not None else "the runtime"
            return f"the plan has nodes {who} computes, which are not captured"
        if not self.steps:
            return "the plan launches nothing"  # only views: nothing worth capturing
        return ""

    @property
    def capture_failed(self) -> bool:
        """A capture was tried and failed (the plan launches eagerly from then on)."""
        return self.not_captured.startswith(_FAILED)

    def _compute(self) -> None:
        backend = self.backend
        if self.captured is None and not self.not_captured and self.computes >= self.warm_up:
            try:
                self.captured = self._capture()
            except (*self.capture_errors, *backend.device.driver_errors) as e:
                self.not_captured = f"{_FAILED} ({type(e).__name__}: {e})"
                logging.getLogger(type(self).__module__).info(
                    "%s: %s launched without %s: %s",
                    backend.name, self.label, self.captured_as, self.not_captured,
                )  # fmt: skip
        if self.captured is not None:
            with backend.device.driver(f"replaying {self.captured_as}"):
                self._replay(self.captured)
            self.replays += 1
        else:
            backend.run(self.steps)
        self.computes += 1

    def release(self) -> None:
        super().release()
        self._drop()

    def _drop(self) -> None:
        if self.captured is not None:
            handle, self.captured = self.captured, None
            self._release(handle)


class GraphCache:
    """One backend's plans for the graphs ``graph_compute`` has seen, by signature.

    Counters for tests and benchmarks: ``bound`` (graphs bound into a new cached plan),
    ``captures`` (plans captured), ``replays`` (computes that were one replay). ``off``
    says why graphs are no longer captured on this backend after a failed capture (""
    while they may be).
    """

    def __init__(self, backend: ReplayingBackend) -> None:
        self.backend = backend
        self.entries: list[tuple[Signature, CapturedPlan]] = []  # most recently used last
        self.off = ""
        self.bound = self.captures = self.replays = 0
        self._params: dict[int, tuple[Any, Hashable]] = {}

    @property
    def plans(self) -> list[CapturedPlan]:
        return [plan for _, plan in self.entries]

    def _lookup(self, key: Signature) -> CapturedPlan | None:
        entries = self.entries
        for i in range(len(entries) - 1, -1, -1):
            sig, plan = entries[i]
            if len(sig) == len(key) and sig == key:
                entries.append(entries.pop(i))
                return plan
        return None

    def compute(self, graph: Graph) -> bool:
        """Queue ``graph``'s work through a cached plan; False when it must be launched
        node by node instead (nothing has been queued then)."""
        backend = self.backend
        if self.off or backend.capture_refused():  # read each time: settings may change
            return False
        key = signature(graph, self._params)
        plan = self._lookup(key)
        if plan is None:
            if any(backend.claims(n) for n in graph.nodes):
                return False  # never captured; its claimed steps would name this graph's nodes
            plan = backend.plan_class(backend, graph, label="graph_compute")
            self.bound += 1
            self.entries.append((key, plan))
            del self.entries[:-CACHE_SIZE]
        had_capture, replays = plan.captured is not None, plan.replays
        plan.compute()
        self.captures += int(not had_capture and plan.captured is not None)
        self.replays += plan.replays - replays
        if plan.capture_failed:
            self.off = plan.not_captured  # logged once, by the plan
            self.clear()
        return True

    def forget(self, buffer: Buffer) -> None:
        """Drop the plans that refer to ``buffer`` (it is being freed)."""
        dropped = [p for _, p in self.entries if any(b is buffer for b in p.buffers)]
        self.entries = [e for e in self.entries if e[1] not in dropped]
        for plan in dropped:
            plan.release()

    def clear(self) -> None:
        for plan in self.plans:
            plan.release()
        self.entries = []
        self._params.clear()


class ReplayingBackend(GPUBackend):
    """A backend whose graph plans are :class:`CapturedPlan`\\ s and whose
    ``graph_compute`` replays the graphs it has seen before (``graphs``)."""

    plan_class: ClassVar[type[CapturedPlan]]

    def __init__(self, device: GPUDevice) -> None:
        self.graphs = GraphCache(self)  # graph_compute's plans, by graph signature
        super().__init__(device)

    def capture_refused(self) -> str:
        """Why this backend never captures, "" when it may (read at every compute: it
        may depend on a setting a user changes between computes)."""
        return ""

    def compute_graph(self, graph: Graph) -> None:
        if not self.graphs.compute(graph):  # a graph seen before: replayed
            super().compute_graph(graph)

    def forget(self, buffer: Buffer) -> None:
        super().forget(buffer)
        self.graphs.forget(buffer)

    def _free(self) -> None:
        self.graphs.clear()
        super()._free()

"""``graph_compute``'s graphs replayed as CUDA graphs, recognised by a signature.

The scheduler and the model runner do not make graph plans: every decode step they
call ``graph_compute`` with the step's graph (often the very same object, sometimes
rebuilt with the same shapes). ggml-cuda meets this in ``ggml_backend_cuda_graph_compute``
by comparing each node with the last graph it captured (``is_cuda_graph_update_required``)
and replaying the captured CUDA graph while nothing that decides the launches changed.
Here the same idea reuses :class:`~.plan.CUDAGraphPlan`: a graph's *signature* keys a
small cache of plans, so a graph seen again is the plan computed again — launched
eagerly the first time (the warm-up), captured the second, replayed with one
``Graph.launch`` from then on.

The signature holds, per node in order, everything a bound launch is made from (see
``tensorplug_kernels.encode`` and ``GPUBackend.bind``): the op and its parameters, and
for the node and each source the type, shape, strides, buffer and byte offset. Values
the kernels read from memory (token ids, positions, masks, cache rows) are not in it:
a replay reads them anew, which is what lets one captured graph serve every step.

Memory safety. A cached plan holds its buffers (``plan.buffers``) and its launches hold
the allocations' pointers, so nothing a cached plan refers to is returned to CUDA
while it is cached, and no other buffer can appear at its addresses: an equal
signature always means the same memory. Freeing one of those buffers drops every
cached plan that refers to it at once (:meth:`GraphCache.forget`, called from the
buffer's ``free``), so freed device memory is really free again, as before this cache
existed. The backend's scratch buffer may grow for later work; a plan keeps the one it
was bound to (sized once for the whole plan, as every plan does). At most
:data:`CACHE_SIZE` plans are kept, least recently used dropped first: enough for a
decode graph, a few prompt shapes and the splits a scheduler hands one backend.

Refusals are the plans': graphs with cuBLAS nodes (cupy cannot capture cuBLAS) are
launched node by node and not cached, ``TENSORPLUG_CUDA_GRAPHS=0`` and GPUs older than
Volta launch every graph eagerly, and a failed capture is logged once and turns the
cache off for the backend (as ggml disables CUDA graphs after a failed capture); the
compute that failed to capture is launched eagerly at once, so it never fails.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.graph import Graph

from .plan import CUDAGraphPlan, graphs_refused

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .backend import CUDABackend

__all__ = ["CACHE_SIZE", "GraphCache", "signature"]

#: Plans ``graph_compute`` keeps per backend.
CACHE_SIZE = 8

#: Op parameter dicts kept frozen per backend before the memo starts afresh. A dict is
#: kept by identity (op parameters cannot change) together with its frozen form, so
#: that its identity cannot be reused by another dict while it is there.
_PARAMS_MEMO = 4096

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


class GraphCache:
    """One backend's plans for the graphs ``graph_compute`` has seen, by signature.

    Counters for tests and benchmarks: ``bound`` (graphs bound into a new cached
    plan), ``captures`` (CUDA graphs captured), ``replays`` (computes that were one
    ``Graph.launch``). ``off`` says why graphs are no longer captured on this backend
    after a failed capture ("" while they may be).
    """

    def __init__(self, backend: CUDABackend) -> None:
        self.backend = backend
        self.entries: list[tuple[Signature, CUDAGraphPlan]] = []  # most recently used last
        self.off = ""
        self.bound = self.captures = self.replays = 0
        self._params: dict[int, tuple[Any, Hashable]] = {}

    @property
    def plans(self) -> list[CUDAGraphPlan]:
        return [plan for _, plan in self.entries]

    def _lookup(self, key: Signature) -> CUDAGraphPlan | None:
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
        if self.off or graphs_refused(backend):
            return False
        key = signature(graph, self._params)
        plan = self._lookup(key)
        if plan is None:
            if any(backend.matmul.takes(n) for n in graph.nodes):
                return False  # never captured; its cuBLAS steps would name this graph's nodes
            plan = CUDAGraphPlan(backend, graph, label="graph_compute")
            self.bound += 1
            self.entries.append((key, plan))
            del self.entries[:-CACHE_SIZE]
        had_graph, replays = plan.cuda_graph is not None, plan.replays
        plan.compute()
        self.captures += int(not had_graph and plan.cuda_graph is not None)
        self.replays += plan.replays - replays
        if plan.capture_failed:
            self.off = plan.not_captured  # logged once, by the plan
            self.clear()
        return True

    def forget(self, buffer: Buffer) -> None:
        """Drop the plans that refer to ``buffer`` (it is being freed)."""
        self.entries = [e for e in self.entries if all(b is not buffer for b in e[1].buffers)]

    def clear(self) -> None:
        self.entries = []
        self._params.clear()

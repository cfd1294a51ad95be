"""Copy an allocated graph, data included, onto another backend (``ggml_backend_graph_copy``).

The copy has the same nodes in the same order, with the same types, layouts, ops,
parameters, names and flags; every tensor that owns memory gets a place in one new
buffer of the backend's buffer type (several when that type has a ``max_size``) and
its current bytes, and views point into their copied base. Computing the copy on the
other backend and comparing node by node is how
:func:`tensorplug.testing.compare_graph_backend` checks a backend against another.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .alloc import alloc_tensors
from .errors import NotAllocatedError
from .graph import Graph
from .tensor import Tensor
from .transfer import tensor_copy

if TYPE_CHECKING:
    from types import TracebackType

    from .backend import Backend
    from .buffer import Buffer

__all__ = ["GraphCopy", "clone_graph", "graph_copy"]


class GraphCopy:
    """The copied graph, the buffer holding it, and a map from original to copy."""

    def __init__(self, graph: Graph, buffer: Buffer | None, copies: dict[int, Tensor]) -> None:
        self.graph = graph
        self.buffer = buffer
        self._copies = copies

    def __getitem__(self, original: Tensor) -> Tensor:
        """The copy of ``original`` (any tensor of the source graph)."""
        try:
            return self._copies[id(original)]
        except KeyError:
            raise KeyError(f"{original.describe()} is not part of the copied graph") from None

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.graph.nodes)

    def free(self) -> None:
        """Release the copy's buffer (``ggml_backend_graph_copy_free``)."""
        if self.buffer is not None:
            self.buffer.free()

    def __enter__(self) -> GraphCopy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.free()


def clone_graph(graph: Graph) -> tuple[Graph, dict[int, Tensor]]:
    """A structural copy of ``graph`` with fresh, unallocated tensors.

    Types, layouts, ops, parameters, names, flags and view relations are kept, memory
    is not. Returns the new graph and a map from ``id(original)`` to its copy; sources
    outside the graph (as in a :meth:`Graph.view`) are copied too.
    """
    clone, copies, _ = _clone(graph)
    return clone, copies


def _clone(graph: Graph) -> tuple[Graph, dict[int, Tensor], list[tuple[Tensor, Tensor]]]:
    copies: dict[int, Tensor] = {}
    order: list[tuple[Tensor, Tensor]] = []  # (original, copy), sources before users

    def dup(t: Tensor) -> Tensor:
        # iterative: sources first, without Python recursion on deep graphs
        stack = [t]
        while stack:
            cur = stack[-1]
            if id(cur) in copies:
                stack.pop()
                continue
            deps = [s for s in (*cur.src, cur.view_src) if s is not None and id(s) not in copies]
            if deps:
                stack.extend(deps)
                continue
            stack.pop()
            new = Tensor(
                cur.type, cur.shape, strides=cur.strides, op=cur.op,
                op_params=dict(cur.op_params), src=[copies[id(s)] for s in cur.src],
                name=cur.name,
                view_src=copies[id(cur.view_src)] if cur.view_src is not None else None,
                view_offs=cur.view_offs,
            )  # fmt: skip
            new.flags = cur.flags
            copies[id(cur)] = new
            order.append((cur, new))
        return copies[id(t)]

    leafs = [dup(t) for t in graph.leafs]
    nodes = [dup(t) for t in graph.nodes]
    return Graph.from_parts(nodes, leafs), copies, order


def graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    """Copy ``graph`` and the current data of all its tensors onto ``backend``.

    Every tensor of the graph must be allocated (compute it, or at least allocate it,
    first). Raises :class:`~tensorplug.NotAllocatedError` naming the first that is not,
    and :class:`~tensorplug.AllocationError` when the backend has no room; in both
    cases nothing stays allocated.
    """
    clone, copies, order = _clone(graph)
    for orig, _ in order:
        if orig.buffer is None:
            raise NotAllocatedError(
                f"graph_copy: {orig.describe()} has no memory; allocate (or compute) the "
                "graph before copying it"
            )
    buffer = alloc_tensors([c for _, c in order], backend.buffer_type())
    try:  # alloc_tensors already pointed the views at their copied bases
        for orig, new in order:
            if new.view_src is None:
                tensor_copy(orig, new)
    except BaseException:
        if buffer is not None:
            buffer.free()
        raise
    return GraphCopy(clone, buffer, copies)

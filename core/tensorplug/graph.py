"""Compute graphs: the nodes to run, in an order where every source comes first.

Built like ``ggml_build_forward_expand``: a depth-first walk from each output visits
sources before the tensor itself. Tensors without an op (and not marked as trainable
parameters) are *leafs* — weights, inputs, constants — and everything else is a
*node*. A view's base tensor is visited too, so whoever places memory sees it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from .errors import GraphError, OutOfBoundsError
from .opcodes import Op
from .tensor import Tensor, TensorFlag

if TYPE_CHECKING:
    from .buffer import Buffer

__all__ = ["Graph"]


class Graph:
    """Nodes in topological order plus leafs; no size limit.

    For a backend: :meth:`needed_outside` says which nodes something outside this graph
    reads (ggml marks them with the OUTPUT flag), so a backend that compiles the graph
    may keep every other intermediate value in registers or device-local scratch.
    """

    __slots__ = ("_keep", "_last_reader", "_parent", "_seen", "leafs", "nodes")

    def __init__(self, outputs: Tensor | Iterable[Tensor] = ()) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._seen: set[int] = set()
        self._keep: set[int] = set()
        self._parent: tuple[Graph, int] | None = None  # (graph, stop) for a view
        self._last_reader: dict[int, int] | None = None
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        for t in outputs:
            self.expand(t)

    def expand(self, tensor: Tensor) -> Graph:
        """Add ``tensor`` and everything it depends on (``ggml_build_forward_expand``)."""
        if not isinstance(tensor, Tensor):
            raise GraphError(
                f"a graph is built from Tensors, got {type(tensor).__name__} {tensor!r}"
            )
        seen, nodes, leafs = self._seen, self.nodes, self.leafs
        open_: set[int] = set()  # on the current path: meeting one again is a cycle
        # iterative DFS: deep graphs (thousands of layers) must not hit the recursion limit
        # each entry: a tensor, its dependencies once visited (made once, not at every
        # return to it: a new prompt length's graph is ~230 nodes), the next to visit
        stack: list[tuple[Tensor, tuple[Tensor, ...] | None, int]] = [(tensor, None, 0)]
        while stack:
            t, deps, i = stack.pop()
            if deps is None:
                if id(t) in seen:
                    continue
                open_.add(id(t))
                deps = t.src if t.view_src is None else (*t.src, t.view_src)
            if i < len(deps):
                stack.append((t, deps, i + 1))
                child = deps[i]
                if id(child) in open_:
                    raise GraphError(
                        f"{t.describe()} depends on itself through {child.describe()}: a "
                        "source was changed after the graph was built; build the ops again"
                    )
                if id(child) not in seen:
                    stack.append((child, None, 0))
                continue
            open_.discard(id(t))
            if id(t) in seen:
                continue
            seen.add(id(t))
            if t.op is Op.NONE and not t.flags & TensorFlag.PARAM:
                leafs.append(t)
            else:
                nodes.append(t)
        return self

    @classmethod
    def from_parts(cls, nodes: Sequence[Tensor], leafs: Sequence[Tensor]) -> Graph:
        """A graph of exactly these nodes and leafs, in this order, their sources not
        walked: a part of a graph already ordered (a split, a view, a copy)."""
        g = cls()
        g.nodes = list(nodes)
        g.leafs = list(leafs)
        g._seen = {id(t) for t in g.nodes} | {id(t) for t in g.leafs}
        return g

    def view(self, start: int, stop: int) -> Graph:
        """Nodes ``start:stop`` as a graph of their own (``ggml_graph_view``); no leafs."""
        if not 0 <= start <= stop <= len(self.nodes):
            raise OutOfBoundsError(
                f"graph view [{start}, {stop}) is outside the graph's {len(self.nodes)} nodes"
            )
        view = Graph.from_parts(self.nodes[start:stop], ())
        view._parent = (self, stop)
        return view

    # -- what must be written to memory --------------------------------------------------

    def keep(self, *tensors: Tensor) -> Graph:
        """Mark ``tensors`` as read from outside this graph (the scheduler does this for
        nodes an eval callback asks to see)."""
        self._keep.update(id(t) for t in tensors)
        return self

    def _readers(self) -> dict[int, int]:
        """Tensor id -> index of the last node reading it (through a view, too)."""
        if self._last_reader is None:
            last: dict[int, int] = {}
            for i, n in enumerate(self.nodes):
                for s in (*n.src, n.view_src):
                    if s is not None:
                        last[id(s)] = i
                        if s.view_src is not None:
                            last[id(s.view_src)] = i
            self._last_reader = last
        return self._last_reader

    def needed_outside(self, node: Tensor) -> bool:
        """True when ``node``'s value must be in memory after this graph is computed:
        it is flagged OUTPUT or kept, no node of the graph reads it (it is what the
        graph was built for), it writes into memory the graph does not own (a view of a
        leaf, such as set_rows into a KV cache), or — for a view made by
        :meth:`view`, as the scheduler's splits are — a later node of the whole graph
        reads it (the scheduler copies it to another backend, or computes on it in a
        later split). Every other node is an intermediate that only this graph reads."""
        if node.flags & TensorFlag.OUTPUT or id(node) in self._keep:
            return True
        owner = node.view_src
        if owner is not None and id(owner) not in self._seen:
            return True
        if self._parent is not None:
            parent, stop = self._parent
            return parent.needed_outside(node) or parent._readers().get(id(node), -1) >= stop
        return id(node) not in self._readers()

    def buffers(self) -> list[Buffer]:
        """Every buffer the nodes and their sources live in, once each, in first-use
        order. A runtime that binds memory ahead of time checks these are still live
        before it hands them to kernels."""
        found: dict[int, Buffer] = {}
        for node in self.nodes:
            for t in (node, *node.src):
                buf = t.base.buffer
                if buf is not None:
                    found.setdefault(id(buf), buf)
        return list(found.values())

    @property
    def needed_nodes(self) -> list[Tensor]:
        """The nodes :meth:`needed_outside` is true for, in graph order."""
        return [n for n in self.nodes if self.needed_outside(n)]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    def __contains__(self, tensor: object) -> bool:
        return id(tensor) in self._seen

    def node(self, i: int) -> Tensor:
        return self.nodes[i]

    @property
    def outputs(self) -> list[Tensor]:
        """Nodes flagged as outputs, or else the last node."""
        marked = [t for t in self.nodes if t.flags & TensorFlag.OUTPUT]
        return marked or self.nodes[-1:]

    def describe(self) -> str:
        """A readable listing, one node per line, as ``ggml_graph_print``."""
        lines = [f"graph: {len(self.nodes)} nodes, {len(self.leafs)} leafs"]
        for i, t in enumerate(self.nodes):
            srcs = ", ".join(s.name or f"<{s.op.value}>" for s in t.src)
            lines.append(
                f"  {i:4d} {t.op.value:<15} {t.type.name:<5} {list(t.shape)!s:<22} "
                f"{t.name or '-'} <- {srcs}"
            )
        for t in self.leafs:
            lines.append(f"  leaf {t.type.name:<5} {list(t.shape)!s:<22} {t.name or '-'}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {len(self.nodes)} nodes, {len(self.leafs)} leafs>"

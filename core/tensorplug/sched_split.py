"""Assigning graph nodes to backends and cutting the graph into splits (the scheduler's core).

This is ``ggml_backend_sched_split_graph``, in the same passes:

1. *Pre-allocated and pinned tensors.* A tensor with memory runs on the
   highest-priority backend that can use that buffer type and run its op; graph inputs
   go to the last backend (the CPU); an op reading a weight (a source in a
   ``WEIGHTS`` buffer) runs where the weight is, unless the weight is in host memory
   and a higher-priority backend asks to offload the op (``offload_op``, which checks a
   minimum batch size). User assignments (``set_tensor_backend``) are kept.
2. *Expansion.* Assignments spread to neighbouring unassigned nodes: first those of
   the non-CPU backends, down then up the graph, then everyone's, skipping nodes the
   backend cannot run.
3. *Upgrade and leftovers.* A node moves to a higher-priority backend with the same
   buffer type when that backend can run it and read all its sources; a node still
   unassigned goes to the backend that supports it and can read most of its inputs.
   No backend at all: :class:`~tensorplug.UnsupportedError` naming op and backends.
4. *Sources.* Unassigned sources follow their view base or their consumer.
5. *Splits.* A new split starts whenever the backend changes (or a weight from
   another backend would be copied into a split that already has inputs, so its memory
   can be reused). Each source living where the split's backend cannot read it gets a
   copy on that backend (``n_copies`` of them with pipeline parallelism) and the node
   reads the copy: its ``src`` is rewritten, and restored when the scheduler moves on.

Speed matters (a 5,000-node graph should split in a few milliseconds), so the passes
work on dicts keyed by the tensors themselves (identity hashing) and on plain lists,
ask ``supports_op`` once per node and backend, and only rare paths do anything more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .alloc_plan import Use, same_layout
from .buffer import BufferType, BufferUsage
from .errors import UnsupportedError
from .opcodes import Op
from .tensor import Tensor, TensorFlag

if TYPE_CHECKING:
    from .backend import Backend
    from .graph import Graph

__all__ = ["SplitContext", "SplitResult", "Split", "split_graph"]

#: ggml_is_view_op: nodes that only re-describe memory; no split is decided on them.
VIEW_LIKE: tuple[Op, ...] = (Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE)

_INPUT = TensorFlag.INPUT.value
_NO_FLAGS = TensorFlag.NONE
_COPY_FLAGS = TensorFlag.INPUT | TensorFlag.OUTPUT
_WEIGHTS = BufferUsage.WEIGHTS


class Split:
    """Consecutive nodes ``[start, end)`` of the graph that run on one backend."""

    __slots__ = ("_graph", "_source", "backend_id", "end", "inputs", "start")

    def __init__(self, source: Graph, backend_id: int, start: int) -> None:
        self._source = source
        self._graph: Graph | None = None
        self.backend_id = backend_id
        self.start = start
        self.end = start
        #: sources computed elsewhere, copied to this backend before the split runs
        self.inputs: list[Tensor] = []

    @property
    def graph(self) -> Graph:
        """The split's nodes as a graph of their own (made when first needed)."""
        if self._graph is None:
            self._graph = self._source.view(self.start, self.end)
        return self._graph

    def __repr__(self) -> str:
        return (
            f"<Split backend={self.backend_id} nodes=[{self.start}, {self.end}) "
            f"inputs={len(self.inputs)}>"
        )


class SplitContext:
    """What splitting needs from the scheduler, and the caches it keeps between calls."""

    def __init__(
        self, backends: Sequence[Backend], bufts: Sequence[BufferType], n_copies: int
    ) -> None:
        self.backends = tuple(backends)
        self.names = [b.name for b in backends]
        self.bufts = tuple(bufts)
        self.n_copies = n_copies
        self.op_offload = True
        #: user assignments (``set_tensor_backend``): tensor -> backend index
        self.user: dict[Tensor, int] = {}
        #: per backend: buffer type -> whether that backend can use it
        self.buft_ok: list[dict[BufferType, bool]] = [{} for _ in backends]
        #: the copy tensors the previous split made, in order: the next split reuses
        #: them when its i-th copy has the same layout (same-shaped graphs, batch after
        #: batch), instead of constructing thousands of new tensors
        self.copy_pool: list[tuple[list[Tensor], str, Op, int]] = []


class SplitResult:
    """One split graph: its splits, assignments, copies and what the allocator must plan."""

    __slots__ = (
        "alloc_leaf_ids",
        "alloc_leafs",
        "alloc_node_ids",
        "alloc_nodes",
        "copies",
        "cur_copy",
        "graph",
        "graph_inputs",
        "ids",
        "rewrites",
        "splits",
    )

    def __init__(self, graph: Graph, cur_copy: int) -> None:
        self.graph = graph
        self.cur_copy = cur_copy
        self.splits: list[Split] = []
        #: backend index of every node and leaf of the graph, and of every copy
        self.ids: dict[Tensor, int] = {}
        #: (node, its original sources) for every node now reading copies
        self.rewrites: list[tuple[Tensor, tuple[Tensor, ...]]] = []
        #: per backend: source -> its copies on that backend
        self.copies: list[dict[Tensor, list[Tensor]]] = []
        #: graph inputs that got per-copy slots (pipeline parallelism)
        self.graph_inputs: dict[Tensor, list[Tensor]] = {}
        self.alloc_nodes: list[Tensor | Use] = []
        self.alloc_node_ids: list[int] = []
        self.alloc_leafs: list[Tensor] = []
        self.alloc_leaf_ids: list[int] = []

    def copy_of(self, tensor: Tensor, backend_id: int) -> Tensor:
        """The copy of split input ``tensor`` on ``backend_id`` used by this run."""
        return self.copies[backend_id][tensor][self.cur_copy]

    def restore(self) -> None:
        """Give rewritten nodes their original sources back."""
        for node, src in self.rewrites:
            node.src = src
        self.rewrites = []


def split_graph(graph: Graph, ctx: SplitContext, cur_copy: int) -> SplitResult:
    """Assign every tensor of ``graph`` to a backend and cut it into splits.

    The passes of ``ggml_backend_sched_split_graph``, each a function of its own:
    1. :meth:`_Assigner.pin` — tensors whose memory already decides (weights, inputs,
       pre-allocated tensors) and the user's choices;
    2. :func:`spread` — those assignments spread to their unassigned neighbours;
    3. :meth:`_Assigner.settle` — upgrades to higher-priority backends sharing a buffer
       type, and a home for whatever is left;
    4-5. :func:`_cut` and :func:`_alloc_lists` — splits, their inputs and copies.
    """
    res = SplitResult(graph, cur_copy)
    assign = _Assigner(ctx, res)
    assign.pin(graph)
    work = [t for t in graph.nodes if t.op not in VIEW_LIKE]
    chosen = [res.ids.get(t, -1) for t in work]
    spread(work, chosen, len(ctx.backends) - 1, assign.supports)
    assign.settle(work, chosen)
    _cut(res, ctx, assign.buffer_supported)
    _alloc_lists(res, ctx)
    return res


def spread(
    work: Sequence[Tensor], chosen: list[int], cpu: int, supports: Callable[[int, Tensor], bool]
) -> None:
    """Pass 2: extend each assignment in ``chosen`` (-1: none yet) to its unassigned
    neighbours in ``work`` that the backend supports — down, then up, first without
    letting backend ``cpu`` (the last, the host) spread, then with it, as ggml does, so
    the host CPU only takes what no other backend reaches."""
    n = len(work)
    down, up = range(n), range(n - 1, -1, -1)
    for order, skip_cpu in ((down, True), (up, True), (down, False), (up, False)):
        cur = -1
        for k in order:
            b = chosen[k]
            if b >= 0:
                cur = -1 if (skip_cpu and b == cpu) else b
            elif cur >= 0 and supports(cur, work[k]):
                chosen[k] = cur


class _Assigner:
    """What passes 1 and 3 consult: cached support answers and where memory lives."""

    def __init__(self, ctx: SplitContext, res: SplitResult) -> None:
        self.ctx, self.res = ctx, res
        self.backends, self.bufts = ctx.backends, ctx.bufts
        self.n_back = len(ctx.backends)
        self.last = self.n_back - 1
        self.ids = res.ids
        self.ids.update(ctx.user)
        self.sup: list[dict[Tensor, bool]] = [{} for _ in range(self.n_back)]

    def supports(self, b: int, t: Tensor) -> bool:
        r = self.sup[b].get(t)
        if r is None:
            r = self.sup[b][t] = bool(self.backends[b].supports_op(t))
        return r

    def uses(self, b: int, buft: BufferType) -> bool:
        ok = self.ctx.buft_ok[b]
        r = ok.get(buft)
        if r is None:
            r = ok[buft] = bool(self.backends[b].supports_buft(buft))
        return r

    def from_buffer(self, buft: BufferType, op: Tensor) -> int:
        if op.op is Op.NONE:  # nothing runs: every backend "supports" a leaf, as in ggml
            return next((b for b in range(self.n_back) if self.uses(b, buft)), -1)
        for b in range(self.n_back):
            if self.uses(b, buft) and self.supports(b, op):
                return b
        return -1

    def buffer_supported(self, t: Tensor, b: int) -> bool:
        vs = t.view_src
        buf = t.buffer if vs is None else vs.buffer
        if buf is not None:
            return self.uses(b, buf.buft)
        tb = self.ids.get(t, -1)
        if tb < 0 and vs is not None:
            tb = self.ids.get(vs, -1)
        return tb >= 0 and self.uses(b, self.bufts[tb])

    def from_cur(self, t: Tensor) -> int:
        """The backend ``t``'s own memory, its being an input, or its weights decide."""
        buf = t.buffer
        vs = t.view_src
        if buf is None and vs is not None:
            buf = vs.buffer
        if buf is not None:
            b = self.from_buffer(buf.buft, t)
            if b < 0:
                raise UnsupportedError(
                    f"tensor {t.describe()} ({t.op.value}) already lives in a "
                    f"{buf.buft.name} buffer, but none of the backends {self.ctx.names} can "
                    "both use that buffer type and run the op there; add a backend that can, "
                    "or place the tensor elsewhere"
                )
            return b
        fl = t.flags
        if fl is not _NO_FLAGS and fl & _INPUT:
            return self.last
        for s in t.src:
            sbuf = s.buffer
            if sbuf is None or sbuf.usage is not _WEIGHTS:
                continue
            if t.op is Op.ROPE and len(t.src) > 2 and s is t.src[2]:
                continue  # rope's frequency factors are too small to decide by
            b = self.from_buffer(sbuf.buft, t)
            if self.ctx.op_offload and b == self.last and sbuf.is_host:
                for c in range(self.last):
                    if self.supports(c, t) and self.backends[c].offload_op(t):
                        return c
            return b
        return -1

    def pin(self, graph: Graph) -> None:
        """Pass 1: pre-allocated tensors, inputs and weight users (user choices are kept)."""
        ids = self.ids
        leaf_home: dict[BufferType, int] = {}  # where leafs of a buffer type live
        for t in graph.leafs:
            if t not in ids:
                buf = t.buffer
                if buf is None and t.view_src is not None:
                    buf = t.view_src.buffer
                if buf is not None:
                    b = leaf_home.get(buf.buft)
                    if b is None:
                        b = leaf_home[buf.buft] = self.from_cur(t)
                    ids[t] = b
                elif t.flags is not _NO_FLAGS and t.flags & _INPUT:
                    ids[t] = self.last
        for t in graph.nodes:
            if t in ids:
                continue
            vs = t.view_src
            if (
                t.buffer is None
                and t.flags is _NO_FLAGS
                and (vs is None or vs.buffer is None)
                and all(s.buffer is None for s in t.src)
            ):
                continue  # the common case: no memory of its own or of its sources decides
            b = self.from_cur(t)
            if b >= 0:
                ids[t] = b
        for t, b in self.ctx.user.items():
            if t.op not in VIEW_LIKE and t.op is not Op.NONE and not self.supports(b, t):
                raise UnsupportedError(
                    f"{t.describe()} ({t.op.value}) was assigned to backend "
                    f"{self.backends[b].name!r}, which does not support it; assign it to a "
                    "backend that does"
                )

    def settle(self, work: Sequence[Tensor], chosen: Sequence[int]) -> None:
        """Pass 3: upgrade to higher-priority backends sharing the buffer type; place
        what no assignment reached on the backend holding most of its inputs."""
        for t, b in zip(work, chosen, strict=True):
            if b < 0:
                b = _most_inputs(t, self.n_back, self.ids, self.supports, self.buffer_supported)
                if b < 0:
                    raise UnsupportedError(
                        f"no backend can run {t.describe()}: op {t.op.value} with sources "
                        f"{[_where(s) for s in t.src]} is not supported by any of "
                        f"{[be.name for be in self.backends]}; add a backend that supports it"
                        " (or keep its sources in memory such a backend reads)"
                    )
            elif b:
                for c in range(b):
                    if (
                        self.bufts[c] is self.bufts[b]
                        and self.supports(c, t)
                        and all(self.buffer_supported(s, c) for s in t.src)
                    ):
                        b = c
                        break
            self.ids[t] = b


def _where(t: Tensor) -> str:
    """``t`` described, with the buffer its memory is in when it has one: a backend may
    support an op only for some kinds of memory (CPU_REPACK feeds products alone)."""
    buf = t.base.buffer
    return t.describe() if buf is None else f"{t.describe()} in {buf.name}"


def _most_inputs(
    t: Tensor,
    n_back: int,
    ids: dict[Tensor, int],
    supports: Callable[[int, Tensor], bool],
    buffer_supported: Callable[[Tensor, int], bool],
) -> int:
    """The backend that supports ``t`` and can read the most of its assigned sources."""
    best, best_b = -1, -1
    for c in range(n_back):
        if supports(c, t):
            n_ok = sum(
                1
                for s in t.src
                if (s in ids or (s.view_src is not None and s.view_src in ids))
                and buffer_supported(s, c)
            )
            if n_ok > best:
                best, best_b = n_ok, c
    return best_b


def _cut(res: SplitResult, ctx: SplitContext, supported: Callable[[Tensor, int], bool]) -> None:
    """Passes 4 and 5: backends for the remaining sources; splits, their inputs, copies."""
    graph = res.graph
    nodes = graph.nodes
    ids = res.ids
    n_copies, cur_copy = ctx.n_copies, res.cur_copy
    backends = ctx.backends
    copies: list[dict[Tensor, list[Tensor]]] = [{} for _ in backends]
    res.copies = copies
    pool = ctx.copy_pool
    used: list[tuple[list[Tensor], str, Op, int]] = []  # (copies, source name/op, backend)
    ctx.copy_pool = used
    rewrites = res.rewrites
    splits = res.splits

    make_copies = _CopyMaker(ctx, pool, used, ids)

    last = len(backends) - 1
    pending: list[Tensor] = []
    split: Split | None = None
    cur = -1
    for i, node in enumerate(nodes):
        b = follow(node, ids, pending)  # pass 4
        if node.op in VIEW_LIKE:
            continue
        src = node.src
        # pass 5: a new split when the backend changes, or when a weight must be copied
        # into a split that already has inputs (so the copies' memory can be reused)
        if (
            split is None
            or b != cur
            or (split.inputs and _copies_a_weight(src, ids, cur, supported))
        ):
            if split is None:
                split = Split(graph, b, 0)  # leading views belong to the first split
            else:
                split.end = i
                split = Split(graph, b, i)
            splits.append(split)
            cur = b
        new_src: list[Tensor] | None = None
        for s in src:
            if n_copies > 1 and s.flags is not _NO_FLAGS and s.flags & _INPUT:
                _graph_input_copies(res, ctx, s)
            if ids[s] != cur and not supported(s, cur):
                made = copies[cur].get(s)
                if made is None:
                    made = copies[cur][s] = make_copies(s, cur)
                    split.inputs.append(s)  # type: ignore[union-attr]
                if new_src is None:
                    new_src = list(src)
                for j, x in enumerate(src):
                    if x is s:
                        new_src[j] = made[cur_copy]
        if new_src is not None:
            rewrites.append((node, src))
            node.src = tuple(new_src)
    # what is still left (views nobody reads, their bases) costs nothing anywhere: the CPU
    for t in pending:
        if t not in ids:
            vs = t.view_src
            ids[t] = ids.get(vs, last) if vs is not None else last
    for t in res.graph.leafs:
        if t not in ids:
            ids[t] = last
    if split is None:  # only views
        if nodes:
            split = Split(graph, ids[nodes[0]], 0)
            splits.append(split)
        else:
            return
    split.end = len(nodes)


def follow(node: Tensor, ids: dict[Tensor, int], pending: list[Tensor]) -> int:
    """Pass 4 for one node: a node or view without a backend follows its base, and its
    unplaced sources follow it (a source view, through its base); returns the node's
    backend, -1 when not known yet (then it waits in ``pending``)."""
    b = ids.get(node, -1)
    if b < 0:
        vs = node.view_src
        b = ids.get(vs, -1) if vs is not None else -1
        if b >= 0:
            ids[node] = b
        else:
            pending.append(node)  # a view of a base no one placed yet
    for s in node.src:
        if s in ids:
            continue
        svs = s.view_src
        if svs is not None:
            sb = ids.get(svs, -1)
            if sb < 0 and b >= 0:
                sb = ids[svs] = b
            if sb >= 0:
                ids[s] = sb
        elif b >= 0:
            ids[s] = b
    return b


def _copies_a_weight(
    src: Sequence[Tensor],
    ids: dict[Tensor, int],
    cur: int,
    supported: Callable[[Tensor, int], bool],
) -> bool:
    """Whether running here would copy in a weight that lives on another backend."""
    for s in src:
        sbuf = s.buffer
        if sbuf is not None and sbuf.usage is _WEIGHTS and ids[s] != cur and not supported(s, cur):
            return True
    return False


class _CopyMaker:
    """The tensors that hold a split input's copies on a backend, one per pipeline copy;
    reused from the previous split of the same graph when they fit, as ggml keeps its
    graph copies between computes."""

    def __init__(
        self,
        ctx: SplitContext,
        pool: list[tuple[list[Tensor], str, Op, int]],
        used: list[tuple[list[Tensor], str, Op, int]],
        ids: dict[Tensor, int],
    ) -> None:
        self.names, self.n_copies = ctx.names, ctx.n_copies
        self.pool, self.used, self.ids = pool, used, ids

    def __call__(self, s: Tensor, b: int) -> list[Tensor]:
        i = len(self.used)
        entry = self.pool[i] if i < len(self.pool) else None
        name = f"{self.names[b]}#{s.name or s.op.value}#"
        if entry is not None and same_layout(entry[0][0], s):
            made = entry[0]
            if entry[1] != s.name or entry[2] is not s.op or entry[3] != b:
                for c, t in enumerate(made):
                    t.name = f"{name}{c}"
        else:
            made = [
                Tensor(s.type, s.shape, strides=s.strides, name=f"{name}{c}")
                for c in range(self.n_copies)
            ]
            if self.n_copies > 1:
                for copy in made:
                    copy.flags = _COPY_FLAGS  # placed up front and never reused
        self.used.append((made, s.name, s.op, b))
        for t in made:
            self.ids[t] = b
        return made


def _graph_input_copies(res: SplitResult, ctx: SplitContext, s: Tensor) -> None:
    """With pipeline parallelism a graph input gets a slot per copy; this run uses ``s``."""
    if s in res.graph_inputs:
        return
    made = []
    for c in range(ctx.n_copies):
        if c == res.cur_copy:
            made.append(s)
        else:
            dup = Tensor(s.type, s.shape, strides=s.strides, name=f"{s.name}#{c}")
            dup.flags = _COPY_FLAGS
            made.append(dup)
    res.graph_inputs[s] = made


def _alloc_lists(res: SplitResult, ctx: SplitContext) -> None:
    """The node and leaf lists the graph allocator plans (ggml's ``sched->graph``).

    Before each split come, for each of its inputs, a :class:`Use` of the input (so it
    stays alive until copied) and the copy (so it is placed when the split starts).
    With pipeline parallelism every copy slot is also a leaf, placed up front and kept.
    """
    g = res.graph
    nodes = g.nodes
    ids = res.ids
    node_ids = [ids[t] for t in nodes]
    a_nodes, a_ids = res.alloc_nodes, res.alloc_node_ids
    a_leafs, a_lids = res.alloc_leafs, res.alloc_leaf_ids
    cc = res.cur_copy
    for sp in res.splits:
        b = sp.backend_id
        copies = res.copies[b]
        for inp in sp.inputs:
            a_nodes.append(Use(inp))
            a_ids.append(ids[inp])
            a_nodes.append(copies[inp][cc])
            a_ids.append(b)
        a_nodes.extend(nodes[sp.start : sp.end])
        a_ids.extend(node_ids[sp.start : sp.end])
    if ctx.n_copies > 1:
        for s, made in res.graph_inputs.items():
            a_leafs.extend(made)
            a_lids.extend([ids[s]] * len(made))
        for sp in res.splits:
            for inp in sp.inputs:
                made = res.copies[sp.backend_id][inp]
                a_leafs.extend(made)
                a_lids.extend([sp.backend_id] * len(made))
    a_leafs.extend(g.leafs)
    a_lids.extend([ids[t] for t in g.leafs])

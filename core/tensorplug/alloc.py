"""Memory for graphs and static tensors (ggml-alloc's ``gallocr`` and friends).

A :class:`GraphAllocator` gives every tensor of a graph a place in one compute buffer
per buffer type (several joined in a :class:`~tensorplug.MultiBuffer` when the type
has a ``max_size``), reusing memory as soon as nothing needs it: the rules — leafs and
inputs first and kept, outputs kept, blocks freed after their last reader (views keep
their base), in-place ops over their parent's block — are in
:mod:`tensorplug.alloc_plan`.

As in ggml, :meth:`~GraphAllocator.reserve` plans the largest graph you will run and
allocates the buffers; :meth:`~GraphAllocator.alloc_graph` then replays that plan for
every graph with the same shape (same block lifetimes, no block larger), plans a
smaller or different graph best-fit in the existing buffers, and re-reserves (grows
the buffers) only when that does not fit. Reserving uses a compact offline placement
that knows every lifetime up front; replaying reuses its offsets, so the per-batch
cost is one walk over the graph.

:func:`alloc_tensors` is the simple sequential allocator for weights and other static
tensors (``ggml_backend_alloc_ctx_tensors_from_buft``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from .alloc_plan import (
    INPLACE_OPS,
    AllocPlan,
    Blocks,
    Layout,
    Placement,
    Use,
    decide,
    place_compact,
    place_online,
)
from .buffer import Buffer, BufferType, BufferUsage, MultiBuffer
from .errors import AllocationError, InvalidArgumentError
from .tensor import Tensor
from .transfer import tensor_alloc, view_init

if TYPE_CHECKING:
    from .backend import Backend
    from .graph import Graph

__all__ = [
    "INPLACE_OPS",
    "AllocPlan",
    "GraphAllocator",
    "Placement",
    "Use",
    "alloc_ctx_tensors",
    "alloc_tensors",
]


class GraphAllocator:
    """Plans and places the memory of graphs (``ggml_gallocr``), one buffer per buffer type.

    ``buffer_types`` may repeat a type (the scheduler passes one per backend): buffer
    ids that share a type share one buffer, as in ggml.
    """

    def __init__(self, buffer_types: BufferType | Sequence[BufferType]) -> None:
        bufts = [buffer_types] if isinstance(buffer_types, BufferType) else list(buffer_types)
        if not bufts:
            raise InvalidArgumentError("GraphAllocator needs at least one buffer type")
        self.buffer_types: tuple[BufferType, ...] = tuple(bufts)
        # buffer id -> index of the first id with the same type (which owns the memory)
        self._owner: list[int] = [next(j for j, b in enumerate(bufts) if b is t) for t in bufts]
        self._buffers: list[list[Buffer]] = [[] for _ in bufts]
        self._placed: list[Tensor] = []
        # the blocks and offsets of the last reserved plan, replayed for graphs like it
        self._reserved: tuple[Blocks, Layout] | None = None
        self.last_plan: AllocPlan | None = None

    # -- public -------------------------------------------------------------------------

    def reserve(
        self,
        graph: Graph,
        node_buffer_ids: Sequence[int] | None = None,
        leaf_buffer_ids: Sequence[int] | None = None,
    ) -> AllocPlan:
        """Plan ``graph`` and make the buffers at least as large as it needs.

        Nothing is placed: use it with the largest graph you will run, so that later
        :meth:`alloc_graph` calls find buffers big enough. Raises
        :class:`~tensorplug.AllocationError` if a buffer cannot be allocated.
        """
        return self.reserve_n(graph.nodes, graph.leafs, node_buffer_ids, leaf_buffer_ids)

    def alloc_graph(
        self,
        graph: Graph,
        node_buffer_ids: Sequence[int] | None = None,
        leaf_buffer_ids: Sequence[int] | None = None,
    ) -> AllocPlan:
        """Give every tensor of ``graph`` its memory; grows the buffers if it no longer fits.

        Tensors this allocator placed for an earlier graph lose their memory first (their
        data is about to be overwritten). ``node_buffer_ids[i]`` picks the buffer type of
        ``graph.nodes[i]`` (default: all 0); likewise for leafs.
        """
        return self.alloc_n(graph.nodes, graph.leafs, node_buffer_ids, leaf_buffer_ids)

    def buffer_size(self, buffer_id: int = 0) -> int:
        """Bytes allocated for ``buffer_id`` (0 when it shares another id's buffer)."""
        if self._owner[buffer_id] != buffer_id:
            return 0
        return sum(b.size for b in self._buffers[buffer_id])

    def buffer(self, buffer_id: int = 0) -> Buffer | None:
        """The compute buffer of ``buffer_id`` (a MultiBuffer when chunked), or None."""
        bufs = self._buffers[self._owner[buffer_id]]
        if not bufs:
            return None
        return bufs[0] if len(bufs) == 1 else MultiBuffer(bufs)

    def free(self) -> None:
        """Release every buffer; tensors placed in them lose their memory."""
        self.release_tensors()
        self._reserved = None
        for bufs in self._buffers:
            for b in bufs:
                b.free()
            bufs.clear()

    # -- ggml's *_n forms: node lists that are not a Graph's (the scheduler's splits) -----

    def reserve_n(
        self,
        nodes: Sequence[Tensor | Use],
        leafs: Sequence[Tensor],
        node_bufs: Sequence[int] | None,
        leaf_bufs: Sequence[int] | None,
        before_realloc: Callable[[], None] | None = None,
    ) -> AllocPlan:
        """:meth:`reserve` over explicit node and leaf lists (ggml's ``gallocr_reserve_n``).

        The scheduler plans its splits this way: its node list holds :class:`Use` entries
        for copies that are not nodes of any graph. ``before_realloc`` runs before a
        buffer is replaced, so that queued work that reads the old one can finish.
        """
        self.release_tensors()
        blocks = self._decide(nodes, leafs, node_bufs, leaf_bufs)
        plan = self._reserve_blocks(blocks, before_realloc)
        self.last_plan = plan
        return plan

    def alloc_n(
        self,
        nodes: Sequence[Tensor | Use],
        leafs: Sequence[Tensor],
        node_bufs: Sequence[int] | None,
        leaf_bufs: Sequence[int] | None,
        before_realloc: Callable[[], None] | None = None,
    ) -> AllocPlan:
        """:meth:`alloc_graph` over explicit node and leaf lists, as :meth:`reserve_n`."""
        self.release_tensors()
        blocks = self._decide(nodes, leafs, node_bufs, leaf_bufs)
        reserved = self._reserved
        plan = None
        if reserved is not None and blocks.fits_in(reserved[0]):
            # the same lifetimes as the reserved graph, no block larger: replay its offsets
            plan = AllocPlan(blocks, reserved[1])
        if plan is None or not self._fits(plan):
            plan = AllocPlan(blocks, place_online(blocks, self.buffer_types))
            if not self._fits(plan):
                plan = self._reserve_blocks(blocks, before_realloc)
        self._place(plan)
        self.last_plan = plan
        return plan

    # -- planning --------------------------------------------------------------------------

    def _decide(
        self,
        nodes: Sequence[Tensor | Use],
        leafs: Sequence[Tensor],
        node_bufs: Sequence[int] | None,
        leaf_bufs: Sequence[int] | None,
    ) -> Blocks:
        node_b = self._buffer_ids("node", nodes, node_bufs)
        leaf_b = self._buffer_ids("leaf", leafs, leaf_bufs)
        return decide(nodes, leafs, node_b, leaf_b, self.buffer_types)

    def _reserve_blocks(
        self, blocks: Blocks, before_realloc: Callable[[], None] | None
    ) -> AllocPlan:
        """Place compactly, make the buffers big enough, and remember it for replays."""
        layout = place_compact(blocks, self.buffer_types)
        plan = AllocPlan(blocks, layout)
        self._reserved = None  # until the buffers for it exist
        self._ensure_buffers(plan, before_realloc)
        self._reserved = (blocks.lifetimes(), layout)
        return plan

    def _fits(self, plan: AllocPlan) -> bool:
        return all(_big_enough(self._buffers[b], need) for b, need in enumerate(plan.chunk_sizes))

    def _buffer_ids(self, what: str, seq: Sequence[object], ids: Sequence[int] | None) -> list[int]:
        """Buffer ids mapped to the id owning their buffer type; all 0 when not given."""
        if ids is None:
            return [0] * len(seq)
        if len(ids) != len(seq):
            raise InvalidArgumentError(
                f"{len(ids)} {what} buffer ids given for {len(seq)} {what}s; pass one per {what}"
            )
        owner = self._owner
        if ids and (min(ids) < 0 or max(ids) >= len(owner)):
            raise InvalidArgumentError(
                f"{what} buffer ids must be in range({len(owner)}), got {list(ids)}"
            )
        return [owner[b] for b in ids]

    # -- buffers and placement ---------------------------------------------------------------

    def _ensure_buffers(
        self, plan: AllocPlan, before_realloc: Callable[[], None] | None = None
    ) -> None:
        """(Re)allocate each buffer type's chunks when the plan needs more than they have.

        ``before_realloc`` runs once before the first buffer is replaced (the scheduler
        waits there for work still using the old buffers).
        """
        for b, need in enumerate(plan.chunk_sizes):
            if self._owner[b] != b:
                continue
            have = self._buffers[b]
            if _big_enough(have, need):
                continue
            if before_realloc is not None:
                before_realloc()
                before_realloc = None
            # free first: on a device the old and new buffers may not both fit
            for old in have:
                old.free()
            have.clear()
            buft = self.buffer_types[b]
            try:
                for n in need:
                    buf = buft.alloc_buffer(n)
                    buf.usage = BufferUsage.COMPUTE
                    have.append(buf)
            except AllocationError as e:
                for buf in have:
                    buf.free()
                have.clear()
                raise AllocationError(
                    f"the graph needs {sum(need)} bytes of {buft.name} compute memory "
                    f"({len(need)} buffer(s)) and that could not be allocated: {e}"
                ) from e

    def release_tensors(self) -> None:
        """Take memory back from the tensors of the previous graph (their data is stale).

        Every allocation does this first; the scheduler calls it on ``reset`` so that no
        tensor of a forgotten graph still points into a buffer the next graph reuses.
        """
        mine = {b for bufs in self._buffers for b in bufs}
        for t in self._placed:
            buf = t.buffer
            if buf is not None and (buf in mine or buf.is_freed):
                t.buffer = None
                t.offset = 0
        self._placed = []
        for bufs in self._buffers:
            for b in bufs:
                b.reset()

    def _place(self, plan: AllocPlan) -> None:
        """Give each planned tensor its block, then each view its base's memory.

        The plan guarantees alignment and bounds, so tensor_alloc's checks are skipped;
        a buffer's ``init_tensor`` hook still runs when its class has one.
        """
        buffers = self._buffers
        blocks, layout = plan.blocks, plan.layout
        bid, chunk, offset = blocks.buffer, layout.chunk, layout.offset
        for t, k in zip(blocks.tensors, blocks.owner, strict=True):
            t.buffer = buffers[bid[k]][chunk[k]]
            t.offset = offset[k]
        placed = self._placed
        placed.extend(blocks.tensors)
        if any(_has_init_hook(buf) for bufs in buffers for buf in bufs):
            for t in blocks.tensors:
                t.buffer.init_tensor(t)  # type: ignore[union-attr]
        for t in blocks.views:  # bases before their views, so one pass is enough
            vs = t.view_src
            if t.buffer is None and vs.buffer is not None:  # type: ignore[union-attr]
                buf = vs.buffer  # type: ignore[union-attr]
                t.buffer = buf
                t.offset = vs.offset + t.view_offs  # type: ignore[union-attr]
                if _has_init_hook(buf):
                    buf.init_tensor(t)
                placed.append(t)


def _big_enough(have: Sequence[Buffer], need: Sequence[int]) -> bool:
    """Whether buffers ``have`` hold chunks of ``need`` bytes, one chunk per buffer."""
    return len(have) >= len(need) and all(h.size >= n for h, n in zip(have, need, strict=False))


def _has_init_hook(buf: Buffer) -> bool:
    return type(buf)._init_tensor is not Buffer._init_tensor


# -- static tensors ------------------------------------------------------------------------------


def alloc_tensors(
    tensors: Iterable[Tensor],
    buffer_type: BufferType,
    usage: BufferUsage = BufferUsage.ANY,
) -> Buffer | None:
    """Place every unallocated tensor one after another in new buffers of ``buffer_type``.

    ``ggml_backend_alloc_ctx_tensors_from_buft``: tensors are padded to the alignment
    and packed in order; when the next one would pass the type's ``max_size`` a new
    buffer starts, and several buffers come back as one :class:`~tensorplug.MultiBuffer`.
    Views are initialised once their base has memory. Returns None when every tensor
    was already allocated. On failure nothing is placed and the buffers made so far
    are freed.
    """
    todo = list(dict.fromkeys(tensors))  # a tensor listed twice is placed once
    align, limit = buffer_type.alignment, buffer_type.max_size
    groups: list[tuple[int, list[tuple[Tensor, int]]]] = []  # (size, [(tensor, offset)])
    cur: list[tuple[Tensor, int]] = []
    cur_size = 0
    for t in todo:
        if t.buffer is not None or t.view_src is not None:
            continue
        size = -(-buffer_type.alloc_size(t) // align) * align
        if size > limit:
            raise AllocationError(
                f"{buffer_type.name}: tensor {t.describe()} needs {size} bytes, more than the "
                f"{limit} bytes one buffer of this type can hold"
            )
        if cur and cur_size + size > limit:
            groups.append((cur_size, cur))
            cur, cur_size = [], 0
        cur.append((t, cur_size))
        cur_size += size
    if cur:
        groups.append((cur_size, cur))
    buffers: list[Buffer] = []
    try:
        for size, _ in groups:
            buf = buffer_type.alloc_buffer(size)
            buf.usage = usage
            buffers.append(buf)
    except AllocationError:
        for buf in buffers:
            buf.free()
        raise
    for buf, (_, members) in zip(buffers, groups, strict=True):
        for t, off in members:
            tensor_alloc(buf, t, off)
    for t in todo:
        if t.view_src is not None and t.buffer is None and t.view_src.buffer is not None:
            view_init(t)
    if not buffers:
        return None
    return buffers[0] if len(buffers) == 1 else MultiBuffer(buffers)


def alloc_ctx_tensors(tensors: Iterable[Tensor], backend: Backend) -> Buffer | None:
    """:func:`alloc_tensors` in the backend's default buffer type (``..._alloc_ctx_tensors``)."""
    return alloc_tensors(tensors, backend.buffer_type())

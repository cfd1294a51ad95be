"""The memory plan of a graph: offsets for every tensor, reusing memory as soon as possible.

This is the planning half of ggml-alloc (``ggml_gallocr_alloc_graph_impl`` and
``ggml_dyn_tallocr``); :mod:`tensorplug.alloc` turns a plan into buffers and places
tensors. Rules, in ggml's terms:

* leafs, INPUT and OUTPUT tensors are never freed, and nothing is computed in place
  over them: a leaf or an input holds data the application writes before each run, so
  the graph can be computed again without writing it anew (ggml frees inputs after
  their last use; we keep them, which costs only their own bytes);
* INPUT nodes are placed before any other node, then nodes in execution order;
* a tensor's block is freed right after the last node that reads it, directly or
  through a view; views take no memory of their own. The base of a view that nothing
  consumes is kept, as in ggml, since someone may still read the view;
* an op in :data:`INPLACE_OPS` writes into its parent's block when this node is the
  last reader of that block, reads it through exactly one source, the block is our own
  (not a leaf, input, output or pre-allocated tensor) in the same buffer, and the
  layouts match (a view parent must start at offset 0 of its base). Backends must
  accept a destination aliasing a source for these ops;
* a buffer type's ``max_size`` caps each chunk of memory; a plan may use several
  chunks, which become several buffers.

Planning has two steps. :func:`decide` walks the graph once and settles everything
that does not depend on offsets: which tensors share a block (in place) and when each
block is taken and released. Bookkeeping is a dict of last-use positions and one of
live blocks, keyed by the tensors themselves (a :class:`~tensorplug.Tensor` hashes by
identity), so this takes milliseconds for 5,000 nodes. Then offsets:
:func:`place_online` is ggml's allocator — free blocks sorted by offset, best fit, a
freed block merging with its neighbours — and :func:`place_compact` an offline
placement that sees every lifetime at once and avoids best fit's fragmentation. Two
graphs whose blocks have the same lifetimes can share offsets, which is how a
reserved plan is replayed.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from .buffer import BufferType
from .errors import AllocationError
from .opcodes import Op
from .tensor import Tensor, TensorFlag
from .types import Type

__all__ = [
    "END",
    "INPLACE_OPS",
    "AllocPlan",
    "Blocks",
    "Layout",
    "Placement",
    "Use",
    "decide",
    "place_compact",
    "place_online",
]

#: Ops whose kernels may write their result over a source (``ggml_op_can_inplace``).
#: A tuple, not a set: membership then compares identities and never hashes an enum.
INPLACE_OPS: tuple[Op, ...] = (
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SCALE, Op.UNARY, Op.RMS_NORM, Op.SOFT_MAX, Op.ROPE,
)  # fmt: skip

_INPUT = TensorFlag.INPUT.value
_OUTPUT = TensorFlag.OUTPUT.value
_NO_FLAGS = TensorFlag.NONE
_NONE = Op.NONE

#: ``(tensor, buffer_id, chunk, offset, size)``: one block given to one tensor.
Entry = tuple[Tensor, int, int, int, int]


class Use:
    """A planning-only node: "``tensor`` is read at this point of the node list".

    The scheduler puts one before each cross-backend copy so the source stays alive
    until the copy is made (ggml inserts a dummy view node for the same purpose).
    """

    __slots__ = ("src",)

    # what the planner reads from a node, as class constants
    flags = TensorFlag.NONE
    view_src = None
    op = Op.NONE
    buffer = None

    def __init__(self, tensor: Tensor) -> None:
        self.src = (tensor,)

    def __repr__(self) -> str:
        return f"Use({self.src[0].describe()})"


class Placement(NamedTuple):
    """Where a plan put one tensor: buffer id, chunk (member buffer), offset, bytes."""

    buffer_id: int
    chunk: int
    offset: int
    size: int


class AllocPlan:
    """A planned graph: bytes per buffer id and a block for each tensor given memory.

    ``sizes[b]`` is what buffer id ``b`` needs over all its chunks and
    ``chunk_sizes[b]`` the size of each chunk (each becomes one buffer).
    """

    __slots__ = ("_entries", "_index", "blocks", "chunk_sizes", "layout", "sizes")

    def __init__(self, blocks: Blocks, layout: Layout) -> None:
        self.blocks = blocks
        self.layout = layout
        self.chunk_sizes = layout.chunk_sizes
        self.sizes = [sum(c) for c in layout.chunk_sizes]
        self._entries: list[Entry] | None = None
        self._index: dict[int, int] | None = None

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def entries(self) -> list[Entry]:
        """One ``(tensor, buffer_id, chunk, offset, size)`` per tensor given memory, in
        planning order; a result computed in place shares its parent's block."""
        if self._entries is None:
            b, size = self.blocks.buffer, self.blocks.size
            chunk, offset = self.layout.chunk, self.layout.offset
            self._entries = [
                (t, b[k], chunk[k], offset[k], size[k])
                for t, k in zip(self.blocks.tensors, self.blocks.owner, strict=True)
            ]
        return self._entries

    def placement(self, tensor: Tensor) -> Placement | None:
        """Where ``tensor`` went, or None (a view, pre-allocated, or not in the graph)."""
        if self._index is None:
            self._index = {id(t): i for i, t in enumerate(self.blocks.tensors)}
        i = self._index.get(id(tensor))
        if i is None:
            return None
        _, b, c, off, size = self.entries[i]
        return Placement(b, c, off, size)

    def __repr__(self) -> str:
        return f"<AllocPlan {len(self.blocks.tensors)} tensors, sizes={self.sizes}>"


# -- the dynamic allocator: best fit over sorted, merging free blocks ------------------------


class _Chunk:
    """One future buffer: free blocks sorted by offset; the last one is the open tail."""

    __slots__ = ("high", "offs", "sizes")

    def __init__(self, limit: int) -> None:
        self.offs: list[int] = [0]
        self.sizes: list[int] = [limit]
        self.high = 0  # high-water mark: the size this chunk's buffer needs


class _DynAlloc:
    """Offsets in one buffer type (``ggml_dyn_tallocr``), in chunks of at most ``limit``."""

    __slots__ = ("alignment", "buft", "chunks", "limit")

    def __init__(self, buft: BufferType) -> None:
        self.buft = buft
        self.alignment = buft.alignment
        self.limit = buft.max_size
        self.chunks: list[_Chunk] = []

    def alloc(self, size: int, blocks: Blocks, k: int) -> tuple[int, int, int]:
        """Reserve ``size`` (aligned) bytes for block ``k``: ``(chunk, offset, size)``."""
        if size > self.limit:
            t = blocks.tensors[blocks.owner.index(k)]
            raise AllocationError(
                f"{self.buft.name}: tensor {t.describe()} needs {size} bytes but one buffer "
                f"of this type holds at most {self.limit} bytes; use smaller tensors or "
                "another buffer type"
            )
        chunks = self.chunks
        if not chunks:
            chunks.append(_Chunk(self.limit))
        best_c = best_k = -1
        best_size = sys.maxsize
        # best fit among the holes: every free block but each chunk's tail
        for c, ch in enumerate(chunks):
            sizes = ch.sizes
            for k in range(len(sizes) - 1):
                s = sizes[k]
                if size <= s < best_size:
                    best_c, best_k, best_size = c, k, s
        if best_c < 0:
            if len(chunks) == 1:
                sizes = chunks[0].sizes
                if sizes and sizes[-1] >= size:
                    best_c, best_k = 0, len(sizes) - 1
            else:
                best_c, best_k = self._pick_tail(size)
        if best_c < 0:
            chunks.append(_Chunk(self.limit))
            best_c, best_k = len(chunks) - 1, 0
        ch = chunks[best_c]
        off = ch.offs[best_k]
        left = ch.sizes[best_k] - size
        if left:
            ch.offs[best_k] = off + size
            ch.sizes[best_k] = left
        else:
            del ch.offs[best_k], ch.sizes[best_k]
        if off + size > ch.high:
            ch.high = off + size
        return best_c, off, size

    def _pick_tail(self, size: int) -> tuple[int, int]:
        """The chunk tail to cut ``size`` bytes from, or ``(-1, -1)`` for a new chunk.

        Prefer a tail where the tensor fits below the chunk's current size (no growth),
        the tightest such; otherwise the one that grows its chunk the least.
        """
        best_c = best_k = -1
        best_reuse = -sys.maxsize
        for c, ch in enumerate(self.chunks):
            k = len(ch.sizes) - 1
            if k < 0 or ch.sizes[k] < size:
                continue
            reuse = ch.high - ch.offs[k] - size
            if (reuse >= 0 and (best_reuse < 0 or reuse < best_reuse)) or (
                best_reuse < 0 and reuse > best_reuse
            ):
                best_c, best_k, best_reuse = c, k, reuse
        return best_c, best_k

    def free(self, chunk: int, offset: int, size: int) -> None:
        """Return an aligned block, merging it with the free blocks on either side."""
        ch = self.chunks[chunk]
        offs, sizes = ch.offs, ch.sizes
        k = bisect.bisect_left(offs, offset)
        if k > 0 and offs[k - 1] + sizes[k - 1] == offset:
            sizes[k - 1] += size
            if k < len(offs) and offset + size == offs[k]:
                sizes[k - 1] += sizes[k]
                del offs[k], sizes[k]
        elif k < len(offs) and offset + size == offs[k]:
            offs[k] = offset
            sizes[k] += size
        else:
            offs.insert(k, offset)
            sizes.insert(k, size)

    def touch(self) -> None:
        """Make sure chunk 0 exists: an empty tensor still needs a buffer to point into."""
        if not self.chunks:
            self.chunks.append(_Chunk(self.limit))

    def chunk_sizes(self) -> list[int]:
        return [ch.high for ch in self.chunks]


# -- deciding: which tensors share a block, and when each block is live ---------------------


class Blocks:
    """The planning decisions that do not depend on offsets.

    One block per tensor given memory, except that a result computed in place joins
    its parent's block. ``first[k]``/``last[k]`` are the node positions where block
    ``k`` is taken and after which it is released (-1: before any node; :data:`END`:
    never), ``size[k]`` its bytes rounded up to the buffer type's alignment. Two
    graphs with equal ``buffer``/``first``/``last`` lists can share one set of offsets
    as long as each block of the second is no larger: that is how a reserved plan is
    replayed.
    """

    __slots__ = ("buffer", "events", "first", "last", "owner", "size", "tensors", "views")

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []  # every tensor given memory ...
        self.owner: list[int] = []  # ... and the block it lives in
        self.buffer: list[int] = []
        self.first: list[int] = []
        self.last: list[int] = []
        self.size: list[int] = []
        #: the order blocks were taken (k) and released (~k), for the online allocator
        self.events: list[int] = []
        #: views (nodes and leafs), which take their base's memory once it is placed
        self.views: list[Tensor] = []

    def lifetimes(self) -> Blocks:
        """A copy with only what a replay compares (no tensors kept alive)."""
        out = Blocks()
        out.buffer, out.first, out.last, out.size = self.buffer, self.first, self.last, self.size
        return out

    def same_lifetimes(self, other: Blocks) -> bool:
        return self.first == other.first and self.last == other.last and self.buffer == other.buffer

    def fits_in(self, other: Blocks) -> bool:
        """Same lifetimes and no block larger than ``other``'s: ``other``'s offsets work."""
        return self.same_lifetimes(other) and all(
            a <= b for a, b in zip(self.size, other.size, strict=True)
        )


#: ``last`` of a block that is never released
END = sys.maxsize

#: Above this many blocks the compact placement (quadratic) is skipped for best fit.
COMPACT_MAX_BLOCKS = 30_000


def decide(
    nodes: Sequence[Tensor | Use],
    leafs: Sequence[Tensor],
    node_buffer_ids: Sequence[int],
    leaf_buffer_ids: Sequence[int],
    buffer_types: Sequence[BufferType],
) -> Blocks:
    """Walk the graph as ``ggml_gallocr_alloc_graph_impl`` does, deciding blocks.

    ``nodes`` are in execution order and may include :class:`Use` markers; the buffer
    ids index ``buffer_types``. Every source must itself be a node or a leaf, as a
    :class:`~tensorplug.Graph` guarantees. Tensors that already have a buffer are left
    alone. Bookkeeping keys on the tensors themselves (identity hashing, no ``id()``).
    """
    blocks = Blocks()
    tensors, owner, events, views = blocks.tensors, blocks.owner, blocks.events, blocks.views
    bbuf, bfirst, blast, bsize = blocks.buffer, blocks.first, blocks.last, blocks.size
    align = [bt.alignment for bt in buffer_types]
    fast_size = [type(bt).alloc_size is BufferType.alloc_size for bt in buffer_types]
    mem: dict[Tensor, int] = {}  # live blocks we may release, by the tensor owning them
    keep: set[Tensor] = set()  # never released nor overwritten: leafs, inputs, outputs
    done: set[Tensor | Use] = set()  # placed ahead of their turn: leafs and inputs
    last: dict[Tensor, int] = {}  # position of the last node reading a tensor or its base
    no_flags = _NO_FLAGS

    add_tensor, add_owner, add_event = tensors.append, owner.append, events.append
    add_buf, add_first, add_last, add_size = bbuf.append, bfirst.append, blast.append, bsize.append

    def allocate(t: Tensor, b: int, i: int) -> None:
        """Give ``t`` (run at position ``i``) a block: its parent's, or a new one."""
        if t.op in INPLACE_OPS:
            k = in_place_parent(t, b, i, mem, last, bbuf)
            if k is not None:
                blk = mem.pop(k)  # the node takes over its parent's block
                add_tensor(t)
                add_owner(blk)
                if t not in keep:
                    mem[t] = blk
                return
        size = _nbytes(t) if fast_size[b] else buffer_types[b].alloc_size(t)
        a = align[b]
        blk = len(bsize)
        add_size(-(-size // a) * a)
        add_buf(b)
        add_first(i)
        add_last(END)
        add_tensor(t)
        add_owner(blk)
        add_event(blk)
        if t not in keep:
            mem[t] = blk

    # leafs first, so that no node is ever placed over them
    keep.update(leafs)
    for leaf, b in zip(leafs, leaf_buffer_ids, strict=True):
        if leaf in done:
            continue  # listed twice (the scheduler lists pipeline input slots as leafs)
        done.add(leaf)
        if leaf.view_src is not None:
            views.append(leaf)
        elif leaf.buffer is None:
            allocate(leaf, b, -1)

    # what is read last where, what must be kept; inputs are placed right away
    for inp, b in liveness(nodes, node_buffer_ids, last, keep, views, done):
        allocate(inp, b, -1)

    # every node in order: itself, then release what it was the last reader of
    for i, (node, b) in enumerate(zip(nodes, node_buffer_ids, strict=True)):
        if (
            node.buffer is None
            and node.view_src is None
            and type(node) is not Use
            and (node.flags is no_flags or node not in done)
        ):
            allocate(node, b, i)  # type: ignore[arg-type]
        for s in node.src:
            vs = s.view_src
            k = s if vs is None else vs
            if last[k] == i:
                blk = mem.pop(k, None)
                if blk is not None:
                    blast[blk] = i
                    add_event(~blk)
    return blocks


def liveness(
    nodes: Sequence[Tensor | Use],
    node_buffer_ids: Sequence[int],
    last: dict[Tensor, int],
    keep: set[Tensor],
    views: list[Tensor],
    done: set[Tensor | Use],
) -> list[tuple[Tensor, int]]:
    """The analysis pass of :func:`decide`: fills ``last`` (the position of the last node
    reading a tensor or its base), ``keep`` (inputs, outputs and the bases of output
    views, never released nor overwritten) and ``views``; returns the inputs that need a
    block before any node runs, with their buffer ids (marked ``done``)."""
    inputs: list[tuple[Tensor, int]] = []
    int_and, no_flags = int.__and__, _NO_FLAGS
    for i, (node, b) in enumerate(zip(nodes, node_buffer_ids, strict=True)):
        fl = node.flags
        vs = node.view_src
        if fl is not no_flags and int_and(fl, _INPUT | _OUTPUT):
            keep.add(node)  # type: ignore[arg-type]
            if vs is not None:
                keep.add(vs)  # an output view keeps its base for the caller
            if int_and(fl, _INPUT) and node not in done:
                done.add(node)
                if node.buffer is None and vs is None:
                    inputs.append((node, b))  # type: ignore[arg-type]
        if vs is not None:
            views.append(node)  # type: ignore[arg-type]
        for s in node.src:
            last[s] = i
            vs = s.view_src
            if vs is not None:
                last[vs] = i
    for v in views:
        if v not in last and v.op is not _NONE:
            keep.add(v.view_src)  # type: ignore[arg-type]
    return inputs


def in_place_parent(
    t: Tensor, b: int, i: int, mem: dict[Tensor, int], last: dict[Tensor, int], bbuf: list[int]
) -> Tensor | None:
    """The source whose block node ``t`` (at position ``i``, buffer ``b``) may compute
    into, as ggml's in-place reuse: a live block of the same buffer, which ``t`` is the
    last to read, with the same layout, reached from offset 0, and read through only
    one of ``t``'s sources (``add(x, transpose(x))`` must not overwrite ``x``)."""
    src = t.src
    for p in src:
        vs = p.view_src
        k = p if vs is None else vs
        blk = mem.get(k)
        if blk is None or last[k] != i or bbuf[blk] != b:
            continue
        if (vs is not None and p.view_offs) or not same_layout(t, p):
            continue
        if _reads(src, k) != 1:
            continue
        return k
    return None


def _reads(src: tuple[Tensor, ...], base: Tensor) -> int:
    """How many of ``src`` read the memory owned by ``base``."""
    n = 0
    for q in src:
        if q is base or q.view_src is base:
            n += 1
    return n


# -- placing: offsets for the blocks ------------------------------------------------------------


class Layout:
    """Offsets for :class:`Blocks`: ``chunk[k]``/``offset[k]`` per block, sizes per chunk."""

    __slots__ = ("chunk", "chunk_sizes", "offset")

    def __init__(self, chunk: list[int], offset: list[int], chunk_sizes: list[list[int]]) -> None:
        self.chunk = chunk
        self.offset = offset
        self.chunk_sizes = chunk_sizes

    def total(self, buffer_id: int) -> int:
        return sum(self.chunk_sizes[buffer_id])


def place_online(blocks: Blocks, buffer_types: Sequence[BufferType]) -> Layout:
    """Best fit in execution order, as ggml does: fast, and chunked by ``max_size``."""
    allocs = [_DynAlloc(bt) for bt in buffer_types]
    n = len(blocks.size)
    chunk, offset = [0] * n, [0] * n
    size, buf = blocks.size, blocks.buffer
    for ev in blocks.events:
        if ev >= 0:
            a = allocs[buf[ev]]
            if size[ev]:
                chunk[ev], offset[ev], _ = a.alloc(size[ev], blocks, ev)
            else:
                a.touch()
        elif size[~ev]:
            k = ~ev
            allocs[buf[k]].free(chunk[k], offset[k], size[k])
    return Layout(chunk, offset, [a.chunk_sizes() for a in allocs])


def place_compact(blocks: Blocks, buffer_types: Sequence[BufferType]) -> Layout:
    """Offline placement that knows every lifetime up front: largest blocks first.

    Each block goes into the tightest gap left by the blocks already placed that are
    live at the same time (greedy by size, as TFLite's arena planner). It usually
    reaches the peak of simultaneously live bytes where online best fit fragments, at
    the price of O(n²) vectorised work, so it runs when a plan is reserved. A buffer
    type whose ``max_size`` the result would exceed keeps the online placement.
    """
    import numpy as np

    online = place_online(blocks, buffer_types)
    if len(blocks.size) > COMPACT_MAX_BLOCKS:
        return online
    chunk, offset = list(online.chunk), list(online.offset)
    chunk_sizes = [list(c) for c in online.chunk_sizes]
    size = np.asarray(blocks.size, dtype=np.int64)
    first = np.asarray(blocks.first, dtype=np.int64)
    last = np.asarray(blocks.last, dtype=np.int64)
    buf = np.asarray(blocks.buffer, dtype=np.int64)
    for b, bt in enumerate(buffer_types):
        ks = np.flatnonzero((buf == b) & (size > 0))
        if not ks.size:
            continue
        offs, total = _greedy_by_size(first[ks], last[ks], size[ks])
        if total >= online.total(b) or total > bt.max_size:
            continue
        for k, o in zip(ks.tolist(), offs, strict=True):
            chunk[k], offset[k] = 0, o
        chunk_sizes[b] = [total]
    return Layout(chunk, offset, chunk_sizes)


def _greedy_by_size(first: Any, last: Any, size: Any) -> tuple[list[int], int]:
    import numpy as np

    n = len(size)
    offs = [0] * n
    # blocks live for the whole graph (leafs, inputs) conflict with everything: they
    # are stacked at the bottom, and the rest is packed above them
    always = ((first < 0) & (last == END)).tolist()
    base = 0
    s_l = size.tolist()
    for k in range(n):
        if always[k]:
            offs[k] = base
            base += s_l[k]
    rest = [k for k in np.lexsort((first, -size)).tolist() if not always[k]]
    f_l, l_l = first.tolist(), last.tolist()
    pf = np.empty(n, dtype=np.int64)  # placed so far: lifetimes and extents
    pl = np.empty(n, dtype=np.int64)
    po = np.empty(n, dtype=np.int64)
    pe = np.empty(n, dtype=np.int64)
    total = base
    for m, k in enumerate(rest):
        f, l, s = f_l[k], l_l[k], s_l[k]
        off = base
        if m:
            hit = np.flatnonzero((pf[:m] <= l) & (pl[:m] >= f))
            if hit.size:
                o, e = po[hit], pe[hit]
                srt = np.argsort(o, kind="stable")
                best_gap, prev = -1, base
                for start, end in zip(o[srt].tolist(), e[srt].tolist(), strict=True):
                    gap = start - prev
                    if gap >= s and (best_gap < 0 or gap < best_gap):
                        best_gap, off = gap, prev
                    if end > prev:
                        prev = end
                if best_gap < 0:
                    off = prev
        offs[k] = off
        pf[m], pl[m], po[m], pe[m] = f, l, off, off + s
        if off + s > total:
            total = off + s
    return offs, total


def _nbytes(t: Tensor) -> int:
    """``t.nbytes``, several times faster for unquantized types (planning is a hot path)."""
    tt = t.type
    if _BLOCK[tt] != 1:
        return t.nbytes
    n = _TYPE_SIZE[tt]
    for d, s in zip(t.shape, t.strides):  # noqa: B905 - same length by construction
        if not d:
            return 0
        n += (d - 1) * s
    return n


_BLOCK = {t: t.block_size for t in Type}
_TYPE_SIZE = {t: t.type_size for t in Type}


def same_layout(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` lay out the same elements in the same bytes."""
    return a.type is b.type and a.shape == b.shape and a.strides == b.strides

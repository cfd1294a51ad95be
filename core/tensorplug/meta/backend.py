"""The meta device's backend: every graph runs on every member, on the member's parts.

Each node is built again for each member (:func:`tensorplug.rebuild.rebuild`) from the
member's parts of its sources, with the member's part of its shape, and placed where
the meta buffer keeps that member's part. A mirrored source that a split computation
needs is cut on the fly: each member reads its range of its own full copy through a
view. After a node whose result is a *partial* sum (a ``mul_mat`` over a split
reduction axis), the members' graphs are cut: every member computes its piece, then an
all-reduce adds the partial results up on every member before the next piece starts.

The all-reduce goes through the members' own copy paths (``tensor_copy_async``, so a
backend's device-to-device copy is used where it has one): the partial sums are
gathered onto the first member, added there, and the sum is copied back to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import ops
from ..backend import Backend, Status
from ..buffer import Buffer
from ..errors import UnsupportedError
from ..graph import Graph
from ..opcodes import VIEW_OPS, Op
from ..rebuild import rebuild
from ..tensor import Tensor, contiguous_strides
from ..transfer import tensor_copy_async
from .split import SplitState, member_offset, np_axis, slice_shape

if TYPE_CHECKING:
    from .device import MetaDevice

__all__ = ["MetaBackend"]


class _Piece:
    """Nodes every member computes before the all-reduce of ``reduce`` (if any)."""

    def __init__(self, n: int) -> None:
        self.nodes: list[list[Tensor]] = [[] for _ in range(n)]
        self.reduce: list[Tensor] | None = None


class MetaBackend(Backend):
    """One stream per member; a compute runs the members' graphs side by side."""

    def __init__(self, device: MetaDevice) -> None:
        super().__init__(device)
        self.meta = device
        self.members: tuple[Backend, ...] = tuple(d.init_backend() for d in device.members)
        self._scratch: Buffer | None = None
        self._cache: tuple[object, list[_Piece]] | None = None
        self.all_reduce_s = 0.0  # time spent in all-reduces, for benchmarks

    def free(self) -> None:
        if self._scratch is not None:
            self._scratch.free()
        for b in self.members:
            b.free()

    def synchronize(self) -> None:
        for b in self.members:
            b.synchronize()

    # -- compute ------------------------------------------------------------------------

    def _graph_compute(self, graph: Graph) -> Status:
        import time

        pieces = self._expand(graph)
        for piece in pieces:
            for b, nodes in zip(self.members, piece.nodes, strict=True):
                if nodes:
                    status = b.graph_compute_async(Graph.from_parts(nodes, ()))
                    if status is not Status.SUCCESS:
                        return status
            if piece.reduce is not None:
                t0 = time.perf_counter()
                self.synchronize()
                self._all_reduce(piece.reduce)
                self.all_reduce_s += time.perf_counter() - t0
        return Status.SUCCESS

    def _fingerprint(self, graph: Graph) -> object:
        return (id(graph), tuple(
            (id(n), n.offset, id(n.buffer), tuple(id(s) for s in n.src)) for n in graph.nodes
        ))  # fmt: skip

    def _expand(self, graph: Graph) -> list[_Piece]:
        key = self._fingerprint(graph)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        n = len(self.members)
        done: dict[int, list[Tensor]] = {}
        pieces = [_Piece(n)]
        for node in graph.nodes:
            if node.op is Op.NONE:
                continue
            parts = self._node_parts(node, done)
            done[id(node)] = parts
            if node.op not in VIEW_OPS:
                for i, p in enumerate(parts):
                    pieces[-1].nodes[i].append(p)
            if self.meta.plan_of(node).all_reduce:
                pieces[-1].reduce = parts
                pieces.append(_Piece(n))
        self._cache = (key, pieces)
        return pieces

    def _parts_of(self, t: Tensor, done: dict[int, list[Tensor]]) -> list[Tensor]:
        hit = done.get(id(t))
        if hit is not None:
            return hit
        if t.view_src is None:
            buf = t.buffer
            from .device import MetaBuffer

            if not isinstance(buf, MetaBuffer) or buf.meta is not self.meta:
                raise UnsupportedError(
                    f"{t.describe()} is not in {self.meta.name}'s memory; allocate it with "
                    "the meta device's buffer type (a Scheduler copies split inputs for you)"
                )
            parts = buf.parts(t)
        else:  # a view made outside this graph: rebuild it on the members' parts
            parts = self._node_parts(t, done)
        done[id(t)] = parts
        return parts

    def _node_parts(self, node: Tensor, done: dict[int, list[Tensor]]) -> list[Tensor]:
        meta = self.meta
        plan = meta.plan_of(node)
        srcs = [self._parts_of(s, done) for s in node.src]
        out = plan.out if plan.out.is_split else SplitState.mirrored()
        parts = []
        for i, member_buf in enumerate(self._member_buffers(node)):
            src_i = [
                _cut(parts_s[i], s, cut, i) if cut is not None else parts_s[i]
                for s, parts_s, cut in zip(node.src, srcs, plan.cut, strict=True)
            ]
            shape = slice_shape(node, out, i)
            strides = node.strides if not out.is_split else contiguous_strides(node.type, shape)
            params = dict(node.op_params)
            if node.op is Op.VIEW and out.is_split:
                src = node.src[0]
                params["offset"] = member_offset(src, meta.state_of(src), i, params["offset"])
            p = rebuild(node.op, src_i, params, shape, strides)
            if p.shape != shape:
                raise UnsupportedError(
                    f"{node.describe()}: member {meta.members[i].name}'s part came out "
                    f"{list(p.shape)}, expected {list(shape)}"
                )
            p.name, p.flags = node.name, node.flags
            if p.view_src is None:
                if member_buf is None:
                    raise UnsupportedError(f"{node.describe()} has no memory on {meta.name}")
                p.buffer, p.offset = member_buf, node.offset
                member_buf.init_tensor(p)
            else:
                base = p.view_src
                p.buffer, p.offset = base.buffer, base.offset + p.view_offs
                if base.buffer is not None:
                    base.buffer.init_tensor(p)
            parts.append(p)
        return parts

    def _member_buffers(self, node: Tensor) -> Sequence[Buffer | None]:
        from .device import MetaBuffer

        buf = node.buffer
        if node.view_src is None and isinstance(buf, MetaBuffer):
            return buf.members
        return [None] * len(self.members)

    # -- all-reduce ---------------------------------------------------------------------

    def _scratch_for(self, like: Tensor) -> Tensor:
        need = like.nbytes
        if self._scratch is None or self._scratch.size < need:
            if self._scratch is not None:
                self._scratch.free()
            self._scratch = self.members[0].buffer_type().alloc_buffer(need)
        t = Tensor(like.type, like.shape, name="all_reduce_scratch")
        t.buffer, t.offset = self._scratch, 0
        self._scratch.init_tensor(t)
        return t

    def _all_reduce(self, partials: list[Tensor]) -> None:
        """Sum the members' partial results into every member's copy."""
        first, b0 = partials[0], self.members[0]
        scratch = self._scratch_for(first)
        for p, b in zip(partials[1:], self.members[1:], strict=True):
            tensor_copy_async(b, b0, p, scratch)
            total = ops.add(first, scratch)
            total.buffer, total.offset = first.buffer, first.offset  # in place
            b0.graph_compute(Graph.from_parts([total], ()))  # this node alone
        for p, b in zip(partials[1:], self.members[1:], strict=True):
            tensor_copy_async(b0, b, first, p)
        self.synchronize()


def _cut(full: Tensor, src: Tensor, state: SplitState, member: int) -> Tensor:
    """Member ``member``'s range of its full copy of ``src``, as a strided view."""
    ax = np_axis(int(state.axis), full.ndim)
    ranges = state.ranges(member)
    if len(ranges) != 1:
        raise UnsupportedError(f"cannot cut {src.describe()} into a segmented split on the fly")
    start, stop = ranges[0]
    shape = list(full.shape)
    shape[ax] = stop - start
    per = full.type.block_size if ax == full.ndim - 1 else 1  # bytes of a block, not element
    view = ops.view(full, shape, full.strides, start * full.strides[ax] // per)
    base = view.base
    view.buffer, view.offset = base.buffer, base.offset + view.view_offs
    return view

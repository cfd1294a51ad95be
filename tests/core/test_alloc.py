"""The graph allocator: reuse without overlap, in-place rules, growth, static tensors.

The liveness model the plans are checked against is written here independently of the
allocator: a tensor is live from the step that produces it (leafs and inputs: from the
start) to the last step reading it directly or through a view; leafs, inputs, outputs,
tensors nobody reads and bases of views nobody reads live to the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.alloc import INPLACE_OPS, AllocPlan, GraphAllocator, alloc_tensors
from tensorplug.alloc_plan import Blocks, Placement, _DynAlloc
from tensorplug.errors import AllocationError, NotAllocatedError
from tensorplug.host import HostBuffer, HostBufferType

sys.path.insert(0, str(Path(__file__).parents[1] / "plugins_sched"))
import schedkit

END = 10**9


class SmallHost(HostBufferType):
    """Host memory with a small alignment and an optional cap on one buffer."""

    def __init__(self, alignment: int = 16, max_size: int | None = None) -> None:
        super().__init__()
        self._alignment, self._max = alignment, max_size
        self.allocated: list[int] = []

    @property
    def name(self) -> str:
        return "SmallHost"

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def max_size(self) -> int:
        return self._max if self._max is not None else super().max_size

    def _alloc_buffer(self, size: int) -> HostBuffer:
        self.allocated.append(size)
        return super()._alloc_buffer(size)


def _f32(shape: tuple[int, ...], name: str) -> tp.Tensor:
    return tp.new_tensor(Type.F32, shape, name)


# -- an independent liveness model -----------------------------------------------------------


def _lifetimes(graph: tp.Graph) -> dict[int, tuple[int, int]]:
    """``id(tensor) -> (first step, last step)`` for every tensor owning memory."""
    step = {id(t): i for i, t in enumerate(graph.nodes)}
    last: dict[int, int] = {}
    read_views: set[int] = set()
    for i, node in enumerate(graph.nodes):
        for s in node.src:
            read_views.add(id(s))
            owner = s.view_src if s.view_src is not None else s
            last[id(owner)] = max(last.get(id(owner), -1), i)
    out: dict[int, tuple[int, int]] = {}
    for t in [*graph.leafs, *graph.nodes]:
        if t.view_src is not None:
            if id(t) not in read_views or t.flags & tp.TensorFlag.OUTPUT:
                base = id(t.view_src)
                first, _ = out.get(base, (step.get(base, -1), END))
                out[base] = (first, END)
            continue
        first = step.get(id(t), -1)
        if t.op is tp.Op.NONE or t.flags & (tp.TensorFlag.INPUT | tp.TensorFlag.OUTPUT):
            out[id(t)] = (-1 if t.op is tp.Op.NONE or t.flags & tp.TensorFlag.INPUT else first, END)
        elif id(t) in out:
            out[id(t)] = (first, out[id(t)][1])
        else:
            out[id(t)] = (first, last.get(id(t), END))
    return out


def _in_place(child: tp.Tensor, parent: tp.Tensor) -> bool:
    return child.op in INPLACE_OPS and any(s is parent or s.view_src is parent for s in child.src)


def _placed(plan: AllocPlan, t: tp.Tensor) -> Placement:
    """``plan.placement(t)``, for a tensor the test knows owns a block."""
    p = plan.placement(t)
    assert p is not None
    return p


def check_plan(graph: tp.Graph, plan: AllocPlan, alignment: int) -> int:
    """Assert no two simultaneously live tensors overlap; return the live-bytes peak."""
    life = _lifetimes(graph)
    all_placed = [(t, plan.placement(t)) for t in [*graph.leafs, *graph.nodes]]
    placed = [(t, p) for t, p in all_placed if p is not None and p.size]
    for t, p in placed:
        assert p.offset % alignment == 0
        assert p.size >= t.nbytes
    for i, (a, pa) in enumerate(placed):
        la = life[id(a)]
        for b, pb in placed[i + 1 :]:
            if (pa.buffer_id, pa.chunk) != (pb.buffer_id, pb.chunk):
                continue
            if pa.offset >= pb.offset + pb.size or pb.offset >= pa.offset + pa.size:
                continue
            lb = life[id(b)]
            if la[1] < lb[0] or lb[1] < la[0]:
                continue
            # sharing is only allowed when b is computed in place over a, at a's last read
            assert pa.offset == pb.offset and lb[0] == la[1] and _in_place(b, a), (
                f"{a.describe()} {pa} live {la} overlaps {b.describe()} {pb} live {lb}"
            )
    steps = range(-1, len(graph.nodes) + 1)
    peak = 0
    for s in steps:
        blocks = {(p.buffer_id, p.chunk, p.offset): p.size for t, p in placed
                  if life[id(t)][0] <= s <= life[id(t)][1]}  # fmt: skip
        peak = max(peak, sum(blocks.values()))
    return peak


def _chain(n: int = 6) -> tp.Graph:
    x = _f32((8, 32), "x")
    w = _f32((32, 32), "w")
    cur = x
    for i in range(n):
        cur = ops.mul_mat(w, cur).set_name(f"mm{i}")
    return tp.Graph(cur.set_output())


def _diamond() -> tp.Graph:
    x = _f32((16, 16), "x")
    w = _f32((16, 16), "w")
    top = ops.mul_mat(w, x).set_name("top")
    left = ops.mul_mat(w, top).set_name("left")
    right = ops.mul_mat(w, ops.silu(top)).set_name("right")
    bottom = ops.mul_mat(w, ops.mul_mat(w, left) + right).set_name("bottom")
    return tp.Graph(bottom.set_output())


def _block() -> tp.Graph:
    return schedkit.build_llama(n_layer=1, n_tokens=8, n_embd=32, n_head=4, n_ff=64).graph


@pytest.mark.parametrize("build", [_chain, _diamond, _block], ids=["chain", "diamond", "block"])
def test_plans_never_overlap_live_tensors_and_stay_within_the_live_peak(build) -> None:
    graph = build()
    buft = SmallHost(alignment=64)
    plan = GraphAllocator(buft).reserve(graph)
    peak = check_plan(graph, plan, 64)
    assert 0 < plan.sizes[0] <= peak
    # and reuse really happened: far less than giving every tensor its own block
    total = sum(-(-t.nbytes // 64) * 64 for t in [*graph.leafs, *graph.nodes] if t.view_src is None)
    assert plan.sizes[0] < total


def test_chain_reuses_two_blocks_and_leafs_stay() -> None:
    g = _chain(6)
    plan = GraphAllocator(SmallHost(alignment=16)).reserve(g)
    x, w = g.leafs
    leaf_blocks = {_placed(plan, x).offset, _placed(plan, w).offset}
    mm = [_placed(plan, t).offset for t in g.nodes]
    # mul_mat cannot run in place: consecutive results alternate between two blocks
    assert len(set(mm)) == 2 and mm[0] != mm[1] and mm[0] == mm[2]
    assert not leaf_blocks & set(mm)
    assert plan.sizes[0] == 1024 + 4096 + 2 * 1024  # x, w, and two result blocks


def test_unary_chain_runs_in_place_over_intermediates_but_not_over_leafs() -> None:
    x = _f32((4, 64), "x")
    a = ops.silu(x).set_name("a")
    b = ops.neg(a).set_name("b")
    c = ops.scale(b, 2.0).set_name("c")
    d = ops.exp(c).set_name("d").set_output()
    plan = GraphAllocator(SmallHost()).reserve(tp.Graph(d))
    off = {t.name: _placed(plan, t).offset for t in (x, a, b, c, d)}
    assert off["a"] != off["x"]  # leafs hold user data: never overwritten
    assert off["a"] == off["b"] == off["c"] == off["d"]
    assert plan.sizes[0] == 2 * 1024


def test_in_place_needs_last_reader_same_layout_and_an_owned_block() -> None:
    x = _f32((4, 64), "x")
    a = ops.silu(x).set_name("a")
    twice = ops.neg(a).set_name("twice")  # a is read again later: not in place
    later = ops.add(a, twice).set_name("later")  # last reader of a: in place over a
    out_parent = ops.relu(later).set_name("out_parent").set_output()
    after_out = ops.neg(out_parent).set_name("after_out")  # parent is an output: new block
    t_view = ops.transpose(after_out).set_name("t")
    diff_layout = ops.neg(t_view).set_name("diff_layout")  # a transposed view: new layout
    inp = _f32((4, 64), "inp").set_input()
    over_input = ops.add(inp, x).set_name("over_input")  # inputs are kept
    g = tp.Graph([diff_layout, over_input.set_output()])
    plan = GraphAllocator(SmallHost()).reserve(g)

    def off(t: tp.Tensor) -> int:
        return _placed(plan, t).offset

    assert off(twice) != off(a)
    assert off(later) == off(a)
    assert off(out_parent) == off(later)
    assert off(after_out) != off(out_parent)
    assert off(diff_layout) != off(after_out)
    assert off(over_input) not in (off(inp), off(x))
    check_plan(g, plan, 16)


def test_in_place_over_a_view_needs_offset_zero_and_no_other_view() -> None:
    x = _f32((8, 32), "x")
    base = ops.silu(x).set_name("base")
    whole = ops.view(base, (8, 32)).set_name("whole")
    inplace = ops.neg(whole).set_name("inplace")  # the only view, at offset 0: reuse
    base2 = ops.exp(x).set_name("base2")
    tail = ops.view(base2, (4, 32), offset=4 * 32 * 4).set_name("tail")
    not_inplace = ops.neg(tail).set_name("not_inplace")  # offset != 0: a new block
    g = tp.Graph([inplace.set_output(), not_inplace.set_output()])
    plan = GraphAllocator(SmallHost()).reserve(g)
    assert _placed(plan, inplace).offset == _placed(plan, base).offset
    assert _placed(plan, not_inplace).offset != _placed(plan, base2).offset
    assert plan.placement(whole) is None  # views take no memory
    check_plan(g, plan, 16)


def test_views_keep_their_base_alive_until_their_last_reader() -> None:
    x = _f32((8, 32), "x")
    w = _f32((32, 32), "w")
    base = ops.mul_mat(w, x).set_name("base")
    v = ops.reshape(base, (256,)).set_name("v")
    filler = [ops.mul_mat(w, x).set_name(f"f{i}") for i in range(3)]
    acc = filler[0]
    for f in filler[1:]:
        acc = ops.mul_mat(w, acc + f)
    late = ops.add(ops.reshape(acc, (256,)), v).set_name("late").set_output()
    g = tp.Graph(late)
    plan = GraphAllocator(SmallHost()).reserve(g)
    check_plan(g, plan, 16)
    b = plan.placement(base)
    assert b is not None
    for t in g.nodes[g.nodes.index(base) + 1 : g.nodes.index(late)]:
        p = plan.placement(t)
        if p is not None:
            assert p.offset >= b.offset + b.size or p.offset + p.size <= b.offset, t.describe()


def test_dyn_alloc_best_fit_merges_neighbours() -> None:
    a = _DynAlloc(SmallHost(alignment=16))
    blocks = Blocks()  # only read to name a tensor in an error
    offs = [a.alloc(n, blocks, 0)[1] for n in (96, 32, 48, 32)]
    assert offs == [0, 96, 128, 176]
    a.free(0, 0, 96)
    a.free(0, 128, 48)
    assert a.alloc(48, blocks, 0) == (0, 128, 48)  # the tighter hole beats the 96-byte one
    a.free(0, 96, 32)  # merges with the hole before it: [0, 128)
    ch = a.chunks[0]
    assert ch.offs[:1] == [0] and ch.sizes[:1] == [128]
    a.free(0, 176, 32)  # merges with the tail
    assert ch.offs[-1] == 176
    assert a.alloc(128, blocks, 0) == (0, 0, 128)
    assert a.chunk_sizes() == [208]


def test_dyn_alloc_freeing_a_block_between_two_holes_merges_all_three() -> None:
    a = _DynAlloc(SmallHost(alignment=16))
    blocks = Blocks()
    offs = [a.alloc(n, blocks, 0)[1] for n in (32, 48, 64, 16)]
    assert offs == [0, 32, 80, 144]
    a.free(0, 0, 32)
    a.free(0, 80, 64)
    ch = a.chunks[0]
    assert ch.offs[:2] == [0, 80] and ch.sizes[:2] == [32, 64]
    a.free(0, 32, 48)  # between the two holes: one hole [0, 144) remains, not two
    assert ch.offs[:-1] == [0] and ch.sizes[:-1] == [144]
    # the merged hole takes a block larger than either neighbour, without growing the chunk
    assert a.alloc(144, blocks, 0) == (0, 0, 144)
    assert a.chunk_sizes() == [160]


def test_in_place_never_overwrites_a_base_that_the_same_node_reads_twice() -> None:
    x = _f32((16, 16), "x").set_input()
    a = ops.silu(x).set_name("a")
    y = ops.add(a, ops.transpose(a)).set_name("y").set_output()  # reads a twice, a's last use
    single = ops.neg(ops.exp(x).set_name("e")).set_name("single").set_output()  # read once
    g = tp.Graph([y, single])
    plan = GraphAllocator(SmallHost()).reserve(g)
    assert _placed(plan, y).offset != _placed(plan, a).offset
    e = g.nodes[[n.name for n in g.nodes].index("e")]
    assert _placed(plan, single).offset == _placed(plan, e).offset  # the rule still reuses
    check_plan(g, plan, 16)


def test_dyn_alloc_picks_the_chunk_tail_that_grows_least() -> None:
    """With several chunks and no hole big enough, a tensor goes to a chunk's tail: one
    where it fits below the chunk's size (the tightest such), else the one growing least."""
    a = _DynAlloc(SmallHost(alignment=16, max_size=256))
    blocks = Blocks()
    assert [a.alloc(n, blocks, 0) for n in (96, 96)] == [(0, 0, 96), (0, 96, 96)]
    assert a.alloc(160, blocks, 0) == (1, 0, 160)  # chunk 0's tail (64) is too small
    a.free(0, 96, 96)  # chunk 0: tail [96, 256), size 192; chunk 1: tail [160, 256), size 160
    assert a.alloc(64, blocks, 0) == (0, 96, 64)  # fits below chunk 0's size; chunk 1 grows
    assert a.alloc(48, blocks, 0) == (0, 160, 48)  # both grow: chunk 0 by 16, chunk 1 by 48
    assert a.chunk_sizes() == [208, 160]
    a.free(1, 0, 160)  # chunk 1: tail [0, 256), 160 below its size
    a.free(0, 160, 48)  # chunk 0: tail [160, 256), 48 below its size
    assert a.alloc(32, blocks, 0) == (0, 160, 32)  # both fit without growing: the tighter
    assert a.alloc(96, blocks, 0) == (1, 0, 96)  # chunk 0's tail (96 - 32 = 64) is too small
    assert a.chunk_sizes() == [208, 160]
    assert a.alloc(256, blocks, 0) == (2, 0, 256)  # no tail holds it: a new chunk


def test_dyn_alloc_tail_ties_and_exact_fits() -> None:
    a = _DynAlloc(SmallHost(alignment=16, max_size=128))
    blocks = Blocks()
    for chunk in range(3):  # three chunks, each 96 bytes used, a 32-byte tail
        assert a.alloc(96, blocks, 0) == (chunk, 0, 96)
    a.free(0, 32, 64)  # chunk 0: tail [32, 128): 64 bytes below its size
    a.free(1, 64, 32)  # chunk 1: tail [64, 128): 32 bytes below its size
    a.free(2, 48, 48)  # chunk 2: tail [48, 128): 48 below its size
    assert a.alloc(32, blocks, 0) == (1, 64, 32)  # an exact fit beats looser later ones
    assert a.alloc(48, blocks, 0) == (2, 48, 48)  # the tightest, though not the first
    assert a.chunk_sizes() == [96, 96, 96]
    assert a.alloc(64, blocks, 0) == (0, 32, 64)  # ends exactly at the chunk's size
    assert a.alloc(32, blocks, 0) == (0, 96, 32)  # tails of exactly 32; all grow: the first
    assert a.chunk_sizes() == [128, 96, 96]


def test_an_allocation_within_the_reserved_plan_replays_its_offsets() -> None:
    """alloc_graph after reserve() reuses the reserved (compact) offsets when the new graph
    has the same block lifetimes and no larger block, and plans afresh otherwise."""

    def llama(n_layer: int, n_tokens: int) -> tp.Graph:
        return schedkit.build_llama(
            n_layer=n_layer, n_tokens=n_tokens, n_embd=32, n_head=4, n_ff=64
        ).graph

    def offsets(g: tp.Graph, plan: AllocPlan) -> list[int | None]:
        return [None if (p := plan.placement(t)) is None else p.offset for t in g.nodes]

    def afresh(g: tp.Graph) -> list[int | None]:  # a new allocator: nothing to replay
        return offsets(g, GraphAllocator(SmallHost(alignment=16)).alloc_graph(g))

    big = llama(2, 16)
    ga = GraphAllocator(SmallHost(alignment=16))
    compact = offsets(big, ga.reserve(big))
    assert offsets(big, ga.alloc_graph(big)) == compact
    small = llama(2, 8)  # same lifetimes, smaller blocks: the reserved offsets replayed
    assert offsets(small, ga.alloc_graph(small)) == compact
    assert afresh(llama(2, 8)) != compact  # and that differs from planning afresh
    other = llama(1, 8)  # other lifetimes: nothing replayed, a valid plan of its own
    fresh = ga.alloc_graph(other)
    assert offsets(other, fresh) != compact[: len(other.nodes)]
    check_plan(other, fresh, 16)


def test_a_graph_with_other_lifetimes_is_not_given_the_reserved_offsets() -> None:
    """Same number and sizes of blocks, in one buffer, but other lifetimes: replaying the
    reserved offsets would overlap tensors that are live together."""

    def graph(chain: bool) -> tp.Graph:
        x, w = _f32((8, 32), "x"), _f32((32, 32), "w")
        a = ops.mul_mat(w, x).set_name("a")
        b = ops.mul_mat(w, a).set_name("b")
        c = ops.mul_mat(w, b if chain else a).set_name("c").set_output()
        return tp.Graph([c] if chain else [b.set_output(), c])

    ga = GraphAllocator(SmallHost(alignment=16))
    reserved = ga.reserve(graph(chain=True))  # a and c share: a is dead when c runs
    p = {t.name: reserved.placement(t) for t in reserved.blocks.tensors}
    assert p["a"] is not None
    assert p["a"] == p["c"] == (0, 0, p["a"].offset, 1024)  # buffer 0, chunk 0, 1 KiB
    other = graph(chain=False)  # the same steps, but c reads a
    plan = ga.alloc_graph(other)
    assert [t.name for t in other.nodes] == ["a", "b", "c"]
    assert plan.blocks.first == reserved.blocks.first
    assert plan.blocks.size == reserved.blocks.size
    check_plan(other, plan, 16)


def test_max_size_splits_the_plan_into_chunks_and_buffers() -> None:
    buft = SmallHost(alignment=16, max_size=1024)
    x = _f32((4, 64), "x")  # 1 KiB each: every tensor fills a chunk
    y = ops.exp(ops.silu(x) + x).set_output()
    z = ops.mul_mat(_f32((64, 64), "w2"), y).set_output()
    with pytest.raises(AllocationError, match="at most 1024 bytes"):
        GraphAllocator(buft).reserve(tp.Graph(z))
    small = ops.mul_mat(_f32((4, 64), "w"), y).set_name("small").set_output()
    g = tp.Graph(small)
    ga = GraphAllocator(buft)
    plan = ga.alloc_graph(g)
    assert len(plan.chunk_sizes[0]) > 1 and max(plan.chunk_sizes[0]) <= 1024
    buffer = ga.buffer()
    assert isinstance(buffer, tp.MultiBuffer)
    assert {t.buffer for t in g.nodes if t.view_src is None} <= set(buffer.buffers)
    check_plan(g, plan, 16)


def test_alloc_graph_reuses_reserved_buffers_grows_and_unplaces_the_old_graph() -> None:
    buft = SmallHost()
    ga = GraphAllocator(buft)
    big = schedkit.build_llama(n_layer=1, n_tokens=16, n_embd=32).graph
    ga.reserve(big)
    assert len(buft.allocated) == 1
    reserved = ga.buffer()
    small = schedkit.build_llama(n_layer=1, n_tokens=4, n_embd=32)
    ga.alloc_graph(small.graph)
    assert ga.buffer() is reserved and len(buft.allocated) == 1  # it fits: no realloc
    assert small.logits.buffer is reserved
    bigger = schedkit.build_llama(n_layer=2, n_tokens=32, n_embd=32)
    ga.alloc_graph(bigger.graph)
    assert len(buft.allocated) == 2 and reserved.is_freed
    assert ga.last_plan is not None
    assert ga.buffer_size(0) == ga.last_plan.sizes[0] > buft.allocated[0]
    with pytest.raises(NotAllocatedError, match="tensor 'logits' .* has no memory yet"):
        tp.get_array(small.logits)  # its memory now belongs to the new graph
    ga.alloc_graph(bigger.graph)  # the same graph again: placed afresh, no realloc
    assert len(buft.allocated) == 2 and bigger.logits.buffer is ga.buffer()


def test_buffer_ids_share_memory_per_buffer_type() -> None:
    host, other = SmallHost(), SmallHost()
    ga = GraphAllocator([host, other, host])
    x = _f32((4, 8), "x")
    a, b, c = ops.exp(x), ops.neg(x), ops.silu(x)
    g = tp.Graph([a.set_output(), b.set_output(), c.set_output()])
    plan = ga.alloc_graph(g, node_buffer_ids=[0, 1, 2], leaf_buffer_ids=[1])
    assert a.buffer is c.buffer is ga.buffer(0) is ga.buffer(2)
    assert b.buffer is x.buffer is ga.buffer(1)
    assert ga.buffer_size(2) == 0 and plan.sizes == [256, 256, 0]
    with pytest.raises(ValueError, match="range"):
        ga.alloc_graph(g, node_buffer_ids=[0, 1, 3])


def test_alloc_tensors_packs_aligned_splits_by_max_size_and_inits_views() -> None:
    buft = SmallHost(alignment=32, max_size=256)
    ts = [_f32((n,), f"t{n}") for n in (10, 30, 40, 20)]  # 40, 120, 160, 80 bytes
    view = ops.view(ts[2], (5,), offset=20)
    buf = alloc_tensors([*ts, view], buft, usage=tp.BufferUsage.WEIGHTS)
    assert isinstance(buf, tp.MultiBuffer) and [b.size for b in buf.buffers] == [192, 256]
    assert [t.offset for t in ts] == [0, 64, 0, 160]
    assert ts[0].buffer is ts[1].buffer is buf.buffers[0]
    assert view.buffer is ts[2].buffer and view.offset == 20
    assert all(b.usage is tp.BufferUsage.WEIGHTS for b in buf.buffers)
    assert alloc_tensors(ts, buft) is None  # all already allocated
    with pytest.raises(AllocationError, match="more than"):
        alloc_tensors([_f32((100,), "big")], buft)


def test_alloc_tensors_failure_leaves_nothing_placed() -> None:
    class Failing(SmallHost):
        def _alloc_buffer(self, size: int) -> HostBuffer:
            if self.allocated:
                raise AllocationError("out of memory")
            return super()._alloc_buffer(size)

    ts = [_f32((64,), "a"), _f32((64,), "b")]
    with pytest.raises(AllocationError, match="out of memory"):
        alloc_tensors(ts, Failing(max_size=256))
    assert all(t.buffer is None for t in ts)


def test_allocated_llama_computes_like_numpy_and_again_with_the_same_inputs() -> None:
    cpu = tp.registry.init_by_name("CPU")
    m = schedkit.build_llama(n_layer=2, n_tokens=8, n_embd=32, n_head=4, n_ff=64)
    wv, iv = m.weight_values(), m.input_values()
    alloc_tensors(list(m.weights.values()), cpu.buffer_type())
    for name, t in m.weights.items():
        tp.set_array(t, wv[name])
    ga = GraphAllocator(cpu.buffer_type())
    plan = ga.alloc_graph(m.graph)
    check_plan(m.graph, plan, cpu.buffer_type().alignment)
    m.set_inputs(iv)
    expected = schedkit.llama_reference(m, wv, iv)
    for _ in range(2):  # inputs are never overwritten, so a second run agrees
        assert cpu.graph_compute(m.graph) is tp.Status.SUCCESS
        np.testing.assert_allclose(tp.get_array(m.logits), expected, rtol=1e-4, atol=1e-4)


def test_allocation_in_chunks_and_device_memory_computes_correctly() -> None:
    reg = schedkit.TestAccelReg(n_devices=1, max_size=4096)
    dev = reg.devices()[0]
    be = dev.init_backend()
    x = _f32((8, 32), "x").set_input()
    w = _f32((32, 32), "w")
    h = ops.silu(ops.mul_mat(w, x))
    y = ops.mul_mat(w, ops.rms_norm(h * h + x, 1e-5)).set_name("y").set_output()
    g = tp.Graph(y)
    ga = GraphAllocator(dev.buffer_type())
    plan = ga.alloc_graph(g)
    assert len(plan.chunk_sizes[0]) >= 2
    rng = np.random.default_rng(3)
    xv, wv = rng.standard_normal((8, 32), np.float32), rng.standard_normal((32, 32), np.float32)
    tp.set_array(x, xv)
    tp.set_array(w, wv)
    assert be.graph_compute(g) is tp.Status.SUCCESS
    hv = xv @ wv.T
    hv = hv / (1 + np.exp(-hv))
    r = hv * hv + xv
    r = r / np.sqrt((r * r).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(tp.get_array(y), r @ wv.T, rtol=1e-4, atol=1e-4)


def test_alloc_tensors_places_a_tensor_listed_twice_once() -> None:
    a = tp.new_tensor(tp.Type.F32, (16,), "a")
    b = tp.new_tensor(tp.Type.F32, (16,), "b")
    buf = tp.alloc_tensors([a, b, a], tp.host_buffer_type())
    assert buf is not None and buf.size == 128
    assert (a.buffer, a.offset, b.offset) == (buf, 0, 64)


def test_in_place_parent_is_the_one_source_read_once() -> None:
    """The in-place rule alone: which parent a node may compute into."""
    from tensorplug.alloc_plan import in_place_parent

    x = ops.scale(_f32((8, 8), "leaf"), 1.0).set_name("x")
    other = ops.scale(_f32((8, 8), "leaf2"), 1.0).set_name("other")
    mem, last, bbuf = {x: 0, other: 1}, {x: 5, other: 5}, [0, 0]
    assert in_place_parent(ops.add(x, other), 0, 5, mem, last, bbuf) is x
    assert in_place_parent(ops.add(x, ops.transpose(x)), 0, 5, mem, last, bbuf) is None
    assert in_place_parent(ops.add(other, x), 0, 5, mem, last, bbuf) is other
    assert in_place_parent(ops.add(x, other), 1, 5, mem, last, bbuf) is None  # other buffer
    assert in_place_parent(ops.add(x, other), 0, 4, mem, last, bbuf) is None  # read later
    assert in_place_parent(ops.add(x, other), 0, 5, {}, last, bbuf) is None  # no live block

"""graph_copy: an allocated graph and its data, copied onto another backend."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.alloc import GraphAllocator, alloc_tensors
from tensorplug.errors import NotAllocatedError
from tensorplug.graph_copy import graph_copy
from tensorplug.registry import init_by_name

sys.path.insert(0, str(Path(__file__).parents[1] / "plugins_sched"))
import schedkit


def _mlp() -> tuple[tp.Graph, dict[str, tp.Tensor]]:
    x = tp.new_tensor(Type.F32, (6, 32), "x").set_input()
    w1 = tp.new_tensor(Type.F32, (64, 32), "w1")
    w2 = tp.new_tensor(Type.F32, (32, 64), "w2")
    h = ops.silu(ops.mul_mat(w1, x)).set_name("h")
    ht = ops.transpose(h).set_name("ht")  # a view: its copy must point into the copy
    y = ops.mul_mat(w2, ops.cont(ops.transpose(ht))).set_name("y")
    out = ops.rms_norm(y + x, 1e-5).set_name("out").set_output()
    return tp.Graph(out), {"x": x, "w1": w1, "w2": w2, "h": h, "ht": ht, "out": out}


def test_graph_copy_moves_structure_and_data_and_computes_the_same() -> None:
    cpu = init_by_name("CPU")
    graph, t = _mlp()
    rng = np.random.default_rng(5)
    alloc_tensors([t["w1"], t["w2"]], cpu.buffer_type())
    GraphAllocator(cpu.buffer_type()).alloc_graph(graph)
    for name in ("x", "w1", "w2"):
        tp.set_array(t[name], rng.standard_normal(t[name].shape).astype(np.float32))
    assert cpu.graph_compute(graph) is tp.Status.SUCCESS
    expected = tp.get_array(t["out"])

    dev = schedkit.TestAccelReg(n_devices=1).devices()[0]
    acc = dev.init_backend()
    with graph_copy(acc, graph) as copy:
        assert copy.buffer is not None and not copy.buffer.is_host
        assert [n.op for n in copy.graph.nodes] == [n.op for n in graph.nodes]
        assert [n.name for n in copy.graph.nodes] == [n.name for n in graph.nodes]
        for orig in [*graph.leafs, *graph.nodes]:
            c = copy[orig]
            assert (c.type, c.shape, c.strides, c.flags) == (
                orig.type, orig.shape, orig.strides, orig.flags,
            )  # fmt: skip
            assert c is not orig and c.buffer is not None
            np.testing.assert_array_equal(tp.get_array(c), tp.get_array(orig))
        ht = copy[t["ht"]]
        assert ht.view_src is copy[t["h"]] and ht.buffer is copy[t["h"]].buffer
        for orig in graph.nodes:
            assert all(a is copy[b] for a, b in zip(copy[orig].src, orig.src, strict=True))
        # the copy runs on the other backend and gives the same result
        tp.tensor_memset(copy[t["out"]], 0)
        assert acc.graph_compute(copy.graph) is tp.Status.SUCCESS
        np.testing.assert_allclose(tp.get_array(copy[t["out"]]), expected, rtol=1e-5, atol=1e-6)
        used = dev.used
    assert copy.buffer.is_freed and dev.used < used


def test_graph_copy_of_an_unallocated_graph_raises_and_leaks_nothing() -> None:
    graph, _ = _mlp()
    dev = schedkit.TestAccelReg(n_devices=1).devices()[0]
    with pytest.raises(NotAllocatedError, match="allocate"):
        graph_copy(dev.init_backend(), graph)
    assert dev.used == 0


# -- pass 2 of the split, alone ---------------------------------------------------------------


def _spread(chosen: list[int], unsupported: frozenset[tuple[int, int]] = frozenset()) -> list[int]:
    from tensorplug.sched_split import spread

    work = [tp.new_tensor("f32", (1,), f"n{i}") for i in range(len(chosen))]
    index = {id(t): i for i, t in enumerate(work)}
    out = list(chosen)
    spread(work, out, 1, lambda b, t: (b, index[id(t)]) not in unsupported)
    return out


@pytest.mark.parametrize(
    ("chosen", "expected"),
    [
        # GPU (0) spreads both ways; the CPU (1) only takes what the GPU cannot reach
        ([-1, 0, -1, -1], [0, 0, 0, 0]),
        ([-1, 1, -1, 0], [1, 1, 0, 0]),  # node 2 goes to the GPU, not to the CPU before it
        ([1, -1, -1, -1], [1, 1, 1, 1]),
        ([-1, -1, -1, -1], [-1, -1, -1, -1]),  # nothing assigned: left for pass 3
    ],
)
def test_spread_lets_the_cpu_take_only_what_is_left(chosen: list[int], expected: list[int]) -> None:
    assert _spread(chosen) == expected


def test_spread_skips_nodes_the_backend_cannot_run() -> None:
    # as ggml's set_if_supported: the GPU cannot run node 2, which is left for pass 3,
    # and the spread goes on past it to node 3
    assert _spread([0, -1, -1, -1], frozenset({(0, 2)})) == [0, 0, -1, 0]


def test_follow_places_views_with_their_base_and_sources_with_their_consumer() -> None:
    from tensorplug.sched_split import follow

    base = tp.new_tensor("f32", (4, 8), "base")
    loose = tp.new_tensor("f32", (4, 8), "loose")  # a source nobody placed
    view = tp.ops.transpose(base)
    node = tp.ops.add(loose, tp.ops.transpose(view))
    ids = {base: 0, node: 1}
    pending: list[tp.Tensor] = []
    assert follow(view, ids, pending) == 0 and ids[view] == 0  # the view follows its base
    assert follow(node, ids, pending) == 1
    assert ids[loose] == 1  # an unplaced source follows the node reading it
    orphan = tp.ops.reshape(tp.new_tensor("f32", (32,), "nobody"), (4, 8))
    assert follow(orphan, {}, pending) == -1 and pending == [orphan]

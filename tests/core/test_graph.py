"""Graphs list every node after its sources, once, with no size limit."""

from __future__ import annotations

import pytest

import tensorplug as tp
from tensorplug import Type, ops


def _leaf(name: str, shape: tuple[int, ...] = (4, 4)) -> tp.Tensor:
    return tp.new_tensor(Type.F32, shape, name)


def test_topological_order_leafs_and_shared_subexpressions() -> None:
    a, b = _leaf("a"), _leaf("b")
    s = ops.add(a, b).set_name("s")
    left = ops.silu(s).set_name("left")
    right = ops.mul(s, b).set_name("right")
    out = ops.add(left, right).set_name("out")
    g = tp.Graph(out)
    assert [t.name for t in g.nodes] == ["s", "left", "right", "out"]
    assert [t.name for t in g.leafs] == ["a", "b"]
    assert len(g) == 4 and s in g and out in g
    assert g.outputs == [out]


def test_multiple_outputs_and_expand_are_idempotent() -> None:
    a = _leaf("a")
    x, y = ops.neg(a).set_name("x"), ops.exp(a).set_name("y").set_output()
    g = tp.Graph([x, y])
    g.expand(x).expand(y)
    assert [t.name for t in g.nodes] == ["x", "y"]
    assert g.outputs == [y]


def test_view_bases_are_visited_and_params_are_nodes() -> None:
    cache = _leaf("cache", (8, 4))
    upd = ops.set_rows(cache, _leaf("rows", (2, 4)), tp.new_tensor(Type.I32, (2,), "idx"))
    v = ops.view(upd, (2, 4), offset=16).set_name("v")
    w = _leaf("w", (2, 4)).set_param()
    g = tp.Graph([ops.add(v, w)])
    assert w in g.nodes and cache in g.leafs and upd in g.nodes
    # a node's sources always come earlier in the order
    pos = {id(t): i for i, t in enumerate(g.nodes)}
    for i, t in enumerate(g.nodes):
        for s in (*t.src, *([t.view_src] if t.view_src is not None else [])):
            assert pos.get(id(s), -1) < i


def test_deep_graph_has_no_recursion_limit() -> None:
    t = _leaf("x", (4,))
    for _ in range(20_000):
        t = ops.neg(t)
    g = tp.Graph(t)
    assert len(g) == 20_000 and len(g.leafs) == 1


def test_graph_view_slices_nodes() -> None:
    t = _leaf("x")
    for i in range(10):
        t = ops.relu(t).set_name(f"n{i}")
    g = tp.Graph(t)
    v = g.view(3, 7)
    assert [n.name for n in v.nodes] == ["n3", "n4", "n5", "n6"] and v.leafs == []
    assert "graph: 4 nodes" in v.describe()
    with pytest.raises(IndexError, match="outside the graph's 10 nodes"):
        g.view(5, 11)


def test_buffers_lists_each_buffer_a_graph_touches_once_in_first_use_order() -> None:
    import tensorplug as tp
    from tensorplug import ops

    a, b = tp.new_tensor("f32", (4,), "a"), tp.new_tensor("f32", (4,), "b")
    s = ops.add(a, b)
    v = ops.view(s, (2,), offset=0)  # a view: its memory is its base's
    out = ops.scale(v, 2.0)
    graph = tp.Graph(out)
    assert graph.buffers() == []  # nothing allocated yet
    cpu = tp.registry.init_by_name("CPU").buffer_type()
    first = tp.alloc_tensors([a], cpu)
    second = tp.alloc_tensors([b, s, out], cpu)
    # the first node, s = a + b, lives in the second buffer and reads the first
    assert graph.buffers() == [second, first]

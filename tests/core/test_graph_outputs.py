"""Which nodes a backend must write to memory (ggml's OUTPUT flag, made complete): what the
graph was built for, flagged outputs, writes into memory the graph does not own, and —
in the scheduler's splits and an eval callback's runs — what is read outside."""

from __future__ import annotations

import numpy as np

import tensorplug as tp
from tensorplug import Graph, Status, ops
from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice


def _names(nodes: list[tp.Tensor]) -> list[str]:
    return [n.name for n in nodes]


def _chain() -> tuple[tp.Tensor, ...]:
    x = tp.new_tensor("f32", (4, 8), "x")
    a = ops.neg(x).set_name("a")
    b = ops.exp(a).set_name("b")
    c = ops.add(b, a).set_name("c")
    d = ops.scale(c, 2.0).set_name("d")
    return x, a, b, c, d


def test_a_graph_needs_what_it_was_built_for_and_flagged_outputs() -> None:
    _x, a, b, _c, d = _chain()
    g = Graph(d)
    assert _names(g.needed_nodes) == ["d"]
    b.set_output()
    assert _names(g.needed_nodes) == ["b", "d"]
    g.keep(a)
    assert _names(g.needed_nodes) == ["a", "b", "d"]


def test_two_requested_results_are_both_needed() -> None:
    _x, _a, b, _c, d = _chain()
    e = ops.sum_rows(b).set_name("e")
    g = Graph([d, e])
    assert _names(g.needed_nodes) == ["d", "e"]


def test_a_write_into_a_leaf_is_needed_even_when_nothing_reads_it() -> None:
    cache = tp.new_tensor("f32", (4, 8), "cache")
    rows = tp.new_tensor("f32", (2, 8), "rows")
    idx = tp.new_tensor("i32", (2,), "idx")
    stored = ops.set_rows(cache, ops.neg(rows).set_name("neg"), idx).set_name("stored")
    out = ops.sum_rows(ops.neg(rows)).set_name("out")
    g = Graph([stored, out])
    assert "stored" in _names(g.needed_nodes) and "neg" not in _names(g.needed_nodes)


def test_a_view_of_a_graph_needs_what_later_nodes_read() -> None:
    _x, _a, _b, _c, d = _chain()
    g = Graph(d)
    first, second = g.view(0, 2), g.view(2, 4)  # [a, b] then [c, d]
    assert _names(first.needed_nodes) == ["a", "b"]  # both read by c
    assert _names(second.needed_nodes) == ["d"]


def test_scheduler_splits_tell_each_backend_what_leaves_its_split() -> None:
    seen: dict[str, list[str]] = {}

    class Recorder(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            seen.setdefault(self.name, []).extend(_names(graph.needed_nodes))
            return super()._graph_compute(graph)

    class NoExp(Recorder):
        def supports_op(self, op: tp.Tensor) -> bool:
            return op.op is not tp.Op.UNARY or op.op_params["fn"] != tp.UnaryOp.EXP

    first = NoExp(ReferenceDevice())
    cpu = tp.init_by_name("CPU")
    x, _a, _b, _c, d = _chain()
    sched = tp.Scheduler([first, cpu])
    g = Graph(d)
    sched.alloc_graph(g)
    tp.set_array(x, np.ones((4, 8), np.float32))
    sched.graph_compute(g)
    # a runs on the first backend, b (exp) on the CPU, c and d back on the first: a is
    # read across the split boundary, and d is the result
    assert "a" in seen[first.name] and "d" in seen[first.name]
    assert "c" not in seen[first.name]
    np.testing.assert_allclose(tp.get_array(d), 2 * (np.exp(-1.0) - 1), rtol=1e-6)


def test_nodes_an_eval_callback_asks_for_are_needed() -> None:
    needed: list[list[str]] = []

    class Recorder(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            needed.append(_names(graph.needed_nodes))
            return super()._graph_compute(graph)

    be = Recorder(ReferenceDevice())
    x, _a, _b, _c, d = _chain()
    sched = tp.Scheduler([be, tp.init_by_name("CPU")])
    g = Graph(d)
    sched.alloc_graph(g)
    tp.set_array(x, np.ones((4, 8), np.float32))
    sched.set_eval_callback(lambda t, ask: (t.name == "b") if ask else True)
    sched.graph_compute(g)
    assert ["a", "b"] in needed  # the run up to b: b for the callback, a for c later

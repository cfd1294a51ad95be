"""The conformance kit catches what it promises to catch.

Backends here are the reference backend with one deliberate defect each (values off,
NaN, a stray infinity, one byte written past the end or before the start, a write
outside an in-place destination view, an unwritten result, a crash, a refused op), so
each check is shown to fire — and the clean reference backend to pass — without
depending on any plugin.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest

from tensorplug import Graph, Op, Status, Type, ops
from tensorplug.graph_copy import clone_graph
from tensorplug.host import host_buffer_type, tensor_array
from tensorplug.opcodes import VIEW_OPS, GluOp, UnaryOp
from tensorplug.tensor import Tensor
from tensorplug.testing import (
    Case,
    CaseResult,
    Outcome,
    all_cases,
    catalogue,
    compare_arrays,
    compare_graph_backend,
    max_nmse_for,
    nmse,
    run_case,
    run_cases,
)
from tensorplug.testing.compare import Mismatch
from tensorplug.testing.families_nn import MUL_MAT_BATCHES
from tensorplug.testing.operands import FLOAT_TYPES, QUANT_TYPES
from tensorplug.testing.placement import footprint
from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice, reference_backend
from tensorplug.testing.report import render_check
from tensorplug.transfer import set_array, tensor_alloc

# -- the catalogue -------------------------------------------------------------------------------


def test_catalogue_covers_every_op_and_function() -> None:
    for cases in (all_cases(), catalogue()):
        assert {c.op for c in cases} == set(Op) - {Op.NONE}
        tags = set().union(*(c.tags for c in cases))
        assert {u.value for u in UnaryOp} | {g.value for g in GluOp} <= tags


def test_catalogue_covers_every_type() -> None:
    seen = set().union(*(c.types for c in all_cases()))
    assert set(Type) <= seen


def test_quick_catalogue_has_the_quantized_mul_mat_matrix() -> None:
    names = {c.name for c in catalogue(ops=["mul_mat"])}
    for t in (*FLOAT_TYPES, *QUANT_TYPES):
        for n in MUL_MAT_BATCHES:
            assert f"MUL_MAT(type_a={t.name.lower()},type_b=f32,a=[33,64],b=[{n},64])" in names


def test_every_computing_op_has_a_non_contiguous_operand_case() -> None:
    have = set()
    for case in all_cases():
        graph, _ = case.instantiate()
        for node in graph.nodes:
            if node.op == case.op and any(not s.is_contiguous for s in node.src):
                have.add(case.op)
    assert set(Op) - VIEW_OPS - {Op.CPY} - have == set()
    # cpy: a transposed source, and a strided destination view written in place
    cpy_views = [
        c for c in all_cases() if c.op == Op.CPY and ("transposed" in c.name or "rows" in c.name)
    ]
    assert len(cpy_views) >= 5


def test_case_names_are_unique_and_instances_deterministic() -> None:
    cases = all_cases()
    assert len({c.name for c in cases}) == len(cases)
    case = next(c for c in cases if c.op == Op.SET_ROWS)
    (g1, in1), (g2, in2) = case.instantiate(), case.instantiate()
    assert len(in1) == len(g1.leafs) == len(in2)
    for a, b in zip(in1.values(), in2.values(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert g1.nodes[0] is not g2.nodes[0]  # fresh tensors every time


def test_filters() -> None:
    assert {c.op for c in catalogue(ops=["silu"])} == {Op.UNARY}
    assert all("silu" in c.tags for c in catalogue(ops=["SILU"]))
    q4 = catalogue(full=True, types=["q4_0"])
    assert q4 and all(Type.Q4_0 in c.types for c in q4)
    assert len(catalogue(full=True)) > len(catalogue())


def test_set_rows_indices_are_unique_per_destination() -> None:
    for case in catalogue(full=True, ops=["set_rows"]):
        graph, inputs = case.instantiate()
        rows = inputs[graph.nodes[-1].src[2]]
        flat = rows.reshape(-1, rows.shape[-1])
        assert all(len(set(r)) == len(r) for r in flat.tolist()), case.name


# -- the verdict on one pair -----------------------------------------------------------------------


def test_nmse_value() -> None:
    assert nmse(np.array([1.0, 1.0]), np.array([1.0, 1.1])) == pytest.approx(0.01 / 2)
    assert nmse(np.zeros(3), np.zeros(3)) == 0.0


def _mismatch(expected: np.ndarray, actual: np.ndarray, max_nmse: float) -> Mismatch:
    """``compare_arrays``'s mismatch, for arrays the test knows it refuses."""
    bad = compare_arrays(expected, actual, max_nmse)[1]
    assert bad is not None
    return bad


def test_compare_arrays_fails_on_nan_even_when_both_sides_have_it() -> None:
    e = np.array([1.0, np.nan, 3.0])
    err, bad = compare_arrays(e, e.copy(), 1.0, ("CPU", "X"))
    assert bad is not None and math.isnan(err)
    assert "NaN" in bad.message and "[1]" in bad.message


def test_compare_arrays_infinities_must_match_in_place_and_sign() -> None:
    e = np.array([1.0, np.inf, -np.inf])
    assert compare_arrays(e, e.copy(), 1e-7)[1] is None
    assert "inf mismatch" in _mismatch(e, np.array([1.0, np.inf, np.inf]), 1.0).message
    assert "inf mismatch" in _mismatch(e, np.array([1.0, 5.0, -np.inf]), 1.0).message
    assert compare_arrays(np.array([2.0]), np.array([np.inf]), 1.0)[1] is not None


def test_compare_arrays_threshold_and_exact_mode() -> None:
    e, a = np.array([1.0, 2.0]), np.array([1.0, 2.001])
    err, bad = compare_arrays(e, a, 1e-7)
    assert bad is not None and err == pytest.approx(1e-6 / 5)
    assert compare_arrays(e, a, 1e-6)[1] is None
    assert "exact copy" in _mismatch(e, a, 0.0).message
    ints = compare_arrays(np.array([1, 2, 3]), np.array([1, 2, 4]), 1.0)[1]
    assert ints is not None and "1 of 3" in ints.message


def test_thresholds_follow_design() -> None:
    a32, a16 = Tensor(Type.F32, (4, 32)), Tensor(Type.F16, (4, 32))
    assert max_nmse_for(ops.mul_mat(a32, a32)) == 5e-4
    assert max_nmse_for(ops.soft_max(a32)) == 1e-6
    assert max_nmse_for(ops.add(a32, a32)) == 1e-7
    assert max_nmse_for(ops.add(a16, a16)) == 1e-6  # the F16 floor
    assert max_nmse_for(ops.add(Tensor(Type.BF16, (4,)), Tensor(Type.BF16, (4,)))) == 1e-4
    assert max_nmse_for(ops.cpy(a32, Tensor(Type.F32, (4, 32)))) == 0.0
    assert max_nmse_for(ops.cpy(a16, Tensor(Type.F32, (4, 32)))) == 0.0  # widening is exact
    assert max_nmse_for(ops.cpy(a32, Tensor(Type.F16, (4, 32)))) == 1e-6
    assert max_nmse_for(ops.cpy(a32, Tensor(Type.Q4_0, (4, 32)))) == 1e-7
    assert max_nmse_for(ops.argsort(a32)) == 0.0


# -- placement -----------------------------------------------------------------------------------


def test_graph_copy_keeps_structure_and_views() -> None:
    x = Tensor(Type.F32, (3, 4), name="x")
    out = ops.cont(ops.transpose(x))
    graph = Graph(out)
    copy, copies = clone_graph(graph)
    assert [n.op for n in copy.nodes] == [n.op for n in graph.nodes]
    t = copies[id(graph.nodes[0])]
    assert t.view_src is copies[id(x)] and t.strides == graph.nodes[0].strides
    assert copies[id(out)].src[0] is t and t.buffer is None


def test_footprint_of_a_strided_view() -> None:
    base = Tensor(Type.F32, (4, 3))
    col = ops.view(base, (4,), (12,), 4)  # column 1
    mask = footprint(col)
    assert mask.size == 48
    assert np.flatnonzero(mask).tolist() == [
        b for r in range(4) for b in range(12 * r + 4, 12 * r + 8)
    ]


# -- broken backends ------------------------------------------------------------------------------


class Broken(ReferenceBackend):
    """The reference backend plus a defect applied to each node after computing it."""

    def __init__(self, defect: Callable[[Tensor, np.ndarray], None]) -> None:
        super().__init__(ReferenceDevice())
        self.defect = defect

    def _graph_compute(self, graph: Graph) -> Status:
        status = super()._graph_compute(graph)
        for node in graph.nodes:
            if node.op not in VIEW_OPS:
                assert node.buffer is not None
                self.defect(node, node.buffer.host_array())
        return status


def _case(prefix: str) -> Case:
    return next(c for c in all_cases() if c.name.startswith(prefix))


ADD = "ADD(type=f32,shape=[2,3,5,10],b=[2,3,5,10])"


def _run(case: Case, backend: ReferenceBackend) -> CaseResult:
    return run_case(case, backend, reference_backend())


def test_clean_reference_passes_the_quick_catalogue() -> None:
    report = run_cases(catalogue(), reference_backend(), reference_backend())
    assert report.ok and report.count(Outcome.PASS) == len(report.results)


def test_wrong_values_fail_with_nmse() -> None:
    def off(node: Tensor, mem: np.ndarray) -> None:
        tensor_array(node)[...] *= np.float32(1.01)

    r = _run(_case(ADD), Broken(off))
    assert r.outcome is Outcome.FAIL and "NMSE" in r.message and "ADD" in r.message
    assert r.error == pytest.approx(1e-4, rel=1e-3)


def test_nan_fails() -> None:
    def nan(node: Tensor, mem: np.ndarray) -> None:
        tensor_array(node)[0, 0, 0, 3] = np.nan

    r = _run(_case(ADD), Broken(nan))
    assert r.outcome is Outcome.FAIL and "NaN" in r.message and "[0, 0, 0, 3]" in r.message


def test_stray_infinity_fails() -> None:
    def inf(node: Tensor, mem: np.ndarray) -> None:
        tensor_array(node)[1, 2, 3, 4] = np.inf

    r = _run(_case(ADD), Broken(inf))
    assert r.outcome is Outcome.FAIL and "inf mismatch" in r.message


def test_unwritten_result_reads_as_nan() -> None:
    class Lazy(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            return Status.SUCCESS

    r = _run(_case(ADD), Lazy(ReferenceDevice()))
    assert r.outcome is Outcome.FAIL and "NaN" in r.message


def test_write_past_the_end_is_caught_by_the_sentinel() -> None:
    def overflow(node: Tensor, mem: np.ndarray) -> None:
        mem[node.offset + node.nbytes] ^= 0x01  # one byte past the last element

    r = _run(_case(ADD), Broken(overflow))
    assert r.outcome is Outcome.FAIL
    assert "out-of-bounds write after <add>" in r.message and "node 0" in r.message


def test_write_before_the_start_is_caught_by_the_sentinel() -> None:
    def underflow(node: Tensor, mem: np.ndarray) -> None:
        mem[node.offset - 1] ^= 0x80

    r = _run(_case("MUL_MAT(type_a=q4_0,type_b=f32,a=[33,64],b=[7,64])"), Broken(underflow))
    assert r.outcome is Outcome.FAIL and "out-of-bounds write before <mul_mat>" in r.message


def test_in_place_write_outside_the_destination_view_fails() -> None:
    def spill(node: Tensor, mem: np.ndarray) -> None:
        if node.op == Op.CPY:
            mem[node.base.offset] ^= 0x01  # row 0 of the cache; the view starts at row 2

    r = _run(_case("CPY(type_src=f32,type_dst=f32,shape=[3,64],dst=rows"), Broken(spill))
    assert r.outcome is Outcome.FAIL and "outside its destination view" in r.message


def test_refused_op_is_unsupported_not_failed() -> None:
    class NoMatmul(ReferenceBackend):
        def supports_op(self, op: Tensor) -> bool:
            return op.op != Op.MUL_MAT

    backend = NoMatmul(ReferenceDevice())
    report = run_cases(catalogue(ops=["mul_mat", "add"]), backend, reference_backend())
    assert report.ok
    mm = [r for r in report.results if r.op == "mul_mat"]
    assert mm and all(r.outcome is Outcome.UNSUPPORTED for r in mm)
    assert "does not support MUL_MAT" in mm[0].message
    assert all(r.passed for r in report.results if r.op == "add")


def test_failed_status_and_crashes_are_failures_of_their_case() -> None:
    class Failing(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            return Status.FAILED

    class Crashing(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            raise RuntimeError("kernel exploded")

    r = _run(_case(ADD), Failing(ReferenceDevice()))
    assert r.outcome is Outcome.FAIL and "returned failed" in r.message
    r = _run(_case(ADD), Crashing(ReferenceDevice()))
    assert r.outcome is Outcome.FAIL and r.message == "RuntimeError: kernel exploded"


def test_compare_graph_backend_takes_data_from_allocated_leafs() -> None:
    x = Tensor(Type.F32, (2, 3), name="x")
    graph = Graph(ops.scale(ops.cont(ops.transpose(x)), 2.0))
    buf = host_buffer_type().alloc_buffer(x.nbytes)
    tensor_alloc(buf, x, 0)
    set_array(x, np.arange(6, dtype=np.float32).reshape(2, 3))
    seen: list[tuple[int, np.ndarray]] = []

    def record(i: int, t1: Tensor, t2: Tensor) -> bool:
        seen.append((i, tensor_array(t1).copy()))
        np.testing.assert_array_equal(tensor_array(t1), tensor_array(t2))
        return True

    assert compare_graph_backend(reference_backend(), reference_backend(), graph, record)
    assert [i for i, _ in seen] == [1, 2]  # the transpose view (node 0) is skipped
    np.testing.assert_array_equal(seen[1][1], 2 * np.arange(6).reshape(2, 3).T)
    assert graph.nodes[-1].buffer is None  # the caller's graph is never allocated


def test_compare_graph_backend_stops_when_the_callback_says_so() -> None:
    case = _case("SOFT_MAX(type=f32,shape=[2,4,7,33],scale=1,max_bias=0)")
    graph, inputs = case.instantiate()
    graph.expand(ops.scale(graph.nodes[-1], 3.0))
    calls = []

    def stop(i: int, a: Tensor, b: Tensor) -> bool:
        calls.append(i)
        return False

    done = compare_graph_backend(
        reference_backend(),
        reference_backend(),
        graph,
        stop,
        inputs=inputs,
    )
    assert done is False and calls == [0]


def test_whole_graph_mode_still_checks_sentinels() -> None:
    case = _case(ADD)
    graph, inputs = case.instantiate()

    def overflow(node: Tensor, mem: np.ndarray) -> None:
        mem[node.offset + node.nbytes + 5] ^= 0x01

    with pytest.raises(IndexError, match="out-of-bounds write after"):
        compare_graph_backend(
            reference_backend(),
            Broken(overflow),
            graph,
            lambda *a: True,
            inputs=inputs,
            node_by_node=False,
        )


# -- reports ---------------------------------------------------------------------------------------


def test_reports_render_in_every_format(capsys: pytest.CaptureFixture[str]) -> None:
    def off(node: Tensor, mem: np.ndarray) -> None:
        tensor_array(node)[...] = np.float32(np.nan)

    report = run_cases([_case(ADD), _case("SUB(type=f32")], Broken(off), reference_backend())
    render_check(report, "json", out=None)
    data = json.loads(capsys.readouterr().out)
    assert data["summary"] == {"pass": 0, "fail": 2, "unsupported": 0, "total": 2}
    assert data["ok"] is False and data["cases"][0]["error"] == "nan"
    render_check(report, "csv")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "case,op,outcome,error,message,seconds,contract_needed" and len(lines) == 3
    render_check(report, "table", plain=True)
    out = capsys.readouterr().out
    assert (
        out.splitlines()[-1]
        == "reference vs reference: 0/2 passed, 2 failed, 0 unsupported — FAILED"
    )
    assert "fail    ADD(type=f32" in out


def test_a_crashing_backend_is_reported_with_where_it_crashed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Crashes(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            return {}["boom"]  # type: ignore[index]  # a KeyError on purpose

    report = run_cases([_case("NEG(")], Crashes(ReferenceDevice()), reference_backend())
    (r,) = report.results
    assert r.outcome is Outcome.FAIL and r.message == "KeyError: 'boom'"
    assert "in _graph_compute" in r.where and r.where.startswith(__file__)
    assert 'return {}["boom"]' in r.traceback
    render_check(report, "json")
    data = json.loads(capsys.readouterr().out)
    assert "KeyError: 'boom'" in data["cases"][0]["traceback"]
    render_check(report, "table", plain=True)
    assert f"KeyError: 'boom' (at {r.where})" in capsys.readouterr().out

"""The conformance kit's front ends: the pytest plugin, ``tensorplug check`` and ``bench``.

None of these need a plugin: the reference backend stands in for the backend under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorplug import Graph, Op, Status, Tensor, Type, ops
from tensorplug.testing import (
    bench_case,
    bench_cases,
    catalogue,
    compare_graph_backend,
    reference_backend,
    tensor_values,
)
from tensorplug.testing.bench import graph_bytes, graph_flops, numpy_baseline
from tensorplug.testing.families import all_cases
from tensorplug.testing.operands import make
from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice
from tensorplug.testing.report import render_bench

pytest_plugins = ["pytester"]

# the plugin is registered through its pytest11 entry point once tensorplug is installed;
# naming it explicitly (after blocking the entry point) makes these tests independent of that
PLUGIN_ARGS = ("-p", "no:tensorplug", "-p", "tensorplug_pytest")

# -- the pytest plugin -----------------------------------------------------------------------------


def test_an_unrelated_pytest_session_imports_no_tensorplug_module(tmp_path: Path) -> None:
    """pytest loads the plugin in every session wherever tensorplug is installed: a
    project that never uses it must not pay for numpy and the core at start-up."""
    (tmp_path / "test_trivial.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text(
        "import sys\n\n\n"
        "def pytest_sessionfinish(session):\n"
        "    names = sorted(sys.modules)\n"
        "    (session.config.rootpath / 'modules.txt').write_text('\\n'.join(names))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
    modules = (tmp_path / "modules.txt").read_text().split("\n")
    assert "tensorplug_pytest" in modules  # the plugin was loaded through its entry point
    loaded = [m for m in modules if m.split(".")[0] in ("tensorplug", "numpy", "gguf")]
    assert loaded == []


def test_plugin_parametrizes_and_checks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from tensorplug import Op, Status
        from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice

        class NoSub(ReferenceBackend):
            def supports_op(self, op):
                return op.op != Op.SUB

        class WrongMul(ReferenceBackend):
            def _graph_compute(self, graph):
                status = super()._graph_compute(graph)
                from tensorplug.host import tensor_array
                for node in graph.nodes:
                    if node.op == Op.MUL:
                        tensor_array(node)[...] += 1
                return status

        def test_named(tensorplug_case, tensorplug_check):
            tensorplug_check(tensorplug_case, backend="reference", reference="reference")

        def test_instance(tensorplug_case, tensorplug_check):
            tensorplug_check(tensorplug_case, NoSub(ReferenceDevice()), "reference")

        def test_broken(tensorplug_case, tensorplug_check):
            tensorplug_check(tensorplug_case, WrongMul(ReferenceDevice()), "reference")
        """
    )
    result = pytester.runpytest(
        *PLUGIN_ARGS,
        "--tensorplug-op",
        "add,sub",
        "--tensorplug-op",
        "mul",
        "--tensorplug-type",
        "f16",
        "-q",
        "-rs",
    )
    n = 3 * 2  # quick cases with f16 per op: same shape and broadcast rows
    # named: all pass; instance: SUB skipped; broken: MUL fails
    result.assert_outcomes(passed=n + 4 + 4, skipped=2, failed=2)
    result.stdout.fnmatch_lines(["*MUL(type=f16*NMSE*", "*unsupported*does not support SUB*"])
    # each skip names its case, so pytest's -rs summary does not merge them into one line
    result.stdout.fnmatch_lines(["*SUB(type=f16*unsupported*"])


def test_plugin_shows_where_a_crashing_backend_failed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice

        class Crashes(ReferenceBackend):
            def _graph_compute(self, graph):
                return lookup_table()["boom"]

        def lookup_table():
            return {}

        def test_crash(tensorplug_case, tensorplug_check):
            tensorplug_check(tensorplug_case, Crashes(ReferenceDevice()), "reference")
        """
    )
    result = pytester.runpytest(*PLUGIN_ARGS, "--tensorplug-op", "neg", "-q")
    result.stdout.fnmatch_lines(["*KeyError: 'boom'*", "*Traceback*", "*in _graph_compute*"])


def test_plugin_skips_a_backend_that_cannot_run_here(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import tensorplug
        from tensorplug.testing import runner

        def unavailable(name):
            raise tensorplug.BackendUnavailableError("backend 'JAX' cannot run here: no jax")

        @pytest.fixture(autouse=True)
        def no_jax(monkeypatch):  # before tensorplug_check binds resolve_backend
            monkeypatch.setattr(runner, "resolve_backend", unavailable)

        def test_case(tensorplug_case, tensorplug_check):
            tensorplug_check(tensorplug_case, backend="JAX0")
        """
    )
    result = pytester.runpytest(*PLUGIN_ARGS, "--tensorplug-op", "neg", "-q", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 1 and "failed" not in outcomes
    result.stdout.fnmatch_lines(["*cannot run here: no jax*"])


def test_plugin_default_backend_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_conformance(tensorplug_case, tensorplug_check):
            assert tensorplug_check(tensorplug_case).passed
        """
    )
    args = ("--tensorplug-op", "argsort", "--tensorplug-reference", "reference")
    result = pytester.runpytest(*PLUGIN_ARGS, *args, "--tensorplug-backend", "reference")
    quick = sum(c.op == Op.ARGSORT and c.quick for c in all_cases())
    result.assert_outcomes(passed=quick)
    result = pytester.runpytest(*PLUGIN_ARGS, *args, "--tensorplug-full")
    result.stdout.fnmatch_lines(["*no backend to check*--tensorplug-backend*"])


def test_plugin_leaves_other_tests_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    assert True\n")
    pytester.runpytest(*PLUGIN_ARGS).assert_outcomes(passed=1)


# -- tensorplug check -------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorplug", *args], capture_output=True, text=True, check=False
    )


def test_check_cli_json_and_exit_status() -> None:
    run = _cli(
        "check",
        "--backend",
        "reference",
        "--reference",
        "reference",
        "--op",
        "concat",
        "--type",
        "i32",
        "--output",
        "json",
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["ok"] and data["summary"]["total"] == data["summary"]["pass"] == 5
    assert {c["op"] for c in data["cases"]} == {"concat"}


def test_check_cli_jobs_split_the_cases_and_keep_their_order() -> None:
    # the cases in blocks over two processes (each makes its own CPU backend): the same
    # cases, verdicts and order as one process
    args = ("check", "--backend", "CPU", "--op", "concat,scale,rope", "--output", "json")
    one, two = _cli(*args), _cli(*args, "--jobs", "2")
    assert one.returncode == two.returncode == 0, two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    assert (a["backend"], a["reference"]) == (b["backend"], b["reference"]) == ("CPU", "reference")
    assert [(c["case"], c["outcome"]) for c in a["cases"]] == [
        (c["case"], c["outcome"]) for c in b["cases"]
    ]
    assert a["summary"] == b["summary"] and a["summary"]["total"] > 8  # 8 blocks: all used


def test_a_jobs_worker_whose_backends_fail_is_a_message_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from concurrent.futures.process import BrokenProcessPool

    from tensorplug.cli import main
    from tensorplug.errors import TensorplugError
    from tensorplug.testing import check_cli

    args = ["check", "--backend", "reference", "--reference", "reference", "--op", "scale"]
    for error in (TensorplugError("no device FOO0"), BrokenProcessPool("killed")):

        def failing(*_: object, error: BaseException = error) -> object:
            raise error

        monkeypatch.setattr(check_cli, "_run_in_processes", failing)
        assert main([*args, "--jobs", "2"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("tensorplug check: a checking process") and str(error) in err


def test_a_jobs_worker_checks_its_block_of_the_selection() -> None:
    from tensorplug.testing import check_cli

    selection = check_cli.CaseSelection("reference", "reference", True, ["scale"], [])
    cases = catalogue(True, ["scale"])
    got = check_cli.check_block(selection, 2, 5)
    assert [r.case for r in got] == [c.name for c in cases[2:5]]
    assert all(r.passed for r in got)


def test_check_cli_refuses_a_jobs_count_below_one() -> None:
    run = _cli("check", "--jobs", "0")
    assert run.returncode == 2
    assert "--jobs: '0' is not a number of processes (an integer >= 1)" in run.stderr


def test_check_cli_exits_1_on_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorplug.cli import main
    from tensorplug.host import tensor_array
    from tensorplug.testing import check_cli

    class Off(ReferenceBackend):
        def _graph_compute(self, graph: Graph) -> Status:
            status = super()._graph_compute(graph)
            tensor_array(graph.nodes[-1])[...] *= 2
            return status

    monkeypatch.setattr(
        check_cli,
        "resolve_backend",
        lambda name: Off(ReferenceDevice()) if name == "broken" else reference_backend(),
    )
    code = main(
        [
            "check",
            "--backend",
            "broken",
            "--reference",
            "reference",
            "--op",
            "scale",
            "--quick",
            "--output",
            "table",
            "--problems",
        ]
    )
    out = capsys.readouterr().out
    n = len(catalogue(ops=["scale"]))
    assert code == 1
    assert "Traceback" not in out  # a wrong value is not an exception
    assert out.splitlines()[-1].endswith(f"0/{n} passed, {n} failed, 0 unsupported — FAILED")
    assert out.count("fail ") == n and "NMSE" in out


def test_check_cli_usage_errors() -> None:
    run = _cli("check", "--op", "nonsense")
    assert run.returncode == 2 and "unknown op nonsense" in run.stderr
    run = _cli("check", "--type", "q9_9", "--list")
    assert run.returncode == 2 and "unknown tensor type" in run.stderr
    run = _cli("check", "--op", "argmax", "--list")
    assert run.returncode == 0 and run.stdout.splitlines()[0].startswith("ARGMAX(")


# -- bench ------------------------------------------------------------------------------------


def test_work_counts() -> None:
    mm = ops.mul_mat(_t((2, 16, 64)), _t((2, 5, 64)))
    assert graph_flops(_graph(mm)) == 2 * 2 * 16 * 5 * 64
    fa = ops.flash_attn_ext(_t((1, 4, 7, 32)), _t((1, 2, 9, 32)), _t((1, 2, 9, 16)))
    assert graph_flops(_graph(fa)) == 2 * 4 * 7 * 9 * (32 + 16)
    add = ops.add(_t((8, 4)), _t((4,)))
    assert graph_bytes(_graph(add)) == (32 + 32 + 4) * 4
    gather = ops.get_rows(_t((100, 8)), _t((3,), Type.I32))  # 3 rows of 32 bytes read, 3 written
    assert graph_bytes(_graph(gather)) == 3 * 32 + 12 + 3 * 32


def _t(shape: tuple[int, ...], t: Type = Type.F32) -> Tensor:
    return Tensor(t, shape)


def _graph(t: Tensor) -> Graph:
    return Graph(t)


def _reference_result(graph: Graph, inputs: dict[Tensor, np.ndarray]) -> np.ndarray:
    """The float64 reference values of the graph's last computed node."""
    backend = reference_backend()
    results: list[np.ndarray] = []

    def keep(i: int, t1: Tensor, t2: Tensor) -> bool:
        results.append(tensor_values(t1))
        return True

    compare_graph_backend(backend, backend, graph, keep, inputs=inputs)
    return results[-1]


@pytest.mark.parametrize(
    "prefix",
    [
        "PERMUTE(type=f32",
        "TRANSPOSE(type=f32",
        "RESHAPE(type=f32",
        "VIEW(type=f32",
        "SET_ROWS(type=f32,idx=i32",
        "MUL_MAT(type_a=q4_0,type_b=f32,a=[33,64],b=[7,64])",
        "FLASH_ATTN_EXT(shape=[1,4,7,32]",
    ],
)
def test_numpy_baseline_matches_the_reference(prefix: str) -> None:
    # the float32 baseline must compute the same thing, views included
    case = next(c for c in all_cases() if c.name.startswith(prefix))
    graph, inputs = case.instantiate()
    result = numpy_baseline(graph, inputs)()
    assert isinstance(result, np.ndarray) and result.dtype == np.float32
    expected = _reference_result(graph, inputs)
    np.testing.assert_allclose(result, expected.reshape(result.shape), rtol=2e-4, atol=2e-5)


def test_bench_case_reports_rates_and_the_numpy_ratio() -> None:
    mm = make(
        Op.MUL_MAT,
        lambda ins: ops.mul_mat(ins.new(Type.Q8_0, (16, 64)), ins.new(Type.F32, (5, 64))),
        True,
        small=True,
    )
    r = bench_case(mm, reference_backend(), min_time=0.001)
    assert r.us is not None and r.numpy_us is not None  # both timed (None: unsupported)
    assert r.flops == 2 * 16 * 5 * 64 and r.runs >= 1 and r.us > 0 and r.numpy_us > 0
    assert r.gflops == pytest.approx(r.flops / r.us / 1e3) and r.gbps is None
    assert r.speedup == pytest.approx(r.numpy_us / r.us)
    replay = next(c for c in bench_cases(["replay"]))
    rr = bench_case(replay, reference_backend(), min_time=0.001, baseline=False)
    assert rr.us is not None
    assert rr.nodes == 1000 and rr.us_per_node == pytest.approx(rr.us / 1000)
    assert rr.gbps is not None and rr.speedup is None


def test_bench_catalogue_has_the_cpu_target_sizes() -> None:
    names = {c.name for c in bench_cases(["mul_mat"])}
    assert "MUL_MAT(type_a=f32,m=2048,n=2048,k=2048)" in names
    for t in ("q8_0", "q4_0"):
        for n in (512, 1):
            assert f"MUL_MAT(type_a={t},m=2048,n={n},k=2048)" in names


def test_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    case = make(
        Op.ADD,
        lambda ins: ops.add(ins.new(Type.F32, (8, 8)), ins.new(Type.F32, (8,))),
        True,
        tiny=True,
    )
    unsupported = make(Op.ARGSORT, lambda ins: ops.argsort(ins.new(Type.F32, (4, 4))), True)

    class NoSort(ReferenceBackend):
        def supports_op(self, op: Tensor) -> bool:
            return op.op != Op.ARGSORT

    backend = NoSort(ReferenceDevice())
    results = [bench_case(c, backend, min_time=0.001) for c in (case, unsupported)]
    render_bench(results, "reference", as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert data["results"][0]["gbps"] > 0 and data["results"][0]["speedup"] > 0
    assert data["results"][1]["us"] is None and "unsupported" in data["results"][1]["message"]
    render_bench(results, "reference", plain=True)
    assert "speedup" in capsys.readouterr().out


def test_bench_cli_lists_cases() -> None:
    run = _cli("bench", "--op", "replay", "--list")
    assert (
        run.returncode == 0 and run.stdout.strip() == "GRAPH_REPLAY(nodes=1000,kind=add,shape=[4])"
    )


def test_plugin_skips_what_needs_a_later_contract(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from tensorplug.testing.refbackend import ReferenceBackend, ReferenceDevice

        class Declares10(ReferenceDevice):
            api_version = property(lambda self: (1, 0))

        def test_old(tensorplug_case, tensorplug_check):
            tensorplug_check(tensorplug_case, ReferenceBackend(Declares10()), "reference")
        """
    )
    result = pytester.runpytest(
        *PLUGIN_ARGS, "--tensorplug-full", "--tensorplug-op", "add", "--tensorplug-type",
        "f32", "-q", "-rs",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes["skipped"] == 5 and "failed" not in outcomes  # the five tiled ADD cases
    result.stdout.fnmatch_lines(
        ["*ADD(type=f32,shape=?6,4?,b=?6,2?)*contract 1.1 needed (tiled_broadcast;*declares 1.0)*"]
    )

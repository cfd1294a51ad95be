"""The CPU backend as a plugin: registration, device, plans, extensions, host memory."""

from __future__ import annotations

import importlib.metadata
import mmap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from test_cpu_helpers import backend_for, place, q8_activations

import tensorplug as tp
from tensorplug import ops
from tensorplug.errors import BufferFreedError, ComputeAbortedError, UnsupportedError
from tensorplug_cpu import registration
from tensorplug_cpu.backend import CpuBackend
from tensorplug_cpu.device import create_reg, parse_params

RNG = np.random.default_rng(5)


def _chain(n: int, shape: tuple[int, ...] = (4,)) -> tuple[tp.Tensor, tp.Tensor, tp.Tensor]:
    """x → x + c → (x + c) + c → … (n adds); returns (x, c, last)."""
    x, c = tp.new_tensor("f32", shape, "x"), tp.new_tensor("f32", shape, "c")
    y = x
    for _ in range(n):
        y = ops.add(y, c)
    return x, c, y


# -- registration and device -----------------------------------------------------------------


def test_registration_scores_this_machine() -> None:
    score, reason = registration.evaluate_score()
    assert score >= 16 and "numpy" in reason  # numpy imports here, so the CPU can run
    assert registration.name == "CPU" and registration.api_version == tp.API_VERSION


def test_entry_point_is_installed() -> None:
    try:
        importlib.metadata.distribution("tensorplug-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tensorplug-cpu is not installed (pip install -e plugins/cpu)")
    eps = importlib.metadata.entry_points(group="tensorplug.backends")
    cpu = [ep for ep in eps if ep.value == "tensorplug_cpu:registration"]
    assert len(cpu) == 1 and cpu[0].name == "cpu"
    assert cpu[0].load() is registration


def test_device_description() -> None:
    reg = create_reg()
    dev = reg.device(0)
    assert (reg.name, reg.device_count, dev.name, dev.type) == ("CPU", 1, "CPU", tp.DeviceType.CPU)
    free, total = dev.memory()
    assert 0 < free <= total
    assert dev.caps.buffer_from_host_ptr and not dev.caps.asynchronous
    assert dev.buffer_type() is tp.host_buffer_type()
    assert dev.supports_buft(tp.host_buffer_type())
    props = dev.props()
    assert props.name == "CPU" and props.memory_total == total


def test_init_backend_params() -> None:
    assert parse_params("n_threads=3, jit=0") == {"n_threads": 3, "use_jit": False}
    assert parse_params(None) == {}
    with pytest.raises(ValueError, match="n_threads=<int>"):
        parse_params("threads=2")
    be = create_reg().device(0).init_backend("jit=0")
    assert isinstance(be, CpuBackend) and be.jit is None


def test_get_features_reports_blas_and_simd() -> None:
    reg = create_reg()
    fn = reg.get_proc("get_features")
    assert fn is not None and fn is reg.get_proc("ggml_backend_get_features")
    feats = fn(reg)
    assert feats["BLAS"] and feats["numpy"] == np.__version__
    from numpy._core._multiarray_umath import __cpu_features__

    for name in ("AVX2", "FMA3", "AVX512F"):
        assert (name in feats) == bool(__cpu_features__.get(name))
    assert reg.features() == feats
    assert reg.get_proc("no_such_extension") is None


# -- supports_op --------------------------------------------------------------------------------


def _node(op: tp.Op, out_type: str, *srcs: tp.Tensor, **params: object) -> tp.Tensor:
    """A hand-made node, for combinations the op builders refuse to create."""
    return tp.Tensor(out_type, srcs[0].shape, op=op, src=srcs, op_params=dict(params))


def test_supports_op_answers_precisely() -> None:
    dev = create_reg().device(0)
    f32, f16 = tp.new_tensor("f32", (4, 64)), tp.new_tensor("f16", (4, 64))
    q8, q4 = tp.new_tensor("q8_0", (4, 64)), tp.new_tensor("q4_0", (4, 64))
    i32, i8 = tp.new_tensor("i32", (4,)), tp.new_tensor("i8", (4, 64))
    q8_3d = tp.new_tensor("q8_0", (2, 3, 64))
    q = tp.new_tensor("f32", (2, 3, 8))
    kv = tp.new_tensor("bf16", (1, 5, 8))
    yes = [
        ops.add(f16, f32),
        ops.mul_mat(q4, f16),
        ops.mul_mat(f16, f32),
        ops.get_rows(q8, i32),
        ops.cpy(f32, q8),
        ops.cpy(q8, f16),
        ops.set_rows(q4, f32, tp.new_tensor("i64", (4,))),
        ops.cont(ops.permute(q8_3d, (1, 0, 2))),
        ops.transpose(f32),
        ops.flash_attn_ext(q, kv, kv),
    ]
    for node in yes:
        assert dev.supports_op(node), node
    no = [
        _node(tp.Op.CPY, "q4_0", q8, q4),  # quantized → another quantized type
        _node(tp.Op.ARGMAX, "i32", f16),  # argmax reads F32 only
        _node(tp.Op.ADD, "f32", q8, f32),  # arithmetic on quantized data
        _node(tp.Op.GET_ROWS, "f32", i8, tp.new_tensor("i32", (2,))),  # I8 tables
        _node(tp.Op.UNARY, "f32", f32, fn="softplus"),  # unknown function
        _node(tp.Op.MUL_MAT, "f32", tp.Tensor("q8_0", (4, 64), strides=(34, 68)), f32),
    ]
    for node in no:
        assert not dev.supports_op(node), node


def test_every_op_the_kernels_support_has_one_builder() -> None:
    from tensorplug_cpu import kernels

    supported = set(kernels._SUPPORT)
    assert set(kernels.KERNELS) == supported


def test_unsupported_node_is_refused_with_a_clear_error() -> None:
    a = tp.new_tensor("f16", (3, 4), "a")
    bad = _node(tp.Op.ARGMAX, "i32", a)
    g = tp.Graph(bad)
    place(g)
    with pytest.raises(UnsupportedError, match="no kernel for argmax"):
        backend_for().graph_compute(g)


# -- plans -----------------------------------------------------------------------------------------


def test_plan_replays_with_new_inputs() -> None:
    x, c, y = _chain(10)
    g = tp.Graph(y)
    place(g)
    be = backend_for()
    plan = be.graph_plan_create(g)
    assert len(plan.steps) == 10
    for k in range(3):
        tp.set_array(x, np.full(4, k, np.float32))
        tp.set_array(c, np.arange(4, dtype=np.float32))
        assert be.graph_plan_compute(plan) == tp.Status.SUCCESS
        np.testing.assert_array_equal(tp.get_array(y), k + 10 * np.arange(4))
    be.graph_plan_free(plan)
    with pytest.raises(UnsupportedError, match="freed"):
        be.graph_plan_compute(plan)


def test_plan_update_rebinds_to_a_new_graph() -> None:
    be = backend_for()
    _, _, y1 = _chain(2)
    g1 = tp.Graph(y1)
    place(g1)
    plan = be.graph_plan_create(g1)
    x2, c2, y2 = _chain(5)
    g2 = tp.Graph(y2)
    place(g2)
    for t in (x2, c2):
        tp.set_array(t, np.ones(4, np.float32))
    be.graph_plan_update(plan, g2)
    be.graph_plan_compute(plan)
    np.testing.assert_array_equal(tp.get_array(y2), np.full(4, 6.0))
    with pytest.raises(TypeError, match="not created by this CPU backend"):
        backend_for().graph_plan_compute(plan)


def _placed_chain(n: int) -> tuple[tp.Tensor, tp.Tensor, tp.Tensor, tp.Graph]:
    """:func:`_chain` in a placed graph, x = 0 and c = 1 set: (x, c, last, graph)."""
    x, c, y = _chain(n)
    g = tp.Graph(y)
    place(g)
    tp.set_array(x, np.zeros(4, np.float32))
    tp.set_array(c, np.ones(4, np.float32))
    return x, c, y, g


def test_graph_compute_reuses_its_plan_until_the_graph_changes() -> None:
    be = backend_for()
    x, c, y, g = _placed_chain(3)
    be.graph_compute(g)
    first = be._cached
    be.graph_compute(tp.Graph(y))  # a new Graph object with the same nodes and memory
    assert be._cached is first
    # the same tensors moved to another buffer: the plan must follow them
    for t in [*g.leafs, *g.nodes]:
        t.buffer = None
    place(g)
    tp.set_array(x, np.full(4, 2.0, np.float32))
    tp.set_array(c, np.ones(4, np.float32))
    be.graph_compute(g)
    assert be._cached is not first
    np.testing.assert_array_equal(tp.get_array(y), np.full(4, 5.0))


def test_graph_compute_rereads_the_graph_only_after_a_placement_or_a_source_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorplug_cpu import backend as cpu_backend

    keys: list[int] = []
    real = cpu_backend.graph_key

    def counting_key(nodes: Sequence[tp.Tensor]) -> cpu_backend.GraphKey:
        keys.append(1)
        return real(nodes)

    monkeypatch.setattr(cpu_backend, "graph_key", counting_key)
    be = backend_for()
    x, c, y, g = _placed_chain(3)
    be.graph_compute(g)
    read = len(keys)
    for _ in range(3):  # a token loop: same nodes, nothing placed anew
        be.graph_compute(g)
    assert len(keys) == read
    np.testing.assert_array_equal(tp.get_array(y), np.full(4, 3.0))
    g.nodes[-1].src = (x, c)  # rewired in place: the last add now reads x
    be.graph_compute(g)
    assert len(keys) > read
    np.testing.assert_array_equal(tp.get_array(y), np.full(4, 1.0))
    shorter = tp.Graph(g.nodes[0])  # other nodes: read again, computed as they are
    tp.set_array(x, np.full(4, 5.0, np.float32))
    be.graph_compute(shorter)
    np.testing.assert_array_equal(tp.get_array(g.nodes[0]), np.full(4, 6.0))


def test_graph_compute_keeps_the_plans_of_alternating_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorplug_cpu import backend as cpu_backend

    built: list[object] = []
    real = cpu_backend.CpuGraphPlan.bind

    def counting_bind(self: object, *args: object) -> None:
        built.append(self)
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_backend.CpuGraphPlan, "bind", counting_bind)
    be = backend_for()
    chains = [_chain(n) for n in (1, 2, 3)]
    graphs = [tp.Graph(y) for _, _, y in chains]
    for (x, c, _), g in zip(chains, graphs, strict=True):
        place(g)
        tp.set_array(x, np.zeros(4, np.float32))
        tp.set_array(c, np.ones(4, np.float32))
    for _ in range(3):  # prompt, token, prompt, token...: one plan each, built once
        for n, ((_, _, y), g) in enumerate(zip(chains, graphs, strict=True), start=1):
            be.graph_compute(g)
            np.testing.assert_array_equal(tp.get_array(y), np.full(4, float(n)))
            assert be._cached is list(be._plans.values())[-1]  # the one it ran last
    assert len(built) == 3
    more = [_chain(4) for _ in range(cpu_backend.PLAN_CACHE)]
    for x, c, y in more:  # enough new graphs to push the first ones out
        g = tp.Graph(y)
        place(g)
        tp.set_array(x, np.zeros(4, np.float32))
        tp.set_array(c, np.ones(4, np.float32))
        be.graph_compute(g)
    assert len(be._plans) == cpu_backend.PLAN_CACHE
    be.graph_compute(graphs[0])
    assert len(built) == 3 + len(more) + 1  # forgotten, so built again
    # a kept plan over a freed buffer is dropped at the next miss
    buf = more[-1][2].buffer
    assert buf is not None
    buf.free()
    be.graph_compute(graphs[1])
    assert all(not any(b.is_freed for b in p.buffers) for p in be._plans.values())
    assert be._cached is list(be._plans.values())[-1]
    be.free()
    assert not be._plans and be._cached is None


def test_freed_buffer_is_detected_before_computing() -> None:
    be = backend_for()
    _, _, y = _chain(2)
    g = tp.Graph(y)
    buf = place(g)
    plan = be.graph_plan_create(g)
    buf.free()
    with pytest.raises(BufferFreedError, match="buffer 'CPU' used by the graph was freed"):
        be.graph_plan_compute(plan)


# -- extensions ---------------------------------------------------------------------------------


def test_abort_callback_stops_between_nodes_and_leaves_buffers_usable() -> None:
    be = backend_for()
    x, c, y = _chain(6)
    g = tp.Graph(y)
    place(g)
    tp.set_array(x, np.zeros(4, np.float32))
    tp.set_array(c, np.ones(4, np.float32))
    calls = []

    def abort_after_three() -> bool:
        calls.append(1)
        return len(calls) > 3

    set_abort_callback = create_reg().get_proc("set_abort_callback")
    assert set_abort_callback is not None
    set_abort_callback(be, abort_after_three)
    with pytest.raises(ComputeAbortedError, match="before node 3 of 6"):
        be.graph_compute(g)
    assert len(calls) == 4
    np.testing.assert_array_equal(tp.get_array(g.nodes[2]), np.full(4, 3.0))  # done
    assert not np.array_equal(tp.get_array(g.nodes[3]), np.full(4, 4.0))  # never run
    be.set_abort_callback(None)
    be.graph_compute(g)  # the same buffers and plan still work
    np.testing.assert_array_equal(tp.get_array(y), np.full(4, 6.0))


def test_set_n_threads_sets_the_pool_and_blas_runs_on_one_thread_while_computing() -> None:
    from threadpoolctl import threadpool_info

    from tensorplug_cpu.workers import POOL

    def blas_threads() -> int:
        return next(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    original = blas_threads()
    be = backend_for()
    set_n_threads = create_reg().get_proc("ggml_backend_set_n_threads")
    assert set_n_threads is not None
    a, b = tp.new_tensor("f32", (64, 64), "a"), tp.new_tensor("f32", (64, 64), "b")
    out = ops.mul_mat(a, b)
    g = tp.Graph(ops.scale(out, 1.0))
    place(g)
    av, bv = RNG.standard_normal((2, 64, 64)).astype(np.float32)
    tp.set_array(a, av)
    tp.set_array(b, bv)
    during: list[int] = []

    def record_blas_threads() -> bool:
        during.append(blas_threads())
        return False  # never aborts

    be.set_abort_callback(record_blas_threads)
    try:
        set_n_threads(be, 1)
        assert POOL.n_threads == 1
        be.graph_compute(g)
        np.testing.assert_allclose(tp.get_array(out), bv @ av.T, rtol=1e-4, atol=1e-4)
        assert during and set(during) == {1}  # the pool splits products, not BLAS
        assert blas_threads() == original  # the application's numpy keeps its threads
        other = backend_for()
        other.set_n_threads(POOL.max_threads)
        other.graph_compute(g)
        assert POOL.n_threads == POOL.max_threads
        be.graph_compute(g)  # each backend's own count is re-applied when it computes
        assert POOL.n_threads == 1
    finally:
        be.set_n_threads(POOL.max_threads)
    with pytest.raises(ValueError, match="n_threads must be an int >= 1"):
        be.set_n_threads(0)


def test_only_a_plan_that_calls_blas_pins_it_to_one_thread() -> None:
    """Pinning BLAS costs every compute a few µs (each generated token's), so a plan
    whose steps are all numba kernels leaves BLAS as it is; one with a BLAS product
    pins it while it computes."""
    from threadpoolctl import threadpool_info

    def blas_threads() -> int:
        return next(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    be = backend_for()
    if be.jit is None:
        pytest.skip("numba is not installed: every quantized product decodes for BLAS")
    w = tp.new_tensor("q8_0", (64, 64), "w")
    x = tp.new_tensor("f32", (1, 64), "x")  # one token: the fused integer kernel
    fused = tp.Graph(ops.scale(ops.mul_mat(w, x), 1.0))
    a, b = tp.new_tensor("f32", (64, 64), "a"), tp.new_tensor("f32", (64, 64), "b")
    blas = tp.Graph(ops.scale(ops.mul_mat(a, b), 1.0))
    place(fused)
    place(blas)
    tp.set_array(w, tp.quants.quantize(RNG.standard_normal((64, 64)), tp.Type.Q8_0))
    tp.set_array(x, RNG.standard_normal((1, 64)).astype(np.float32))
    tp.set_array(a, RNG.standard_normal((64, 64)).astype(np.float32))
    tp.set_array(b, RNG.standard_normal((64, 64)).astype(np.float32))
    original = blas_threads()
    during: list[int] = []

    def record_blas_threads() -> bool:
        during.append(blas_threads())
        return False  # never aborts

    be.set_abort_callback(record_blas_threads)
    fused_plan, blas_plan = be.graph_plan_create(fused), be.graph_plan_create(blas)
    assert not fused_plan.uses_blas and blas_plan.uses_blas  # type: ignore[attr-defined]
    be.graph_plan_compute(fused_plan)
    assert set(during) == {original}
    during.clear()
    be.graph_plan_compute(blas_plan)
    assert set(during) == {1}
    assert blas_threads() == original


# -- host memory --------------------------------------------------------------------------------


def test_buffer_from_host_ptr_wraps_a_numpy_array_without_copying() -> None:
    dev = create_reg().device(0)
    memory = np.zeros(256, np.uint8)
    buf = dev.buffer_from_host_ptr(memory)
    a = tp.new_tensor("f32", (8,), "a")
    out = ops.scale(a, 2.0)
    tp.tensor_alloc(buf, a, 0)
    tp.tensor_alloc(buf, out, 64)
    memory[:32].view(np.float32)[:] = np.arange(8)  # written by the owner, not via tensorplug
    backend_for().graph_compute(tp.Graph(out))
    np.testing.assert_array_equal(memory[64:96].view(np.float32), 2 * np.arange(8))


def test_buffer_from_host_ptr_reads_weights_from_an_mmap(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gguf

    from tensorplug.quants import quantize

    w = RNG.standard_normal((16, 64)).astype(np.float32)
    raw = quantize(w, tp.Type.Q8_0)
    path = tmp_path / "weights.bin"
    path.write_bytes(raw.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    dev = create_reg().device(0)
    wbuf = dev.buffer_from_host_ptr(mm)
    assert wbuf.host_array().ctypes.data == np.frombuffer(mm, np.uint8).ctypes.data  # no copy
    weight = tp.new_tensor(tp.Type.Q8_0, (16, 64), "w")
    tp.tensor_alloc(wbuf, weight, 0)
    x = tp.new_tensor("f32", (2, 64), "x")
    out = ops.mul_mat(weight, x)
    act = tp.host_buffer_type().alloc_buffer(4096)
    tp.tensor_alloc(act, x, 0)
    tp.tensor_alloc(act, out, 1024)
    xv = RNG.standard_normal((2, 64)).astype(np.float32)
    tp.set_array(x, xv)
    backend_for().graph_compute(tp.Graph(out))
    weights = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)  # independent
    x64 = q8_activations(xv)  # ggml's Q8_0 activations, on every path
    expected = x64 @ weights.astype(np.float64).T
    np.testing.assert_allclose(tp.get_array(out), expected, rtol=1e-5, atol=1e-5)


def test_jit_can_be_switched_off_for_the_process() -> None:
    import os
    import subprocess
    import sys

    code = (
        "from tensorplug_cpu.kernels.jit import jit_status, load_jit\n"
        "from tensorplug_cpu.device import create_reg\n"
        "assert load_jit() is None\n"
        "assert create_reg().device(0).init_backend().jit is None\n"
        "print(jit_status())\n"
    )
    env = {**os.environ, "TENSORPLUG_CPU_JIT": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "disabled by TENSORPLUG_CPU_JIT"


def test_the_plugin_works_without_numba_or_llvmlite_installed() -> None:
    """The ``[numba]`` extra is optional: where neither numba nor llvmlite imports (here
    blocked as Python blocks a module, by ``None`` in ``sys.modules``), the plugin still
    imports, says why it has no kernels, and computes with numpy's (a Q4_0 product,
    against the float product of the decoded weights)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['numba'] = sys.modules['llvmlite'] = None\n"
        "import numpy as np\n"
        "import tensorplug as tp\n"
        "from tensorplug import ops\n"
        "from tensorplug.quants import dequantize, quantize\n"
        "from tensorplug_cpu.device import create_reg\n"
        "from tensorplug_cpu.kernels.jit import jit_status, load_jit\n"
        "from test_cpu_helpers import q8_activations\n"
        "backend = create_reg().device(0).init_backend()\n"
        "assert load_jit() is None and backend.jit is None\n"
        "rng = np.random.default_rng(0)\n"
        "blocks = quantize(rng.standard_normal((8, 64)).astype(np.float32), tp.Type.Q4_0)\n"
        "x = rng.standard_normal((3, 64)).astype(np.float32)\n"
        "w, xt = tp.new_tensor(tp.Type.Q4_0, (8, 64)), tp.new_tensor('f32', (3, 64))\n"
        "g = tp.Graph(ops.mul_mat(w, xt))\n"
        "tp.alloc_tensors([*g.leafs, *g.nodes], tp.host_buffer_type())\n"
        "tp.set_array(w, blocks)\n"
        "tp.set_array(xt, x)\n"
        "backend.graph_compute(g)\n"
        "want = q8_activations(x) @ dequantize(blocks, tp.Type.Q4_0, 64).T  # ggml's rounding\n"
        "got = tp.get_array(g.nodes[-1])\n"
        "print(np.allclose(got, want, rtol=1e-5, atol=1e-4), jit_status())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[1])  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True numba not installed (pip install -e 'plugins/cpu[numba]')"


def test_numba_is_imported_without_coverage_unless_a_coverage_run_is_in_progress() -> None:
    """numba imports ``coverage`` where it is installed, for a coverage run's sake only:
    40-80 ms of each launch. The plugin's import of numba hides it unless it is imported
    already (a run in progress), and leaves it importable afterwards."""
    import os
    import subprocess
    import sys

    pytest.importorskip("numba")
    pytest.importorskip("coverage")
    code = (
        "import sys\n"
        "if 'running' in sys.argv: import coverage\n"
        "from tensorplug_cpu.kernels.jit import load_jit\n"
        "from tensorplug_cpu.kernels.numba_import import numba_module\n"
        "assert load_jit() is not None\n"
        "numba_module()  # where the plugin imports numba (at once, or at a kernel not kept)\n"
        "from numba.misc import coverage_support\n"
        "print(coverage_support.coverage_available, 'coverage' in sys.modules)\n"
        "import coverage\n"
        "print(coverage.Coverage.__name__)\n"
    )
    # the child starts no coverage run of its own (this suite's own subprocess patch)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE_", "COV_CORE_"))}
    for args, seen in (((), "False False"), (("running",), "True True")):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                             text=True, env=env, check=True)  # fmt: skip
        assert out.stdout.split("\n")[:2] == [seen, "Coverage"], out.stdout


def test_a_jit_setting_it_cannot_read_is_refused_naming_the_valid_values() -> None:
    """``TENSORPLUG_CPU_JIT=maybe`` is not taken as on: asking for the kernels raises a
    SettingError that names the values the setting takes; blank means the default."""
    from tensorplug.settings import SettingError
    from tensorplug_cpu.kernels import jit as jit_module
    from tensorplug_cpu.settings import JIT

    assert JIT.get({"TENSORPLUG_CPU_JIT": "off"}) is False
    assert JIT.get({"TENSORPLUG_CPU_JIT": " "}) is True
    with pytest.raises(SettingError, match=r"TENSORPLUG_CPU_JIT='maybe'.*'off'.*'on'"):
        JIT.get({"TENSORPLUG_CPU_JIT": "maybe"})
    saved = dict(jit_module._state)
    jit_module._state.clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TENSORPLUG_CPU_JIT", "maybe")
            with pytest.raises(SettingError, match="expected one of"):
                jit_module.load_jit()
            assert "kernels" not in jit_module._state  # asked again next time, not cached
    finally:
        jit_module._state.clear()
        jit_module._state.update(saved)


def test_plan_scratch_is_aligned_reused_across_nodes_and_distinct_within_one() -> None:
    from tensorplug_cpu.kernels import BuildContext

    ctx = BuildContext()
    # sizes growing a little at a time reuse a slot's array while it is barely big enough
    sizes = np.stack([np.arange(1, 301), RNG.integers(1, 300, 300), np.arange(300, 0, -1)], 1)
    for row in sizes:
        ctx.begin_node()
        types = (np.float32, np.float64, np.int32)
        arrays = [ctx.scratch((int(n), 3), dt) for n, dt in zip(row, types, strict=True)]
        for arr, n in zip(arrays, row, strict=True):
            assert arr.shape == (n, 3) and arr.ctypes.data % 64 == 0
        for i, a in enumerate(arrays):  # one node's temporaries never overlap
            assert not any(np.may_share_memory(a, b) for b in arrays[i + 1 :])
    ctx.begin_node()
    first = ctx.scratch((4,))
    ctx.begin_node()
    assert np.may_share_memory(first, ctx.scratch((4,)))  # the next node reuses slot 0

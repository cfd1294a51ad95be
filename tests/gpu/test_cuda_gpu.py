"""The CUDA backend on a real NVIDIA GPU, through the real cupy.

Every test here skips, saying why, where tensorplug-cuda cannot run (no cupy, no
driver, no GPU): that is CI and every machine without an NVIDIA GPU. On a GPU they
check what the fake of cupy cannot: NVRTC's code for this GPU, warps, real streams and
events, CUDA-graph capture, cuBLAS, out-of-memory recovery. ``scripts/gpu-check.sh``
runs them (with ``tensorplug check --backend CUDA0`` and the benchmark).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mmvq_reference import Product, f16_product

import tensorplug as tp
import tensorplug_cuda
from tensorplug import Type, ops
from tensorplug.quants import quantize
from tensorplug.testing import catalogue, run_cases
from tensorplug_cuda.errors import OutOfMemoryError
from tensorplug_kernels.source import MMVQ_TYPES

_SCORE = tensorplug_cuda.score()
pytestmark = pytest.mark.skipif(_SCORE[0] == 0, reason=f"no usable NVIDIA GPU: {_SCORE[1]}")


@pytest.fixture(scope="module")
def reg() -> Any:
    from tensorplug_cuda.reg import create_reg

    return create_reg()


@pytest.fixture
def backend(reg: Any) -> Iterator[Any]:
    be = reg.devices()[0].init_backend()
    yield be
    be.free()


def test_devices_report_the_gpu(reg: Any) -> None:
    dev = reg.devices()[0]
    props = dev.props()
    assert dev.name == "CUDA0" and props.type in (tp.DeviceType.GPU, tp.DeviceType.IGPU)
    assert 0 < props.memory_free <= props.memory_total
    assert dev.device_id.count(":") == 2 and dev.info.bandwidth > 0
    assert dev.program.kernel("k_unary") is dev.program.kernel("k_unary")


def test_the_quick_catalogue_agrees_with_the_cpu_backend(backend: Any) -> None:
    report = run_cases(catalogue(), backend, tp.registry.init_by_name("CPU"))
    failed = [(r.case, r.message) for r in report.results if r.outcome.name == "FAIL"]
    assert failed == []


def _decode_graph(backend: Any) -> tuple[tp.Graph, tp.Tensor, tp.Tensor]:
    rng = np.random.default_rng(0)
    w = tp.new_tensor("q4_0", (512, 512))
    x = tp.new_tensor("f32", (1, 512)).set_input()
    y = ops.rms_norm(ops.silu(ops.mul_mat(w, x)), 1e-6).set_output()
    graph = tp.Graph(y)
    tp.alloc_tensors([w], backend.buffer_type())
    tp.GraphAllocator(backend.buffer_type()).alloc_graph(graph)
    tp.set_array(w, quantize(rng.standard_normal((512, 512)), Type.Q4_0))
    return graph, x, y


def _launched(backend: Any, graph: tp.Graph) -> None:
    """``graph`` launched kernel by kernel (graph_compute would replay it)."""
    with backend.device.current():
        for node in graph.nodes:
            backend.compute_node(node)
    backend.synchronize()


def test_a_captured_cuda_graph_computes_what_eager_launches_do(backend: Any) -> None:
    graph, x, y = _decode_graph(backend)
    plan = backend.graph_plan_create(graph)
    rng = np.random.default_rng(1)
    for _ in range(4):
        tp.set_array(x, rng.standard_normal((1, 512)).astype(np.float32))
        backend.graph_plan_compute(plan)
        backend.synchronize()
        replayed = tp.get_array(y)
        _launched(backend, graph)
        np.testing.assert_array_equal(replayed, tp.get_array(y))  # bit for bit
    assert plan.captured is not None and plan.replays == 3, plan.not_captured


def test_graph_compute_replays_what_eager_launches_do(backend: Any) -> None:
    graph, x, y = _decode_graph(backend)
    rng = np.random.default_rng(3)
    for _ in range(4):
        tp.set_array(x, rng.standard_normal((1, 512)).astype(np.float32))
        backend.graph_compute(graph)  # eager, captured, then replays
        replayed = tp.get_array(y)
        _launched(backend, graph)
        np.testing.assert_array_equal(replayed, tp.get_array(y))  # bit for bit
    assert backend.graphs.replays == 3 and not backend.graphs.off, backend.graphs.off


def test_cublas_and_the_kernels_agree(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    weights = rng.standard_normal((256, 512)).astype(np.float16)
    acts = rng.standard_normal((64, 512)).astype(np.float32)
    w = tp.new_tensor("f16", (256, 512))
    x = tp.new_tensor("f32", (64, 512))
    y = ops.mul_mat(w, x)
    tp.alloc_tensors([w, x, y], backend.buffer_type())
    tp.set_array(w, weights)
    tp.set_array(x, acts)
    backend.graph_compute(tp.Graph(y))
    tensor_cores = tp.get_array(y)  # F16 operands, F32 sums, F16 result
    assert not backend.matmul.unavailable, backend.matmul.unavailable
    np.testing.assert_allclose(
        tensor_cores, f16_product(acts, weights.astype(np.float32)), rtol=2**-10, atol=2**-14
    )
    backend.matmul.half = False  # weights widened to F32, SGEMM
    backend.graph_compute(tp.Graph(y))
    exact = tp.get_array(y)
    backend.matmul.enabled = False
    backend.graph_compute(tp.Graph(y))
    kernels = tp.get_array(y)
    assert ((exact - kernels) ** 2).sum() / (kernels**2).sum() < 1e-10


@pytest.mark.parametrize("wtype", MMVQ_TYPES, ids=lambda t: t.name)
def test_the_integer_mat_vec_kernels_match_their_formula(backend: Any, wtype: Type) -> None:
    """__dp4a, the warp reductions and NVRTC's code for the mmvq kernels, held to the
    numpy formula of the same computation (tests/mmvq_reference.py)."""
    for tokens in (1, 3, 8):
        p = Product(backend, wtype, tokens, k=1024)
        x = p.new_input()
        backend.graph_compute(p.graph)
        p.check(x)


def test_out_of_device_memory_is_recoverable(reg: Any, backend: Any) -> None:
    dev = reg.devices()[0]
    free, total = dev.memory()
    assert free < total  # the driver's own context takes some: all of it cannot be had
    with pytest.raises(OutOfMemoryError):
        dev.buffer_type().alloc_buffer(total)
    a = tp.new_tensor("f32", (8,))
    y = ops.neg(a)
    tp.alloc_tensors([a, y], backend.buffer_type())
    tp.set_array(a, np.ones(8, np.float32))
    backend.graph_compute(tp.Graph(y))
    np.testing.assert_array_equal(tp.get_array(y), -np.ones(8))


def test_events_and_async_copies_between_streams(reg: Any) -> None:
    dev = reg.devices()[-1]
    first, second = dev.init_backend(), reg.devices()[0].init_backend()
    a = tp.new_tensor("f32", (1024,))
    y = ops.scale(a, 2.0)
    tp.alloc_tensors([a, y], first.buffer_type())
    z = tp.new_tensor("f32", (1024,))
    tp.alloc_tensors([z], second.buffer_type())
    tp.set_array(a, np.arange(1024, dtype=np.float32))
    first.graph_compute_async(tp.Graph(y))
    tp.tensor_copy_async(first, second, y, z)
    second.synchronize()
    np.testing.assert_array_equal(tp.get_array(z), 2 * np.arange(1024))


def test_a_bad_index_is_reported_at_synchronize(backend: Any) -> None:
    table, rows = tp.new_tensor("f32", (4, 8)), tp.new_tensor("i32", (1,))
    y = ops.get_rows(table, rows)
    tp.alloc_tensors([table, rows, y], backend.buffer_type())
    tp.set_array(table, np.zeros((4, 8), np.float32))
    tp.set_array(rows, np.array([4], np.int32))
    with pytest.raises(tp.OutOfBoundsError):
        backend.graph_compute(tp.Graph(y))

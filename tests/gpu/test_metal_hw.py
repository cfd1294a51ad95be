"""The Metal backend on a real Mac, through the real pyobjc.

Every test here skips, saying why, where tensorplug-metal cannot run (not macOS, no
pyobjc, no Metal device): that is CI and every machine that is not a Mac. On a Mac
they check what the fake of Metal cannot: Apple's compiler on the MSL text, simdgroup
reductions, real command buffers and shared events, and that pyobjc's ownership
metadata really frees memory. ``scripts/metal-check.sh`` runs them (with
``tensorplug check --backend Metal0`` and the benchmark). Until it has run on a Mac,
the plugin is not verified on Apple hardware.
"""

from __future__ import annotations

import gc
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorplug as tp
import tensorplug_metal
from tensorplug import ops
from tensorplug.testing import catalogue, run_cases

_SCORE = tensorplug_metal.score()
pytestmark = pytest.mark.skipif(_SCORE[0] == 0, reason=f"no usable Metal device: {_SCORE[1]}")


@pytest.fixture(scope="module")
def reg() -> Any:
    from tensorplug_metal.reg import create_reg

    return create_reg()


@pytest.fixture
def backend(reg: Any) -> Iterator[Any]:
    be = reg.devices()[0].init_backend()
    yield be
    be.free()


def test_the_device_reports_what_metal_says(reg: Any) -> None:
    dev = reg.devices()[0]
    props = dev.props()
    assert dev.name == "Metal0" and props.type in (tp.DeviceType.GPU, tp.DeviceType.IGPU)
    assert 0 < props.memory_free <= props.memory_total
    assert dev.program.kernel("k_unary") is dev.program.kernel("k_unary")


def test_the_quick_catalogue_agrees_with_the_cpu_backend(backend: Any) -> None:
    report = run_cases(catalogue(), backend, tp.registry.init_by_name("CPU"))
    failed = [(r.case, r.message) for r in report.results if r.outcome.name == "FAIL"]
    assert failed == []


def test_freed_buffers_give_their_memory_back_to_metal(reg: Any) -> None:
    """pyobjc issue 690: without the ownership metadata every buffer leaks."""
    dev = reg.devices()[0]
    gc.collect()
    before = int(dev.mtl.currentAllocatedSize())
    for _ in range(20):
        buf = dev.buffer_type().alloc_buffer(64 << 20)
        buf.free()
        del buf
        gc.collect()
    assert int(dev.mtl.currentAllocatedSize()) < before + (64 << 20)


def test_mapped_weights_are_read_without_a_copy(backend: Any, tmp_path: Path) -> None:
    table = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)
    path = tmp_path / "w.bin"
    path.write_bytes(table.tobytes())
    with path.open("rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    dev = backend.device
    buf = dev.buffer_from_host_ptr(memoryview(mapping), table.nbytes)
    w = tp.new_tensor("f32", (4096, 64))
    tp.tensor_alloc(buf, w, 0)
    y = ops.scale(w, 2.0)
    tp.alloc_tensors([y], dev.buffer_type())
    backend.graph_compute(tp.Graph(y))
    np.testing.assert_array_equal(tp.get_array(y), 2 * table)


def test_a_graph_plan_computes_again_and_again(backend: Any) -> None:
    x = tp.new_tensor("f32", (4, 4096), "x")
    y = ops.silu(ops.rms_norm(x, 1e-6))
    graph = tp.Graph(y)
    tp.GraphAllocator(backend.buffer_type()).alloc_graph(graph)
    plan = backend.graph_plan_create(graph)
    rng = np.random.default_rng(1)
    for _ in range(3):
        data = rng.standard_normal((4, 4096)).astype(np.float32)
        tp.set_array(x, data)
        backend.graph_plan_compute(plan)
        backend.synchronize()
        n = data / np.sqrt(np.mean(data * data, axis=-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(tp.get_array(y), n / (1 + np.exp(-n)), rtol=1e-4, atol=1e-5)


def test_a_bad_index_is_raised_at_synchronize(backend: Any) -> None:
    table = tp.new_tensor("f32", (4, 8))
    rows = tp.new_tensor("i32", (2,))
    out = ops.get_rows(table, rows)
    tp.alloc_tensors([table, rows, out], backend.buffer_type())
    tp.set_array(table, np.zeros((4, 8), np.float32))
    tp.set_array(rows, np.array([1, 9], np.int32))
    with pytest.raises(tp.OutOfBoundsError, match="index 9"):
        backend.graph_compute(tp.Graph(out))

"""Freed memory used again: an error naming the buffer, on every backend — not a crash
(a kernel handed a released cl.Buffer takes the whole process down)."""

from __future__ import annotations

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops


def _backend(name: str) -> tp.Backend:
    dev = tp.dev_by_name(name)
    if dev is None:
        pytest.skip(f"no {name} device (pip install pocl-binary-distribution for OpenCL)")
    return dev.init_backend()


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_a_graph_plan_over_a_freed_buffer_raises(device: str) -> None:
    be = _backend(device)
    x = tp.new_tensor("f32", (8,), "x")
    y = ops.neg(x)
    g = tp.Graph(y)
    buf = tp.alloc_tensors([x, y], be.buffer_type())
    tp.set_array(x, np.arange(8, dtype=np.float32))
    plan = be.graph_plan_create(g)
    be.graph_plan_compute(plan)
    be.synchronize()
    np.testing.assert_array_equal(tp.get_array(y), -np.arange(8, dtype=np.float32))
    buf.free()
    with pytest.raises(tp.BufferFreedError, match="was freed"):
        be.graph_plan_compute(plan)
    with pytest.raises(tp.BufferFreedError, match="was freed"):
        be.graph_compute(g)


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_copying_from_a_freed_buffer_raises(device: str) -> None:
    be = _backend(device)
    src = tp.new_tensor("f32", (8,), "src")
    dst = tp.new_tensor("f32", (8,), "dst")
    sbuf = tp.alloc_tensors([src], be.buffer_type())
    tp.alloc_tensors([dst], be.buffer_type())
    sbuf.free()
    with pytest.raises(tp.BufferFreedError, match="'src'.*was freed"):
        tp.tensor_copy_async(be, be, src, dst)


@pytest.mark.parametrize("index_type", ["i32", "i64"])
def test_cpu_set_rows_with_a_bad_index_writes_nothing(index_type: str) -> None:
    be = _backend("CPU")
    cache = tp.new_tensor("f32", (4, 8), "cache")
    rows = tp.new_tensor("f32", (3, 8), "rows")
    idx = tp.new_tensor(index_type, (3,), "idx")
    out = ops.set_rows(cache, rows, idx)
    tp.alloc_tensors([cache, rows, idx], be.buffer_type())
    tp.view_init(out)  # set_rows writes into the cache: its result is a view of it
    tp.set_array(cache, np.zeros((4, 8), np.float32))
    tp.set_array(rows, np.ones((3, 8), np.float32))
    tp.set_array(idx, np.array([0, 1, -1], dtype=np.int32 if index_type == "i32" else np.int64))
    with pytest.raises(tp.OutOfBoundsError, match="index -1 with 4 rows"):
        be.graph_compute(tp.Graph(out))
    np.testing.assert_array_equal(tp.get_array(cache), np.zeros((4, 8), np.float32))


@pytest.mark.parametrize("index_type", ["i32", "i64"])
@pytest.mark.parametrize("bad", [-1, 4, 2**31 - 1])
def test_opencl_set_rows_with_a_bad_index_raises_and_writes_nothing(
    index_type: str, bad: int
) -> None:
    be = _backend("OpenCL0")
    cache = tp.new_tensor("f32", (4, 8), "cache")
    rows = tp.new_tensor("f32", (3, 8), "rows")
    idx = tp.new_tensor(index_type, (3,), "idx")
    out = ops.set_rows(cache, rows, idx)
    tp.alloc_tensors([cache, rows, idx], be.buffer_type())
    tp.view_init(out)
    before = np.arange(32, dtype=np.float32).reshape(4, 8)
    tp.set_array(cache, before)
    tp.set_array(rows, np.ones((3, 8), np.float32))
    dtype = np.int32 if index_type == "i32" else np.int64
    tp.set_array(idx, np.array([0, bad, 1], dtype=dtype))
    with pytest.raises(tp.OutOfBoundsError, match=rf"index {bad}\b.*Nothing was written"):
        be.graph_compute(tp.Graph(out))
    np.testing.assert_array_equal(tp.get_array(cache), before)
    # the error is reported once; a good scatter afterwards works
    tp.set_array(idx, np.array([0, 3, 1], dtype=dtype))
    be.graph_compute(tp.Graph(out))
    got = tp.get_array(cache)
    np.testing.assert_array_equal(got[[0, 1, 3]], np.ones((3, 8), np.float32))
    np.testing.assert_array_equal(got[2], before[2])


def test_opencl_get_rows_with_a_bad_index_raises() -> None:
    be = _backend("OpenCL0")
    table = tp.new_tensor("f32", (5, 4), "table")
    idx = tp.new_tensor("i32", (3,), "idx")
    out = ops.get_rows(table, idx)
    g = tp.Graph(out)
    tp.alloc_tensors([table, idx, out], be.buffer_type())
    tp.set_array(table, np.arange(20, dtype=np.float32).reshape(5, 4))
    tp.set_array(idx, np.array([1, 5, 0], np.int32))
    with pytest.raises(tp.OutOfBoundsError, match="index 5"):
        be.graph_compute(g)
    tp.set_array(idx, np.array([1, 4, 0], np.int32))
    be.graph_compute(g)
    np.testing.assert_array_equal(tp.get_array(out), np.arange(20).reshape(5, 4)[[1, 4, 0]])
    # through a graph plan, too: the error surfaces at synchronize
    plan = be.graph_plan_create(g)
    tp.set_array(idx, np.array([-3, 0, 0], np.int32))
    be.graph_plan_compute(plan)
    with pytest.raises(tp.OutOfBoundsError, match="index -3"):
        be.synchronize()

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

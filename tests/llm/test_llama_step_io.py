"""StepIO: a step graph's inputs written and outputs read through kept host views."""

from __future__ import annotations

import numpy as np
import pytest

import tensorplug as tp
from tensorplug.errors import BufferFreedError, TypeMismatchError
from tensorplug_llm.step_io import StepIO


def _placed(*tensors: tp.Tensor) -> tp.Buffer:
    buf = tp.alloc_tensors(list(tensors), tp.host_buffer_type())
    assert buf is not None
    return buf


def test_writes_and_reads_land_in_the_tensors_memory() -> None:
    io = StepIO()
    a, b = tp.new_tensor("i32", (3,), "a"), tp.new_tensor("f32", (2, 4), "b")
    _placed(a, b)
    io.write(a, np.array([5, 6, 7], np.int32))
    io.write(b, np.arange(8, dtype=np.float32).reshape(2, 4))
    np.testing.assert_array_equal(tp.get_array(a), [5, 6, 7])
    io.write(a, np.array([1, 2, 3], np.int32))  # again, through the kept view
    np.testing.assert_array_equal(tp.get_array(a), [1, 2, 3])
    got = io.read(b)
    np.testing.assert_array_equal(got, np.arange(8).reshape(2, 4))
    io.write(b, np.zeros((2, 4), np.float32))
    assert got.any(), "a read is a copy: the next step's writes do not reach it"


def test_a_tensor_placed_again_is_written_where_it_lives_now() -> None:
    io = StepIO()
    a = tp.new_tensor("f32", (4,), "a")
    first = _placed(a)
    io.write(a, np.ones(4, np.float32))
    a.buffer = None  # what a scheduler allocating a graph again does: it moves the tensor
    second = _placed(a)
    io.write(a, np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(tp.get_array(a), np.full(4, 2.0))
    assert second is not first and first.host_array().view(np.float32)[:4].tolist() == [1] * 4


def test_what_set_array_refuses_is_still_refused() -> None:
    io = StepIO()
    a = tp.new_tensor("i32", (3,), "a")
    buf = _placed(a)
    io.write(a, np.zeros(3, np.int32))
    with pytest.raises(TypeMismatchError, match="dtype int64"):
        io.write(a, np.zeros(3, np.int64))  # no silent narrowing through the view
    with pytest.raises(tp.errors.ShapeError):
        io.write(a, np.zeros(4, np.int32))
    buf.free()
    with pytest.raises(BufferFreedError):
        io.write(a, np.zeros(3, np.int32))
    with pytest.raises(BufferFreedError):
        io.read(a)

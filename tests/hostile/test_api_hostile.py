"""Bad arguments to the tensor/graph API: each refused when given, naming what was wrong,
through the TensorplugError hierarchy — never an AttributeError from inside, never
accepted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops


def _x() -> tp.Tensor:
    return tp.new_tensor("f32", (4, 4), "x")


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: ops.add(_x(), 3.0), tp.TypeMismatchError, "b must be a Tensor, got float 3.0"),
        (lambda: ops.mul_mat(None, _x()), tp.TypeMismatchError, "must be a Tensor, got NoneType"),
        (lambda: tp.Graph([1, 2]), tp.GraphError, "built from Tensors, got int 1"),
        (lambda: tp.Scheduler([None]), tp.TypeMismatchError, "None .NoneType. is not a Backend"),
        (lambda: ops.rms_norm(_x(), -1.0), tp.OpParamError, "eps must be a finite number >= 0"),
        (lambda: ops.norm(_x(), float("nan")), tp.OpParamError, "eps must be a finite number"),
        (lambda: tp.new_tensor("f32", (2.5, 3)), tp.ShapeError, "sequence of whole numbers"),
        (lambda: tp.new_tensor("f32", "abc"), tp.ShapeError, "got 'abc'"),
        (lambda: tp.new_tensor("f32", (True, 3)), tp.ShapeError, "whole numbers"),
        (
            lambda: ops.permute(tp.new_tensor("f32", (2, 3, 4)), (0.5, 1, 2)),
            tp.OpParamError,
            "axes must be whole numbers",
        ),
        (lambda: tp.new_tensor(True, (2,)), tp.TypeMismatchError, "unknown tensor type True"),
        (lambda: ops.view(_x(), (2,), offset=2), tp.ShapeError, "offset 2 does not start"),
        (
            lambda: ops.view(tp.new_tensor("q8_0", (2, 32)), (32,), offset=17),
            tp.ShapeError,
            "does not start a Q8_0 block",
        ),
    ],
)
def test_bad_arguments_are_refused_when_the_graph_is_built(
    build: Callable[[], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        build()


def test_a_cycle_made_after_building_is_an_error_not_a_hang() -> None:
    a = tp.new_tensor("f32", (2,), "a")
    b = ops.neg(a).set_name("b")
    c = ops.neg(b).set_name("c")
    b.src = (c,)  # b now depends on c, which depends on b
    with pytest.raises(tp.GraphError, match="depends on itself"):
        tp.Graph(c)


def test_zero_element_tensors_move_nothing_without_error() -> None:
    z = tp.new_tensor("f32", (0, 4), "z")
    tp.alloc_tensors([z], tp.host_buffer_type())
    tp.set_array(z, np.zeros((0, 4), np.float32))
    assert tp.get_array(z).shape == (0, 4)
    assert tp.tensor_get(z) == b""


def test_negative_sizes_are_out_of_bounds() -> None:
    x = _x()
    tp.alloc_tensors([x], tp.host_buffer_type())
    with pytest.raises(tp.OutOfBoundsError, match="size -5 is negative"):
        tp.tensor_get(x, 0, -5)


def test_pipeline_copies_are_capped() -> None:
    cpu = tp.init_by_name("CPU")
    with pytest.raises(ValueError, match="needs 2 <= n_copies <= 8, got 100000000"):
        tp.Scheduler([cpu], parallel=True, n_copies=10**8)
    code = "import tensorplug as tp; tp.Scheduler([tp.init_by_name('CPU')], parallel=True)"
    env = dict(os.environ, TENSORPLUG_SCHED_COPIES="99999999")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "2 to 8 copies" in done.stderr


def test_a_backend_list_naming_nothing_is_refused() -> None:
    env = dict(os.environ, TENSORPLUG_BACKENDS=",,")
    done = subprocess.run([sys.executable, "-c", "import tensorplug as tp; tp.devices()"],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 1 and "TENSORPLUG_BACKENDS=',,': it names no backend" in done.stderr


def test_op_params_cannot_change_behind_a_compiled_plan() -> None:
    """Backends compile a node's params once; changing them in place would be ignored."""
    cpu = tp.init_by_name("CPU")
    x = tp.new_tensor("f32", (2, 4), "x")
    y = ops.scale(x, 2.0)
    tp.alloc_tensors([x, y], cpu.buffer_type())
    tp.set_array(x, np.ones((2, 4), np.float32))
    cpu.graph_compute(tp.Graph(y))
    with pytest.raises(tp.OpParamError, match="build the op again"):
        y.op_params["scale"] = 3.0
    with pytest.raises(tp.OpParamError, match="fixed when the op is built"):
        y.op_params.update(scale=3.0)
    cpu.graph_compute(tp.Graph(y))
    np.testing.assert_array_equal(tp.get_array(y), np.full((2, 4), 2.0, np.float32))


def test_a_node_added_after_alloc_graph_asks_for_alloc_graph_again() -> None:
    cpu = tp.init_by_name("CPU")
    sched = tp.Scheduler([cpu])
    x = tp.new_tensor("f32", (4,), "x").set_input()
    g = tp.Graph(ops.neg(x))
    sched.alloc_graph(g)
    g.expand(ops.exp(g.nodes[-1]))  # one more node, after the graph got its memory
    with pytest.raises(tp.GraphError, match=r"changed after alloc_graph .* call alloc_graph"):
        sched.graph_compute(g)
    sched.alloc_graph(g)
    tp.set_array(x, np.zeros(4, np.float32))
    assert sched.graph_compute(g) is tp.Status.SUCCESS
    np.testing.assert_array_equal(tp.get_array(g.nodes[-1]), np.ones(4, np.float32))


def test_a_shape_spanning_more_than_2_63_bytes_is_refused() -> None:
    with pytest.raises(tp.ShapeError, match=r"spans \d+ bytes, more than any memory"):
        tp.new_tensor("f32", (2**40, 2**40))
    assert tp.new_tensor("i8", (2**31, 2**31)).nbytes == 2**62  # large, but addressable


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda a, p: ops.rope(a, p, 8, mode=99), r"rope: mode 99 is not one of"),
        (lambda a, p: ops.argsort(a, "sideways"), r"argsort: order 'sideways' is not one of 'asc'"),
        (lambda a, p: ops.unary(a, "gelu_fast"), r"unary: fn 'gelu_fast' is not one of"),
    ],
)
def test_unknown_op_modes_are_op_param_errors_listing_the_choices(build, match) -> None:  # type: ignore[no-untyped-def]
    a = tp.new_tensor("f32", (2, 4, 8))
    pos = tp.new_tensor("i32", (4,))
    with pytest.raises(tp.OpParamError, match=match):
        build(a, pos)


def test_api_argument_errors_are_tensorplug_errors() -> None:
    cpu = tp.dev_by_name("CPU").init_backend()
    with pytest.raises(tp.InvalidArgumentError, match="at least one backend"):
        tp.Scheduler([])
    with pytest.raises(tp.InvalidArgumentError, match="listed twice"):
        tp.Scheduler([cpu, cpu])
    with pytest.raises(tp.InvalidArgumentError, match="n_threads must be an int >= 1"):
        cpu.set_n_threads(-2)
    with pytest.raises(tp.TypeMismatchError, match="expected a callable or None"):
        cpu.set_abort_callback(3)  # type: ignore[arg-type]
    buf = tp.host_buffer_type().alloc_buffer(64)
    with pytest.raises(tp.InvalidArgumentError, match="must be a byte"):
        buf.clear(300)
    with pytest.raises(tp.InvalidArgumentError, match="unknown device type"):
        tp.dev_by_type("quantum")
    with pytest.raises(tp.OutOfBoundsError, match="out of range"):
        tp.dev_get(999)

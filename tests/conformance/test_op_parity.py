"""Where tensorplug follows ggml op by op (issue: op parity with the real ggml): argmax's
tie and NaN rule and gelu's clamps, on every backend, against ggml's own formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_cpu_helpers import ggml_gelu

import tensorplug as tp
from tensorplug import ops
from tensorplug.testing.reference import argmax_row

NAN, INF = math.nan, math.inf

#: rows and the index ggml's ggml_vec_argmax_f32 loop returns for them
ARGMAX_ROWS = [
    ([1.0, 3.0, 3.0, 2.0], 2),  # ties: the last maximum
    ([NAN, 1.0, 0.5], 1),
    ([5.0, NAN, 1.0, 0.5], 2),  # a NaN restarts the search
    ([5.0, 1.0, NAN], 0),  # a trailing NaN changes nothing
    ([NAN, NAN, NAN], 0),
    ([-INF, -INF, -INF], 2),
    ([INF, 1.0, INF], 2),
]


def _backend(device: str) -> tp.Backend:
    dev = tp.dev_by_name(device)
    if dev is None:
        pytest.skip(f"no {device} device (pip install pocl-binary-distribution for OpenCL)")
    return dev.init_backend()


def _ggml_loop(row: list[float]) -> int:
    """ggml_vec_argmax_f32, transcribed: MAX is (a > b ? a : b)."""
    m, idx = -INF, 0
    for i, x in enumerate(row):
        m = m if m > x else x
        if m == x:
            idx = i
    return idx


@pytest.mark.parametrize(("row", "want"), ARGMAX_ROWS)
def test_the_reference_argmax_is_ggmls_loop(row: list[float], want: int) -> None:
    assert _ggml_loop(row) == want
    assert argmax_row(np.array(row, np.float32)) == want


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_every_backend_returns_ggmls_argmax(device: str) -> None:
    be = _backend(device)
    width = max(len(r) for r, _ in ARGMAX_ROWS)
    for row, want in ARGMAX_ROWS:
        x = tp.new_tensor("f32", (1, len(row)), "x")
        y = ops.argmax(x)
        tp.alloc_tensors([x, y], be.buffer_type())
        tp.set_array(x, np.array([row], np.float32))
        be.graph_compute(tp.Graph(y))
        assert int(tp.get_array(y)[0]) == want, (device, row)
    assert width <= 4


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_gelu_clamps_as_ggml_does(device: str) -> None:
    be = _backend(device)
    xs = np.array([-INF, -1e30, -10.0, -9.99, 0.0, 9.99, 10.0, 1e30, INF], np.float32)
    x = tp.new_tensor("f32", (xs.size,), "x")
    y = ops.gelu(x)
    tp.alloc_tensors([x, y], be.buffer_type())
    tp.set_array(x, xs)
    be.graph_compute(tp.Graph(y))
    got = tp.get_array(y)
    assert got[0] == 0 and got[1] == 0 and got[2] == 0  # ggml: 0 at and below -10
    assert got[-1] == INF and got[-2] == 1e30 and got[-3] == 10  # x at and above 10
    x64 = xs[3:6].astype(np.float64)
    want = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    if device == "CPU":  # ggml's CPU: the F16 table's entries (test_cpu_gelu_table.py)
        want = ggml_gelu(xs[3:6])
    np.testing.assert_allclose(got[3:6], want, rtol=1e-6, atol=1e-6)  # float32 tanh near -1


def _erf_gelu(x: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x.astype(float))


#: each gated unit's activation, written out independently of the library
GLU_FORMULAS = {
    "swiglu": lambda x: x / (1 + np.exp(-x)),
    "reglu": lambda x: np.where(x > 0, x, 0.0),
    "geglu": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))),
    "geglu_erf": _erf_gelu,
    "geglu_quick": lambda x: x / (1 + np.exp(-1.702 * x)),
}


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
@pytest.mark.parametrize("fn", sorted(GLU_FORMULAS))
def test_every_gated_unit_matches_its_formula(device: str, fn: str) -> None:
    be = _backend(device)
    rng = np.random.default_rng(7)
    va = rng.uniform(-5, 5, (3, 16)).astype(np.float32)
    vb = rng.uniform(-2, 2, (3, 16)).astype(np.float32)
    a, b = tp.new_tensor("f32", (3, 16), "a"), tp.new_tensor("f32", (3, 16), "b")
    joined = ops.glu(a, b, fn)
    split = getattr(ops, fn)(a)  # halves of a's rows: x then g
    swapped = ops.glu(a, fn=fn, swapped=True)
    tp.alloc_tensors([a, b, joined, split, swapped], be.buffer_type())
    tp.set_array(a, va)
    tp.set_array(b, vb)
    be.graph_compute(tp.Graph([joined, split, swapped]))
    act = GLU_FORMULAS[fn]
    if fn == "geglu" and device == "CPU":  # ggml's CPU looks GELU up in an F16 table
        act = ggml_gelu
    np.testing.assert_allclose(tp.get_array(joined), act(va) * vb, rtol=2e-5, atol=1e-6)
    x, g = va[:, :8], va[:, 8:]
    np.testing.assert_allclose(tp.get_array(split), act(x) * g, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(tp.get_array(swapped), act(g) * x, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_gelu_quick_and_gelu_erf_match_their_formulas(device: str) -> None:
    be = _backend(device)
    xs = np.linspace(-9, 9, 181).astype(np.float32)
    x = tp.new_tensor("f32", xs.shape, "x")
    quick, erf = ops.gelu_quick(x), ops.gelu_erf(x)
    tp.alloc_tensors([x, quick, erf], be.buffer_type())
    tp.set_array(x, xs)
    be.graph_compute(tp.Graph([quick, erf]))
    x64 = xs.astype(np.float64)
    np.testing.assert_allclose(tp.get_array(quick), x64 / (1 + np.exp(-1.702 * x64)), atol=2e-6)
    np.testing.assert_allclose(tp.get_array(erf), _erf_gelu(xs), rtol=1e-6, atol=2e-6)


def test_an_unknown_gated_unit_is_refused() -> None:
    with pytest.raises(tp.OpParamError, match="glu: fn 'swish' is not one of 'swiglu'"):
        ops.glu(tp.new_tensor("f32", (2, 8)), fn="swish")


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_mul_mat_id_routes_each_token_through_its_experts(device: str) -> None:
    be = _backend(device)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 6, 32)).astype(np.float32)  # 4 experts, 6 outputs, K 32
    x = rng.standard_normal((3, 1, 32)).astype(np.float32)  # 3 tokens, one shared row
    sel = np.array([[0, 2], [3, 3], [1, 0]], np.int32)
    tw = tp.new_tensor("f32", w.shape, "w")
    tx = tp.new_tensor("f32", x.shape, "x")
    ti = tp.new_tensor("i32", sel.shape, "ids")
    y = ops.mul_mat_id(tw, tx, ti)
    assert y.shape == (3, 2, 6) and y.type is tp.Type.F32
    tp.alloc_tensors([tw, tx, ti, y], be.buffer_type())
    tp.set_array(tw, w)
    tp.set_array(tx, x)
    tp.set_array(ti, sel)
    be.graph_compute(tp.Graph(y))
    want = np.stack([np.stack([w[sel[t, e]] @ x[t, 0] for e in range(2)]) for t in range(3)])
    np.testing.assert_allclose(tp.get_array(y), want, rtol=1e-5, atol=1e-5)
    tp.set_array(ti, np.array([[0, 4], [1, 1], [0, 0]], np.int32))  # expert 4 does not exist
    with pytest.raises(tp.OutOfBoundsError, match=r"4\b"):
        be.graph_compute(tp.Graph(y))


def test_mul_mat_id_refuses_mismatched_shapes() -> None:
    w, ids = tp.new_tensor("f32", (4, 6, 32)), tp.new_tensor("i32", (3, 2))
    with pytest.raises(tp.ShapeError, match="must share their last"):
        ops.mul_mat_id(w, tp.new_tensor("f32", (3, 1, 16)), ids)
    with pytest.raises(tp.ShapeError, match="must divide the experts used per token"):
        ops.mul_mat_id(w, tp.new_tensor("f32", (3, 3, 32)), ids)
    with pytest.raises(tp.TypeMismatchError):
        ops.mul_mat_id(w, tp.new_tensor("f32", (3, 1, 32)), tp.new_tensor("f32", (3, 2)))


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_top_k_ranks_numbers_then_nans_ties_by_index(device: str) -> None:
    be = _backend(device)
    row = np.array([[2.0, NAN, 5.0, -INF, 5.0, 2.0, NAN, 7.0]], np.float32)
    x = tp.new_tensor("f32", row.shape, "x")
    y = ops.top_k(x, 8)
    tp.alloc_tensors([x, y], be.buffer_type())
    tp.set_array(x, row)
    be.graph_compute(tp.Graph(y))
    assert tp.get_array(y).tolist() == [[7, 2, 4, 0, 5, 3, 1, 6]]


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
def test_clamp_repeat_and_pad_match_numpy(device: str) -> None:
    be = _backend(device)
    v = np.array([[-INF, -3.0, NAN, 0.5], [1.0, 2.5, INF, -0.0]], np.float32)
    a = tp.new_tensor("f32", v.shape, "a")
    c, r, p = ops.clamp(a, -1.0, 2.0), ops.repeat(a, (2, 4, 8)), ops.pad(a, (1, 2))
    tp.alloc_tensors([a, c, r, p], be.buffer_type())
    tp.set_array(a, v)
    be.graph_compute(tp.Graph([c, r, p]))
    # ggml's MAX(MIN(x, hi), lo): a NaN gives hi
    np.testing.assert_array_equal(tp.get_array(c), [[-1, -1, 2, 0.5], [1, 2, 2, -0.0]])
    np.testing.assert_array_equal(tp.get_array(r), np.tile(v, (2, 2, 2)))
    np.testing.assert_array_equal(tp.get_array(p), np.pad(v, ((0, 1), (0, 2))))

"""CPU kernels for arithmetic, activations, norms and row reductions vs float64 numpy."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute, ggml_gelu, nmse, place

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import bf16_to_f32, f32_to_bf16

RNG = np.random.default_rng(1234)


def _values(
    t: tp.Type, shape: tuple[int, ...], scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Random values stored as type ``t``: (array to store, exact float64 values)."""
    x = (RNG.standard_normal(shape) * scale).astype(np.float32)
    if t == tp.Type.F16:
        s = x.astype(np.float16)
        return s, s.astype(np.float64)
    if t == tp.Type.BF16:
        s = f32_to_bf16(x)
        return s, bf16_to_f32(s).astype(np.float64)
    return x, x.astype(np.float64)


def _as_f64(t: tp.Tensor) -> np.ndarray:
    raw = tp.get_array(t)
    return bf16_to_f32(raw).astype(np.float64) if t.type == tp.Type.BF16 else raw.astype(np.float64)


def _round_to(t: tp.Type, x: np.ndarray) -> np.ndarray:
    """float64 → the destination type's values (what a correct kernel can at best give)."""
    x32 = x.astype(np.float32)
    if t == tp.Type.F16:
        return x32.astype(np.float16).astype(np.float64)
    if t == tp.Type.BF16:
        return bf16_to_f32(f32_to_bf16(x32)).astype(np.float64)
    return x32.astype(np.float64)


FLOATS = [tp.Type.F32, tp.Type.F16, tp.Type.BF16]
BINARY = {
    "add": (ops.add, np.add),
    "sub": (ops.sub, np.subtract),
    "mul": (ops.mul, np.multiply),
    "div": (ops.div, np.divide),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("ta", FLOATS)
@pytest.mark.parametrize("b_shape", [(6,), (1, 6), (3, 1, 6), (2, 3, 4, 6)])
def test_binary_broadcast(name: str, ta: tp.Type, b_shape: tuple[int, ...]) -> None:
    build, ref = BINARY[name]
    a = tp.new_tensor(ta, (2, 3, 4, 6), "a")
    b = tp.new_tensor(tp.Type.F32, b_shape, "b")
    av, a64 = _values(ta, a.shape)
    bv, b64 = _values(tp.Type.F32, b_shape)
    if name == "div":
        bv = np.where(np.abs(bv) < 0.1, 1.0, bv).astype(np.float32)
        b64 = bv.astype(np.float64)
    out = build(a, b)
    compute(out, {a: av, b: bv})
    expected = _round_to(ta, ref(a64, b64))
    # one float32 operation, rounded once: exact up to the last bit of the destination
    np.testing.assert_allclose(_as_f64(out), expected, rtol=1e-6 if ta == tp.Type.F32 else 0)


def test_binary_on_permuted_operands() -> None:
    base = tp.new_tensor(tp.Type.F32, (5, 4, 3), "base")
    a = ops.permute(base, (2, 0, 1))  # (3, 5, 4), strided
    b = ops.transpose(tp.new_tensor(tp.Type.F16, (4, 5), "b"))  # (5, 4)
    out = ops.mul(a, b)
    bv, b64 = _values(tp.Type.F16, (4, 5))
    xv, x64 = _values(tp.Type.F32, (5, 4, 3))
    assert b.view_src is not None
    compute(out, {base: xv, b.view_src: bv})
    expected = x64.transpose(2, 0, 1) * b64.T
    np.testing.assert_allclose(tp.get_array(out), expected, rtol=1e-6)


def test_scale_with_bias() -> None:
    a = tp.new_tensor(tp.Type.F32, (3, 7), "a")
    av, a64 = _values(tp.Type.F32, a.shape)
    out = ops.scale(a, 0.25, bias=-1.5)
    compute(out, {a: av})
    np.testing.assert_allclose(tp.get_array(out), a64 * 0.25 - 1.5, rtol=1e-6)


UNARY_REF: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "neg": np.negative,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": ggml_gelu,  # ggml's CPU looks it up in an F16 table
    "silu": lambda x: x / (1 + np.exp(-x)),
    "exp": np.exp,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("fn", sorted(UNARY_REF))
@pytest.mark.parametrize("t", FLOATS)
def test_unary(fn: str, t: tp.Type) -> None:
    a = tp.new_tensor(t, (4, 33), "a")
    av, a64 = _values(t, a.shape, scale=3.0)
    out = ops.unary(a, fn)
    compute(out, {a: av})
    expected = UNARY_REF[fn](a64)
    tol = {tp.Type.F32: 1e-12, tp.Type.F16: 1e-6, tp.Type.BF16: 1e-4}[t]
    assert nmse(_as_f64(out), expected) < tol


def test_unary_extremes_give_no_nan() -> None:
    a = tp.new_tensor(tp.Type.F32, (6,), "a")
    values = np.array([-1000, -88, 0, 88, 1000, -0.0], np.float32)
    out = [ops.silu(a), ops.sigmoid(a), ops.gelu(a), ops.relu(a)]
    compute(out, {a: values})
    silu, sigmoid, gelu, relu = (tp.get_array(t) for t in out)
    np.testing.assert_allclose(silu, [0, -88 / (1 + math.exp(88)), 0, 88, 1000, 0], atol=1e-30)
    np.testing.assert_allclose(sigmoid, [0, 1 / (1 + math.exp(88)), 0.5, 1, 1, 0.5], rtol=1e-6)
    np.testing.assert_allclose(gelu, [0, 0, 0, 88, 1000, 0], atol=1e-30)
    np.testing.assert_array_equal(relu, [0, 0, 0, 88, 1000, 0])


def test_unary_in_place_output_aliasing_its_input() -> None:
    """The graph allocator reuses a source's memory for elementwise results."""
    a = tp.new_tensor(tp.Type.F32, (2, 50), "a")
    outs = [ops.gelu(a), ops.silu(a)]
    av, a64 = _values(tp.Type.F32, a.shape)
    for fn, ref in zip(outs, (UNARY_REF["gelu"], UNARY_REF["silu"]), strict=True):
        buf = tp.host_buffer_type().alloc_buffer(a.nbytes)
        a.buffer = None
        tp.tensor_alloc(buf, a, 0)
        tp.tensor_alloc(buf, fn, 0)  # the same bytes
        tp.set_array(a, av)
        from test_cpu_helpers import backend_for

        backend_for().graph_compute(tp.Graph(fn))
        assert nmse(tp.get_array(fn), ref(a64)) < 1e-12
        fn.buffer = None


@pytest.mark.parametrize("t", FLOATS)
@pytest.mark.parametrize("mode", ["split", "split_swapped", "pair"])
def test_swiglu(t: tp.Type, mode: str) -> None:
    a = tp.new_tensor(t, (3, 16), "a")
    av, a64 = _values(t, a.shape)
    inputs = {a: av}
    if mode == "pair":
        b = tp.new_tensor(t, (3, 16), "b")
        bv, b64 = _values(t, b.shape)
        inputs[b] = bv
        out = ops.swiglu(a, b)
        x, g = a64, b64
    else:
        out = ops.swiglu(a, swapped=mode == "split_swapped")
        x, g = a64[:, :8], a64[:, 8:]
        if mode == "split_swapped":
            x, g = g, x
    compute(out, inputs)
    expected = x / (1 + np.exp(-x)) * g
    tol = {tp.Type.F32: 1e-12, tp.Type.F16: 1e-6, tp.Type.BF16: 1e-4}[t]
    assert nmse(_as_f64(out), expected) < tol


@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16])
def test_norm_and_rms_norm_on_a_permuted_input(t: tp.Type) -> None:
    base = tp.new_tensor(t, (64, 3, 2), "base")
    x = ops.permute(base, (2, 1, 0))  # rows of 64 with a stride of 6 elements
    bv, b64 = _values(t, base.shape, scale=2.0)
    b64 += 0.5
    bv = bv + (0.5 if t == tp.Type.F32 else np.float16(0.5))
    b64 = bv.astype(np.float64)
    outs = [ops.norm(x, 1e-5), ops.rms_norm(x, 1e-6)]
    compute(outs, {base: bv})
    xs = b64.transpose(2, 1, 0)
    mean = xs.mean(-1, keepdims=True)
    norm = (xs - mean) / np.sqrt(((xs - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    rms = xs / np.sqrt((xs**2).mean(-1, keepdims=True) + 1e-6)
    tol = 1e-12 if t == tp.Type.F32 else 1e-6
    assert nmse(_as_f64(outs[0]), norm) < tol
    assert nmse(_as_f64(outs[1]), rms) < tol


@pytest.mark.parametrize("shape", [(3, 64), (300, 768)])  # a step's rows, a prompt's chunks
def test_rms_norm_of_zeros_with_eps_0_is_ggmls_nan_not_an_error(shape: tuple[int, int]) -> None:
    """``1/sqrt(0 + 0)`` is inf and ``0·inf`` NaN in ggml; numba's Python error model
    raised ZeroDivisionError from the kernel instead (a model file may say eps 0). Other
    rows are normalized as with any eps."""
    x = tp.new_tensor(tp.Type.F32, shape, "x")
    out = ops.rms_norm(x, 0.0)
    xv = np.random.default_rng(7).standard_normal(shape).astype(np.float32)  # RNG: others'
    xv[1] = 0
    compute([out], {x: xv})
    got = tp.get_array(out).astype(np.float64)
    assert np.isnan(got[1]).all()
    rest = np.delete(xv, 1, axis=0).astype(np.float64)
    expected = rest / np.sqrt((rest**2).mean(-1, keepdims=True))
    assert nmse(np.delete(got, 1, axis=0), expected) < 1e-12


def test_sum_rows_argmax_argsort() -> None:
    a = tp.new_tensor(tp.Type.F32, (3, 2, 9), "a")
    av = RNG.integers(-4, 5, a.shape).astype(np.float32)  # many ties
    av[0, 0] = [1, 7, 7, 2, 7, -1, 0, 0, 3]
    outs = [ops.sum_rows(a), ops.argmax(a), ops.argsort(a), ops.argsort(a, "desc")]
    compute(outs, {a: av})
    s, am, asc, desc = (tp.get_array(t) for t in outs)
    np.testing.assert_allclose(s, av.astype(np.float64).sum(-1, keepdims=True), rtol=1e-7)
    assert s.shape == (3, 2, 1)
    expected_argmax = np.array([[int(np.flatnonzero(r == r.max())[-1]) for r in m] for m in av])
    np.testing.assert_array_equal(am, expected_argmax)
    assert am[0, 0] == 4  # the last of the tied maxima, as ggml
    for row, ia, idd in zip(
        av.reshape(-1, 9), asc.reshape(-1, 9), desc.reshape(-1, 9), strict=True
    ):
        # stable: equal values keep their index order
        assert sorted(range(9), key=lambda i: (row[i], i)) == list(ia)
        assert sorted(range(9), key=lambda i: (-row[i], i)) == list(idd)


def test_argmax_of_a_vector_and_nan() -> None:
    a = tp.new_tensor(tp.Type.F32, (5,), "a")
    out = ops.argmax(a)
    compute(out, {a: np.array([1, np.nan, 3, 3, 2], np.float32)})
    assert out.shape == (1,)
    assert tp.get_array(out).tolist() == [3]  # ggml: the NaN restarts; last of 3, 3, 2


@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16, tp.Type.BF16, tp.Type.I32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(t: tp.Type, axis: int) -> None:
    a = tp.new_tensor(t, (2, 3, 4), "a")
    shape_b = [2, 3, 4]
    shape_b[axis] = 5
    b = tp.new_tensor(t, shape_b, "b")
    av = RNG.integers(0, 1000, a.shape).astype(t.numpy_dtype)
    bv = RNG.integers(0, 1000, shape_b).astype(t.numpy_dtype)
    out = ops.concat(a, b, axis)
    compute(out, {a: av, b: bv})
    np.testing.assert_array_equal(tp.get_array(out), np.concatenate([av, bv], axis=axis))


def test_every_node_is_written() -> None:
    """The buffer starts as 0xAB garbage: a skipped node would leave it visible."""
    a = tp.new_tensor(tp.Type.F32, (4, 4), "a")
    out = ops.add(ops.exp(a), ops.neg(a))
    g = tp.Graph(out)
    place(g)
    tp.set_array(a, np.zeros((4, 4), np.float32))
    from test_cpu_helpers import backend_for

    backend_for().graph_compute(g)
    np.testing.assert_array_equal(tp.get_array(out), np.ones((4, 4)))


@pytest.mark.parametrize("fn", ["swiglu", "geglu"])
@pytest.mark.parametrize("rows", [2, 9])  # a generation step's few rows, a prompt's
def test_gated_units_agree_with_and_without_numba(fn: str, rows: int) -> None:
    """The numba glu and numpy's compute the same values, ggml's edge cases
    included: geglu is 0 for x <= -10 whatever g is (inf, NaN) and x·g for x >= 10;
    silu(-inf) is NaN as in ggml."""
    special = np.array([-np.inf, np.inf, np.nan, -1e30, 1e30, -10, -9.99, 10, 9.99, -88.8,
                        88.8, -0.0, 0.0, 0.5, -3.0, 7.0], np.float32)  # fmt: skip
    av = np.random.default_rng(5).standard_normal((rows, 32)).astype(np.float32) * 4
    av[0, :16] = special
    av[1, :16] = special[::-1]
    av[1, 16:] = np.array([np.inf, np.nan] * 8, np.float32)  # gates of the special x
    results = []
    for jit in (True, False):
        a = tp.new_tensor("f32", (rows, 32), "a")
        out = getattr(ops, fn)(a)
        compute(out, {a: av}, backend_for(jit=jit))
        results.append(tp.get_array(out).copy())
    fast, slow = results
    assert np.array_equal(np.isnan(fast), np.isnan(slow))
    finite = np.isfinite(slow)
    assert np.array_equal(fast[~finite & ~np.isnan(slow)], slow[~finite & ~np.isnan(slow)])
    # float32 exp/tanh may differ by an ulp between numba (libm) and numpy, and gelu's
    # 1 + tanh(·) cancels for negative x, so the bound scales with |x·g| as well
    x, g = av[:, :16], av[:, 16:]
    # inf - inf and inf·0 come up only where a value is not finite, which is masked out
    with np.errstate(over="ignore", invalid="ignore"):
        bound = 4e-7 * np.abs(slow) + 1e-6 * np.abs(x.astype(np.float64) * g)
        bad = finite & ~(np.abs(fast - slow) <= np.nan_to_num(bound, nan=np.inf))
        product = x * g
    assert not bad.any(), (x[bad], fast[bad], slow[bad])
    if fn == "geglu":
        assert np.all(fast[x <= -10] == 0)
        big = (x >= 10) & np.isfinite(g) & np.isfinite(x)
        np.testing.assert_array_equal(fast[big], product[big])


def test_the_vector_exp_of_the_numba_kernels_is_within_3_ulp() -> None:
    """SwiGLU's exp (no libm call, so its loop vectorizes): within 3 ulp of numpy's
    where float32's e^x is normal, +inf above, 0 below, NaN for NaN."""
    pytest.importorskip("numba")
    from numba import njit

    from tensorplug_cpu.kernels._numba_rows import expf

    @njit(cache=False)
    def exp_all(x: np.ndarray, out: np.ndarray) -> None:
        for i in range(x.size):
            out[i] = expf(x[i])

    x = np.concatenate([np.linspace(-87.3, 88.72, 400_001, dtype=np.float32),
                        np.array([88.7228, 88.7229, 89, 1e30, np.inf, -87.4, -1e30, -np.inf,
                                  np.nan, 0.0, -0.0, 1e-30], np.float32)])  # fmt: skip
    got = np.empty_like(x)
    exp_all(x, got)
    with np.errstate(over="ignore"):
        want = np.exp(x)
    normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
    ulp = np.abs(got[normal].view(np.int32).astype(np.int64) - want[normal].view(np.int32))
    assert ulp.max() <= 3, x[normal][np.argmax(ulp)]
    assert np.all(got[want == np.inf] == np.inf)
    assert np.all(got[(want < np.finfo(np.float32).tiny) & ~np.isnan(x)] <= 1.2e-38)
    assert np.isnan(got[np.isnan(x)]).all()

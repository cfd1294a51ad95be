"""The ops added for parity with ggml (issue 20) — repeat, clamp, pad, top_k, layer_norm,
mul_mat_id, soft_max masks with fewer heads, tiling broadcasts, the GELU and GLU variants —
on the CPU backend and the reference backend, against numpy formulas written here from
the op contracts. (test_op_parity.py checks the special values, argmax's rule and the
OpenCL kernels.)"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute, ggml_activations, ggml_gelu, nmse

import tensorplug as tp
from tensorplug import ops
from tensorplug.opcodes import GluOp, Op, SortOrder
from tensorplug.rebuild import BUILDERS, rebuild
from tensorplug.testing.refbackend import reference_backend

RNG = np.random.default_rng(2020)
BACKENDS: dict[str, Callable[[], tp.Backend]] = {"cpu": backend_for, "ref": reference_backend}

# -- independent formulas (float64, math.* per element where numpy has no function) ------------


def _limit(x: float, f: Callable[[float], float], at_neg_inf: float = 0.0) -> float:
    if math.isnan(x):
        return math.nan
    if x == -math.inf:
        return at_neg_inf
    if x == math.inf:
        return math.inf
    return f(x)


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x > -700 else 0.0


def _gelu_tanh(x: float) -> float:
    if x <= -10:
        return 0.0
    if x >= 10:
        return x
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


SCALAR: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "neg": lambda x: -x,
    "relu": lambda x: x if x > 0 else 0.0,  # NaN > 0 is false: 0, as ggml
    "gelu": lambda x: _limit(x, _gelu_tanh),
    # 1 + erf(v/√2) = erfc(-v/√2), which keeps the far negative tail from cancelling to 0
    "gelu_erf": lambda x: _limit(x, lambda v: 0.5 * v * math.erfc(-v / math.sqrt(2))),
    "gelu_quick": lambda x: _limit(x, lambda v: v * _sig(1.702 * v)),
    "silu": lambda x: _limit(x, lambda v: v * _sig(v)),
    "exp": lambda x: math.exp(x) if x < 709 else math.inf,
    "tanh": math.tanh,
    "sigmoid": lambda x: math.nan if math.isnan(x) else _sig(x) if x != math.inf else 1.0,
}

SPECIAL = np.array(
    [-np.inf, np.inf, np.nan, -3e38, 3e38, -1e20, 1e20, -88.0, 88.0, -10.0, 10.0, -9.99,
     -1.0, -0.0, 0.0, 0.5, 3.0],
    np.float32,
)  # fmt: skip


def _expect_unary(fn: str, x: np.ndarray) -> np.ndarray:
    """NaN gives NaN (but relu, whose ``x > 0`` test sends it to 0)."""
    f = SCALAR[fn]
    return np.array(
        [math.nan if math.isnan(v) and fn != "relu" else f(float(v)) for v in x], np.float64
    )


def test_gelu_of_minus_inf_is_zero_as_in_ggml() -> None:
    a = tp.new_tensor(tp.Type.F32, (3,), "a")
    out = ops.gelu(a)
    compute(out, {a: np.array([-np.inf, -10.0, -1e30], np.float32)})
    assert tp.get_array(out).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("fn", ["gelu_erf", "gelu_quick"])
@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16, tp.Type.BF16])
def test_gelu_variants_on_ordinary_values(fn: str, t: tp.Type) -> None:
    a = tp.new_tensor(t, (4, 33), "a")
    x = (RNG.standard_normal(a.shape) * 3).astype(np.float32)
    stored = x if t == tp.Type.F32 else x.astype(np.float16)
    if t == tp.Type.BF16:
        from tensorplug.quants import bf16_to_f32, f32_to_bf16

        stored = f32_to_bf16(x)
        x = bf16_to_f32(stored)
    out = ops.unary(a, fn)
    compute(out, {a: stored})
    got = tp.get_array(out)
    if t == tp.Type.BF16:
        from tensorplug.quants import bf16_to_f32

        got = bf16_to_f32(got)
    want = _expect_unary(fn, np.asarray(x, np.float64).ravel()).reshape(a.shape)
    tol = {tp.Type.F32: 1e-12, tp.Type.F16: 1e-6, tp.Type.BF16: 1e-4}[t]
    assert nmse(got, want) < tol


# -- argmax / argsort / top_k ties -------------------------------------------------------------


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_argsort_and_top_k_keep_ties_in_index_order(backend: str) -> None:
    row = np.array([[2, 5, 2, 5, 1, 5, 2]], np.float32)
    a = tp.new_tensor(tp.Type.F32, row.shape, "a")
    outs = [ops.argsort(a), ops.argsort(a, SortOrder.DESC), ops.top_k(a, 4),
            ops.argsort_top_k(a, 4)]  # fmt: skip
    compute(outs, {a: row}, BACKENDS[backend]())
    asc, desc, top, via_sort = (tp.get_array(o).tolist()[0] for o in outs)
    assert asc == [4, 0, 2, 6, 1, 3, 5]
    assert desc == [1, 3, 5, 0, 2, 6, 4]
    assert top == via_sort == [1, 3, 5, 0]


def test_top_k_on_random_rows() -> None:
    a = tp.new_tensor(tp.Type.F32, (3, 4, 50), "a")
    av = RNG.standard_normal(a.shape).astype(np.float32)
    out = ops.top_k(a, 5)
    compute(out, {a: av})
    np.testing.assert_array_equal(tp.get_array(out), np.argsort(-av, axis=-1)[..., :5])


# -- GLU variants ------------------------------------------------------------------------------

GLU_ACT = {"swiglu": "silu", "geglu": "gelu", "geglu_erf": "gelu_erf",
           "geglu_quick": "gelu_quick", "reglu": "relu"}  # fmt: skip


@pytest.mark.parametrize("fn", [g.value for g in GluOp])
@pytest.mark.parametrize("mode", ["split", "split_swapped", "pair"])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_glu_variants(fn: str, mode: str, backend: str) -> None:
    builder = getattr(ops, fn)
    a = tp.new_tensor(tp.Type.F32, (3, 16), "a")
    av = (RNG.standard_normal(a.shape) * 3).astype(np.float32)
    inputs = {a: av}
    if mode == "pair":
        b = tp.new_tensor(tp.Type.F32, (3, 16), "b")
        bv = RNG.standard_normal(b.shape).astype(np.float32)
        inputs[b] = bv
        out = builder(a, b)
        x, g = av, bv
    else:
        out = builder(a, swapped=mode == "split_swapped")
        x, g = av[:, :8], av[:, 8:]
        if mode == "split_swapped":
            x, g = g, x
    compute(out, inputs, BACKENDS[backend]())
    act = _expect_unary(GLU_ACT[fn], x.astype(np.float64).ravel()).reshape(x.shape)
    if fn == "geglu" and backend == "cpu":  # ggml's CPU looks GELU up in an F16 table
        act = ggml_gelu(x)
    assert nmse(tp.get_array(out), act * g) < 1e-12


# -- tiling broadcasts -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("shape", "bshape"),
    [((6, 4), (6, 2)), ((2, 3, 4, 6), (1, 3, 2, 3)), ((4, 6), (2, 6)), ((5, 6), (3,))],
)
def test_binary_ops_tile_a_smaller_b(
    backend: str, shape: tuple[int, ...], bshape: tuple[int, ...]
) -> None:
    a = tp.new_tensor(tp.Type.F32, shape, "a")
    b = tp.new_tensor(tp.Type.F32, bshape, "b")
    av = RNG.standard_normal(shape).astype(np.float32)
    bv = RNG.uniform(0.5, 2, bshape).astype(np.float32)
    outs = [ops.add(a, b), ops.sub(a, b), ops.mul(a, b), ops.div(a, b)]
    compute(outs, {a: av, b: bv}, BACKENDS[backend]())
    # element i of a meets b[i % b.shape], written out index by index
    tiled = np.empty(shape, np.float64)
    # annotated: numpy's stubs take the concatenated shape for a 0-d one
    bp: np.ndarray = bv.reshape((1,) * (len(shape) - len(bshape)) + bshape)
    for idx in np.ndindex(*shape):
        tiled[idx] = bp[tuple(i % d for i, d in zip(idx, bp.shape, strict=True))]
    a64 = av.astype(np.float64)
    for out, want in zip(outs, (a64 + tiled, a64 - tiled, a64 * tiled, a64 / tiled), strict=True):
        assert nmse(tp.get_array(out), want) < 1e-13


def test_binary_refuses_a_b_that_does_not_divide() -> None:
    a = tp.new_tensor(tp.Type.F32, (6, 4), "a")
    with pytest.raises(tp.ShapeError, match="must divide"):
        ops.add(a, tp.new_tensor(tp.Type.F32, (6, 3), "b"))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_soft_max_mask_with_fewer_heads_is_tiled(backend: str) -> None:
    a = tp.new_tensor(tp.Type.F32, (2, 4, 3, 8), "a")
    mask = tp.new_tensor(tp.Type.F32, (1, 2, 3, 8), "mask")
    av = RNG.standard_normal(a.shape).astype(np.float32)
    mv = RNG.standard_normal(mask.shape).astype(np.float32)
    mv[..., 5:] = -np.inf
    out = ops.soft_max(a, mask, scale=0.5)
    compute(out, {a: av, mask: mv}, BACKENDS[backend]())
    x = av.astype(np.float64) * 0.5
    for h in range(4):
        x[:, h] += mv[0, h % 2]  # ggml: mask head i02 % ne12
    e = np.exp(x - x.max(-1, keepdims=True))
    assert nmse(tp.get_array(out), e / e.sum(-1, keepdims=True)) < 1e-12
    with pytest.raises(tp.ShapeError, match="divide"):
        ops.soft_max(a, tp.new_tensor(tp.Type.F32, (1, 3, 3, 8), "m3"))


# -- repeat, clamp, pad, layer_norm ------------------------------------------------------------


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16, tp.Type.I32])
def test_repeat(backend: str, t: tp.Type) -> None:
    a = tp.new_tensor(t, (2, 3), "a")
    av = RNG.integers(-50, 50, a.shape).astype(t.numpy_dtype)
    out = ops.repeat(a, (2, 4, 9))
    assert ops.repeat(a, out).shape == (2, 4, 9)  # a tensor gives the shape too
    compute(out, {a: av}, BACKENDS[backend]())
    np.testing.assert_array_equal(tp.get_array(out), np.tile(av, (2, 2, 3)))
    with pytest.raises(tp.ShapeError, match="divide"):
        ops.repeat(a, (5, 9))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_clamp_follows_ggml_max_min(backend: str) -> None:
    a = tp.new_tensor(tp.Type.F32, (7,), "a")
    av = np.array([-np.inf, -2, -0.5, 0.25, 3, np.inf, np.nan], np.float32)
    outs = [ops.clamp(a, -1.0, 1.0), ops.clamp(a, 0.0, math.inf), ops.clamp(a, 2.0, 1.0)]
    compute(outs, {a: av}, BACKENDS[backend]())
    # MAX(MIN(x, hi), lo) with C comparisons: NaN < hi is false, so NaN gives hi
    assert tp.get_array(outs[0]).tolist() == [-1, -1, -0.5, 0.25, 1, 1, 1]
    assert tp.get_array(outs[1]).tolist() == [0, 0, 0, 0.25, 3, math.inf, math.inf]
    assert tp.get_array(outs[2]).tolist() == [2.0] * 7
    with pytest.raises(tp.OpParamError):
        ops.clamp(a, math.nan, 1.0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.BF16])
def test_pad_appends_zeros(backend: str, t: tp.Type) -> None:
    base = tp.new_tensor(t, (5, 3), "base")
    a = ops.transpose(base)  # (3, 5), not contiguous
    bv = RNG.integers(1, 9, base.shape).astype(np.float32)
    stored = bv
    if t == tp.Type.BF16:
        from tensorplug.quants import f32_to_bf16

        stored = f32_to_bf16(bv)
    out = ops.pad(a, (2, 1))
    assert out.shape == (5, 6)
    compute(out, {base: stored}, BACKENDS[backend]())
    got = tp.get_array(out)
    if t == tp.Type.BF16:
        from tensorplug.quants import bf16_to_f32

        got = bf16_to_f32(got)
    np.testing.assert_array_equal(got, np.pad(bv.T, [(0, 2), (0, 1)]))
    with pytest.raises(tp.OpParamError):
        ops.pad(a, (1,))


def test_layer_norm_composes_norm_mul_add() -> None:
    a = tp.new_tensor(tp.Type.F32, (4, 16), "a")
    w = tp.new_tensor(tp.Type.F32, (16,), "w")
    b = tp.new_tensor(tp.Type.F32, (16,), "b")
    av, wv, bv = (RNG.standard_normal(t.shape).astype(np.float32) for t in (a, w, b))
    out = ops.layer_norm(a, w, b, 1e-5)
    assert out.op == Op.ADD and out.src[0].op == Op.MUL
    compute(out, {a: av, w: wv, b: bv})
    x = av.astype(np.float64)
    n = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    assert nmse(tp.get_array(out), n * wv + bv) < 1e-12


# -- mul_mat_id --------------------------------------------------------------------------------


def _moe_expected(w: np.ndarray, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    n_tokens, n_used = ids.shape
    out = np.zeros((n_tokens, n_used, w.shape[1]))
    for t in range(n_tokens):
        for e in range(n_used):
            out[t, e] = w[ids[t, e]] @ x[t, e % x.shape[1]]
    return out


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16, tp.Type.Q8_0, tp.Type.Q4_0])
@pytest.mark.parametrize("n_b", [1, 2])
def test_mul_mat_id(backend: str, t: tp.Type, n_b: int) -> None:
    n_expert, n_out, n_in, n_tokens, n_used = 5, 12, 64, 6, 2
    a = tp.new_tensor(t, (n_expert, n_out, n_in), "experts")
    b = tp.new_tensor(tp.Type.F32, (n_tokens, n_b, n_in), "x")
    ids = tp.new_tensor(tp.Type.I32, (n_tokens, n_used), "ids")
    wv = RNG.standard_normal(a.shape).astype(np.float32)
    xv = RNG.standard_normal(b.shape).astype(np.float32)
    iv = np.array([RNG.permutation(n_expert)[:n_used] for _ in range(n_tokens)], np.int32)
    iv[0] = [4, 4 if n_b == 2 else 0]  # one expert twice for a token: still its own slot
    from tensorplug.testing.cases import encode_values
    from tensorplug.testing.refbackend import gguf_decode

    stored = encode_values(wv, t)
    w_exact = gguf_decode(stored, t)  # what the kernel sees after quantization
    out = ops.mul_mat_id(a, b, ids)
    assert out.shape == (n_tokens, n_used, n_out) and out.type == tp.Type.F32
    compute(out, {a: stored, b: xv, ids: iv}, BACKENDS[backend]())
    # the CPU rounds activations as ggml's CPU does for the weight type (its vec_dot_type)
    x_seen = ggml_activations(xv, t) if backend == "cpu" else xv.astype(np.float64)
    want = _moe_expected(w_exact.reshape(a.shape), x_seen, iv)
    assert nmse(tp.get_array(out), want) < 1e-10


def test_mul_mat_id_checks_shapes_and_ids() -> None:
    a = tp.new_tensor(tp.Type.F32, (4, 8, 16), "a")
    b = tp.new_tensor(tp.Type.F32, (3, 1, 16), "b")
    with pytest.raises(tp.ShapeError, match="one row per token"):
        ops.mul_mat_id(a, b, tp.new_tensor(tp.Type.I32, (2, 2), "ids"))
    with pytest.raises(tp.ShapeError, match="divide"):
        ops.mul_mat_id(a, tp.new_tensor(tp.Type.F32, (3, 2, 16), "b2"),
                       tp.new_tensor(tp.Type.I32, (3, 3), "ids"))  # fmt: skip
    ids = tp.new_tensor(tp.Type.I32, (3, 2), "ids")
    out = ops.mul_mat_id(a, b, ids)
    with pytest.raises(tp.OutOfBoundsError, match=r"= 4 is not an expert"):
        compute(out, {a: np.zeros(a.shape, np.float32), b: np.zeros(b.shape, np.float32),
                      ids: np.array([[0, 1], [2, 4], [3, 3]], np.int32)})  # fmt: skip


# -- the op vocabulary: rebuild rules and where each new op may run ----------------------------


def test_every_computing_op_has_a_rebuild_rule() -> None:
    assert set(Op) - {Op.NONE} == set(BUILDERS)


def test_new_ops_rebuild_identically() -> None:
    a = tp.new_tensor(tp.Type.F32, (4, 6), "a")
    w = tp.new_tensor(tp.Type.Q8_0, (3, 5, 32), "w")
    x = tp.new_tensor(tp.Type.F32, (2, 1, 32), "x")
    ids = tp.new_tensor(tp.Type.I32, (2, 2), "ids")
    nodes = [ops.repeat(a, (2, 8, 12)), ops.clamp(a, -1, 2), ops.pad(a, (1, 2)),
             ops.top_k(a, 3), ops.mul_mat_id(w, x, ids), ops.geglu_quick(a),
             ops.reglu(a, a)]  # fmt: skip
    for n in nodes:
        again = rebuild(n.op, n.src, n.op_params, n.shape, n.strides)
        assert (again.op, again.shape, again.type, again.op_params) == (
            n.op, n.shape, n.type, n.op_params,
        )  # fmt: skip


def test_the_gpu_kernel_library_runs_every_new_op() -> None:
    """repeat, clamp, pad, top_k, masks tiled over heads, the GELU/GLU variants, tiled
    binary operands and mul_mat_id all have GPU kernels: ``supports`` says yes (their
    values are checked against the CPU in test_op_parity.py and by the kit)."""
    encode = pytest.importorskip("tensorplug_kernels.encode")
    from tensorplug_kernels.launch import Limits

    lim = Limits(wg=64, local_mem=32768)
    a = tp.new_tensor(tp.Type.F32, (4, 6), "a")
    nodes = [
        ops.repeat(a, (8, 6)), ops.clamp(a, 0, 1), ops.pad(a, (1, 1)), ops.top_k(a, 2),
        ops.soft_max(tp.new_tensor(tp.Type.F32, (4, 3, 6), "s"),
                     tp.new_tensor(tp.Type.F32, (2, 3, 6), "m")),
        ops.gelu_erf(a), ops.gelu_quick(a), ops.geglu(a), ops.reglu(a, a),
        ops.add(a, tp.new_tensor(tp.Type.F32, (2, 6), "b")),
        ops.mul_mat_id(tp.new_tensor(tp.Type.F32, (3, 5, 6), "w"),
                       tp.new_tensor(tp.Type.F32, (2, 1, 6), "x"),
                       tp.new_tensor(tp.Type.I32, (2, 2), "ids")),
    ]  # fmt: skip
    for node in nodes:
        assert encode.supports(node, lim), node.describe()

"""Op builders: result shapes/types follow ggml, bad operands fail where the graph is built."""

from __future__ import annotations

import pytest

import tensorplug as tp
from tensorplug import Op, Type, ops


def T(shape: tuple[int, ...], t: Type = Type.F32, name: str = "") -> tp.Tensor:
    return tp.new_tensor(t, shape, name)


def test_binary_ops_broadcast_b_onto_a() -> None:
    a, b = T((2, 3, 4), name="a"), T((3, 1), name="b")
    for fn, op in ((ops.add, Op.ADD), (ops.sub, Op.SUB), (ops.mul, Op.MUL), (ops.div, Op.DIV)):
        out = fn(a, b)
        assert out.op is op and out.shape == a.shape and out.src == (a, b)
    assert (a + b).op is Op.ADD and (a * b).op is Op.MUL
    assert (a - b).op is Op.SUB and (a / b).op is Op.DIV
    with pytest.raises(tp.ShapeError, match=r"add: b 'c' \(F32\[2, 4\]\) does not repeat onto"):
        ops.add(a, T((2, 4), name="c"))
    with pytest.raises(tp.ShapeError, match="does not repeat onto"):
        ops.add(T((4,)), a)  # b may not be bigger than a
    with pytest.raises(tp.TypeMismatchError, match="mul: a .*I32.* must be one of BF16, F16, F32"):
        ops.mul(T((4,), Type.I32), T((4,)))


def test_unary_glu_scale_norms() -> None:
    a = T((5, 8), Type.F16)
    for fn in (ops.abs, ops.neg, ops.relu, ops.gelu, ops.silu, ops.exp, ops.tanh, ops.sigmoid):
        out = fn(a)
        assert out.op is Op.UNARY and out.type is Type.F16 and out.shape == (5, 8)
    assert ops.silu(a).op_params["fn"] is tp.UnaryOp.SILU
    s = ops.scale(a, 0.5, bias=1.0)
    assert s.op_params == {"scale": 0.5, "bias": 1.0}
    assert ops.swiglu(a).shape == (5, 4)
    assert ops.swiglu(a, a).shape == (5, 8)
    with pytest.raises(tp.ShapeError, match="swapped applies to the split form only"):
        ops.swiglu(a, a, swapped=True)
    with pytest.raises(tp.ShapeError, match="swiglu: a .* even last dimension"):
        ops.swiglu(T((2, 3)))
    with pytest.raises(tp.ShapeError, match="swiglu: b .* must have the shape"):
        ops.swiglu(T((2, 4)), T((2, 2)))
    assert ops.rms_norm(a, 1e-6).op_params["eps"] == 1e-6
    assert ops.norm(a, 1e-5).op is Op.NORM
    with pytest.raises(tp.TypeMismatchError, match="rms_norm"):
        ops.rms_norm(T((4,), Type.I8), 1e-5)


def test_mul_mat_shapes_types_and_gqa_broadcast() -> None:
    w = T((16, 64), Type.Q4_0, "w")
    x = T((3, 7, 64), name="x")
    out = ops.mul_mat(w, x)
    assert out.shape == (3, 7, 16) and out.type is Type.F32
    # grouped-query attention: 2 KV heads serve 8 query heads
    k = T((1, 2, 10, 32))
    q = T((1, 8, 5, 32))
    assert ops.mul_mat(k, q).shape == (1, 8, 5, 10)
    with pytest.raises(tp.ShapeError, match="must share their last .n_in. dimension"):
        ops.mul_mat(w, T((7, 32)))
    with pytest.raises(tp.ShapeError, match="batch dimensions of b"):
        ops.mul_mat(T((3, 10, 32)), T((4, 5, 32)))
    with pytest.raises(tp.TypeMismatchError, match="mul_mat: b"):
        ops.mul_mat(T((4, 32)), T((2, 32), Type.Q8_0))


def test_mul_mat_vector_result_shape() -> None:
    assert ops.mul_mat(T((4, 8)), T((1, 8))).shape == (1, 4)
    assert ops.mul_mat(T((4, 8)), T((8,))).shape == (1, 4)


def test_soft_max_mask_rules() -> None:
    a = T((2, 4, 3, 10))
    m = T((1, 1, 8, 10), Type.F16)
    out = ops.soft_max(a, m, scale=0.1, max_bias=8.0)
    assert out.shape == a.shape and out.src == (a, m)
    assert out.op_params == {"scale": 0.1, "max_bias": 8.0}
    with pytest.raises(tp.ShapeError, match="mask .* must be"):
        ops.soft_max(a, T((2, 10)))
    with pytest.raises(tp.ShapeError, match="outer axes must divide"):
        ops.soft_max(a, T((3, 1, 3, 10)))
    with pytest.raises(tp.ShapeError, match="ALiBi"):
        ops.soft_max(a, None, max_bias=1.0)
    with pytest.raises(tp.TypeMismatchError, match="soft_max: a"):
        ops.soft_max(T((3, 4), Type.F16))


def test_rope_validation() -> None:
    x = T((5, 4, 64), name="x")
    pos = T((5,), Type.I32, "pos")
    out = ops.rope(x, pos, 64, tp.RopeMode.NEOX, freq_base=5e5)
    assert out.shape == x.shape and out.op_params["mode"] is tp.RopeMode.NEOX
    assert out.op_params["freq_base"] == 5e5
    assert ops.rope(x, pos, 32, freq_factors=T((16,))).src[2].shape == (16,)
    with pytest.raises(tp.ShapeError, match="pos .* one position per token"):
        ops.rope(x, T((4,), Type.I32), 64)
    with pytest.raises(tp.ShapeError, match="n_dims=63 must be even"):
        ops.rope(x, pos, 63)
    with pytest.raises(tp.ShapeError, match="freq_factors"):
        ops.rope(x, pos, 64, freq_factors=T((8,)))
    with pytest.raises(tp.TypeMismatchError, match="rope: pos"):
        ops.rope(x, T((5,)), 64)


def test_flash_attn_ext_shapes() -> None:
    q = T((2, 8, 5, 64))
    k = T((2, 2, 12, 64), Type.F16)
    v = T((2, 2, 12, 48), Type.F16)
    mask = T((1, 1, 8, 12), Type.F16)
    out = ops.flash_attn_ext(q, k, v, mask, scale=0.125)
    assert out.shape == (2, 5, 8, 48) and out.type is Type.F32
    with pytest.raises(tp.ShapeError, match="multiple of k/v heads"):
        ops.flash_attn_ext(T((2, 3, 5, 64)), k, v)
    with pytest.raises(tp.ShapeError, match="shapes do not agree"):
        ops.flash_attn_ext(q, k, T((2, 2, 11, 48), Type.F16))
    with pytest.raises(tp.ShapeError, match="mask"):
        ops.flash_attn_ext(q, k, v, T((1, 1, 4, 12), Type.F16))


def test_rows_ops() -> None:
    table = T((100, 32), Type.Q8_0, "tok_embd")
    ids = T((7,), Type.I32, "ids")
    emb = ops.get_rows(table, ids)
    assert emb.shape == (7, 32) and emb.type is Type.F32
    assert ops.get_rows(T((10, 4), Type.I32), ids).type is Type.I32
    with pytest.raises(tp.ShapeError, match="get_rows: rows"):
        ops.get_rows(T((3, 10, 4)), T((2, 5), Type.I32))
    with pytest.raises(tp.TypeMismatchError, match="get_rows: rows"):
        ops.get_rows(table, T((7,)))
    cache = T((64, 128), Type.F16, "k_cache")
    upd = ops.set_rows(cache, T((3, 128)), T((3,), Type.I64))
    assert upd.view_src is cache and upd.shape == cache.shape and upd.op is Op.SET_ROWS
    with pytest.raises(tp.ShapeError, match="set_rows: rows"):
        ops.set_rows(cache, T((3, 128)), T((4,), Type.I64))
    with pytest.raises(tp.ShapeError, match="set_rows: b"):
        ops.set_rows(cache, T((3, 64)), T((3,), Type.I64))


def test_copies_and_conversions() -> None:
    a = T((4, 64))
    q = T((4, 64), Type.Q4_1)
    out = ops.cpy(a, q)
    assert out.view_src is q and out.type is Type.Q4_1
    assert ops.cpy(q, T((256,))).type is Type.F32
    with pytest.raises(tp.TypeMismatchError, match="cannot convert"):
        ops.cpy(q, T((4, 64), Type.Q8_0))
    with pytest.raises(tp.ShapeError, match="same number of elements"):
        ops.cpy(a, T((4, 32)))
    assert ops.dup(q).type is Type.Q4_1
    assert ops.cont(a, (64, 4)).shape == (64, 4)
    with pytest.raises(tp.ShapeError, match="cannot lay out"):
        ops.cont(a, (3, 3))


def test_concat_and_reductions() -> None:
    a, b = T((2, 3, 4)), T((2, 5, 4))
    assert ops.concat(a, b, 1).shape == (2, 8, 4)
    assert ops.concat(a, b, -2).op_params["axis"] == 1
    with pytest.raises(tp.ShapeError, match="differ outside axis 0"):
        ops.concat(a, b, 0)
    with pytest.raises(tp.TypeMismatchError, match="differ in type"):
        ops.concat(a, T((2, 3, 4), Type.F16), 0)
    assert ops.sum_rows(a).shape == (2, 3, 1)
    assert ops.argmax(a).shape == (2, 3) and ops.argmax(a).type is Type.I32
    assert ops.argmax(T((9,))).shape == (1,)
    s = ops.argsort(a, "desc")
    assert s.shape == a.shape and s.op_params["order"] is tp.SortOrder.DESC

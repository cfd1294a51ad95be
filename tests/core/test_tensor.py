"""Tensor geometry and views follow ggml: same nbytes, strides and view flattening."""

from __future__ import annotations

import pytest

import tensorplug as tp
from tensorplug import Type, ops


def test_contiguous_strides_and_ggml_views_of_geometry() -> None:
    t = tp.new_tensor(Type.F32, (2, 3, 4, 5), "t")
    assert t.strides == (240, 80, 20, 4)
    assert t.ne() == (5, 4, 3, 2)
    assert t.nb() == (4, 20, 80, 240)
    assert t.nbytes == 480 and t.nelements == 120 and t.nrows == 24
    assert t.is_contiguous and not t.is_view and not t.is_allocated


def test_quantized_strides_count_blocks_like_ggml_nb0() -> None:
    q = tp.new_tensor(Type.Q4_0, (3, 64))
    # nb[0] is the block size in bytes, nb[1] the row size: ggml_new_tensor's layout
    assert q.strides == (36, 18)
    assert q.nbytes == 3 * 36
    assert q.row_bytes == 36


def test_nbytes_of_strided_views_matches_ggml_formula() -> None:
    base = tp.new_tensor(Type.F32, (4, 6))
    tt = ops.transpose(base)
    assert tt.shape == (6, 4) and tt.strides == (4, 24)
    # ggml_nbytes: type_size + sum((ne[i]-1)*nb[i])
    assert tt.nbytes == 4 + 5 * 4 + 3 * 24 == base.nbytes
    assert not tt.is_contiguous
    empty = tp.new_tensor(Type.F32, (0, 3))
    assert empty.nbytes == 0


def test_quantized_last_dim_must_hold_whole_blocks() -> None:
    with pytest.raises(tp.ShapeError, match="multiple of its block size 32"):
        tp.new_tensor(Type.Q8_0, (2, 40), "w")


@pytest.mark.parametrize("shape", [(), (1, 2, 3, 4, 5)])
def test_rank_is_one_to_four(shape: tuple[int, ...]) -> None:
    with pytest.raises(tp.ShapeError, match="1 to 4 dimensions"):
        tp.new_tensor(Type.F32, shape)


def test_negative_dims_and_bad_strides_are_refused() -> None:
    with pytest.raises(tp.ShapeError, match="negative dimension"):
        tp.new_tensor(Type.F32, (2, -1))
    with pytest.raises(tp.ShapeError, match="strides given"):
        tp.Tensor(Type.F32, (2, 3), strides=(4,))


def test_views_of_views_flatten_to_the_base() -> None:
    base = tp.new_tensor(Type.F32, (8, 8), "base")
    v1 = ops.view(base, (4, 8), offset=64)
    v2 = ops.view(v1, (2, 8), offset=32)
    assert v2.view_src is base
    assert v2.view_offs == 96
    assert v2.src == (v1,)
    assert v2.base is base


def test_view_out_of_bounds_is_refused() -> None:
    base = tp.new_tensor(Type.F32, (4, 4))
    with pytest.raises(tp.ShapeError, match="reaches past the end"):
        ops.view(base, (4, 4), offset=4)
    with pytest.raises(tp.ShapeError, match="negative"):
        ops.view(base, (2,), offset=-4)


def test_reshape_permute_transpose_shapes_and_strides() -> None:
    a = tp.new_tensor(Type.F16, (2, 3, 4))
    r = ops.reshape(a, (6, 4))
    assert r.shape == (6, 4) and r.strides == (8, 2) and r.op is tp.Op.RESHAPE
    p = ops.permute(a, (2, 0, 1))
    assert p.shape == (4, 2, 3) and p.strides == (2, 24, 8)
    assert not p.is_contiguous
    with pytest.raises(tp.ShapeError, match="not contiguous; make it so with cont"):
        ops.reshape(p, (24,))
    with pytest.raises(tp.ShapeError, match="cannot reshape"):
        ops.reshape(a, (5, 5))
    with pytest.raises(tp.ShapeError, match="not a permutation"):
        ops.permute(a, (0, 0, 1))
    c = ops.cont(p)
    assert c.is_contiguous and c.shape == p.shape


def test_flags_and_names_chain() -> None:
    t = tp.new_tensor(Type.F32, (3,)).set_name("x").set_input().set_output()
    assert t.name == "x"
    assert t.flags == tp.TensorFlag.INPUT | tp.TensorFlag.OUTPUT
    assert "x" in repr(t)


def test_unallocated_tensor_access_is_a_clear_error() -> None:
    t = tp.new_tensor(Type.F32, (3,), "w")
    with pytest.raises(tp.NotAllocatedError, match="'w'.*has no memory yet"):
        tp.tensor_get(t)

"""CPU copies with conversion (cpy/dup/cont) and row gathers/scatters (get_rows/set_rows).

Quantized bytes are checked against ``gguf.quants`` bit for bit.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_cpu_helpers import compute

import tensorplug as tp
from tensorplug import ops
from tensorplug.errors import OutOfBoundsError
from tensorplug.quants import bf16_to_f32, f32_to_bf16

RNG = np.random.default_rng(7)
QUANTS = [tp.Type.Q8_0, tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_0, tp.Type.Q5_1]


def _gguf_type(t: tp.Type) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[t.name]


def _f32(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _stored(t: tp.Type, x: np.ndarray) -> np.ndarray:
    if t == tp.Type.BF16:
        return f32_to_bf16(x)
    if t.is_quantized:
        return gguf.quants.quantize(x, _gguf_type(t))
    return x.astype(t.numpy_dtype)


def _decoded(t: tp.Type, raw: np.ndarray) -> np.ndarray:
    if t == tp.Type.BF16:
        return bf16_to_f32(raw)
    if t.is_quantized:
        return gguf.quants.dequantize(raw, _gguf_type(t))
    return raw.astype(np.float32)


@pytest.mark.parametrize("src", [tp.Type.F32, tp.Type.F16, tp.Type.BF16])
@pytest.mark.parametrize("dst", [tp.Type.F32, tp.Type.F16, tp.Type.BF16])
def test_cpy_between_float_types_reshaping(src: tp.Type, dst: tp.Type) -> None:
    a = tp.new_tensor(src, (4, 6), "a")
    b = tp.new_tensor(dst, (3, 8), "b")
    x = _f32(a.shape) * 100
    out = ops.cpy(a, b)
    compute(out, {a: _stored(src, x)})
    expected = _stored(dst, _decoded(src, _stored(src, x)).reshape(3, 8))
    np.testing.assert_array_equal(tp.get_array(out), expected)
    np.testing.assert_array_equal(tp.get_array(b), expected)  # written into b's memory


@pytest.mark.parametrize("t", QUANTS)
def test_cpy_float_to_quantized_matches_gguf_bytes(t: tp.Type) -> None:
    a = tp.new_tensor(tp.Type.F32, (3, 2, 64), "a")
    b = tp.new_tensor(t, (6, 64), "b")
    x = _f32(a.shape)
    out = ops.cpy(a, b)
    compute(out, {a: x})
    np.testing.assert_array_equal(tp.get_array(b), _stored(t, x.reshape(6, 64)))


@pytest.mark.parametrize("t", QUANTS)
@pytest.mark.parametrize("dst", [tp.Type.F32, tp.Type.F16])
def test_cpy_quantized_to_float(t: tp.Type, dst: tp.Type) -> None:
    a = tp.new_tensor(t, (4, 64), "a")
    b = tp.new_tensor(dst, (2, 128), "b")
    raw = _stored(t, _f32(a.shape))
    out = ops.cpy(a, b)
    compute(out, {a: raw})
    expected = _decoded(t, raw).reshape(2, 128).astype(dst.numpy_dtype)
    np.testing.assert_array_equal(tp.get_array(out), expected)


def test_cpy_into_a_strided_view_of_a_cache() -> None:
    """Writing new K rows into columns of a larger F16 cache through a strided view."""
    cache = tp.new_tensor(tp.Type.F16, (8, 10), "cache")
    dst = ops.view(cache, (8, 3), strides=cache.strides, offset=4 * 2)  # columns 4..6
    k = tp.new_tensor(tp.Type.F32, (3, 8), "k")
    out = ops.cpy(ops.transpose(k), dst)
    kv = _f32(k.shape)
    before = _f32(cache.shape).astype(np.float16)
    compute(out, {k: kv, cache: before})
    after = before.copy()
    after[:, 4:7] = kv.T.astype(np.float16)
    np.testing.assert_array_equal(tp.get_array(cache), after)


@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.BF16, tp.Type.I32, tp.Type.Q4_1])
def test_dup_and_cont_of_permuted_tensors(t: tp.Type) -> None:
    a = tp.new_tensor(t, (3, 4, 64), "a")
    p = ops.permute(a, (1, 0, 2))  # quantized types keep their last axis last
    outs = [ops.dup(p), ops.cont(p, (12, 64))]
    if t.is_quantized:
        raw = _stored(t, _f32(a.shape))
        expected = raw.reshape(3, 4, -1).transpose(1, 0, 2)
    elif t == tp.Type.I32:
        raw = RNG.integers(-1000, 1000, a.shape).astype(np.int32)
        expected = raw.transpose(1, 0, 2)
    else:
        raw = _stored(t, _f32(a.shape))
        expected = raw.transpose(1, 0, 2)
    compute(outs, {a: raw})
    dup, cont = (tp.get_array(o) for o in outs)
    assert outs[0].is_contiguous and outs[1].is_contiguous
    np.testing.assert_array_equal(dup, expected)
    np.testing.assert_array_equal(cont, expected.reshape(12, -1))


@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16, tp.Type.BF16, tp.Type.I32, *QUANTS])
def test_get_rows_decodes_every_type(t: tp.Type) -> None:
    table = tp.new_tensor(t, (10, 64), "table")
    idx = tp.new_tensor(tp.Type.I32, (5,), "idx")
    rows = np.array([3, 0, 9, 3, 7], np.int32)
    if t == tp.Type.I32:
        raw = RNG.integers(-1000, 1000, table.shape).astype(np.int32)
        values = raw
    else:
        raw = _stored(t, _f32(table.shape))
        values = _decoded(t, raw)
    out = ops.get_rows(table, idx)
    compute(out, {table: raw, idx: rows})
    assert out.type == (tp.Type.I32 if t == tp.Type.I32 else tp.Type.F32)
    np.testing.assert_array_equal(tp.get_array(out), values[rows])


def test_get_rows_batched() -> None:
    table = tp.new_tensor(tp.Type.F32, (2, 3, 6, 4), "table")
    idx = tp.new_tensor(tp.Type.I32, (2, 3, 5), "idx")
    tv = _f32(table.shape)
    iv = RNG.integers(0, 6, idx.shape).astype(np.int32)
    out = ops.get_rows(table, idx)
    compute(out, {table: tv, idx: iv})
    expected = np.take_along_axis(tv, iv[..., None].repeat(4, axis=-1), axis=2)
    np.testing.assert_array_equal(tp.get_array(out), expected)


@pytest.mark.parametrize("bad", [10, -1])
def test_get_rows_out_of_range_index_raises(bad: int) -> None:
    table = tp.new_tensor(tp.Type.F32, (10, 4), "table")
    idx = tp.new_tensor(tp.Type.I32, (2,), "idx")
    out = ops.get_rows(table, idx)
    with pytest.raises(OutOfBoundsError, match="row index"):
        compute(out, {table: _f32(table.shape), idx: np.array([1, bad], np.int32)})


@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16, tp.Type.BF16, *QUANTS])
@pytest.mark.parametrize("index_type", [tp.Type.I32, tp.Type.I64])
def test_set_rows_converts_into_the_table(t: tp.Type, index_type: tp.Type) -> None:
    table = tp.new_tensor(t, (8, 64), "table")
    b = tp.new_tensor(tp.Type.F32, (3, 64), "b")
    idx = tp.new_tensor(index_type, (3,), "idx")
    before = _stored(t, _f32(table.shape))
    bv = _f32(b.shape)
    rows = np.array([6, 1, 4], index_type.numpy_dtype)
    out = ops.set_rows(table, b, idx)
    compute(out, {table: before, b: bv, idx: rows})
    expected = before.copy()
    expected[rows] = _stored(t, bv)
    np.testing.assert_array_equal(tp.get_array(table), expected)


def test_set_rows_of_a_generation_step_rounds_to_f16_as_numpy_does() -> None:
    """One row into an F16 table (a KV cache), as the numba kernel writes it: every
    value rounds as numpy's float32 → float16 cast (to nearest even, through the
    subnormals, to ±inf past 65504), NaN stays NaN."""
    rng = np.random.default_rng(11)
    bits = rng.integers(0x33000000, 0x47A00000, 4000, dtype=np.uint32)  # f16's whole range
    halfway = (np.arange(1, 40, dtype=np.uint32) << 13) | 0x1000  # exactly between two f16s
    edge = np.array([65504, 65519.99, 65520, 1e-8, 2.98e-8, 6.1e-5, 0.0, -0.0, np.inf], np.float32)
    values = np.concatenate([bits.view(np.float32), (0x3F800000 | halfway).view(np.float32),
                             edge, [np.nan]]).astype(np.float32)  # fmt: skip
    values = np.concatenate([values, -values])[None, :]
    table = tp.new_tensor(tp.Type.F16, (3, values.shape[1]), "cache")
    b = tp.new_tensor(tp.Type.F32, values.shape, "b")
    idx = tp.new_tensor(tp.Type.I64, (1,), "idx")
    out = ops.set_rows(table, b, idx)
    compute(out, {table: np.zeros(table.shape, np.float16), b: values, idx: np.array([2])})
    with np.errstate(over="ignore"):  # past 65504 is ±inf: the case under test
        want = values[0].astype(np.float16)
    got = tp.get_array(table)[2]
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    assert not tp.get_array(table)[:2].any()


def test_set_rows_broadcasts_indices_over_batches() -> None:
    table = tp.new_tensor(tp.Type.F32, (2, 3, 5, 4), "table")
    b = tp.new_tensor(tp.Type.F32, (2, 3, 2, 4), "b")
    idx = tp.new_tensor(tp.Type.I64, (1, 3, 2), "idx")  # shared by both outer batches
    tv, bv = _f32(table.shape), _f32(b.shape)
    iv = np.array([[[0, 4], [2, 1], [3, 3]]], np.int64)
    out = ops.set_rows(table, b, idx)
    compute(out, {table: tv, b: bv, idx: iv})
    expected = tv.copy()
    for i in range(2):
        for j in range(3):
            for k in range(2):
                expected[i, j, iv[0, j, k]] = bv[i, j, k]  # last write wins on duplicates
    np.testing.assert_array_equal(tp.get_array(table), expected)


def test_set_rows_negative_index_raises() -> None:
    table = tp.new_tensor(tp.Type.F16, (4, 8), "table")
    b = tp.new_tensor(tp.Type.F32, (1, 8), "b")
    idx = tp.new_tensor(tp.Type.I64, (1,), "idx")
    out = ops.set_rows(table, b, idx)
    with pytest.raises(OutOfBoundsError, match="index -2 with 4 rows"):
        compute(out, {table: np.zeros((4, 8), np.float16), b: _f32((1, 8)), idx: np.array([-2])})


@pytest.mark.parametrize("index_type", [tp.Type.I32, tp.Type.I64])
def test_set_rows_with_a_bad_index_in_a_later_batch_writes_nothing(index_type: tp.Type) -> None:
    """Every index is checked before any row is written, also on the few-row path of a
    generation step: a KV cache is never left half updated."""
    table = tp.new_tensor(tp.Type.F16, (2, 4, 8), "table")
    b = tp.new_tensor(tp.Type.F32, (2, 1, 8), "b")
    idx = tp.new_tensor(index_type, (2, 1), "idx")
    before = _f32(table.shape).astype(np.float16)
    out = ops.set_rows(table, b, idx)
    bad = np.array([[1], [-1]], index_type.numpy_dtype)
    with pytest.raises(OutOfBoundsError, match="index -1 with 4 rows"):
        compute(out, {table: before, b: _f32(b.shape), idx: bad})
    np.testing.assert_array_equal(tp.get_array(table), before)

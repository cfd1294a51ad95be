"""tensorplug.quants must produce and read exactly the bytes ggml / GGUF use.

``gguf.quants`` (the reference's numpy port, shipped with llama.cpp) is the oracle: every
encoded byte and every decoded float bit pattern is compared with it, not approximately.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tensorplug.errors import ShapeError, TypeMismatchError
from tensorplug.quants import (
    SUPPORTED_TYPES,
    bf16_to_f32,
    dequantize,
    dequantize_blocks,
    f32_to_bf16,
    quantize,
)
from tensorplug.types import Type, row_size

gq = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

QUANT_TYPES = [Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1]
FLOAT_TYPES = [Type.F32, Type.F16, Type.BF16]
ALL_TYPES = FLOAT_TYPES + QUANT_TYPES


# ---------------------------------------------------------------------------------------
# oracle helpers
# ---------------------------------------------------------------------------------------


def ref_quantize(x: np.ndarray, t: Type) -> np.ndarray:
    """gguf's bytes for ``x`` as uint8 (..., row_bytes); gguf returns F32/F16 as floats."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gguf warns on degenerate blocks
        out = gq.quantize(x, GGMLQuantizationType(int(t)))
    return np.ascontiguousarray(out).view(np.uint8)


def ref_dequantize(data: np.ndarray, t: Type) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = gq.dequantize(data, GGMLQuantizationType(int(t)))
    return np.asarray(out, dtype=np.float32)


def silently(fn: Callable[..., np.ndarray], *args: object, **kwargs: object) -> np.ndarray:
    """Call ``fn`` turning any warning into a failure: degenerate input is not an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape and identical float32 bit patterns (NaN payloads and -0.0 included)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check_against_gguf(x: np.ndarray, t: Type) -> None:
    got = silently(quantize, x, t)
    want = ref_quantize(x, t)
    assert got.dtype == np.uint8
    assert got.shape == (*x.shape[:-1], row_size(t, x.shape[-1]))
    assert got.shape == want.shape
    if got.tobytes() != want.tobytes():
        flat_got, flat_want = got.reshape(-1), want.reshape(-1)
        first = int(np.flatnonzero(flat_got != flat_want)[0])
        pytest.fail(
            f"{t.name}: bytes differ from gguf at byte {first} "
            f"(block {first // t.type_size}, offset {first % t.type_size}): "
            f"{flat_got[first]:#04x} != {flat_want[first]:#04x}"
        )
    decoded = silently(dequantize, got, t)
    assert decoded.dtype == np.float32
    assert decoded.shape == x.shape
    assert same_bits(decoded, ref_dequantize(want, t))


# ---------------------------------------------------------------------------------------
# data sets
# ---------------------------------------------------------------------------------------


def _normal() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((37, 256)).astype(np.float32)


def _zeros() -> np.ndarray:
    # +0.0 and -0.0 rows: the sign of the zero picked as "max" decides the sign of d
    z = np.zeros((4, 64), np.float32)
    z[1] = -0.0
    z[2, ::2] = -0.0
    return z


def _extremes() -> np.ndarray:
    rng = np.random.default_rng(1)
    rows = [
        np.tile([65504.0, -65504.0], 32),  # f16 max
        np.tile([65519.0, -65520.0], 32),  # rounds to f16 max / overflows to inf
        np.tile([1e5, -3e5], 32),  # scale beyond f16 range
        np.tile([1e-40, -3e-41], 32),  # f32 subnormals: 1/d overflows
        np.full(64, 1e-45),  # smallest f32 subnormal: d underflows to 0
        np.tile([1e-38, 2e-39], 32),  # around the smallest normal
        np.tile([6e-8, -6e-5], 32),  # f16 subnormal scales
        np.concatenate([rng.standard_normal(63) * 1e-3, [1e4]]),  # one huge outlier
        np.concatenate([[1e30], rng.standard_normal(63)]),  # outlier first in the block
        np.tile([3.0, -3.0], 32),  # |max| == |min|: first occurrence wins
        np.tile([-3.0, 3.0], 32),
        np.tile([1e38, -1e38], 32),
        np.linspace(-8.5, 8.5, 64),  # exact .5 ties in Q8_0 / Q4 rounding
    ]
    return np.array(rows, dtype=np.float32)


def _nonfinite() -> np.ndarray:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[0, 5] = np.nan
    x[1, 40] = np.inf
    x[2, 3] = -np.inf
    x[3, 0], x[3, 1] = np.inf, -np.inf
    return x


def _odd_rows() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((7, 96)).astype(np.float32) * 3


def _one_row() -> np.ndarray:
    return np.random.default_rng(4).uniform(-1, 1, (1, 32)).astype(np.float32)


def _one_dim() -> np.ndarray:
    return np.random.default_rng(5).standard_normal(160).astype(np.float32)


def _three_d() -> np.ndarray:
    return np.random.default_rng(6).standard_normal((2, 3, 128)).astype(np.float32) * 1e3


def _float64() -> np.ndarray:
    # converted to f32 first for quantized types (like ggml), straight to f16 for F16
    return np.random.default_rng(7).standard_normal((5, 64)) * 17.0


def _strided() -> np.ndarray:
    return np.random.default_rng(8).standard_normal((9, 4, 128)).astype(np.float32)[::2, 1:, ::2]


def _many_chunks() -> np.ndarray:
    # 257 * 32 = 8224 blocks: more than one 8192-block chunk, with a ragged last chunk
    return np.random.default_rng(9).standard_normal((257, 1024)).astype(np.float32)


def _uniform_positive() -> np.ndarray:
    # Q4_1 / Q5_1 minimum is non-zero; Q4_0 / Q5_0 pick a positive max
    return np.random.default_rng(10).uniform(0.5, 2.0, (6, 64)).astype(np.float32)


DATASETS: dict[str, Callable[[], np.ndarray]] = {
    "normal": _normal,
    "zeros": _zeros,
    "extremes": _extremes,
    "nonfinite": _nonfinite,
    "odd_rows": _odd_rows,
    "one_row": _one_row,
    "one_dim": _one_dim,
    "three_d": _three_d,
    "float64": _float64,
    "strided": _strided,
    "many_chunks": _many_chunks,
    "uniform_positive": _uniform_positive,
}


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("data", list(DATASETS))
def test_matches_gguf(t: Type, data: str) -> None:
    check_against_gguf(DATASETS[data](), t)


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_arbitrary_bytes(t: Type) -> None:
    """Any stored bytes decode like gguf, including NaN/inf/subnormal f16 scales."""
    rng = np.random.default_rng(11)
    data = rng.integers(0, 256, (19, 7 * t.type_size), dtype=np.uint8)
    assert same_bits(silently(dequantize, data, t), ref_dequantize(data, t))


def test_dequantize_many_chunks_random_bytes() -> None:
    rng = np.random.default_rng(12)
    for t in QUANT_TYPES:
        data = rng.integers(0, 256, (3, 8200 * t.type_size), dtype=np.uint8)
        data[..., 1 :: t.type_size] &= 0x3F  # keep most scales finite
        assert same_bits(dequantize(data, t), ref_dequantize(data, t)), t.name


def test_quantize_does_not_modify_input() -> None:
    x = _extremes()
    before = x.copy()
    for t in ALL_TYPES:
        quantize(x, t)
    assert same_bits(x, before)


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_types_return_new_arrays(t: Type) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = quantize(x, t)
    assert not np.shares_memory(b, x)
    y = dequantize(b, t)
    assert not np.shares_memory(y, b)
    assert y.flags.writeable
    np.testing.assert_array_equal(y, x)


def test_threads_do_not_share_scratch_memory() -> None:
    """Kernels reuse per-thread scratch buffers; concurrent calls must not interfere."""
    rng = np.random.default_rng(17)
    inputs = [rng.standard_normal((64, 4096)).astype(np.float32) * (i + 1) for i in range(4)]
    want = [(quantize(x, Type.Q5_1), dequantize(quantize(x, Type.Q4_0), Type.Q4_0)) for x in inputs]

    def work(i: int) -> bool:
        for _ in range(5):
            q = quantize(inputs[i], Type.Q5_1)
            y = dequantize(quantize(inputs[i], Type.Q4_0), Type.Q4_0)
            if q.tobytes() != want[i][0].tobytes() or not same_bits(y, want[i][1]):
                return False
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(work, range(4)))


def test_quants_does_not_import_gguf() -> None:
    code = "import sys, tensorplug.quants; print('gguf' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------
# dequantize_blocks on views
# ---------------------------------------------------------------------------------------


@pytest.fixture(params=QUANT_TYPES, ids=lambda t: t.name)
def stored(request: pytest.FixtureRequest) -> tuple[Type, np.ndarray, np.ndarray]:
    t: Type = request.param
    x = np.random.default_rng(13).standard_normal((24, 320)).astype(np.float32)
    data = quantize(x, t)
    return t, data, dequantize(data, t)


def test_blocks_of_contiguous_rows(stored: tuple[Type, np.ndarray, np.ndarray]) -> None:
    t, data, full = stored
    blocks = data.reshape(24, 10, t.type_size)
    assert same_bits(dequantize_blocks(blocks, t), full)
    assert same_bits(dequantize_blocks(blocks[5], t), full[5])


def test_blocks_of_strided_views(stored: tuple[Type, np.ndarray, np.ndarray]) -> None:
    t, data, full = stored
    blocks = data.reshape(24, 10, t.type_size)
    # every third row: rows merge into one strided 2-D view, read in place
    assert same_bits(dequantize_blocks(blocks[::3], t), full[::3])
    # a range of blocks in each row: leading axes cannot merge, gathered piece by piece
    assert same_bits(dequantize_blocks(blocks[::3, 2:7], t), full[::3, 64:224])
    assert same_bits(
        dequantize_blocks(blocks[:, ::-2], t), full.reshape(24, 10, 32)[:, ::-2].reshape(24, 160)
    )
    # 4-D, non-mergeable at several levels
    four = blocks.reshape(4, 6, 10, t.type_size)[:, ::2, 1:9]
    want = full.reshape(4, 6, 10, 32)[:, ::2, 1:9].reshape(4, 3, 256)
    assert same_bits(dequantize_blocks(four, t), want)


def test_blocks_with_non_contiguous_bytes(stored: tuple[Type, np.ndarray, np.ndarray]) -> None:
    """A view whose block bytes are not adjacent (last axis strided) still decodes."""
    t, data, full = stored
    blocks = data.reshape(24, 10, t.type_size)
    wide = np.zeros((24, 10, 2 * t.type_size), np.uint8)
    wide[..., ::2] = blocks
    assert same_bits(dequantize_blocks(wide[..., ::2], t), full)
    transposed = np.ascontiguousarray(blocks.transpose(2, 0, 1)).transpose(1, 2, 0)
    assert same_bits(dequantize_blocks(transposed, t), full)


def test_blocks_read_only_input(stored: tuple[Type, np.ndarray, np.ndarray]) -> None:
    t, data, full = stored
    ro = data.copy()
    ro.flags.writeable = False
    assert same_bits(dequantize(ro, t), full)


def test_blocks_of_many_chunks_non_mergeable() -> None:
    t = Type.Q4_0
    x = np.random.default_rng(14).standard_normal((2, 40, 8192)).astype(np.float32)
    blocks = quantize(x, t).reshape(2, 40, 256, t.type_size)
    # 40 x 255 blocks per first-axis index (more than one chunk), rows not mergeable
    view = blocks[:, :, 1:]
    want = dequantize(blocks, t).reshape(2, 40, 256, 32)[:, :, 1:].reshape(2, 40, 255 * 32)
    assert same_bits(dequantize_blocks(view, t), want)
    assert same_bits(dequantize_blocks(blocks[:, ::3, 1:], t), want[:, ::3])


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_blocks_of_float_types(t: Type) -> None:
    x = np.random.default_rng(15).standard_normal((6, 10)).astype(np.float32)
    data = quantize(x, t)
    blocks = data.reshape(6, 10, t.type_size)[::2, 3:]
    assert same_bits(dequantize_blocks(blocks, t), dequantize(data, t)[::2, 3:])


def test_out_parameter(stored: tuple[Type, np.ndarray, np.ndarray]) -> None:
    t, data, full = stored
    out = np.full(full.shape, np.nan, np.float32)
    assert dequantize(data, t, out=out) is out
    assert same_bits(out, full)
    out2 = np.empty((24, 10 * 32), np.float32)
    assert dequantize_blocks(data.reshape(24, 10, t.type_size), t, out=out2) is out2
    assert same_bits(out2, full)
    with pytest.raises(ShapeError, match="shape"):
        dequantize(data, t, out=np.empty((24, 319), np.float32))
    with pytest.raises(ShapeError, match="contiguous"):
        dequantize(data, t, out=np.empty((320, 24), np.float32).T)
    with pytest.raises(TypeMismatchError, match="float32"):
        dequantize(data, t, out=np.empty(full.shape, np.float64))


# ---------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_quantize_rejects_partial_block(t: Type) -> None:
    x = np.ones((2, 48), np.float32)
    with pytest.raises(ShapeError, match=rf"{t.name}.*multiple of 32") as err:
        quantize(x, t)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("t", [Type.I8, Type.I16, Type.I32, Type.I64], ids=lambda t: t.name)
def test_unsupported_types(t: Type) -> None:
    with pytest.raises(TypeMismatchError, match=rf"no codec for {t.name}.*Q8_0"):
        quantize(np.ones((1, 32), np.float32), t)
    with pytest.raises(TypeMismatchError, match=t.name):
        dequantize(np.zeros((1, 32), np.uint8), t)
    with pytest.raises(TypeMismatchError, match=t.name):
        dequantize_blocks(np.zeros((1, 1, t.type_size), np.uint8), t)


def test_type_given_by_name_or_id() -> None:
    x = _normal()
    want = quantize(x, Type.Q4_1)
    assert quantize(x, "q4_1").tobytes() == want.tobytes()  # type: ignore[arg-type]
    assert quantize(x, 3).tobytes() == want.tobytes()  # type: ignore[arg-type]
    with pytest.raises(TypeMismatchError, match="unknown tensor type"):
        quantize(x, "q3_7")  # type: ignore[arg-type]


def test_dequantize_rejects_partial_block() -> None:
    with pytest.raises(ShapeError, match=r"Q8_0.*34-byte blocks.*multiple of 34"):
        dequantize(np.zeros((2, 35), np.uint8), Type.Q8_0)
    with pytest.raises(ShapeError, match="F32"):
        dequantize(np.zeros((2, 6), np.uint8), Type.F32)


def test_dequantize_checks_n() -> None:
    data = quantize(np.ones((2, 64), np.float32), Type.Q5_1)
    assert dequantize(data, Type.Q5_1, n=64).shape == (2, 64)
    with pytest.raises(ShapeError, match="hold 64 elements, not 96"):
        dequantize(data, Type.Q5_1, n=96)


def test_dequantize_rejects_non_bytes() -> None:
    with pytest.raises(TypeMismatchError, match="uint8"):
        dequantize(np.zeros((2, 34), np.float32), Type.Q8_0)
    # int8 bytes are accepted as-is
    data = quantize(np.ones((1, 32), np.float32), Type.Q8_0)
    assert same_bits(dequantize(data.view(np.int8), Type.Q8_0), dequantize(data, Type.Q8_0))


def test_dequantize_blocks_rejects_wrong_block_shape() -> None:
    with pytest.raises(ShapeError, match=r"\(\.\.\., nblocks, 18\)"):
        dequantize_blocks(np.zeros((4, 34), np.uint8), Type.Q4_0)
    with pytest.raises(ShapeError, match=r"got \(18,\); reshape the row bytes"):
        dequantize_blocks(np.zeros(18, np.uint8), Type.Q4_0)


def test_quantize_rejects_bad_values() -> None:
    with pytest.raises(TypeMismatchError, match="real numbers"):
        quantize(np.ones((1, 32), np.complex64), Type.Q8_0)
    with pytest.raises(ShapeError, match="at least one axis"):
        quantize(np.float32(1.0), Type.F32)


def test_empty_inputs() -> None:
    for t in ALL_TYPES:
        assert quantize(np.zeros((0, 64), np.float32), t).shape == (0, row_size(t, 64))
        assert quantize(np.zeros((3, 0), np.float32), t).shape == (3, 0)
        assert dequantize(np.zeros((0, t.type_size), np.uint8), t).shape == (0, t.block_size)


def test_supported_types() -> None:
    # the K-quants and IQ4 types have their own tests (test_kquants.py, test_iquants.py)
    k_quants = {Type.Q2_K, Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K}
    assert set(SUPPORTED_TYPES) == set(ALL_TYPES) | k_quants | {Type.IQ4_NL, Type.IQ4_XS}


# ---------------------------------------------------------------------------------------
# BF16
# ---------------------------------------------------------------------------------------

SPECIAL_F32_BITS = np.array(
    [
        0x00000000,  # +0
        0x80000000,  # -0
        0x7F800000,  # +inf
        0xFF800000,  # -inf
        0x7FC00000,  # quiet NaN
        0xFFC00000,  # negative quiet NaN
        0x7F800001,  # signalling NaN, payload only in the low half: must stay NaN
        0xFF800001,
        0x7FBFFFFF,  # signalling NaN with a full payload
        0x7FFFFFFF,
        0x7F7FFFFF,  # f32 max: rounds up to inf
        0x7F7F7FFF,  # just below the tie
        0x3F808000,  # tie, even below: stays 0x3F80
        0x3F818000,  # tie, odd below: rounds up to 0x3F82
        0x3F80FFFF,
        0x00000001,  # smallest subnormal
        0x00008000,  # subnormal tie
        0x00018000,
        0x807FFFFF,  # largest negative subnormal
    ],
    dtype=np.uint32,
)


def test_f32_to_bf16_matches_gguf_on_special_values() -> None:
    x = SPECIAL_F32_BITS.view(np.float32)
    got = silently(f32_to_bf16, x)
    assert got.dtype == np.uint16
    assert np.array_equal(got, ref_quantize(x, Type.BF16).view(np.uint16))
    # and through the generic entry point, byte for byte
    assert quantize(x, Type.BF16).tobytes() == ref_quantize(x, Type.BF16).tobytes()


def test_f32_to_bf16_matches_gguf_on_random_bits() -> None:
    bits = np.random.default_rng(16).integers(0, 2**32, 1 << 20, dtype=np.uint32)
    x = bits.view(np.float32)
    assert np.array_equal(f32_to_bf16(x), ref_quantize(x, Type.BF16).view(np.uint16))


def test_bf16_to_f32_every_pattern() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = ref_dequantize(every.view(np.uint8), Type.BF16)
    assert same_bits(bf16_to_f32(every), want)
    assert same_bits(bf16_to_f32(every.view(np.int16)), want)
    assert same_bits(dequantize(every.view(np.uint8), Type.BF16), want)


def test_bf16_round_trip() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    back = f32_to_bf16(bf16_to_f32(every))
    is_nan = (every & 0x7FFF) > 0x7F80
    # every non-NaN bf16 value survives exactly (inf and -0.0 included) ...
    assert np.array_equal(back[~is_nan], every[~is_nan])
    # ... and a NaN stays a NaN of the same sign, made quiet
    assert np.array_equal(back[is_nan], every[is_nan] | 0x0040)
    assert np.isnan(bf16_to_f32(back[is_nan])).all()


def test_bf16_nan_and_inf_values() -> None:
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32)
    y = bf16_to_f32(f32_to_bf16(x))
    assert np.isnan(y[:2]).all()
    assert np.signbit(y[1]) and not np.signbit(y[0])
    assert np.array_equal(y[2:], x[2:])
    assert np.signbit(y[5])


def test_bf16_rounding_is_nearest_even() -> None:
    # 1 + 2**-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0)
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20], np.float32)
    assert np.array_equal(bf16_to_f32(f32_to_bf16(x)), np.array([1.0, 1.015625, 1.0078125]))


def test_bf16_from_float64_goes_through_f32() -> None:
    x = np.array([1e300, -1e300, 1 / 3], np.float64)
    assert np.array_equal(silently(f32_to_bf16, x), ref_quantize(x, Type.BF16).view(np.uint16))


def test_bf16_rejects_non_u16() -> None:
    with pytest.raises(TypeMismatchError, match="uint16"):
        bf16_to_f32(np.zeros(3, np.float32))


def test_f16_goes_through_numpy_float16() -> None:
    x = np.array([[1.0, 65504.0, 65520.0, 1e-8, -2.5e-8, np.nan, -np.inf, 1 / 3]])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert silently(quantize, x, Type.F16).tobytes() == want.tobytes()
    assert same_bits(dequantize(quantize(x, Type.F16), Type.F16), want)

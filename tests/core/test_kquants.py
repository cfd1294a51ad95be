"""The K-quant codecs (Q2_K … Q6_K) against ggml.

Decoding is compared with ``gguf.quants`` bit for bit on arbitrary block bytes.
Encoding is compared byte for byte with what ggml's reference quantizers wrote for a
fixed set of awkward rows (``tests/data/kquants_ggml.npz``; gguf has no K-quant
encoder), and, where ggml-python is installed, with ggml itself on fresh data.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tensorplug import quants
from tensorplug.errors import ShapeError
from tensorplug.kquants import K_TYPES
from tensorplug.types import Type

FIXTURE = Path(__file__).parents[1] / "data" / "kquants_ggml.npz"

#: Relative RMS error of a Gaussian row after a round trip, measured with ggml's own
#: quantizers (the same bytes): a loose ceiling that still catches a wrong layout.
ROUND_TRIP_ERROR = {
    Type.Q2_K: 0.33,
    Type.Q3_K: 0.17,
    Type.Q4_K: 0.08,
    Type.Q5_K: 0.04,
    Type.Q6_K: 0.02,
}


def _random_blocks(t: Type, n: int, seed: int) -> np.ndarray:
    """Arbitrary block bytes with finite f16 scales (any bits are a valid block)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, t.type_size), dtype=np.uint8)
    scales = {Type.Q2_K: (80, 82), Type.Q3_K: (108,), Type.Q4_K: (0, 2),
              Type.Q5_K: (0, 2), Type.Q6_K: (208,)}[t]  # fmt: skip
    for at in scales:
        halves = rng.uniform(-2, 2, n).astype(np.float16)
        raw[:, at : at + 2] = halves.view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_decoding_is_gguf_bit_for_bit(t: Type) -> None:
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    raw = _random_blocks(t, 300, seed=int(t))
    ours = quants.dequantize(raw.reshape(3, -1), t)
    theirs = gq.dequantize(raw.reshape(3, -1), GGMLQuantizationType(int(t)))
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_encoding_is_the_bytes_ggml_wrote(t: Type) -> None:
    data = np.load(FIXTURE)
    x, expected = data["x"], data[t.name]
    ours = quants.quantize(x, t)
    blocks = ours.reshape(-1, t.type_size) != expected.reshape(-1, t.type_size)
    differing = np.flatnonzero(blocks.any(axis=1))
    assert differing.size == 0, f"{differing.size} blocks differ, first {differing[:5]}"


@pytest.mark.skipif(
    importlib.util.find_spec("ggml") is None,
    reason="ggml-python is not installed (pip install ggml-python to compare with ggml live)",
)
@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_encoding_matches_ggml_live(t: Type) -> None:
    import ggml

    rng = np.random.default_rng(1000 + int(t))
    x = (rng.standard_normal((64, 1024)) * rng.uniform(1e-3, 30, (64, 1))).astype(np.float32)
    x[::5] **= 3
    expected = np.zeros(64 * 4 * t.type_size, np.uint8)
    ggml.ggml_quantize_init(int(t))
    src = x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    dst = expected.ctypes.data_as(ctypes.c_void_p)
    ggml.ggml_quantize_chunk(int(t), src, dst, 0, 64, 1024, None)
    np.testing.assert_array_equal(quants.quantize(x, t).reshape(-1), expected)


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_round_trip_error_is_what_the_bit_width_gives(t: Type) -> None:
    x = np.random.default_rng(3).standard_normal((8, 2048)).astype(np.float32)
    y = quants.dequantize(quants.quantize(x, t), t, 2048)
    error = np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2))
    assert error < ROUND_TRIP_ERROR[t]
    # and it is a real quantizer: most values change, none wildly
    assert np.mean(y != x) > 0.9 and np.max(np.abs(y - x)) < 1.5


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_zero_and_constant_blocks(t: Type) -> None:
    x = np.zeros((3, 256), np.float32)
    x[1] = 0.75
    x[2, :16] = -3.0
    y = quants.dequantize(quants.quantize(x, t), t)
    np.testing.assert_array_equal(y[0], 0.0)
    assert np.abs(y[1] - 0.75).max() < 0.75 * ROUND_TRIP_ERROR[t] * 2
    # zeros stay zeros outside the sub-block (16 or 32 values) shared with the spike
    np.testing.assert_array_equal(y[2, 32:], 0.0)


def test_rows_must_hold_whole_super_blocks() -> None:
    with pytest.raises(ShapeError, match="256-element blocks"):
        quants.quantize(np.zeros((2, 320), np.float32), Type.Q4_K)
    with pytest.raises(ShapeError, match="144-byte blocks"):
        quants.dequantize(np.zeros((2, 100), np.uint8), Type.Q4_K)


def test_type_geometry_is_ggmls() -> None:
    sizes = {Type.Q2_K: 84, Type.Q3_K: 110, Type.Q4_K: 144, Type.Q5_K: 176, Type.Q6_K: 210}
    for t, size in sizes.items():
        assert (t.block_size, t.type_size, t.is_quantized) == (256, size, True)
    assert [int(t) for t in K_TYPES] == [10, 11, 12, 13, 14]  # ggml_type ids

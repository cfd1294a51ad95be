"""The IQ4_NL and IQ4_XS codecs against ggml.

Decoding is compared with ``gguf.quants`` bit for bit on arbitrary block bytes.
Encoding is compared byte for byte with what ggml's quantizers (``quantize_iq4_nl`` /
``quantize_iq4_xs`` without an importance matrix) wrote for a fixed set of awkward rows
(``tests/data/iq4_ggml.npz``, written by ``make_iq4_fixture.py`` through the libggml of
llama-cpp-python; gguf has no IQ4 encoder).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensorplug import quants
from tensorplug.errors import ShapeError
from tensorplug.iquants import IQ4_TYPES, KVALUES_IQ4NL
from tensorplug.types import Type

FIXTURE = Path(__file__).parents[1] / "data" / "iq4_ggml.npz"

#: Relative RMS error of a Gaussian row after a round trip (ggml's bytes give the same):
#: a loose ceiling that still catches a wrong layout or a wrong table.
ROUND_TRIP_ERROR = {Type.IQ4_NL: 0.11, Type.IQ4_XS: 0.11}


def _random_blocks(t: Type, n: int, seed: int) -> np.ndarray:
    """Arbitrary block bytes with a finite f16 ``d`` (any other bits are a valid block)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, t.type_size), dtype=np.uint8)
    raw[:, 0:2] = rng.uniform(-2, 2, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("t", IQ4_TYPES, ids=lambda t: t.name)
def test_decoding_is_gguf_bit_for_bit(t: Type) -> None:
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    raw = _random_blocks(t, 96, seed=int(t))
    ours = quants.dequantize(raw.reshape(3, -1), t)
    theirs = gq.dequantize(raw.reshape(3, -1), GGMLQuantizationType(int(t)))
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("t", IQ4_TYPES, ids=lambda t: t.name)
def test_encoding_is_the_bytes_ggml_wrote(t: Type) -> None:
    data = np.load(FIXTURE)
    x, expected = data["x"], data[t.name]
    ours = quants.quantize(x, t)
    blocks = ours.reshape(-1, t.type_size) != expected.reshape(-1, t.type_size)
    differing = np.flatnonzero(blocks.any(axis=1))
    assert differing.size == 0, f"{differing.size} blocks differ, first {differing[:5]}"


@pytest.mark.parametrize("t", IQ4_TYPES, ids=lambda t: t.name)
def test_round_trip_error_is_what_the_bit_width_gives(t: Type) -> None:
    x = np.random.default_rng(3).standard_normal((8, 2048)).astype(np.float32)
    y = quants.dequantize(quants.quantize(x, t), t, 2048)
    error = np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2))
    assert error < ROUND_TRIP_ERROR[t]
    assert np.mean(y != x) > 0.9 and np.max(np.abs(y - x)) < 1.5


def test_every_value_is_a_table_level_times_the_block_scale() -> None:
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    raw = quants.quantize(x, Type.IQ4_NL).reshape(8, 18)
    y = quants.dequantize(raw.reshape(4, -1), Type.IQ4_NL).reshape(8, 32)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    levels = y / d
    assert np.isin(levels, KVALUES_IQ4NL.astype(np.float32)).all()
    # the largest magnitude of a block lands on an end of the table
    assert (np.abs(levels).max(axis=1) >= 113).all()


@pytest.mark.parametrize("t", IQ4_TYPES, ids=lambda t: t.name)
def test_zero_blocks_decode_to_zero(t: Type) -> None:
    x = np.zeros((2, 256), np.float32)
    x[1, :32] = np.linspace(-1, 1, 32)
    y = quants.dequantize(quants.quantize(x, t), t)
    np.testing.assert_array_equal(y[0], 0.0)
    np.testing.assert_array_equal(y[1, 32:], 0.0)
    assert np.abs(y[1, :32] - x[1, :32]).max() < 0.1


def test_rows_must_hold_whole_blocks() -> None:
    with pytest.raises(ShapeError, match="256-element blocks"):
        quants.quantize(np.zeros((2, 320), np.float32), Type.IQ4_XS)
    with pytest.raises(ShapeError, match="18-byte blocks"):
        quants.dequantize(np.zeros((2, 100), np.uint8), Type.IQ4_NL)


def test_type_geometry_is_ggmls() -> None:
    assert (Type.IQ4_NL.block_size, Type.IQ4_NL.type_size, int(Type.IQ4_NL)) == (32, 18, 20)
    assert (Type.IQ4_XS.block_size, Type.IQ4_XS.type_size, int(Type.IQ4_XS)) == (256, 136, 23)
    assert Type.parse("iq4_xs") is Type.IQ4_XS and Type.IQ4_NL.is_quantized

"""The activation quantizers of the integer kernels, value for value against numpy's
formulas of ggml's rounding (``test_cpu_helpers``): Q8_0's and Q8_1's codes, f16 scales
and code sums, Q8_K's codes and scales. The kernels find each block's largest magnitude
in four interleaved running maxima and round with ggml's ``nearest_int`` addition
(``_numba_quant.nearest_int``); neither may change a bit: ties of exactly half, blocks of
zeros, magnitudes from 1e-38 to 1e30, a largest magnitude met twice with both signs
(Q8_K keeps the first), and a NaN, which every running maximum skips. A Q8_K super-block
whose scale is zero (of NaNs only, or an infinite largest magnitude) is ggml's zeros and
``d = 1/iscale``, where its division by a signed zero raised ZeroDivisionError."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_helpers import q8_0_blocks, q8_k_blocks

pytest.importorskip("numba", reason="the quantizers are numba kernels")

from tensorplug_cpu.kernels._numba_quant import (
    quantize_q8_0,
    quantize_q8_1,
    quantize_q8_k,
)
from tensorplug_cpu.kernels.jit import F16_TO_F32 as TABLE


def _rows() -> np.ndarray:
    rng = np.random.default_rng(11)
    wide = rng.standard_normal((24, 512)) * np.logspace(-38, 30, 512)
    x = np.concatenate([wide, rng.standard_normal((24, 512))]).astype(np.float32)
    x[:, ::7] = np.round(x[:, ::7])  # whole numbers: some scale to ties
    x[30, :256] = 0  # a super-block of zeros
    x[31, 5], x[31, 9] = 40.0, -40.0  # the largest magnitude twice: 40 first
    x[32, 300], x[32, 260] = 40.0, -40.0  # ... -40 first
    # exact ties once scaled: the largest magnitude 127, so 127/amax is 1
    x[33] = np.tile(np.array([127, 2.5, -3.5, 0.5, -0.5, 1.5, -126.5, 7], np.float32), 64)
    x[34] = -x[33]
    return x


def _quantized(fn: object, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_blocks = x.shape[1] // 32
    xq = np.zeros(x.shape, np.int8)
    xd = np.zeros((x.shape[0], n_blocks), np.float32)
    xs = np.zeros((x.shape[0], n_blocks), np.int32)
    fn(x, xq, xd, xs, TABLE)  # type: ignore[operator]
    return xq, xd, xs


def test_q8_0_and_q8_1_are_ggmls_rounding() -> None:
    x = _rows()
    codes, scales, _ = q8_0_blocks(x)
    xq, xd, xs = _quantized(quantize_q8_0, x)
    assert np.array_equal(xq.reshape(codes.shape), codes)
    with np.errstate(over="ignore"):  # the 1e30 rows' scales overflow f16, as ggml's do
        assert np.array_equal(xd, scales[..., 0].astype(np.float16).astype(np.float32))
    assert np.array_equal(xs, codes.sum(-1))
    q1, d1, s1 = _quantized(quantize_q8_1, x)
    assert np.array_equal(q1, xq) and np.array_equal(d1, xd)
    # Q8_1's s: f16(d·Σcode) with d the unrounded float32 scale
    with np.errstate(over="ignore"):  # the 1e30 rows' s overflow f16, as ggml's do
        s = (scales[..., 0] * codes.sum(-1).astype(np.float32)).astype(np.float16)
    assert np.array_equal(s1.view(np.float32), s.astype(np.float32))


def test_q8_k_is_ggmls_rounding() -> None:
    x = _rows()
    codes, d = q8_k_blocks(x)
    xq, xd, xs = _quantized(quantize_q8_k, x)
    assert np.array_equal(xq.reshape(codes.shape), codes)
    assert np.array_equal(xd, np.repeat(d[..., 0], 8, axis=-1))
    assert np.array_equal(xs, codes.reshape(x.shape[0], -1, 32).sum(-1))
    assert xq[31, 5] == -127 and xq[31, 9] == 127  # iscale from the first: 40
    assert xq[32, 260] == -127 and xq[32, 300] == 127  # ... and here from -40


@pytest.mark.parametrize("fn", [quantize_q8_0, quantize_q8_k], ids=["q8_0", "q8_k"])
def test_a_nan_is_skipped_by_the_largest_magnitude(fn: object) -> None:
    """A NaN activation leaves its block's scale that of the other values (a running
    ``max(amax, |v|)`` never takes it) and every other code as it was."""
    x = _rows()[40:44].copy()
    clean = _quantized(fn, x)
    x[1, 3] = np.nan
    xq, xd, _ = _quantized(fn, x)
    assert np.array_equal(xd, clean[1])
    others = np.ones(x.shape, bool)
    others[1, 3] = False
    assert np.array_equal(xq[others], clean[0][others])


@pytest.mark.parametrize(
    ("bad", "d"), [(np.inf, -np.inf), (-np.inf, np.inf), (np.nan, 0.0)], ids=["inf", "-inf", "nan"]
)
def test_q8_k_of_a_super_block_scaled_by_zero_is_ggmls(bad: float, d: float) -> None:
    """``iscale = −127/±inf`` is a signed zero: ggml's ``nearest_int`` makes 0 of every
    ``0·x`` (the NaN ``0·inf`` too) and ``d = 1/iscale`` the opposite infinity; a
    super-block of NaNs has ``amax`` 0, and ggml writes zeros with ``d = 0``. The other
    super-blocks and rows keep their codes."""
    x = _rows()[40:43].copy()
    clean = _quantized(quantize_q8_k, x)
    if np.isnan(bad):
        x[1, 256:] = np.nan
    else:
        x[1, 300] = bad
    xq, xd, xs = _quantized(quantize_q8_k, x)
    assert not xq[1, 256:].any() and not xs[1, 8:].any()
    assert np.array_equal(xd[1, 8:], np.full(8, d, np.float32))
    kept = np.ones(x.shape, bool)
    kept[1, 256:] = False
    assert np.array_equal(xq[kept], clean[0][kept])
    assert np.array_equal(xd[:, :8], clean[1][:, :8]) and np.array_equal(xs[:, :8], clean[2][:, :8])
    assert np.array_equal(xd[[0, 2]], clean[1][[0, 2]])

"""The conformance kit's oracle: reference formulas against hand-computed values.

Each expected number here is worked out from the op's definition by hand (or a
one-line closed form), never by calling the formula under test a second way.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensorplug.testing import reference as ref


def test_mul_mat_is_b_times_a_transposed() -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # (n_out=3, n_in=2)
    b = np.array([[1.0, 1.0], [2.0, 0.0]])  # (n_tokens=2, n_in=2)
    np.testing.assert_array_equal(ref.mul_mat(a, b), [[3, 7, 11], [2, 6, 10]])


def test_mul_mat_repeats_weight_batches_onto_consecutive_activation_batches() -> None:
    # a has 2 batches (identity, 2·identity); b has 4: batches 0,1 use a[0], 2,3 use a[1]
    a = np.stack([np.eye(2), 2 * np.eye(2)])[None]  # (1, 2, 2, 2)
    b = np.ones((1, 4, 1, 2))
    out = ref.mul_mat(a, b)
    assert out.shape == (1, 4, 1, 2)
    np.testing.assert_array_equal(out[0, :, 0, 0], [1, 1, 2, 2])


def test_soft_max_scale_and_mask() -> None:
    np.testing.assert_allclose(ref.soft_max(np.array([0.0, math.log(3)])), [0.25, 0.75])
    np.testing.assert_allclose(
        ref.soft_max(np.array([0.0, 2 * math.log(3)]), scale=0.5), [0.25, 0.75]
    )
    masked = ref.soft_max(np.array([[5.0, 1.0, 1.0]]), np.array([[-np.inf, 0.0, 0.0]]))
    np.testing.assert_array_equal(masked, [[0.0, 0.5, 0.5]])


def test_alibi_slopes_follow_ggml() -> None:
    # 4 heads, max_bias 8: m = 4, m0 = 2^-2, slope_h = m0^(h+1)
    np.testing.assert_allclose(
        ref.alibi_slopes(4, 8.0, np.dtype(np.float64)), [2**-2, 2**-4, 2**-6, 2**-8]
    )
    # 6 heads: heads 4, 5 use m1 = 2^(-8/2/4) = 0.5 with odd powers 1, 3
    np.testing.assert_allclose(ref.alibi_slopes(6, 8.0, np.dtype(np.float64))[4:], [0.5, 0.125])
    np.testing.assert_array_equal(ref.alibi_slopes(3, 0.0, np.dtype(np.float64)), [1, 1, 1])


def test_soft_max_applies_the_slope_to_the_mask_per_head() -> None:
    a = np.zeros((1, 2, 1, 2))
    mask = np.array([[0.0, 1.0]])
    out = ref.soft_max(a, mask, 1.0, max_bias=8.0)  # 2 heads: slopes 2^-4 and 2^-8
    for h, slope in enumerate((2**-4, 2**-8)):
        e = math.exp(slope)
        np.testing.assert_allclose(out[0, h, 0], [1 / (1 + e), e / (1 + e)])


def test_rope_normal_and_neox_pairs() -> None:
    x = np.array([[[1.0, 0.0, 1.0, 0.0]]])  # (tokens=1, heads=1, dim=4)
    pos = np.array([1])
    # NORMAL: pairs (0,1) and (2,3); theta_i = pos * 10000^(-2i/4) = 1, 0.01
    normal = ref.rope(x, pos, 4, 0)
    np.testing.assert_allclose(
        normal[0, 0], [math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)]
    )
    # NEOX: pairs (0,2) and (1,3): (1, 1) rotated by 1 rad, (0, 0) stays 0
    neox = ref.rope(x, pos, 4, 2)
    c, s = math.cos(1), math.sin(1)
    np.testing.assert_allclose(neox[0, 0], [c - s, 0.0, s + c, 0.0], atol=1e-15)


def test_rope_copies_the_dimensions_past_n_dims_and_uses_freq_factors() -> None:
    x = np.array([[[1.0, 0.0, 7.0, 8.0]]])
    out = ref.rope(x, np.array([2]), 2, 0, freq_factors=np.array([4.0]))
    np.testing.assert_allclose(out[0, 0], [math.cos(0.5), math.sin(0.5), 7.0, 8.0])


def test_yarn_corr_dims_match_ggml() -> None:
    # 128·ln(4096 / (32·2π)) / (2·ln 10000) = 20.9 -> floor 20; with beta 1: 45.03 -> ceil 46
    assert ref.rope_yarn_corr_dims(128, 4096, 10000.0, 32.0, 1.0) == (20.0, 46.0)


def test_yarn_scales_the_magnitude() -> None:
    # ext_factor != 0: mscale = attn_factor·(1 + 0.1·ln(1/freq_scale)); position 0 has no angle
    out = ref.rope(
        np.array([[[1.0, 0.0]]]),
        np.array([0]),
        2,
        0,
        freq_scale=0.25,
        ext_factor=1.0,
        attn_factor=1.0,
        n_ctx_orig=512,
    )
    np.testing.assert_allclose(out[0, 0], [1 + 0.1 * math.log(4), 0.0])


def test_flash_attn_weights_values_by_softmax_and_swaps_heads_and_tokens() -> None:
    q = np.array([[[[1.0, 0.0]]]])  # (B=1, H=1, n_q=1, D=2)
    k = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])
    v = np.array([[[[1.0], [0.0]]]])
    out = ref.flash_attn_ext(q, k, v)
    assert out.shape == (1, 1, 1, 1)
    np.testing.assert_allclose(out[0, 0, 0, 0], math.e / (math.e + 1))
    # two query heads sharing one kv head; output is (B, n_q, H, D_v)
    q2 = np.zeros((1, 2, 3, 2))
    out2 = ref.flash_attn_ext(q2, k, np.array([[[[2.0], [4.0]]]]))
    assert out2.shape == (1, 3, 2, 1)
    np.testing.assert_allclose(out2, 3.0)  # equal logits: the mean of the values


def test_flash_attn_softcap() -> None:
    q = np.array([[[1.0, 0.0]]])  # 3-d: (H=1, n_q=1, D=2)
    k = np.array([[[4.0, 0.0], [0.0, 0.0]]])
    v = np.array([[[1.0], [0.0]]])
    # logits (4, 0) capped to 2·tanh(2) and 0
    capped = 2 * math.tanh(2)
    expected = math.exp(capped) / (math.exp(capped) + 1)
    np.testing.assert_allclose(ref.flash_attn_ext(q, k, v, logit_softcap=2.0)[0, 0, 0], expected)


def test_unary_values() -> None:
    x = np.array([-1.0, 0.0, 1.0])
    np.testing.assert_allclose(ref.UNARY["relu"](x), [0, 0, 1])
    np.testing.assert_allclose(ref.UNARY["sigmoid"](x), [0.2689414, 0.5, 0.7310586], rtol=1e-6)
    np.testing.assert_allclose(ref.UNARY["silu"](x), [-0.2689414, 0.0, 0.7310586], rtol=1e-6)
    # tanh approximation, not erf: 0.5·(1 + tanh(0.7978846·1.044715))
    np.testing.assert_allclose(ref.UNARY["gelu"](np.array([1.0])), [0.8411920], rtol=1e-6)


def test_swiglu_halves_and_swap() -> None:
    a = np.array([1.0, 2.0])
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    np.testing.assert_allclose(ref.glu(a), [silu(1) * 2])
    np.testing.assert_allclose(ref.glu(a, swapped=True), [silu(2) * 1])
    np.testing.assert_allclose(ref.glu(np.array([2.0]), np.array([3.0])), [silu(2) * 3])


def test_norms() -> None:
    s = math.sqrt(1.25)  # population variance of 1..4
    np.testing.assert_allclose(
        ref.norm(np.array([1.0, 2, 3, 4]), 0.0), [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]
    )
    r = math.sqrt(12.5)  # sqrt(mean(9, 16))
    np.testing.assert_allclose(ref.rms_norm(np.array([3.0, 4.0]), 0.0), [3 / r, 4 / r])


def test_rows_gather_scatter_and_sorts() -> None:
    a = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(ref.get_rows(a, np.array([2, 0, 2])), [[4, 5], [0, 1], [4, 5]])
    out = ref.set_rows(a, np.array([[9.0, 9.0]]), np.array([1]))
    np.testing.assert_array_equal(out, [[0, 1], [9, 9], [4, 5]])
    np.testing.assert_array_equal(a[1], [2, 3])  # the source is not modified
    ties = np.array([1.0, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(ref.argsort(ties), [1, 3, 0, 2])
    np.testing.assert_array_equal(ref.argsort(ties, descending=True), [0, 2, 1, 3])
    np.testing.assert_array_equal(ref.argmax(np.array([1.0, 3.0, 3.0])), [2])  # ggml: the last


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_formulas_keep_the_input_dtype(dtype: type) -> None:
    rng = np.random.default_rng(0)
    x: np.ndarray = rng.uniform(-1, 1, (2, 3, 4, 8)).astype(dtype)
    pos = np.arange(4)
    results = [
        ref.rope(x[0], pos[:3], 8, 2, ext_factor=1.0, n_ctx_orig=64, freq_scale=0.5),
        ref.soft_max(x, x[0, 0], 0.5, 8.0),
        ref.flash_attn_ext(x, x[:, :1], x[:, :1], x[0, 0, :, :4], 0.3, 8.0, 2.0),
        ref.mul_mat(x, x),
        ref.norm(x, 1e-5),
        ref.rms_norm(x, 1e-5),
        ref.glu(x),
        *(f(x) for f in ref.UNARY.values()),
    ]
    assert {r.dtype for r in results} == {np.dtype(dtype)}

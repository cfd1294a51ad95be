"""Sampling: greedy, top-k, top-p, temperature, and seeded draws."""

from __future__ import annotations

import numpy as np
import pytest

from tensorplug_llm.sampling import Sampler, SamplerParams

LOGITS = np.array([1.0, 3.0, -2.0, 3.0, 0.5, 2.0, -1.0, 0.0], dtype=np.float32)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def test_greedy_is_the_first_maximum() -> None:
    s = Sampler(SamplerParams(temperature=0.0))
    assert s(LOGITS) == 1  # 3.0 at ids 1 and 3: the first
    assert s(-LOGITS) == 2


def test_top_k_keeps_the_k_largest_best_first() -> None:
    s = Sampler(SamplerParams(temperature=1.0, top_k=3, top_p=1.0))
    ids, probs = s.candidates(LOGITS)
    assert ids.tolist() == [1, 3, 5]  # ties by id
    np.testing.assert_allclose(probs, _softmax(LOGITS[[1, 3, 5]].astype(np.float64)))
    assert Sampler(SamplerParams(temperature=0.8, top_k=1))(LOGITS) == 1


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    p = _softmax(LOGITS.astype(np.float64))
    order = [1, 3, 5, 0, 4, 7, 6, 2]
    cum = np.cumsum(p[order])
    for top_p in (0.3, 0.6, float(cum[2]) + 1e-9, 0.99):
        ids, _ = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=top_p)).candidates(LOGITS)
        n = int(np.argmax(cum >= top_p)) + 1
        assert ids.tolist() == order[:n]


def test_temperature_scales_after_filtering() -> None:
    s = Sampler(SamplerParams(temperature=0.5, top_k=4, top_p=1.0))
    ids, probs = s.candidates(LOGITS)
    np.testing.assert_allclose(probs, _softmax(LOGITS[ids].astype(np.float64) / 0.5))


def test_draws_follow_the_distribution_and_the_seed() -> None:
    params = SamplerParams(temperature=0.7, top_k=0, top_p=1.0, seed=42)
    s = Sampler(params)
    draws = np.array([s(LOGITS) for _ in range(10000)])
    freq = np.bincount(draws, minlength=LOGITS.size) / draws.size
    want = _softmax(LOGITS.astype(np.float64) / 0.7)
    # binomial standard deviation <= 0.005 at n=10000: 0.02 is 4 sigma
    np.testing.assert_allclose(freq, want, atol=0.02)
    again = Sampler(params)
    assert [again(LOGITS) for _ in range(50)] == draws[:50].tolist()
    other = Sampler(SamplerParams(temperature=0.7, top_k=0, top_p=1.0, seed=43))
    assert [other(LOGITS) for _ in range(50)] != draws[:50].tolist()


def test_bad_top_p() -> None:
    with pytest.raises(ValueError, match="top_p must be positive"):
        Sampler(SamplerParams(temperature=1.0, top_p=0.0))

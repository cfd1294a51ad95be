"""Sampling: llama.cpp's chain stage by stage against independent formulas, seeded
draws, logprobs, validation, and the original greedy/top-k/top-p ``Sampler``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorplug.errors import RunError
from tensorplug_llm.sampling import (
    LlamaDraws,
    Sampler,
    SamplerParams,
    SamplingParamError,
    SamplingParams,
    TokenSampler,
)

LOGITS = np.array([1.0, 3.0, -2.0, 3.0, 0.5, 2.0, -1.0, 0.0], dtype=np.float32)
# every truncating stage off, so that a test sees one stage alone
OFF: dict[str, Any] = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _random_logits(seed: int, n: int = 1000, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def _ranked(z: np.ndarray, ids: list[int]) -> list[int]:
    """``ids`` by logit descending, ties by id: the order the chain keeps."""
    return sorted(ids, key=lambda i: (-float(z[i]), i))


# -- the original Sampler ----------------------------------------------------------------------


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


#: llama.cpp's own chain (top-k, top-p, min-p, temp, dist) on these logits, 12 draws a
#: seed, recorded through llama-cpp-python 0.3.36 by tests/data/record_llama_draws.py:
#: (logits, seed, temperature, top_k, top_p, min_p) → tokens
LLAMA_CPP_DRAWS = [
    ("small", 42, 1.0, 0, 1.0, 0.0, [3, 1, 3, 3, 3, 1, 3, 1, 1, 3, 1, 3]),
    ("small", 3, 1.3, 5, 0.5, 0.0, [1, 3, 1, 3, 1, 1, 1, 1, 1, 3, 1, 1]),
    ("big", 7, 0.8, 40, 0.95, 0.05, [639, 803, 944, 803, 803, 639, 639, 803, 639, 803, 185, 803]),
    ("big", 42, 0.7, 0, 1.0, 0.0, [816, 493, 803, 803, 639, 220, 639, 639, 220, 803, 185, 803]),
]


@pytest.mark.parametrize("name,seed,temperature,top_k,top_p,min_p,drawn", LLAMA_CPP_DRAWS)
def test_a_seed_draws_what_llama_cpp_draws(
    name: str, seed: int, temperature: float, top_k: int, top_p: float, min_p: float,
    drawn: list[int],
) -> None:  # fmt: skip
    """The generator, the draw and the order the candidates are walked in (by id where
    no stage sorted them) are llama.cpp's, so a seed picks llama.cpp's tokens."""
    logits = LOGITS if name == "small" else _random_logits(5)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            typical_p=1.0, seed=seed)  # fmt: skip
    s = TokenSampler(params)
    assert [s(logits) for _ in range(12)] == drawn


def test_llama_draws_are_libstdcpps_uniform_doubles_of_mt19937() -> None:
    """``std::uniform_real_distribution<double>(0, 1)`` over ``std::mt19937(seed)``, as
    libstdc++ computes them (printed by a C++ program), and llama.cpp's default seed
    (0xFFFFFFFF) is a random one."""
    draws = LlamaDraws(42)
    assert [draws.random() for _ in range(3)] == [
        0.79654298428784598, 0.18343478789336848, 0.77969099761266125,
    ]  # fmt: skip
    assert LlamaDraws(42 + (1 << 32)).random() == 0.79654298428784598  # the low 32 bits
    firsts = {LlamaDraws(0xFFFFFFFF).random() for _ in range(4)}
    assert len(firsts) == 4  # four random seeds (a clash has probability ~2**-30)


def test_bad_top_p() -> None:
    with pytest.raises(ValueError, match="top_p must be positive"):
        Sampler(SamplerParams(temperature=1.0, top_p=0.0))


# -- TokenSampler: greedy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0.0), SamplingParams(top_k=1), SamplingParams(-1.0)]
)
def test_greedy_is_argmax_bit_for_bit(params: SamplingParams) -> None:
    old = Sampler()
    for seed in range(50):
        logits = _random_logits(seed, 4096)
        logits[seed * 7 % 4096] = logits.max()  # a tie: the first maximum wins
        got = TokenSampler(params, 4096).sample(logits).token
        assert got == int(np.argmax(logits)) == old(logits)


def test_greedy_without_adjustments_is_the_chains_choice() -> None:
    """With no bias, penalty or mask, greedy takes the float32 logits' first maximum
    without the chain's float64 copy: the same id as the chain, ties, NaN and a hidden
    vocabulary included, and every logit at ``-inf`` refused the same way."""
    hidden = np.full(64, -np.inf, np.float32)
    cases = [_random_logits(seed, 4096) for seed in range(20)]
    for seed, z in enumerate(cases[:10]):
        z[seed * 11 % 4096] = z.max()  # a tie: the first maximum wins
    cases[10][77] = np.nan  # argmax's NaN: the first one, in float32 as in float64
    cases[11][:] = -np.inf
    cases[11][4095] = -1e30
    for z in cases:
        s = TokenSampler(SamplingParams(temperature=0.0), z.size)
        ids = np.array([int(np.argmax(s.adjusted_logits(z)))])  # the float64 chain
        assert s.sample(z).token == int(ids[0])
    with pytest.raises(RunError, match="no token can be sampled"):
        TokenSampler(SamplingParams(temperature=0.0)).sample(hidden)


def test_greedy_sees_bias_penalties_and_mask() -> None:
    s = TokenSampler(SamplingParams(temperature=0.0, logit_bias={1: -10.0}), LOGITS.size)
    assert s.sample(LOGITS).token == 3
    allowed = np.zeros(LOGITS.size, bool)
    allowed[[0, 4]] = True
    assert s.sample(LOGITS, allowed).token == 0
    p = TokenSampler(SamplingParams(temperature=0.0, repeat_penalty=2.0), LOGITS.size)
    p.accept_prompt([1, 3])  # 3.0 -> 1.5: id 5 (2.0) leads
    assert p.sample(LOGITS).token == 5


# -- TokenSampler: each stage against its formula --------------------------------------------------


def test_logit_bias_adds_and_bans() -> None:
    bias = {"2": 5.5, 1: -math.inf}  # a JSON object's keys are strings
    s = TokenSampler(SamplingParams(**OFF, logit_bias=bias), LOGITS.size)  # type: ignore[arg-type]
    want = LOGITS.astype(np.float64)
    want[2] += 5.5
    want[1] = -np.inf
    np.testing.assert_array_equal(s.adjusted_logits(LOGITS), want)
    ids, probs = s.candidates(LOGITS)
    assert 1 not in ids.tolist()
    np.testing.assert_allclose(probs, _softmax(want[ids]))
    assert 1 not in {s.sample(LOGITS).token for _ in range(300)}


@pytest.mark.parametrize("last_n", [3, 64, -1])
def test_penalties_over_the_last_n_tokens(last_n: int) -> None:
    rep, freq, pres = 1.3, 0.4, 0.25
    params = SamplingParams(
        **OFF,
        repeat_penalty=rep,
        frequency_penalty=freq,
        presence_penalty=pres,
        penalty_last_n=last_n,
    )
    s = TokenSampler(params, LOGITS.size)
    history = [1, 2, 1, 7, 6, 1, 2]
    for t in history:
        s.accept(t)
    window = history if last_n < 0 else history[-last_n:]
    want = LOGITS.astype(np.float64)
    for t in set(window):
        c = window.count(t)
        z = want[t]
        want[t] = (z / rep if z > 0 else z * rep) - c * freq - pres
    np.testing.assert_allclose(s.adjusted_logits(LOGITS), want, rtol=1e-15)
    s.reset()
    np.testing.assert_array_equal(s.adjusted_logits(LOGITS), LOGITS.astype(np.float64))


def test_accepting_a_token_outside_the_vocabulary() -> None:
    s = TokenSampler(SamplingParams(repeat_penalty=1.1), 8)
    with pytest.raises(ValueError, match=r"token id 8 is outside the vocabulary \(0..7\)"):
        s.accept(8)
    with pytest.raises(ValueError, match="token id -1 is outside the vocabulary"):
        TokenSampler(SamplingParams(repeat_penalty=1.1)).accept(-1)


def test_penalties_off_when_last_n_is_zero() -> None:
    s = TokenSampler(SamplingParams(**OFF, repeat_penalty=2.0, penalty_last_n=0), LOGITS.size)
    s.accept_prompt([1, 1, 3])
    np.testing.assert_array_equal(s.adjusted_logits(LOGITS), LOGITS.astype(np.float64))


@pytest.mark.parametrize("k", [1, 3, 17, 999, 1000, 5000])
def test_top_k(k: int) -> None:
    z = _random_logits(1)
    ids, _ = TokenSampler(SamplingParams(**{**OFF, "top_k": k})).candidates(z)
    n = min(k, z.size)
    assert ids.tolist() == _ranked(z, list(range(z.size)))[:n]


@pytest.mark.parametrize("masked", [0.0, 0.5, 0.999])
def test_top_k_and_top_p_on_a_large_vocabulary(masked: float) -> None:
    """50k logits: the sampler selects from a subsample's bound, and sorts only what
    top-p may keep; the result is the plain sort's, masks and ties included."""
    rng = np.random.default_rng(11)
    z = np.round(rng.standard_normal(49152) * 4, 1).astype(np.float32)  # many ties
    allowed = rng.random(z.size) >= masked
    ok = np.flatnonzero(allowed).tolist()
    ranked = _ranked(z, ok)
    for k in (1, 5, 40, 700):
        ids, _ = TokenSampler(SamplingParams(**{**OFF, "top_k": k})).candidates(z, allowed)
        assert ids.tolist() == ranked[:k]
    for scale, top_p in ((1.0, 0.5), (4.0, 0.9), (4.0, 0.999)):  # nuclei of ~1 to ~20k
        zs = (z * scale).astype(np.float32)
        probs = _softmax(zs[ok].astype(np.float64))
        cum = np.cumsum(np.sort(probs)[::-1])
        n = int(np.searchsorted(cum, top_p)) + 1
        params = SamplingParams(**{**OFF, "top_p": top_p})
        ids, _ = TokenSampler(params).candidates(zs, allowed)
        assert ids.tolist() == _ranked(zs, ok)[:n]


def _typical_reference(z: np.ndarray, p: float) -> set[int]:
    """Meister et al.'s locally typical set, written out (as llama.cpp's loop)."""
    probs = _softmax(z.astype(np.float64))
    entropy = -sum(q * math.log(q) for q in probs)
    order = sorted(range(z.size), key=lambda i: (abs(-math.log(probs[i]) - entropy), i))
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += probs[i]
        if mass > p:
            break
    return set(kept)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.7, 0.95])
def test_typical_p(p: float) -> None:
    for seed in range(3):
        z = _random_logits(seed, 200)
        ids, probs = TokenSampler(SamplingParams(**{**OFF, "typical_p": p})).candidates(z)
        assert set(ids.tolist()) == _typical_reference(z, p)
        assert ids.tolist() == _ranked(z, ids.tolist())  # back in logit order for top-p
        np.testing.assert_allclose(probs, _softmax(z[ids].astype(np.float64)))


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 0.9, 0.999])
def test_top_p(p: float) -> None:
    z = _random_logits(2)
    ranked = _ranked(z, list(range(z.size)))
    probs = _softmax(z.astype(np.float64))
    kept, mass = [], 0.0
    for i in ranked:
        kept.append(i)
        mass += probs[i]
        if mass >= p:
            break
    ids, _ = TokenSampler(SamplingParams(**{**OFF, "top_p": p})).candidates(z)
    assert ids.tolist() == kept


@pytest.mark.parametrize("p", [0.01, 0.05, 0.3, 1.0])
def test_min_p(p: float) -> None:
    z = _random_logits(3)
    probs = _softmax(z.astype(np.float64))
    want = [i for i in _ranked(z, list(range(z.size))) if probs[i] >= p * probs.max() * (1 - 1e-12)]
    ids, _ = TokenSampler(SamplingParams(**{**OFF, "min_p": p})).candidates(z)
    assert ids.tolist() == want


def test_the_whole_chain_in_llama_cpp_order() -> None:
    """Bias, penalties, mask, top-k, typical, top-p, min-p, temperature, written out as
    plain Python over (id, logit) lists."""
    z = _random_logits(4, 500, 2.0)
    params = SamplingParams(
        temperature=0.7,
        top_k=60,
        typical_p=0.9,
        top_p=0.8,
        min_p=0.02,
        repeat_penalty=1.2,
        frequency_penalty=0.1,
        presence_penalty=0.2,
        penalty_last_n=8,
        logit_bias={7: 2.0, 11: -1.0},
    )
    allowed = np.random.default_rng(9).random(z.size) < 0.7
    s = TokenSampler(params, z.size)
    history = [3, 7, 7, 100, 250, 3, 7, 42, 42]
    s.accept_prompt(history)

    logit = {i: float(z[i]) for i in range(z.size)}
    for i, b in params.logit_bias.items():
        logit[i] += b
    window = history[-8:]
    for t in set(window):
        v = logit[t]
        logit[t] = (v / 1.2 if v > 0 else v * 1.2) - window.count(t) * 0.1 - 0.2
    cand = sorted((i for i in logit if allowed[i]), key=lambda i: (-logit[i], i))[:60]

    def probs_of(ids: list[int]) -> dict[int, float]:
        top = max(logit[i] for i in ids)
        e = {i: math.exp(logit[i] - top) for i in ids}
        total = sum(e.values())
        return {i: v / total for i, v in e.items()}

    pr = probs_of(cand)
    entropy = -sum(q * math.log(q) for q in pr.values())
    typical, mass = [], 0.0
    for i in sorted(cand, key=lambda i: abs(-math.log(pr[i]) - entropy)):
        typical.append(i)
        mass += pr[i]
        if mass > 0.9:
            break
    cand = [i for i in cand if i in set(typical)]
    pr, nucleus, mass = probs_of(cand), [], 0.0
    for i in cand:
        nucleus.append(i)
        mass += pr[i]
        if mass >= 0.8:
            break
    cand = [i for i in nucleus if logit[i] >= logit[nucleus[0]] + math.log(0.02)]
    scaled = np.array([logit[i] / 0.7 for i in cand])

    ids, probs = s.candidates(z, allowed)
    assert ids.tolist() == cand
    np.testing.assert_allclose(probs, _softmax(scaled), rtol=1e-12)


# -- TokenSampler: draws, logprobs, masks ----------------------------------------------------


def test_seeded_draws_are_reproducible_and_follow_the_distribution() -> None:
    z = _random_logits(6, 50, 1.0)
    params = SamplingParams(temperature=0.9, top_k=10, top_p=1.0, min_p=0.0, seed=1234)
    ids, probs = TokenSampler(params).candidates(z)
    s = TokenSampler(params)
    draws = [s.sample(z).token for _ in range(8000)]
    again = TokenSampler(params)
    assert [again.sample(z).token for _ in range(100)] == draws[:100]
    other = TokenSampler(dataclasses.replace(params, seed=1235))
    assert [other.sample(z).token for _ in range(100)] != draws[:100]
    freq = np.array([draws.count(int(i)) for i in ids]) / len(draws)
    np.testing.assert_allclose(freq, probs, atol=0.025)  # 4.5 sigma at n=8000
    assert set(draws) <= set(ids.tolist())
    s.reset()  # a reset restarts the generator from the seed
    assert [s.sample(z).token for _ in range(100)] == draws[:100]


def test_logprobs_are_the_models_full_softmax() -> None:
    z = _random_logits(7, 300)
    logp = z.astype(np.float64) - np.log(np.exp(z.astype(np.float64)).sum())
    best = sorted(range(z.size), key=lambda i: -logp[i])[:5]
    params = SamplingParams(temperature=1.7, top_k=3, logit_bias={best[4]: 50.0}, n_probs=5)
    s = TokenSampler(params, z.size)
    for _ in range(20):
        got = s.sample(z)
        assert got.token == best[4]  # the bias makes it win; its logprob is the model's
        assert got.logprob == pytest.approx(logp[got.token], abs=1e-6)  # float32 logits
        assert got.top_logprobs is not None
        assert [i for i, _ in got.top_logprobs] == best
        np.testing.assert_allclose([lp for _, lp in got.top_logprobs], logp[best], atol=1e-6)
    assert TokenSampler(SamplingParams(n_probs=0)).sample(z).top_logprobs is None
    for params in (SamplingParams(temperature=0.0), SamplingParams(seed=1)):
        kept = TokenSampler(params).sample(z)
        spared = TokenSampler(dataclasses.replace(params, token_logprob=False)).sample(z)
        assert kept.logprob == pytest.approx(logp[kept.token], abs=1e-6)
        assert spared == type(spared)(kept.token, None)  # the same token, no softmax
    asked = SamplingParams(temperature=0.0, n_probs=2, token_logprob=False)
    top = TokenSampler(asked).sample(z)  # n_probs computes them anyway
    assert top.logprob == pytest.approx(logp[top.token], abs=1e-6) and top.top_logprobs
    every = TokenSampler(SamplingParams(n_probs=10**6)).sample(z).top_logprobs
    assert every is not None and len(every) == z.size


def test_mask_restricts_draws_and_a_dead_end_is_an_error() -> None:
    z = _random_logits(8, 64)
    allowed = np.zeros(64, bool)
    allowed[[5, 9, 60]] = True
    s = TokenSampler(SamplingParams(**OFF, seed=0), 64)
    # 5 has p = 0.0085: 2000 draws miss it with probability e**-17
    assert {s.sample(z, allowed).token for _ in range(2000)} == {5, 9, 60}
    with pytest.raises(ValueError, match="no token can be sampled"):
        s.sample(z, np.zeros(64, bool))
    with pytest.raises(ValueError, match="no token can be sampled"):
        TokenSampler(SamplingParams(temperature=0.0), 64).sample(z, np.zeros(64, bool))
    with pytest.raises(ValueError, match="mask has 10 entries for 64 logits"):
        s.sample(z, np.ones(10, bool))
    with pytest.raises(ValueError, match="got 63 logits for a vocabulary of 64"):
        s.sample(z[:63])


def test_calling_samples_and_accepts() -> None:
    s = TokenSampler(SamplingParams(temperature=0.0, repeat_penalty=100.0), LOGITS.size)
    assert [s(LOGITS) for _ in range(3)] == [1, 3, 5]  # each pick is penalized next time


def test_generate_with_a_token_sampler(tmp_path: Path) -> None:
    from tensorplug_llm import ModelRunner
    from tensorplug_llm.placement import Placement, host_cpu
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "f32", 3)
    params = SamplingParams(temperature=1.0, top_k=0, min_p=0.0, repeat_penalty=1.3, seed=5)
    runs = []
    with ModelRunner(path, placement=Placement.on(host_cpu(), 2)) as m:
        for _ in range(2):
            m.reset()
            runs.append(m.generate([1, 300, 301], 8, TokenSampler(params), stop_at_eos=False))
        m.reset()
        greedy = m.generate([1, 300, 301], 8, TokenSampler(SamplingParams(0.0)), stop_at_eos=False)
        m.reset()
        old = m.generate([1, 300, 301], 8, Sampler(), stop_at_eos=False)
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 8
    assert greedy.tokens == old.tokens


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("temperature", float("nan"), "must be a finite number"),
        ("top_k", 2.5, "must be an integer"),
        ("top_p", 1.5, "must be between 0 and 1"),
        ("min_p", -0.1, "must be between 0 and 1"),
        ("typical_p", float("inf"), "must be a finite number"),
        ("repeat_penalty", 0.0, "must be positive"),
        ("frequency_penalty", "a lot", "must be a finite number"),
        ("presence_penalty", float("-inf"), "must be a finite number"),
        ("penalty_last_n", -2, "must be -1"),
        ("seed", -5, "must be a non-negative integer"),
        ("seed", True, "must be an integer"),
        ("n_probs", -1, "must be 0 or more"),
        ("logit_bias", [1, 2], "must map token ids to numbers"),
        ("logit_bias", {"x": 1.0}, "keys must be token ids"),
        ("logit_bias", {3: float("nan")}, "must be a finite number or -inf"),
    ],
)
def test_bad_parameters_name_the_field(field: str, value: object, says: str) -> None:
    with pytest.raises(SamplingParamError, match=f"^{field} .*{says}") as err:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert err.value.param == field


def test_logit_bias_outside_the_vocabulary() -> None:
    with pytest.raises(SamplingParamError, match="names token 8, outside the vocabulary"):
        TokenSampler(SamplingParams(logit_bias={8: 1.0}), 8)
    late = TokenSampler(SamplingParams(logit_bias={8: 1.0}))  # checked at the first logits
    with pytest.raises(SamplingParamError, match="outside the vocabulary"):
        late.sample(LOGITS)


def test_post_sampling_probs_are_the_draws_own_distribution() -> None:
    """llama-server's ``post_sampling_probs``: the survivors of the chain, normalized as
    the draw leaves them, in the order it walks them; a greedy chain lists its one
    token at probability 1."""
    z = _random_logits(11, 200, 2.0)
    params = SamplingParams(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0, seed=3,
                            n_probs=10, post_sampling_probs=True)  # fmt: skip
    ids, probs = TokenSampler(params).candidates(z)
    got = TokenSampler(params).sample(z)
    assert got.top_logprobs is not None and len(got.top_logprobs) == 5  # 5 survive top-k
    assert [i for i, _ in got.top_logprobs] == ids.tolist()
    np.testing.assert_allclose([math.exp(lp) for _, lp in got.top_logprobs], probs, rtol=1e-6)
    assert got.logprob == dict(got.top_logprobs)[got.token]
    raw = TokenSampler(dataclasses.replace(params, post_sampling_probs=False)).sample(z)
    assert raw.token == got.token and raw.logprob is not None and raw.logprob < got.logprob
    greedy = TokenSampler(dataclasses.replace(params, temperature=0.0)).sample(z)
    assert greedy.top_logprobs == [(int(np.argmax(z)), 0.0)] and greedy.logprob == 0.0

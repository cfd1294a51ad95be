"""Choosing the next token from logits: llama.cpp's sampler chain, with logprobs.

:class:`TokenSampler` runs the chain of llama.cpp's common sampler, in its order:

1. **logit bias** — ``logit_bias[id]`` is added to the token's logit (``-inf`` bans it);
2. **penalties** over the last ``penalty_last_n`` accepted tokens: a token seen there has
   its logit divided by ``repeat_penalty`` when positive, multiplied when not (the CTRL
   penalty with llama.cpp's fix for negative logits), then ``count * frequency_penalty +
   presence_penalty`` subtracted (OpenAI's definitions);
3. the **allowed** mask of a structured-output constraint (:mod:`.constraint`), if any;
4. **top-k** keeps the ``k`` largest logits; 5. **typical-p** keeps the locally typical
   set (tokens whose surprise is closest to the entropy) up to mass ``p``; 6. **top-p**
   the smallest most likely set reaching ``p``; 7. **min-p** the tokens whose probability
   is at least ``min_p`` times the best one's — each on the softmax of the survivors at
   temperature 1;
8. **temperature** divides the survivors' logits; 9. **dist** draws one from their
   softmax as llama.cpp's does, with llama.cpp's generator seeded by ``seed``
   (:class:`LlamaDraws`): the same seed and logits give llama.cpp's choice.

A temperature of 0 or less, or ``top_k == 1``, is greedy: the first maximum of the logits
after steps 1-3, so with no bias, penalty or mask it is ``argmax(logits)``, bit for bit
what :class:`Sampler` always did. The chain's thresholds are computed in float64, which
is why they can differ from llama.cpp's float32 ones only in the last bits; the draw is
llama.cpp's float32 softmax and double running sum, so a seeded draw picks llama.cpp's
token unless the logits themselves differ.

Logprobs (``n_probs``, OpenAI's ``logprobs``/``top_logprobs``) are those of the model's
own distribution, the full softmax of the raw logits before bias, penalties, mask and
truncation — what llama-server reports for ``n_probs``.

:class:`Sampler` (``SamplerParams``: temperature, top-k, top-p, seed) is the original
four-knob sampler the CLI uses; it is this chain with min-p, typical-p and penalties off.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np

from tensorplug.errors import RunError

__all__ = [
    "SampledToken",
    "Sampler",
    "SamplerParams",
    "SamplingParamError",
    "LlamaDraws",
    "SamplingParams",
    "TokenSampler",
]

#: llama.cpp's ``LLAMA_DEFAULT_SEED``: a seed of "pick one at random"
RANDOM_SEED = 0xFFFFFFFF


class LlamaDraws:
    """Uniform draws in [0, 1) as llama.cpp's samplers make them, so that a seed gives
    llama.cpp's choices (llama-server's, llama-cpp-python's): ``std::mt19937`` seeded
    with the seed's low 32 bits (numpy's ``RandomState`` seeds its Mersenne Twister the
    same way), read through libstdc++'s ``std::uniform_real_distribution<double>``: two
    32-bit outputs, the second the high word, summed in double and scaled by 2⁻⁶⁴.
    None, a negative seed or :data:`RANDOM_SEED` draws a seed at random, as llama.cpp
    does for its default seed."""

    def __init__(self, seed: int | None) -> None:
        if seed is None or seed < 0 or seed & 0xFFFFFFFF == RANDOM_SEED:
            seed = secrets.randbits(32)
        self._twister = np.random.RandomState(seed & 0xFFFFFFFF)

    def random(self) -> float:
        low, high = self._twister.randint(0, 1 << 32, size=2, dtype=np.uint32)
        value = (float(low) + float(high) * 4294967296.0) / 18446744073709551616.0
        return value if value < 1.0 else math.nextafter(1.0, 0.0)


class SamplingParamError(RunError):
    """A sampling parameter is out of range; ``param`` names it (as OpenAI's error body
    does), the message says what it must be."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """What the sampler chain does; the defaults are llama.cpp's.

    ``top_k <= 0``, ``top_p == 1``, ``typical_p == 1``, ``min_p == 0``,
    ``repeat_penalty == 1`` and zero frequency/presence penalties switch their stage off.
    ``penalty_last_n``: how many of the last accepted tokens the penalties look at (0: the
    penalties are off, -1: every accepted token). ``logit_bias`` maps token ids (ints, or
    their decimal strings as in OpenAI's JSON) to an added logit. ``seed``: None or -1
    draws a random one. ``n_probs``: how many of the most likely tokens each
    :class:`SampledToken` lists with their logprobs (0: none). ``post_sampling_probs``:
    those logprobs are of the draw's own distribution, the chain's survivors (llama-server's
    ``post_sampling_probs``), not the model's full softmax. ``token_logprob``: whether each
    :class:`SampledToken` carries the drawn token's own logprob where ``n_probs`` is 0
    (the model's full softmax: a pass over the whole vocabulary each token, which a
    caller that reports no logprobs turns off; the token's is then None).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    n_probs: int = 0
    post_sampling_probs: bool = False
    token_logprob: bool = True

    def __post_init__(self) -> None:
        _finite("temperature", self.temperature)
        _integer("top_k", self.top_k)
        for name in ("top_p", "min_p", "typical_p"):
            value = _finite(name, getattr(self, name))
            if not 0.0 <= value <= 1.0:
                raise SamplingParamError(name, f"must be between 0 and 1, got {value}")
        if _finite("repeat_penalty", self.repeat_penalty) <= 0.0:
            raise SamplingParamError(
                "repeat_penalty", f"must be positive (1 is off), got {self.repeat_penalty}"
            )
        _finite("frequency_penalty", self.frequency_penalty)
        _finite("presence_penalty", self.presence_penalty)
        if _integer("penalty_last_n", self.penalty_last_n) < -1:
            raise SamplingParamError(
                "penalty_last_n",
                f"must be -1 (every token), 0 (off) or a count, got {self.penalty_last_n}",
            )
        if self.seed is not None and _integer("seed", self.seed) < -1:
            raise SamplingParamError(
                "seed", f"must be a non-negative integer, or None or -1 for a random one, "
                f"got {self.seed}"
            )  # fmt: skip
        if _integer("n_probs", self.n_probs) < 0:
            raise SamplingParamError("n_probs", f"must be 0 or more, got {self.n_probs}")
        object.__setattr__(self, "logit_bias", _bias_map(self.logit_bias))

    @property
    def greedy(self) -> bool:
        """Whether the chain always picks the most likely token."""
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def penalizes(self) -> bool:
        """Whether the penalty stage changes anything (llama.cpp's ``is_disabled``)."""
        return self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


@dataclass(frozen=True)
class SampledToken:
    """A drawn token, its logprob under the model's distribution (None where
    ``token_logprob`` was off and ``n_probs`` 0) and, when ``n_probs`` asked for them,
    the ``n_probs`` most likely tokens with theirs, best first."""

    token: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None = None


class TokenSampler:
    """One sequence's sampler: the chain of :class:`SamplingParams`, a seeded generator
    and the penalty history.

    ``sample(logits, allowed)`` draws a token; ``accept(token)`` records it in the
    history the penalties read (feed the prompt with :meth:`accept_prompt` first, as
    llama-server does). Calling the sampler does both and returns the id, which is what
    :meth:`ModelRunner.generate` needs. ``n_vocab`` None takes the size of the first logits.
    Not thread-safe: one sampler per sequence.
    """

    def __init__(self, params: SamplingParams | None = None, n_vocab: int | None = None) -> None:
        self.params = params or SamplingParams()
        self.n_vocab = n_vocab
        if n_vocab is not None:
            self._check_bias(n_vocab)
        last_n = self.params.penalty_last_n
        self._history: deque[int] = deque(maxlen=None if last_n < 0 else last_n)
        self._counts: Counter[int] = Counter()
        self._bias_ids = np.fromiter(self.params.logit_bias.keys(), np.int64)
        self._bias = np.fromiter(self.params.logit_bias.values(), np.float64)
        self.rng = self._new_rng()

    def _new_rng(self) -> LlamaDraws:
        return LlamaDraws(self.params.seed)

    def _check_bias(self, n_vocab: int) -> None:
        bad = [tid for tid in self.params.logit_bias if tid >= n_vocab]
        if bad:
            raise SamplingParamError(
                "logit_bias", f"names token {bad[0]}, outside the vocabulary (0..{n_vocab - 1})"
            )

    # -- history ---------------------------------------------------------------------------

    def accept(self, token: int) -> None:
        """Record ``token`` as the sequence's next one (for the penalties)."""
        if not self.params.penalizes:
            return
        if token < 0 or (self.n_vocab is not None and token >= self.n_vocab):
            top = "" if self.n_vocab is None else f" (0..{self.n_vocab - 1})"
            raise RunError(f"token id {token} is outside the vocabulary{top}")
        if self._history.maxlen is not None and len(self._history) == self._history.maxlen:
            gone = self._history[0]
            self._counts[gone] -= 1
            if not self._counts[gone]:
                del self._counts[gone]
        self._history.append(token)
        self._counts[token] += 1

    def accept_prompt(self, tokens: Iterable[int]) -> None:
        """Record a prompt's tokens: repeating the prompt is penalized too."""
        for token in tokens:
            self.accept(token)

    def reset(self) -> None:
        """Forget the history and restart the generator from the seed (a new request)."""
        self._history.clear()
        self._counts.clear()
        self.rng = self._new_rng()

    # -- the chain -------------------------------------------------------------------------

    def adjusted_logits(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
        """Steps 1-3: the logits (float64) after bias and penalties, ``-inf`` where the
        mask forbids a token."""
        z = self._vector(logits).astype(np.float64)
        if self._bias_ids.size:
            z[self._bias_ids] += self._bias
        if self._counts:
            p = self.params
            ids = np.fromiter(self._counts.keys(), np.int64, len(self._counts))
            counts = np.fromiter(self._counts.values(), np.float64, len(self._counts))
            seen = z[ids]
            seen = np.where(seen <= 0.0, seen * p.repeat_penalty, seen / p.repeat_penalty)
            z[ids] = seen - counts * p.frequency_penalty - p.presence_penalty
        if allowed is not None:
            allowed = np.asarray(allowed, dtype=bool).reshape(-1)
            if allowed.size != z.size:
                raise RunError(
                    f"the allowed-token mask has {allowed.size} entries for {z.size} logits"
                )
            z[~allowed] = -np.inf
        return z

    def candidates(
        self, logits: np.ndarray, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ids that survive the chain, by logit descending (ties: lower id first),
        and the probabilities the draw gives them."""
        ids, zs = self._survivors(logits, allowed)
        if self.params.greedy:
            return ids, np.ones(1)
        return ids, _softmax(zs / self.params.temperature)

    def _survivors(
        self, logits: np.ndarray, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ids that survive steps 1-7, by logit descending (ties: lower id first),
        and their logits (float64, before the temperature)."""
        p = self.params
        if p.greedy and allowed is None and not self._bias_ids.size and not self._counts:
            # nothing moves a logit: the float32 logits' first maximum is the float64
            # chain's (widening keeps their order), without a widened copy of them all
            x = self._vector(logits)
            top = int(np.argmax(x))
            if x[top] == -np.inf:
                raise _nothing_left()
            return np.array([top]), x[top : top + 1].astype(np.float64)
        z = self.adjusted_logits(logits, allowed)
        if p.greedy:
            best = int(np.argmax(z))
            if z[best] == -np.inf:
                raise _nothing_left()
            return np.array([best]), z[best : best + 1]
        n_finite = int(np.count_nonzero(z > -np.inf))
        if n_finite == 0:
            raise _nothing_left()
        nucleus_first = p.top_k <= 0 and p.typical_p >= 1.0 and p.top_p < 1.0
        if nucleus_first:  # top-p alone over the whole vocabulary: sort only the nucleus
            ids = _nucleus(z, n_finite, p.top_p)
        else:
            ids = _best_first(z, p.top_k if 0 < p.top_k < n_finite else None)
        zs = z[ids]
        if p.typical_p < 1.0:
            keep = _typical(zs, p.typical_p)
            ids, zs = ids[keep], zs[keep]
        if p.top_p < 1.0 and not nucleus_first:
            cum = np.cumsum(_softmax(zs))
            n = min(int(np.searchsorted(cum, p.top_p)) + 1, ids.size)  # first cum >= top_p
            ids, zs = ids[:n], zs[:n]
        if p.min_p > 0.0:
            n = int(np.count_nonzero(zs >= zs[0] + math.log(p.min_p)))
            ids, zs = ids[:n], zs[:n]
        return ids, zs

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> SampledToken:
        """Draw the next token (not yet accepted: call :meth:`accept` with it)."""
        ids, zs = self._survivors(logits, allowed)
        if self.params.greedy:
            return self._with_logprobs(int(ids[0]), logits, ids[:1], np.ones(1))
        walk, probs, chosen = self._draw(ids, zs)
        return self._with_logprobs(int(ids[walk[chosen]]), logits, ids[walk], probs)

    def _draw(self, ids: np.ndarray, zs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """llama.cpp's ``dist`` over the survivors: their float32 logits divided by the
        temperature, ``expf(logit - max)`` each, summed in double; the first whose
        running sum reaches ``sum·u`` is chosen, ``u`` from :class:`LlamaDraws`. A draw
        is made even for one survivor, as llama.cpp keeps its generator in step so. The
        survivors are walked best first, as llama.cpp's sorted candidates are, or by
        id where no step of its chain sorted them (no top-k, typical-p or top-p).
        Returns the walk (positions in ``ids``), each survivor's probability in that
        order (float32, as llama.cpp leaves them) and the chosen one's place in it."""
        p = self.params
        u = self.rng.random()
        walk = np.arange(ids.size)
        if ids.size == 1:
            return walk, np.ones(1, np.float32), 0
        scaled = zs.astype(np.float32) / np.float32(p.temperature)
        if p.top_k <= 0 and p.typical_p >= 1.0 and p.top_p >= 1.0:
            walk = np.argsort(ids)
        weights = np.exp(scaled[walk] - scaled.max())
        running = np.cumsum(weights, dtype=np.float64)
        chosen = min(int(np.searchsorted(running, running[-1] * u)), ids.size - 1)
        return walk, (weights / running[-1]).astype(np.float32), chosen

    def __call__(self, logits: np.ndarray) -> int:
        """Sample and accept: the id of the next token."""
        token = self.sample(logits).token
        self.accept(token)
        return token

    def _vector(self, logits: np.ndarray) -> np.ndarray:
        v = np.asarray(logits).reshape(-1)
        if self.n_vocab is None:
            self._check_bias(v.size)
            self.n_vocab = v.size
        elif v.size != self.n_vocab:
            raise RunError(f"got {v.size} logits for a vocabulary of {self.n_vocab} tokens")
        return v

    def _with_logprobs(
        self, token: int, logits: np.ndarray, drawn: np.ndarray, probs: np.ndarray
    ) -> SampledToken:
        """``token`` with its logprob and the ``n_probs`` best: the model's full softmax,
        or with ``post_sampling_probs`` the draw's (``drawn`` ids with ``probs``, in the
        order the draw walked them; the zeros a greedy chain leaves are not listed)."""
        if self.params.post_sampling_probs:
            with np.errstate(divide="ignore"):  # log(0): -inf
                logs = np.log(probs.astype(np.float64))
            own = float(logs[np.flatnonzero(drawn == token)[0]])
            kept = np.flatnonzero(probs > 0)[: self.params.n_probs]
            survivors = [(int(drawn[i]), float(logs[i])) for i in kept]
            return SampledToken(token, own, survivors or None)
        if not self.params.n_probs and not self.params.token_logprob:
            return SampledToken(token, None)
        x = np.asarray(logits).reshape(-1)
        top = x.max()
        lse = float(top) + math.log(float(np.exp(x - top).sum(dtype=np.float64)))
        listed = None
        n = min(self.params.n_probs, x.size)
        if n:
            best = _best_first(x, n)
            listed = [(int(i), float(x[i]) - lse) for i in best]
        return SampledToken(token, float(x[token]) - lse, listed)


def _best_first(z: np.ndarray, m: int | None = None) -> np.ndarray:
    """The ids of the ``m`` largest finite logits of ``z`` (all finite ones when None),
    by logit descending, ties by lower id.

    Partitioning 50k logits to find the best 40 costs milliseconds, so the m-th best of
    a 16m-long subsample is found first: at least m logits reach it, hence each of the m
    best does, and only the few hundred that reach it are partitioned. (Under a mask
    the subsample may hold only ``-inf``: then the allowed ids are the ones to look at.)
    """
    if m is not None and m * 64 < z.size:
        sub = z[:: z.size // (16 * m)]
        floor = np.partition(sub, sub.size - m)[sub.size - m]
        ids = np.flatnonzero(z >= floor) if floor > -np.inf else np.flatnonzero(z > -np.inf)
    else:
        ids = np.flatnonzero(z > -np.inf)
    if m is not None and m < ids.size:  # every id tied with the m-th best, so ties go by id
        zi = z[ids]
        ids = ids[zi >= -np.partition(-zi, m - 1)[m - 1]]
    return ids[np.argsort(-z[ids], kind="stable")][:m]


def _nucleus(z: np.ndarray, n_finite: int, p: float) -> np.ndarray:
    """Top-p over the finite logits of ``z``, best first: the shortest prefix of the
    sorted logits whose softmax mass reaches ``p``, found by sorting the best 256, 2048...
    until their mass does (llama.cpp's top-p grows a partial sort the same way)."""
    top = z.max()
    total = np.exp(z - top).sum()
    m = 256
    while True:
        best = _best_first(z, m if m < n_finite else None)
        cum = np.cumsum(np.exp(z[best] - top) / total)
        if cum[-1] >= p or best.size == n_finite:
            return best[: min(int(np.searchsorted(cum, p)) + 1, best.size)]
        m *= 8


def _typical(z: np.ndarray, p: float) -> np.ndarray:
    """Positions (ascending, so ``z``'s order is kept) of the locally typical set of
    logits ``z``: by ``|surprise - entropy|`` ascending until the mass exceeds ``p``."""
    logp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
    probs = np.exp(logp)
    entropy = -float(np.sum(probs * logp))
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    over = np.flatnonzero(np.cumsum(probs[order]) > p)
    n = int(over[0]) + 1 if over.size else order.size
    return np.sort(order[:n])


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    out: np.ndarray = e / e.sum()
    return out


def _nothing_left() -> RunError:
    return RunError(
        "no token can be sampled: the constraint's mask and logit_bias rule out every token"
    )


def _finite(name: str, value: object) -> float:
    if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value):
        raise SamplingParamError(name, f"must be a finite number, got {value!r}")
    return float(value)


def _integer(name: str, value: object) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool):
        raise SamplingParamError(name, f"must be an integer, got {value!r}")
    return int(value)


def _bias_map(bias: object) -> dict[int, float]:
    """``logit_bias`` as ``{id: float}``: keys may be ints or decimal strings (JSON's
    object keys), values finite numbers or ``-inf`` (the token is never drawn)."""
    if not isinstance(bias, Mapping):
        raise SamplingParamError(
            "logit_bias", f"must map token ids to numbers, got {type(bias).__name__}"
        )
    out: dict[int, float] = {}
    for key, value in bias.items():
        tid = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if not isinstance(tid, Integral) or isinstance(tid, bool) or tid < 0:
            raise SamplingParamError(
                "logit_bias", f"keys must be token ids (integers >= 0), got {key!r}"
            )
        ok = isinstance(value, Real) and not isinstance(value, bool)
        if not ok or not (math.isfinite(value) or value == -math.inf):  # type: ignore[arg-type]
            raise SamplingParamError(
                "logit_bias", f"[{key!r}] must be a finite number or -inf, got {value!r}"
            )
        out[int(tid)] = float(value)  # type: ignore[arg-type]
    return out


# -- the original sampler ------------------------------------------------------------------


@dataclass(frozen=True)
class SamplerParams:
    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 40  # <= 0: keep every token
    top_p: float = 0.95  # >= 1: keep every token
    seed: int = 0


class Sampler(TokenSampler):
    """The CLI's sampler: temperature, top-k, top-p and seed, greedy by default; a seed
    draws what llama.cpp's chain of those stages draws."""

    def __init__(self, params: SamplerParams | None = None) -> None:
        p = params or SamplerParams()
        if p.top_p <= 0.0:
            raise RunError(f"top_p must be positive (1 keeps every token), got {p.top_p}")
        super().__init__(
            SamplingParams(
                temperature=p.temperature,
                top_k=p.top_k,
                top_p=min(p.top_p, 1.0),
                min_p=0.0,
                seed=p.seed,
            )
        )
        self.sampler_params = p

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:  # no logprobs, no history: the loop of old, bit for bit
            return int(np.argmax(logits))
        return super().__call__(logits)

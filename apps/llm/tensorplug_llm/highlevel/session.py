"""One sequence's state as llama-cpp-python keeps it: the tokens evaluated, their logits,
and the sampler that continues them.

llama-cpp-python's ``Llama`` is a single conversation over one KV cache: ``eval(tokens)``
appends to ``input_ids`` (and, with ``logits_all``, their rows of ``scores``),
``sample()`` draws the next token from the last logits, and ``generate(tokens)`` reuses
the longest prefix the cache already holds before evaluating the rest. Programs read
``n_tokens``, ``input_ids`` and ``scores`` directly, so :class:`Session` keeps exactly
those arrays, and keeps the runner's sequence 0 (``ModelRunner.n_past``) in step with
``n_tokens``.

Sampling follows llama-cpp-python's chain (``Llama._init_sampler``): logits processors
first, then the repetition penalties over the tokens sampled in this generation (not
the prompt), the grammar, and top-k → typical → top-p → min-p → temperature → draw (or
greedy at temperature 0, or mirostat). The draw is llama.cpp's ``dist``, on its
generator (:class:`~tensorplug_llm.sampling.LlamaDraws`: ``std::mt19937`` and libstdc++'s
uniform doubles), so a seeded run draws llama.cpp's tokens wherever the chain's
probabilities agree. Mirostat (at a positive temperature, which it does not apply, as
llama-cpp-python's chain) draws with the same generator in llama.cpp's float32
arithmetic and ``std::discrete_distribution``'s draw, so a seeded mirostat run draws
llama.cpp's tokens too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..prefix import common_prefix
from ..sampling import LlamaDraws, SamplingParams, TokenSampler

if TYPE_CHECKING:
    from ..constraint import Constraint
    from ..runner import ModelRunner
    from .processors import LogitsProcessorList, StoppingCriteriaList

__all__ = ["SampleSettings", "Session"]

#: llama-cpp-python's ``LLAMA_DEFAULT_SEED``: "pick a random seed".
DEFAULT_SEED = 0xFFFFFFFF

#: The candidates mirostat 1.0 estimates the distribution's shape from (llama.cpp's m).
_MIROSTAT_M = 100


@dataclass(frozen=True)
class SampleSettings:
    """The keyword arguments of llama-cpp-python's ``sample``/``generate``, as one value.

    ``tfs_z`` is accepted and has no effect, as in llama-cpp-python 0.3 (llama.cpp
    removed tail-free sampling); ``penalize_nl`` likewise.
    """

    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    temp: float = 0.80
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    tfs_z: float = 1.0
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    penalize_nl: bool = True
    logits_processor: LogitsProcessorList | None = None
    grammar: Any = None  # a LlamaGrammar, a response_format dict or a Constraint
    logit_bias: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        if self.mirostat_mode not in (0, 1, 2):
            raise ValueError(
                f"mirostat_mode must be 0 (off), 1 (mirostat) or 2 (mirostat 2.0), "
                f"got {self.mirostat_mode!r}"
            )

    def chain(self, seed: int | None, last_n: int, n_vocab: int) -> TokenSampler:
        """The sampler chain of these settings (mirostat aside: :class:`_Mirostat`)."""
        if self.temp < 0.0:  # llama-cpp-python: a plain draw from the distribution
            top_k, top_p, min_p, typical_p, temperature = 0, 1.0, 0.0, 1.0, 1.0
        else:
            top_k, top_p, min_p = self.top_k, self.top_p, self.min_p
            typical_p, temperature = self.typical_p, self.temp
        params = SamplingParams(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            penalty_last_n=last_n,
            logit_bias=self.logit_bias or {},
            seed=seed,
        )
        return TokenSampler(params, n_vocab)


class _Mirostat:
    """llama.cpp's mirostat samplers (1.0 with m = 100, and 2.0) in its float32
    arithmetic: the candidates are sorted and cut where their surprise passes ``mu``
    (2.0) or to the ``k`` that 1.0 estimates from the distribution's shape, and drawn as
    ``std::discrete_distribution`` draws; ``mu`` follows the target ``tau``. With the
    same logits and seed, the draws are llama.cpp's."""

    def __init__(self, settings: SampleSettings, rng: LlamaDraws, n_vocab: int) -> None:
        self.version = settings.mirostat_mode
        self.tau = np.float32(settings.mirostat_tau)
        self.eta = np.float32(settings.mirostat_eta)
        self.mu = np.float32(2.0) * self.tau
        self.rng = rng
        self.n_vocab = n_vocab

    def draw(self, z: np.ndarray) -> int:
        logits = z.astype(np.float32)
        finite = np.flatnonzero(logits > -np.inf)
        order = finite[np.lexsort((finite, -logits[finite]))]  # descending, ties by id
        logits = logits[order]
        p = _softmax32(logits)
        if self.version == 1:
            keep = _top_k_int(self._k(p))
        else:
            over = np.flatnonzero(-np.log2(p.astype(np.float64)).astype(np.float32) > self.mu)
            keep = int(over[0]) if over.size else p.size
        keep = min(max(keep, 1), p.size)
        p = _softmax32(logits[:keep])
        pick = _discrete(p, self.rng)
        surprise = -np.float32(math.log2(float(p[pick])))
        self.mu = np.float32(self.mu - self.eta * np.float32(surprise - self.tau))
        return int(order[pick])

    def _k(self, p: np.ndarray) -> np.float32:
        """Mirostat 1.0's ``k``: the Zipf exponent ``s_hat`` estimated from the first
        ``m`` probabilities, then the k whose expected surprise is ``mu``."""
        f32 = np.float32
        sum_tb, sum_tt = f32(0.0), f32(0.0)
        for i in range(min(_MIROSTAT_M - 1, p.size - 1)):
            t = _logf(f32(i + 2) / f32(i + 1))
            b = _logf(p[i] / p[i + 1])
            sum_tb = f32(sum_tb + f32(t * b))
            sum_tt = f32(sum_tt + f32(t * t))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            s_hat = f32(sum_tb / sum_tt)
            eps = f32(s_hat - f32(1.0))
            top = f32(eps * _powf(f32(2.0), self.mu))
            bottom = f32(f32(1.0) - _powf(f32(self.n_vocab), -eps))
            return _powf(f32(top / bottom), f32(1.0) / s_hat)


def _logf(x: np.float32) -> np.float32:
    """``logf`` (the float64 logarithm rounded to float32; non-positive: -inf or NaN)."""
    v = float(x)
    if v > 0.0:
        return np.float32(math.log(v))
    return np.float32(-np.inf if v == 0.0 else np.nan)


def _powf(x: np.float32, y: np.float32) -> np.float32:
    """``powf`` (the float64 power rounded to float32): NaN for a negative base and a
    fractional exponent, inf past float32's range."""
    try:
        return np.float32(math.pow(float(x), float(y)))
    except ValueError:
        return np.float32(np.nan)
    except OverflowError:
        return np.float32(np.inf)


def _top_k_int(k: np.float32) -> int:
    """C's ``int(k)`` on x86: truncation, and INT_MIN where the value is NaN or out of
    int's range (llama.cpp then keeps one candidate)."""
    v = float(k)
    if not math.isfinite(v) or not -(2.0**31) <= v < 2.0**31:
        return -(2**31)
    return int(v)


def _softmax32(logits: np.ndarray) -> np.ndarray:
    """llama.cpp's softmax of sorted float32 logits: ``expf`` of each less the first,
    summed in order, each divided by the sum (all in float32)."""
    e = np.exp((logits - logits[0]).astype(np.float64)).astype(np.float32)
    total = np.cumsum(e, dtype=np.float32)[-1]
    return (e / total).astype(np.float32)


def _discrete(p: np.ndarray, rng: LlamaDraws) -> int:
    """libstdc++'s ``std::discrete_distribution<int>(p)(rng)``: the weights as doubles,
    normalised by their running sum, cumulated, the last set to 1, and the first whose
    cumulated weight reaches one uniform draw (none drawn for a single weight)."""
    if p.size < 2:
        return 0
    w = p.astype(np.float64)
    w = w / np.cumsum(w)[-1]
    cumulated = np.cumsum(w)
    cumulated[-1] = 1.0
    return int(np.searchsorted(cumulated, rng.random(), side="left"))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


@dataclass
class _Draw:
    """The sampler of one generation: its chain, the grammar's matcher, mirostat."""

    settings: SampleSettings
    chain: TokenSampler
    constraint: Constraint | None
    mirostat: _Mirostat | None = None
    extra: list[Callable[[np.ndarray, np.ndarray], np.ndarray]] = field(default_factory=list)


class Session:
    """llama-cpp-python's evaluation state over sequence 0 of a :class:`ModelRunner`.

    ``input_ids`` (int32, ``n_ctx``) and ``scores`` (float32: ``(n_ctx, n_vocab)`` with
    ``logits_all``, else ``(n_batch, n_vocab)`` and left unwritten, as llama-cpp-python
    0.3 leaves it) are the arrays programs read; ``n_tokens`` how many are valid.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        n_batch: int,
        logits_all: bool,
        last_n_tokens_size: int,
        seed: int,
        constraint_for: Callable[[Any], Constraint],
        threads: Callable[[int], None] | None = None,
        draft_model: Callable[[npt.NDArray[np.intc]], Any] | None = None,
    ) -> None:
        self.runner = runner
        self.draft_model = draft_model
        self.n_ctx = runner.n_ctx
        self.n_vocab = runner.config.n_vocab
        self.n_batch = n_batch
        self.logits_all = logits_all
        self.last_n_tokens_size = last_n_tokens_size
        self.seed = seed
        self._constraint_for = constraint_for
        self._threads = threads
        self.input_ids: npt.NDArray[np.intc] = np.zeros(self.n_ctx, dtype=np.intc)
        rows = self.n_ctx if logits_all else n_batch
        self.scores: npt.NDArray[np.single] = np.zeros((rows, self.n_vocab), dtype=np.single)
        self.n_tokens = 0
        #: the logits of the last token evaluated (None after a reset or a restored state)
        self.last_logits: np.ndarray | None = None
        self._draw: _Draw | None = None

    # -- evaluation ---------------------------------------------------------------------------

    def reset(self) -> None:
        self.n_tokens = 0
        self.last_logits = None
        self.runner.reset()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (the cache's rows past them are dropped)."""
        self.n_tokens = n
        self.last_logits = None
        if n == 0:
            self.runner.reset()
        elif self.runner.n_past > n:
            self.runner.n_past = n

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after the first ``n_tokens``, in chunks of ``n_batch``."""
        ids = [int(t) for t in tokens]
        if not ids:
            return
        if self.n_tokens + len(ids) > self.n_ctx:
            raise ValueError(
                f"Requested tokens ({self.n_tokens + len(ids)}) exceed context window of "
                f"{self.n_ctx}"
            )
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
        self.truncate(self.n_tokens)  # what the cache holds past n_tokens is stale
        for start in range(0, len(ids), self.n_batch):
            chunk = ids[start : start + self.n_batch]
            if self._threads is not None:
                self._threads(len(chunk))
            n_past = self.n_tokens
            logits = self.runner.eval(chunk, all_logits=self.logits_all)
            self.input_ids[n_past : n_past + len(chunk)] = chunk
            if self.logits_all:
                self.scores[n_past : n_past + len(chunk)] = logits
                self.last_logits = self.scores[n_past + len(chunk) - 1]
            else:
                self.last_logits = np.asarray(logits, dtype=np.single)
            self.n_tokens += len(chunk)

    def logits_at(self, idx: int | None) -> np.ndarray:
        """The logits that predict token ``idx + 1`` (None: the last evaluated)."""
        if idx is not None and idx != self.n_tokens - 1:
            if not self.logits_all:
                raise ValueError(
                    "sampling at an earlier position needs its logits: create the model "
                    "with logits_all=True"
                )
            return self.scores[idx]
        if self.last_logits is None:
            raise ValueError("no logits to sample from: evaluate tokens first (eval)")
        return self.last_logits

    # -- sampling -----------------------------------------------------------------------------

    def start(self, settings: SampleSettings, seed: int | None = None) -> None:
        """Begin a generation: a fresh sampler (its penalties see only what it samples)."""
        self._draw = self._new_draw(settings, self.seed if seed is None else seed)

    def _new_draw(self, settings: SampleSettings, seed: int) -> _Draw:
        chain = settings.chain(
            None if seed == DEFAULT_SEED else seed, self.last_n_tokens_size, self.n_vocab
        )
        constraint = None if settings.grammar is None else self._constraint_for(settings.grammar)
        # llama-cpp-python's chain: temperature 0 is greedy and below 0 a plain draw,
        # whatever the mirostat mode
        miro = settings.mirostat_mode and settings.temp > 0.0
        mirostat = _Mirostat(settings, chain.rng, self.n_vocab) if miro else None
        return _Draw(settings, chain, constraint, mirostat)

    def sample(self, settings: SampleSettings, idx: int | None = None) -> int:
        """Draw the next token from the logits at ``idx`` and accept it (the grammar
        and the penalties move on); without a generation begun, a one-off sampler."""
        draw = self._draw or self._new_draw(settings, self.seed)
        logits = np.array(self.logits_at(idx), dtype=np.single)
        processors = draw.settings.logits_processor
        if processors:
            logits = np.asarray(processors(self.input_ids[: self.n_tokens], logits))
        allowed = draw.constraint.allowed() if draw.constraint is not None else None
        if draw.mirostat is not None:
            token = draw.mirostat.draw(draw.chain.adjusted_logits(logits, allowed))
        else:
            token = draw.chain.sample(logits, allowed).token
        draw.chain.accept(token)
        if draw.constraint is not None:
            draw.constraint.accept(token)
        return token

    def generate(
        self,
        tokens: Sequence[int],
        settings: SampleSettings,
        *,
        reset: bool = True,
        stopping_criteria: StoppingCriteriaList | None = None,
        seed: int | None = None,
    ) -> Generator[int, Sequence[int] | None, None]:
        """llama-cpp-python's ``generate``: reuse the cached prefix of ``tokens``,
        evaluate the rest, then sample, yield and evaluate token by token for ever (the
        caller stops); a value sent back is evaluated after the yielded token."""
        self.start(settings, seed)
        pending = list(tokens)
        if reset and self.n_tokens > 0:
            prefix = common_prefix(self.input_ids[: self.n_tokens], pending)
            if prefix == len(pending) == self.n_tokens and self.last_logits is not None:
                pending = []  # the whole prompt is cached with its logits
            else:
                # a prompt the cache holds entirely is evaluated again from its last
                # token, so that its logits are fresh
                keep = prefix - 1 if prefix == len(pending) else prefix
                self.truncate(max(keep, 0))
                pending = pending[max(keep, 0) :]
        elif reset:
            self.reset()
        if not pending and self.last_logits is None:
            raise ValueError("generate needs at least one token to evaluate")
        sample_at = self.n_tokens + len(pending) - 1
        while True:
            self.eval(pending)
            # each evaluated row is sampled in turn: past the prompt, a row beyond the
            # sampled token's is a draft's, kept while sampling agrees with it
            while sample_at < self.n_tokens:
                token = self.sample(settings, sample_at)
                sample_at += 1
                if stopping_criteria is not None and stopping_criteria(
                    self.input_ids[:sample_at], self.logits_at(sample_at - 1)
                ):
                    return
                sent = yield token
                pending = [token, *(sent or ())]
                if sample_at < self.n_tokens and token != self.input_ids[sample_at]:
                    self.truncate(sample_at)  # the draft parts here: the rest is dropped
                    break
            if self.draft_model is not None:
                self._propose(pending)

    def _propose(self, pending: list[int]) -> None:
        """The draft model's tokens after ``pending`` (the tokens about to be
        evaluated), appended to it, as many as the context has room for."""
        assert self.draft_model is not None
        so_far = np.concatenate(
            [self.input_ids[: self.n_tokens], np.asarray(pending, dtype=np.intc)]
        )
        room = self.n_ctx - self.n_tokens - len(pending)
        drafts = np.asarray(self.draft_model(so_far)).astype(int)[: max(room, 0)]
        pending.extend(int(t) for t in drafts)

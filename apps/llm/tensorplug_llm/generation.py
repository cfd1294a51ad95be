"""What the API layer asks of whatever runs generations: submit a job, iterate its tokens.

The API (:mod:`tensorplug_llm.api`) and the server speak to a *generator*: an object
with ``submit(job) -> handle``, the handle an iterator of token events with ``cancel()``.
That is the shape of the engine's ``Engine.submit`` (continuous batching over ``-np``
sequences); :class:`SerialGenerator` is the same shape over today's single-sequence
:class:`~tensorplug_llm.runner.Llama` — one request at a time, the others waiting their
turn — which is what a server with ``-np 1`` is, and what runs when no engine is given.

Handles are iterated on whatever thread the caller likes (the server's worker threads)
while the generator's own thread computes; ``cancel()`` may come from any thread (a
client that went away) and ends the iteration at the next token.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tensorplug.errors import RunError

if TYPE_CHECKING:
    from .runner import Llama

__all__ = [
    "Constraint",
    "GenerationHandle",
    "GenerationJob",
    "Generator",
    "GeneratorStats",
    "SerialGenerator",
    "TokenEvent",
    "log_softmax",
]


class Constraint(Protocol):
    """Structured output: which tokens may come next (the sampling helper's protocol)."""

    def allowed(self) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...

    def done(self) -> bool: ...


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; ``finish_reason`` is set on the last one ("stop": end of
    generation or constraint complete, "length": max_tokens or a full context)."""

    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None


@dataclass
class GenerationJob:
    """One request as the API hands it on: prompt ids, a token budget, the sampling
    options by llama.cpp's names (``temperature``, ``top_k``, ``top_p``, ``min_p``,
    ``seed``, penalties, ``logit_bias``), how many top logprobs, a constraint."""

    prompt: list[int]
    max_tokens: int | None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    n_probs: int = 0
    constraint: Constraint | None = None
    #: keep generating past end-of-generation tokens (llama-server's ``ignore_eos``)
    ignore_eos: bool = False


class GenerationHandle(Protocol):
    def __iter__(self) -> Iterator[TokenEvent]: ...

    def cancel(self) -> None: ...


@dataclass
class GeneratorStats:
    """Counters for ``/metrics`` and for tests that look for leaks."""

    n_parallel: int
    running: int
    waiting: int
    kv_cells_used: int
    kv_cells_total: int
    prompt_tokens_total: int
    generated_tokens_total: int
    requests_total: int


class Generator(Protocol):
    def submit(self, job: GenerationJob) -> GenerationHandle: ...

    def stats(self) -> GeneratorStats: ...

    def close(self) -> None: ...


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p of every token (float64: logprobs of unlikely tokens keep their digits)."""
    z = logits.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def top_logprobs(logp: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens, most likely first."""
    if n <= 0:
        return []
    n = min(n, logp.size)
    idx = np.argpartition(-logp, n - 1)[:n]
    idx = idx[np.argsort(-logp[idx], kind="stable")]
    return [(int(i), float(logp[i])) for i in idx]


_END = object()


class _SerialHandle:
    def __init__(self, job: GenerationJob, owner: SerialGenerator) -> None:
        self.job = job
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cancelled = threading.Event()
        self.started = False  # under the owner's lock
        self._owner = owner

    def __iter__(self) -> Iterator[TokenEvent]:
        while True:
            item = self.events.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        with self._owner.lock:
            if self.cancelled.is_set():
                return
            self.cancelled.set()
            if not self.started:  # it leaves the queue now, not when its turn comes
                self._owner.waiting -= 1
        self.events.put(_END)  # an iterator blocked on the queue ends now


class SerialGenerator:
    """Runs one job at a time on today's single-sequence ``Llama`` (``-np 1``).

    Each job starts from an empty cache (``reset``); jobs wait in a FIFO queue. The
    sampling options ``temperature``, ``top_k``, ``top_p`` and ``seed`` are honoured by
    the runner's :class:`~tensorplug_llm.sampling.Sampler`; any other option set away
    from its neutral value is refused with its name, rather than ignored.
    """

    NEUTRAL: Mapping[str, Any] = {
        "min_p": (0.0, 0.05),
        "typical_p": (1.0,),
        "repeat_penalty": (1.0,),
        "frequency_penalty": (0.0,),
        "presence_penalty": (0.0,),
        "logit_bias": (None, {}),
    }

    def __init__(self, llama: Llama) -> None:
        self.llama = llama
        self._jobs: queue.SimpleQueue[_SerialHandle | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.waiting = 0
        self._running = 0
        self._prompt_total = 0
        self._generated_total = 0
        self._requests_total = 0
        self._thread = threading.Thread(target=self._work, name="tensorplug-serial", daemon=True)
        self._thread.start()

    def check(self, job: GenerationJob) -> None:
        """Refuse what this generator cannot do, naming the option."""
        for name, value in job.sampling.items():
            if name in self.NEUTRAL and value not in self.NEUTRAL[name]:
                raise RunError(
                    f"{name}={value!r} needs the batching engine's sampler; this server runs "
                    "requests one at a time with temperature, top_k, top_p and seed only"
                )
        n_vocab = self.llama.config.n_vocab
        if not job.prompt:
            raise RunError("the prompt has no tokens")
        if any(not 0 <= t < n_vocab for t in job.prompt):
            raise RunError(f"a prompt token is outside the vocabulary (0..{n_vocab - 1})")
        if len(job.prompt) >= self.llama.n_ctx:
            raise RunError(
                f"the prompt has {len(job.prompt)} tokens; the context holds "
                f"{self.llama.n_ctx} (start the server with a larger -c)"
            )

    def submit(self, job: GenerationJob) -> _SerialHandle:
        self.check(job)
        handle = _SerialHandle(job, self)
        with self.lock:
            self.waiting += 1
            self._requests_total += 1
        self._jobs.put(handle)
        return handle

    def stats(self) -> GeneratorStats:
        with self.lock:
            return GeneratorStats(
                n_parallel=1,
                running=self._running,
                waiting=self.waiting,
                kv_cells_used=self.llama.n_past,
                kv_cells_total=self.llama.n_ctx,
                prompt_tokens_total=self._prompt_total,
                generated_tokens_total=self._generated_total,
                requests_total=self._requests_total,
            )

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _work(self) -> None:
        while (handle := self._jobs.get()) is not None:
            with self.lock:
                if handle.cancelled.is_set():
                    continue  # counted out of the queue when it was cancelled
                handle.started = True
                self.waiting -= 1
                self._running += 1
            try:
                self._run(handle)
            except Exception as e:  # the caller's thread raises it
                handle.events.put(e)
            finally:
                self.llama.reset()
                with self.lock:
                    self._running -= 1
                handle.events.put(_END)

    def _run(self, handle: _SerialHandle) -> None:
        from .sampling import Sampler, SamplerParams

        job, llama = handle.job, self.llama
        s = job.sampling
        sampler = Sampler(
            SamplerParams(
                float(s.get("temperature", 0.8)),
                int(s.get("top_k", 40)),
                float(s.get("top_p", 0.95)),
                int(s["seed"]) if s.get("seed") is not None else 0,
            )
        )
        eog = llama.vocab.eog if llama.vocab is not None and not job.ignore_eos else frozenset()
        llama.reset()
        logits = llama.eval(job.prompt, prompt=True)
        with self.lock:
            self._prompt_total += len(job.prompt)
        budget = llama.n_ctx - len(job.prompt)
        if job.max_tokens is not None:
            budget = min(budget, job.max_tokens)
        for n in range(1, budget + 1):
            if handle.cancelled.is_set():
                return
            masked = logits
            if job.constraint is not None:
                masked = np.where(job.constraint.allowed(), logits, -np.inf).astype(np.float32)
            token = sampler(masked)
            logp = log_softmax(logits)
            if job.constraint is not None:
                job.constraint.accept(token)
            with self.lock:
                self._generated_total += 1
            finish = None
            if token in eog or (job.constraint is not None and job.constraint.done()):
                finish = "stop"
            elif n == budget:
                finish = "length"
            handle.events.put(
                TokenEvent(
                    token,
                    float(logp[token]),
                    top_logprobs(logp, job.n_probs) if job.n_probs else None,
                    finish,
                )
            )
            if finish is not None:
                return
            logits = llama.eval([token])

"""What the API layer asks of whatever runs generations: submit a job, iterate its tokens.

The API (:mod:`tensorplug_llm.api`) and the server speak to a *generator*: an object
with ``submit(job) -> handle``, the handle an iterator of token events with ``cancel()``,
and ``stats()`` for ``/metrics``. :class:`EngineGenerator` is the batching engine
(continuous batching over ``-np`` sequences) in that shape; the API layer stays free of
the engine's request type, so a replica elsewhere (Ray) or a test's own generator fits
the same slot.

Handles are iterated on whatever thread the caller likes (the server's worker threads)
while the engine's thread computes; ``cancel()`` may come from any thread (a client
that went away) and ends the iteration at the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .engine import Engine
    from .request import Request, RequestHandle
    from .sampling import TokenSampler

__all__ = [
    "Constraint",
    "GenerationHandle",
    "GenerationJob",
    "Generator",
    "GeneratorStats",
    "EngineGenerator",
    "TokenEvent",
]

#: seconds between two looks at an embedding's ``stopped`` while it waits or runs: how
#: late a client that left, or a deadline, frees its slots at most
STOP_POLL_S = 0.1


class Constraint(Protocol):
    """Structured output: which tokens may come next (the sampling helper's protocol)."""

    def allowed(self) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...

    def done(self) -> bool: ...


class TokenEvent(Protocol):
    """One generated token; ``finish_reason`` is set on the last one ("stop": end of
    generation or constraint complete, "length": max_tokens or a full context)."""

    @property
    def token(self) -> int: ...

    @property
    def logprob(self) -> float | None: ...

    @property
    def top_logprobs(self) -> list[tuple[int, float]] | None: ...

    @property
    def finish_reason(self) -> str | None: ...


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
    #: whether each event carries its token's logprob where ``n_probs`` is 0 (OpenAI's
    #: ``logprobs`` asked for with no top ones): a softmax over the vocabulary a token,
    #: which a request that reports no logprobs is spared
    logprobs: bool = True
    #: keep generating past end-of-generation tokens (llama-server's ``ignore_eos``)
    ignore_eos: bool = False
    #: report the prompt's evaluation among the handle's events (llama-server's
    #: ``return_progress``), where the generator can: :meth:`RequestHandle.events
    #: <tensorplug_llm.request.RequestHandle.events>`
    report_progress: bool = False
    #: the slot it must run in (llama-server's ``id_slot``; None: whichever suits)
    slot: int | None = None
    #: with the engine's context shift: the first tokens a shift keeps (-1: the prompt)
    n_keep: int = 0
    #: the shortest cached run moved to the prompt's place (llama-server's
    #: ``n_cache_reuse``; None: the engine's)
    cache_reuse: int | None = None


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
    #: cells idle slots keep for prefix reuse (the rest of the used ones are running)
    kv_cells_cached: int
    prompt_tokens_total: int
    prompt_tokens_reused: int
    generated_tokens_total: int
    requests_total: int
    #: running requests that gave their cells up when the cache was full (resumed later)
    preemptions: int = 0
    #: the tokens one request's sequence may hold (a slot's context); None: every cell
    n_ctx_seq: int | None = None
    #: steps the model computed (llama-server's decodes), and the slots they held on average
    decode_steps: int = 0
    busy_slots_per_step: float = 0.0


class Generator(Protocol):
    def submit(self, job: GenerationJob) -> GenerationHandle: ...

    def embed(
        self,
        texts: Sequence[Sequence[int]],
        pooling: str | None = None,
        stopped: Callable[[], bool] | None = None,
    ) -> list[np.ndarray]:
        """Each token list's pooled embedding (float32, not normalized); ``pooling``
        overrides the file's (``none``: every token's row). ``stopped``: asked while
        the texts wait or run; once true, they are cancelled and
        :class:`~tensorplug_llm.request.RequestStopped` raised."""
        ...

    def submit_choices(self, jobs: Sequence[GenerationJob]) -> Sequence[GenerationHandle]:
        """Jobs with one prompt (the choices of OpenAI's ``n``), run side by side."""
        ...

    def stats(self) -> GeneratorStats: ...

    def close(self) -> None: ...


class EngineGenerator:
    """The batching :class:`~tensorplug_llm.engine.Engine` behind the generator shape:
    a job becomes an engine ``Request`` with a :class:`~tensorplug_llm.sampling.TokenSampler`
    of its options; the engine's loop thread runs the steps."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        engine.start()

    def sampler(self, job: GenerationJob) -> TokenSampler:
        """The job's sampler; a bad option raises a ``SamplingParamError`` naming it."""
        from .sampling import SamplingParams, TokenSampler

        params = SamplingParams(**dict(job.sampling), n_probs=job.n_probs,
                                token_logprob=job.logprobs)  # fmt: skip
        return TokenSampler(params, self.engine.llama.config.n_vocab)

    def check(self, job: GenerationJob) -> None:
        self.sampler(job)

    def submit(self, job: GenerationJob) -> RequestHandle:
        return self.engine.submit(self._request(job))

    def embed(
        self,
        texts: Sequence[Sequence[int]],
        pooling: str | None = None,
        stopped: Callable[[], bool] | None = None,
    ) -> list[np.ndarray]:
        """Embeddings computed by the engine beside the generations: every text is
        submitted at once (they run side by side, up to the slots), then collected,
        ``stopped`` asked every :data:`STOP_POLL_S` meanwhile."""
        from .request import Request, RequestStopped

        handles = []
        out = []
        try:
            for t in texts:  # a text refused at submit cancels those queued before it
                handles.append(self.engine.submit(Request(list(t), embed=True, pooling=pooling)))
            for handle in handles:
                while stopped is not None and not handle.wait(STOP_POLL_S):
                    if stopped():
                        raise RequestStopped("the embeddings were stopped before they were done")
                handle.result()
                assert handle.embedding is not None
                out.append(handle.embedding)
        finally:
            for handle in handles:
                handle.cancel()  # those not run yet, if one failed
        return out

    def submit_choices(self, jobs: Sequence[GenerationJob]) -> list[RequestHandle]:
        """Choices sharing one evaluation of their prompt (``Engine.submit_group``)."""
        return self.engine.submit_group([self._request(job) for job in jobs])

    def _request(self, job: GenerationJob) -> Request:
        from .request import Request

        return Request(
            prompt=job.prompt,
            max_tokens=job.max_tokens,
            sampler=self.sampler(job),
            stop_tokens=frozenset() if job.ignore_eos else None,
            constraint=job.constraint,
            n_probs=job.n_probs,
            report_progress=job.report_progress,
            slot=job.slot,
            n_keep=job.n_keep,
            cache_reuse=job.cache_reuse,
        )

    def stats(self) -> GeneratorStats:
        e, kv = self.engine, self.engine.llama.kv
        return GeneratorStats(
            n_parallel=e.n_parallel,
            running=e.n_running,
            waiting=e.n_waiting,
            kv_cells_used=kv.n_used,
            kv_cells_total=kv.n_ctx,
            kv_cells_cached=e.cached_tokens(),
            prompt_tokens_total=e.stats.prompt_tokens_evaluated,
            prompt_tokens_reused=e.stats.prompt_tokens_reused,
            generated_tokens_total=e.stats.generated_tokens,
            requests_total=e.stats.requests_submitted,
            preemptions=e.stats.preemptions,
            n_ctx_seq=e.n_ctx_seq,
            decode_steps=e.stats.steps,
            busy_slots_per_step=e.stats.slot_steps / e.stats.steps if e.stats.steps else 0.0,
        )

    def close(self) -> None:
        self.engine.close()

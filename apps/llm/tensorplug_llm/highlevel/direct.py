"""A generator (:mod:`tensorplug_llm.generation`'s shape) that runs one request at a time
on the Python API's own :class:`~.session.Session`, in the caller's thread.

The chat path of :class:`~tensorplug_llm.highlevel.Llama` is the server's
(:class:`~tensorplug_llm.api.LLM`: the chat template, tools, ``response_format``,
logprobs, the chunks), so the Python API and the HTTP API answer a conversation alike.
What differs is where the tokens come from: not the batching engine on a thread of its
own, but the program's single sequence, whose cached prefix the next call reuses and
whose sampler takes llama-cpp-python's extra options (typical-p, mirostat, logits
processors, a grammar, stopping criteria), handed over per call with :meth:`options`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ..generation import GenerationJob, GeneratorStats
from .completion import logits_to_logprobs
from .session import SampleSettings

if TYPE_CHECKING:
    from ..tokenizer import Vocab
    from .processors import StoppingCriteriaList
    from .session import Session

__all__ = ["DirectGenerator", "Event"]


@dataclass(frozen=True)
class Event:
    """One generated token (the generator protocol's ``TokenEvent``)."""

    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class CallOptions:
    """What a llama-cpp-python call adds to the OpenAI-shaped job."""

    settings: SampleSettings = field(default_factory=SampleSettings)
    stopping_criteria: StoppingCriteriaList | None = None


class _Handle:
    """Iterating runs the generation; ``cancel`` ends it at the next token."""

    def __init__(self, tokens: Iterator[Event]) -> None:
        self._tokens = tokens
        self._cancelled = False

    def __iter__(self) -> Iterator[Event]:
        for event in self._tokens:
            if self._cancelled:
                return
            yield event

    def cancel(self) -> None:
        self._cancelled = True


class DirectGenerator:
    """Jobs run one at a time on ``session`` when their handle is iterated."""

    def __init__(self, session: Session, vocab: Vocab) -> None:
        self.session = session
        self.vocab = vocab
        self._options = CallOptions()
        self._requests = 0
        self._generated = 0
        self._prompt = 0
        #: whether the last job's final event was an end token or a criterion's stop,
        #: which llama-cpp-python does not count as a completion token
        self.ended_uncounted = False

    @contextlib.contextmanager
    def options(self, options: CallOptions) -> Iterator[None]:
        """Use ``options`` for the jobs submitted inside the block."""
        before, self._options = self._options, options
        try:
            yield
        finally:
            self._options = before

    def check(self, job: GenerationJob) -> None:
        self._settings(job)  # a bad option is refused before anything runs

    def submit(self, job: GenerationJob) -> _Handle:
        self._requests += 1
        self._prompt += len(job.prompt)
        return _Handle(self._run(job, self._settings(job), self._options.stopping_criteria))

    def submit_choices(self, jobs: Sequence[GenerationJob]) -> list[_Handle]:
        if len(jobs) != 1:
            raise ValueError("n > 1 needs several sequences: the Python API runs one (n=1)")
        return [self.submit(jobs[0])]

    def embed(
        self,
        texts: Sequence[Sequence[int]],
        pooling: str | None = None,
        stopped: Callable[[], bool] | None = None,
    ) -> list[np.ndarray]:
        """Each text's embedding, in this thread (a program's own sequence; ``stopped``
        is for a server's requests, which never come here)."""
        runner = self.session.runner
        out = [np.asarray(runner.embed(list(t), pooling), dtype=np.float32) for t in texts]
        self.session.n_tokens = 0  # embedding cleared the cache
        self.session.last_logits = None
        return out

    def stats(self) -> GeneratorStats:
        kv = self.session.runner.kv
        return GeneratorStats(
            n_parallel=1,
            running=0,
            waiting=0,
            kv_cells_used=kv.n_used,
            kv_cells_total=kv.n_ctx,
            kv_cells_cached=kv.n_used,
            prompt_tokens_total=self._prompt,
            prompt_tokens_reused=0,
            generated_tokens_total=self._generated,
            requests_total=self._requests,
        )

    def close(self) -> None:
        """Nothing runs in the background."""

    def _settings(self, job: GenerationJob) -> SampleSettings:
        s = dict(job.sampling)
        return replace(
            self._options.settings,
            temp=float(s.get("temperature", self._options.settings.temp)),
            top_k=int(s.get("top_k", self._options.settings.top_k)),
            top_p=float(s.get("top_p", self._options.settings.top_p)),
            min_p=float(s.get("min_p", self._options.settings.min_p)),
            repeat_penalty=float(s.get("repeat_penalty", 1.0)),
            frequency_penalty=float(s.get("frequency_penalty", 0.0)),
            presence_penalty=float(s.get("presence_penalty", 0.0)),
            logit_bias=s.get("logit_bias") or None,
        )

    def _run(
        self, job: GenerationJob, settings: SampleSettings, stopping: StoppingCriteriaList | None
    ) -> Iterator[Event]:
        session = self.session
        n_ctx = session.n_ctx
        if len(job.prompt) >= n_ctx:
            raise ValueError(
                f"Requested tokens ({len(job.prompt)}) exceed context window of {n_ctx}"
            )
        budget = n_ctx - len(job.prompt)
        if job.max_tokens is not None:
            budget = min(budget, job.max_tokens)
        if job.constraint is not None:
            settings = replace(settings, grammar=job.constraint)
        seed = job.sampling.get("seed")
        tokens = session.generate(job.prompt, settings, stopping_criteria=stopping, seed=seed)
        n = 0
        self.ended_uncounted = False
        try:
            for token in tokens:
                n += 1
                self._generated += 1
                logprob, top = self._logprobs(token, job.n_probs)
                if token in self.vocab.eog and not job.ignore_eos:
                    self.ended_uncounted = True
                    yield Event(token, logprob, top, "stop")
                    return
                finish = "length" if n >= budget else None
                yield Event(token, logprob, top, finish)
                if finish is not None:
                    return
            # a stopping criterion ended the generation
            self.ended_uncounted = True
            yield Event(self.vocab.eos if self.vocab.eos is not None else 0, None, None, "stop")
        finally:
            tokens.close()

    def _logprobs(
        self, token: int, n_probs: int
    ) -> tuple[float | None, list[tuple[int, float]] | None]:
        if not n_probs:
            return None, None
        logits = self.session.logits_at(self.session.n_tokens - 1)
        lp = logits_to_logprobs(logits)
        best = np.argsort(-lp, kind="stable")[:n_probs]
        return float(lp[token]), [(int(i), float(lp[i])) for i in best]

"""A request to the engine, its events, and the handle its caller follows it by.

:class:`Request` is what a caller asks for (prompt, limits, the sampler and constraint
that pick its tokens); :class:`RequestHandle` is what it gets back: an iterator of
:class:`TokenEvent` s, fed by the engine's thread, that can be cancelled from any
thread (and, where the request asks, :class:`PromptProgress` reports while its prompt
is evaluated: :meth:`RequestHandle.events`). The sampler and the constraint are seen
through protocols
(:class:`TokenSampler`, :class:`Constraint`): ``sampling.TokenSampler`` and the
structured-output constraints implement them; :class:`GreedySampler` is the default.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tensorplug.errors import RunError

__all__ = [
    "Constraint",
    "GreedySampler",
    "GreedyToken",
    "PromptProgress",
    "Request",
    "RequestError",
    "RequestHandle",
    "RequestStopped",
    "SampledToken",
    "Stepper",
    "TokenEvent",
    "TokenSampler",
]


class RequestError(RunError):
    """A request that cannot run (bad tokens, too long) or failed while running; the
    engine and the other requests go on."""


class RequestStopped(RequestError):
    """A request its caller stopped before it finished (a client that left, a deadline):
    not the request's fault, and nothing to report to anyone."""


# -- what a request carries -------------------------------------------------------------------


class SampledToken(Protocol):
    """What a sampler returns: the token, its log-probability under the full softmax
    (None when not computed) and the ``n_probs`` most probable (token, logprob)."""

    @property
    def token(self) -> int: ...
    @property
    def logprob(self) -> float | None: ...
    @property
    def top_logprobs(self) -> list[tuple[int, float]] | None: ...


class TokenSampler(Protocol):
    """Picks a request's next token (``sampling.TokenSampler`` is one)."""

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> SampledToken: ...
    def accept(self, token: int) -> None: ...


class Constraint(Protocol):
    """Structured output (``constraint.Constraint``): the tokens allowed next."""

    def allowed(self) -> np.ndarray: ...
    def accept(self, token: int) -> None: ...
    def done(self) -> bool: ...


@dataclass(frozen=True)
class GreedyToken:
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


class GreedySampler:
    """The first most likely (allowed) token; with ``n_probs`` > 0 also its
    log-probability and the ``n_probs`` most probable tokens' (full softmax)."""

    def __init__(self, n_probs: int = 0) -> None:
        self.n_probs = n_probs

    def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> GreedyToken:
        scores = logits if allowed is None else np.where(allowed, logits, -np.inf)
        token = int(np.argmax(scores))
        if self.n_probs <= 0:
            return GreedyToken(token)
        z = logits.astype(np.float64)
        logp = z - (z.max() + math.log(np.exp(z - z.max()).sum()))
        top = np.argsort(-logp, kind="stable")[: self.n_probs]
        return GreedyToken(token, float(logp[token]), [(int(t), float(logp[t])) for t in top])

    def accept(self, token: int) -> None:
        """Greedy keeps no history."""


@dataclass
class Request:
    """One completion: ``prompt`` token ids, up to ``max_tokens`` new ones (None: until
    a stop token or the context is full). ``stop_tokens`` None: the model's
    end-of-generation tokens. ``sampler`` None: greedy (with ``n_probs`` > 0, each event
    carries log-probabilities). ``on_event`` is called on the engine's thread for each
    event (keep it short); stop *strings* are the API layer's, which cancels the
    request when one matches.

    ``embed``: compute the prompt's embedding instead of generating (the handle's
    ``embedding``, pooled by ``pooling``: ``mean``, ``cls``, ``last``, None for the
    model file's own, as :meth:`ModelRunner.embed <tensorplug_llm.runner.ModelRunner.embed>`)."""

    prompt: Sequence[int]
    max_tokens: int | None = None
    sampler: TokenSampler | None = None
    stop_tokens: frozenset[int] | None = None
    on_event: Callable[[TokenEvent], None] | None = None
    constraint: Constraint | None = None
    n_probs: int = 0
    embed: bool = False
    pooling: str | None = None
    #: report the prompt's evaluation (:class:`PromptProgress`) among the events
    report_progress: bool = False
    #: the slot it must run in (llama-server's ``id_slot``; None: whichever suits)
    slot: int | None = None
    #: with the engine's context shift: the first tokens a shift keeps (-1: the prompt)
    n_keep: int = 0
    #: the shortest run of cached tokens moved to where the prompt has them (llama-server's
    #: ``n_cache_reuse``; 0: none; None: the engine's ``cache_reuse``)
    cache_reuse: int | None = None


@dataclass(frozen=True)
class PromptProgress:
    """How far a request's prompt is evaluated (llama-server's ``prompt_progress``):
    ``total`` prompt tokens, ``cache`` of them found in cached cells, ``processed`` in
    the cache now (the cached ones included), ``time_ms`` since the request was
    admitted. One when it is admitted (``processed == cache``), one after each chunk
    of its prompt the engine evaluates; the last has ``processed == total``."""

    total: int
    cache: int
    processed: int
    time_ms: int


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. ``text``: the text it completes (UTF-8 split across byte
    tokens comes out whole; "" for stop tokens; None without a vocabulary).
    ``finish_reason``: None while the request goes on, else "stop" (a stop token or a
    finished constraint) or "length" (``max_tokens`` or the context)."""

    token: int
    text: str | None
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None
    finish_reason: str | None


class Stepper(Protocol):
    """What a handle needs of its engine: to run a step itself when no loop thread
    does, and to wake the loop on a cancel."""

    @property
    def loop_running(self) -> bool: ...
    def step(self) -> bool: ...
    def wake(self) -> None: ...


# -- handles -----------------------------------------------------------------------------------

_DONE = object()  # the end of a handle's events


class RequestHandle:
    """A submitted request: iterate it for its :class:`TokenEvent` s (the iteration
    raises :class:`RequestError` if the request failed), ``cancel()`` it from any
    thread. Counters: ``prompt_tokens_evaluated`` (prompt tokens the model computed),
    ``prompt_tokens_reused`` (taken from cached cells)."""

    def __init__(self, engine: Stepper, request: Request, request_id: int) -> None:
        self.engine = engine
        self.request = request
        self.id = request_id
        self.prompt_tokens_evaluated = 0
        self.prompt_tokens_reused = 0
        self.tokens: list[int] = []
        self.finish_reason: str | None = None  # also "cancelled" or "error"
        self.error: RequestError | None = None
        #: an ``embed`` request's pooled vector (float32, not normalized), once done
        self.embedding: np.ndarray | None = None
        self._events: queue.SimpleQueue[TokenEvent | PromptProgress | object] = queue.SimpleQueue()
        self._admitted_at: float | None = None
        self._cancelled = threading.Event()
        self._finished = threading.Event()

    def cancel(self) -> None:
        """Stop the request; its slot and cells are free again at the next step (the
        cells stay cached for prefix reuse)."""
        self._cancelled.set()
        self.engine.wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the request ends, at most ``timeout`` seconds (the engine's loop
        thread must be running it); whether it has ended."""
        return self._finished.wait(timeout)

    def __iter__(self) -> Iterator[TokenEvent]:
        return self

    def __next__(self) -> TokenEvent:
        while True:
            item = self._next_item()
            if isinstance(item, TokenEvent):
                return item

    def events(self) -> Iterator[TokenEvent | PromptProgress]:
        """The tokens, and the prompt's :class:`PromptProgress` reports before them
        where the request asked for them (``report_progress``)."""
        while True:
            try:
                yield self._next_item()
            except StopIteration:
                return

    def _next_item(self) -> TokenEvent | PromptProgress:
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                if not self.engine.loop_running:
                    if not self.engine.step() and self._events.empty():
                        raise RunError(f"request {self.id} is not queued in its engine") from None
                    continue
                item = self._events.get()
            if item is _DONE:
                self._events.put(_DONE)  # later calls end too
                if self.error is not None:
                    raise self.error
                raise StopIteration
            assert isinstance(item, TokenEvent | PromptProgress)
            return item

    def result(self) -> list[int]:
        """Every generated token (waits for the end; raises if the request failed)."""
        for _ in self:
            pass
        return self.tokens

    # -- called by the engine -------------------------------------------------------------------

    def deliver(self, event: TokenEvent) -> None:
        """Hand ``event`` to the reader (and ``on_event``, which may raise)."""
        self.tokens.append(event.token)
        self._events.put(event)
        if self.request.on_event is not None:
            self.request.on_event(event)

    def progress(self, cache: int, processed: int) -> None:
        """The prompt holds ``processed`` tokens in the cache, ``cache`` of them found
        there: reported where the request asked (:class:`PromptProgress`)."""
        if not self.request.report_progress:
            return
        now = time.monotonic()
        if self._admitted_at is None:
            self._admitted_at = now
        elapsed = int((now - self._admitted_at) * 1000)
        self._events.put(PromptProgress(len(self.request.prompt), cache, processed, elapsed))

    def end(self, reason: str, error: RequestError | None = None) -> None:
        """No more events: the reader's iteration stops (raising ``error`` if given)."""
        if self._finished.is_set():
            return
        self.finish_reason, self.error = reason, error
        self._finished.set()
        self._events.put(_DONE)

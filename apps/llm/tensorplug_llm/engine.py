"""Many requests on one model: continuous batching over slots, with prefix reuse.

llama-server's design in our names. The :class:`Engine` owns ``n_parallel`` *slots*,
sequence ids ``0 .. n_parallel - 1`` of the model's one KV cache. Each step is one
:meth:`ModelRunner.decode <tensorplug_llm.runner.ModelRunner.decode>` carrying the next token of
every generating request plus chunks of waiting prompts, up to a token budget
(``n_batch``, vLLM's idea: decode tokens first, so a long prompt never stalls the
streams already running). Requests join and leave between steps; a batched decode
reads each weight once for all of its streams, which is where the throughput comes
from.

Prefix reuse: a slot remembers the tokens its cells hold after its request ends. A new
request takes the idle slot whose tokens share the longest prefix with its prompt (ties:
the least recently used), keeps those cells and evaluates only the rest (at least the
last prompt token, whose logits it needs). When the cache runs out of cells, idle slots
give theirs back, least recently used first.

Preemption (vLLM's recompute preemption): when the running requests themselves need
more cells than the cache has, the most recently admitted one gives way: its slot goes
idle (its cells evictable like any idle slot's) and it goes back to the head of the
queue with everything that decides its continuation (sampler and its generator,
constraint, text decoder, the tokens it generated). Its cells are evicted last, and
from the tail, only as many as needed. Resumed, it evaluates its prompt plus those
tokens again (less the prefix still cached) and goes on exactly where it was. The
oldest request is never preempted for a younger one, so one request always progresses.

Embeddings (``Request(tokens, embed=True)``): the tokens are a sequence of their own
in a slot, evaluated in chunks within the same token budget as the prompts beside
them (a second decode of the step asks for the chunks' final hidden states rather
than logits), pooled as :meth:`ModelRunner.embed <tensorplug_llm.runner.ModelRunner.embed>` pools
(:mod:`pooling`), and their cells removed (``seq_rm``). So one loaded model serves
completions and embeddings at once. An encoder (BERT) is served the same way, each
text in one step (its attention sees the whole text); it generates nothing, so a
generation request to it is refused at ``submit``.

Several choices of one prompt (OpenAI's ``n``, :meth:`Engine.submit_group`): the
requests are admitted together into as many slots; the first evaluates the prompt, and
when its last token's logits come out the others share its cells (``seq_cp``: nothing
computed twice) and each samples its first token from those same logits with its own
sampler. From there they are independent sequences.

Sampling and constraints are the request's own (``request.py``'s protocols
``TokenSampler`` and ``Constraint``); without a sampler a request is greedy. A
constraint's token mask is computed on a helper thread while the step's decode runs,
so structured output does not stall the other sequences.

Arithmetic: the engine makes its model batch-invariant (:meth:`ModelRunner.set_batch_invariant
<tensorplug_llm.runner.ModelRunner.set_batch_invariant>`): every row of a step is summed as
if it were alone, so a request's numbers depend neither on the requests decoded beside
it nor on how much of its prompt was found cached, and a seeded request reproduces its
choices on a busy server. A model used on its own (``tensorplug run``, ``chat``) keeps
ggml's orders, llama.cpp's logits to the bit, whose last bits depend on a step's row
count as llama.cpp's do.

Threads: :meth:`Engine.submit` may be called from any thread. Either a loop thread runs
the steps (:meth:`Engine.start`), or whoever iterates a :class:`RequestHandle` drives
:meth:`Engine.step` itself while no loop thread runs (tests, scripts).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.errors import RunError

from .batch import BatchBuilder
from .kv_cells import MAX_SEQUENCES
from .pooling import pool, pooling_kind
from .prefix import common_prefix
from .request import (
    Constraint,
    GreedySampler,
    Request,
    RequestError,
    RequestHandle,
    SampledToken,
    TokenEvent,
    TokenSampler,
)
from .tokenizer import StreamDecoder

if TYPE_CHECKING:
    from .runner import ModelRunner

__all__ = [
    "Constraint",
    "Engine",
    "EngineStats",
    "GreedySampler",
    "Request",
    "RequestError",
    "RequestHandle",
    "SampledToken",
    "TokenEvent",
    "TokenSampler",
]


#: The largest prompt step :meth:`Engine.warm_up` evaluates: a chat turn's new tokens,
#: once a shared prefix is reused, are fewer; longer prompts pay for their graph once,
#: and computing a larger step costs more than building its graph (a 256-row step of
#: SmolLM2-135M is most of a second on 2 cores).
WARM_UP_ROWS = 64
#: How many context lengths (``n_kv``, in steps of the model's ``kv_pad``) the warm-up
#: builds its steps at: the graph cache (``runner.GRAPH_CACHE``) and the CPU's plan cache
#: hold two levels of a 4-slot server's steps.
WARM_UP_LEVELS = 2


@dataclass
class EngineStats:
    """Totals since the engine started (``/metrics`` reads these)."""

    requests_submitted: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    prompt_tokens_evaluated: int = 0
    prompt_tokens_reused: int = 0
    generated_tokens: int = 0
    steps: int = 0
    slots_evicted: int = 0
    #: running requests that gave their cells up and went back to the queue
    preemptions: int = 0
    #: tokens evaluated again to resume preempted requests (not in prompt_tokens_evaluated)
    tokens_recomputed: int = 0


@dataclass
class _Slot:
    seq: int
    #: the tokens whose K/V the slot's cells hold, at positions 0 .. len - 1
    cached: list[int] = field(default_factory=list)
    job: _Job | None = None
    last_used: int = -1
    #: its cells are a preempted job's: evicted from the tail, as few as needed, so the
    #: job resumes from the prefix that survives
    preempted: bool = False


@dataclass
class _Job:
    """A request in a slot: its prompt still to evaluate, then generation."""

    handle: RequestHandle
    slot: _Slot
    pending: list[int]  # prompt tokens not evaluated yet
    sampler: TokenSampler
    stop_tokens: frozenset[int]
    decoder: StreamDecoder | None
    admitted: int  # the order of first admission: the newest is preempted first
    next_token: int | None = None  # sampled, to be evaluated by the next step
    n_generated: int = 0
    preempted: int = 0  # how many times it gave its cells up
    #: tokens it had in the cache when last preempted: evaluating them again is recompute
    evaluated: int = 0
    #: a choice waiting for its leader's prompt: it shares those cells when they exist
    leader: _Job | None = None
    #: the other choices of this job's prompt, forked when its last prompt token is done
    followers: list[_Job] = field(default_factory=list)
    #: an embedding's final hidden states so far, a block per evaluated chunk
    hidden: list[np.ndarray] = field(default_factory=list)

    @property
    def embed(self) -> bool:
        return self.handle.request.embed


@dataclass
class _Waiting:
    """A queue entry: a request (with ``followers``: other choices of its prompt,
    admitted with it), or a preempted job that resumes with its state."""

    handle: RequestHandle
    resumed: _Job | None = None
    followers: list[RequestHandle] = field(default_factory=list)

    @property
    def handles(self) -> list[RequestHandle]:
        return [self.handle, *self.followers]

    def tokens(self) -> list[int]:
        """What the cache must hold for it to go on: the prompt, and for a resumed job
        the tokens it generated (the last one sampled but not yet evaluated)."""
        prompt = [int(t) for t in self.handle.request.prompt]
        return prompt + self.handle.tokens if self.resumed is not None else prompt


class Engine:
    """Continuous batching over ``n_parallel`` slots of one :class:`ModelRunner`.

    ``n_batch`` is the token budget of a step (default: the model's ``n_batch``).
    ``similarity``: the share of a prompt a slot's cached prefix must cover for the
    request to prefer that slot (llama-server's ``--slot-prompt-similarity``, 0.5).
    The engine owns the model's cache: do not call ``eval``/``generate`` on the same
    model while it runs.
    """

    def __init__(
        self,
        llama: ModelRunner,
        n_parallel: int = 4,
        n_batch: int | None = None,
        *,
        similarity: float = 0.5,
    ) -> None:
        if not 1 <= n_parallel <= MAX_SEQUENCES:
            raise RunError(f"n_parallel must be 1..{MAX_SEQUENCES}, got {n_parallel}")
        if n_batch is not None and n_batch < 1:
            raise RunError(f"n_batch must be at least 1, got {n_batch}")
        if not 0.0 <= similarity <= 1.0:
            raise RunError(f"similarity is a share of the prompt, 0..1; got {similarity}")
        self.llama = llama
        # a request's numbers depend on neither the requests decoded beside it nor the
        # prefix it found cached (ModelRunner.set_batch_invariant)
        llama.set_batch_invariant(True)
        self.n_parallel = n_parallel
        self.n_batch = n_batch or llama.n_batch
        self.similarity = similarity
        self.slots = [_Slot(i) for i in range(n_parallel)]
        self.stats = EngineStats()
        self._waiting: deque[_Waiting] = deque()
        self._lock = threading.Lock()  # guards _waiting
        self._step_lock = threading.Lock()  # one step at a time
        self._wakeup = threading.Condition(self._lock)
        self._ids = itertools.count()
        self._tick = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._masks: ThreadPoolExecutor | None = None
        llama.reset()

    # -- submitting --------------------------------------------------------------------------

    def submit(self, request: Request) -> RequestHandle:
        """Queue ``request``; thread-safe. A request that can never run (no prompt, a
        token outside the vocabulary, longer than the context, a bad ``max_tokens``)
        raises :class:`RequestError` here, naming what is wrong."""
        self._check(request)
        handle = RequestHandle(self, request, next(self._ids))
        with self._lock:
            self._waiting.append(_Waiting(handle))
            self.stats.requests_submitted += 1
            self._wakeup.notify()
        return handle

    def submit_group(self, requests: Sequence[Request]) -> list[RequestHandle]:
        """Queue requests with one prompt (choices of it, OpenAI's ``n``): they are
        admitted together, the prompt is evaluated once and its cells shared by all
        (``seq_cp``), each samples with its own sampler from the same logits. At most
        ``n_parallel`` requests (they run side by side); thread-safe."""
        if not 1 <= len(requests) <= self.n_parallel:
            raise RequestError(
                f"a group runs its {len(requests)} requests side by side: 1 to n_parallel = "
                f"{self.n_parallel} of them"
            )
        for r in requests:
            self._check(r)
        prompt = [int(t) for t in requests[0].prompt]
        if any([int(t) for t in r.prompt] != prompt for r in requests[1:]):
            raise RequestError("the requests of a group must have the same prompt")
        handles = [RequestHandle(self, r, next(self._ids)) for r in requests]
        with self._lock:
            self._waiting.append(_Waiting(handles[0], followers=handles[1:]))
            self.stats.requests_submitted += len(handles)
            self._wakeup.notify()
        return handles

    def _check(self, request: Request) -> None:
        try:
            prompt = np.asarray(request.prompt, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            raise RequestError(
                f"the prompt must be a list of token ids (ints), got {request.prompt!r:.80}"
            ) from None
        n_vocab, n_ctx = self.llama.config.n_vocab, self.llama.n_ctx
        if prompt.size == 0:
            raise RequestError("the prompt is empty: a request needs at least one token")
        bad = prompt[(prompt < 0) | (prompt >= n_vocab)]
        if bad.size:
            raise RequestError(
                f"prompt token id {int(bad[0])} is outside the vocabulary (0..{n_vocab - 1})"
            )
        if prompt.size > n_ctx:
            raise RequestError(
                f"the prompt has {prompt.size} tokens; the context holds {n_ctx} (n_ctx): "
                "shorten the prompt or load the model with a larger context (-c / --ctx-size)"
            )
        if request.max_tokens is not None and request.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1 (or None), got {request.max_tokens}")
        if request.n_probs < 0:
            raise RequestError(f"n_probs must be >= 0, got {request.n_probs}")
        cfg = self.llama.config
        if request.embed:
            try:
                pooling_kind(request.pooling, cfg.pooling)
            except RunError as e:
                raise RequestError(str(e)) from None
        elif cfg.arch.encoder:
            raise RequestError(
                f"{self.llama.file.path.name} is an embedding model ('{cfg.arch.name}', a "
                "bidirectional encoder with no output layer): it computes embeddings "
                "(/v1/embeddings, LLM.embed), it cannot generate text"
            )

    def warm_up(self) -> None:
        """Build the graphs, allocations and CPU plans of the steps a server runs first —
        a prompt step of every padded size (:meth:`ModelRunner.step_rows`) from 2 rows up to
        :data:`WARM_UP_ROWS` and a decode step of 1 .. ``n_parallel`` requests — at the
        first :data:`WARM_UP_LEVELS` context lengths a step reads (``n_kv``: the used
        cells rounded up to ``kv_pad``), by preparing them (:meth:`ModelRunner.prepare`) in an
        empty cache.
        Each new step shape otherwise costs its first request 40-80 ms (SmolLM2-135M, 2
        cores), most of a short prompt's time to first token; and the cache of a
        server with a few slots of chat-sized requests soon holds more than ``kv_pad``
        cells (4 slots of a 40-token prompt and 64 tokens do), where every shape was
        built again: 4 clients' second requests waited 150-300 ms more for their first
        token. Does nothing once the engine holds anything, nor for an encoder (it has
        no logits to decode; its embedding steps are not padded)."""
        llama = self.llama
        if llama.config.arch.encoder:
            return
        top = min(self.n_batch, WARM_UP_ROWS)
        # from 2 rows: a new request's last prompt token beside a few decoding ones
        sizes = sorted({llama.step_rows(n) for n in range(2, top + 1)})
        with self._step_lock:
            if self._has_work() or llama.kv.n_used:
                return
            try:
                for level in range(WARM_UP_LEVELS):
                    if level and not self._reach_level(level):
                        break
                    self._warm_steps(sizes)
            finally:
                llama.kv.clear()

    def _reach_level(self, level: int) -> bool:
        """Make steps read ``level + 1`` times ``kv_pad`` cells: a placeholder sequence
        (no slot's) takes the first cell past ``level`` times ``kv_pad``, without
        computing anything there (no token attends to it). False when the context is
        not that long or every sequence id is a slot's."""
        llama, kv = self.llama, self.llama.kv
        cell = level * llama.kv_pad
        if cell >= kv.n_ctx or self.n_parallel >= MAX_SEQUENCES:
            return False
        kv.assign(np.array([cell]), np.array([0]), [(self.n_parallel,)])
        return True

    def _warm_steps(self, sizes: list[int]) -> None:
        """A prompt step of each of ``sizes`` and a decode step of 1 .. ``n_parallel``
        requests, prepared (:meth:`ModelRunner.prepare`: built, allocated, their plans bound
        and the kernels they call made ready), none computed: computing them all
        (SmolLM2-135M, 2 cores: 26 steps, 2.2 s) was ~1 s of throw-away prompts on top
        of their plans."""
        llama = self.llama
        for n in sizes:
            llama.prepare(n, pad=True)
        for n in range(1, min(self.n_parallel, self.n_batch) + 1):
            llama.prepare(n, n_outputs=n)

    def wake(self) -> None:
        """Let the loop thread look for work (a cancel, a new request)."""
        with self._lock:
            self._wakeup.notify()

    # -- the loop thread ---------------------------------------------------------------------

    @property
    def loop_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Run steps on a daemon thread until :meth:`close`."""
        if self.loop_running:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="tensorplug-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._has_work():
                    self._wakeup.wait()
                if self._stop:
                    return
            try:
                self.step()
            except Exception as e:  # a fault of the engine itself: its requests end
                self._fail_running(e)

    def _fail_running(self, cause: Exception) -> None:
        """Fail every running request (their cells are dropped: what a failed step
        left there is unknown); queued requests stay queued."""
        with self._step_lock:
            for slot in self.slots:
                self.llama.kv.seq_rm(slot.seq)
                slot.cached.clear()
                if slot.job is not None:
                    self._fail(slot.job, RequestError(f"the engine's step failed: {cause}"), cause)

    def _has_work(self) -> bool:
        return bool(self._waiting) or any(s.job is not None for s in self.slots)

    def close(self) -> None:
        """Stop the loop thread; requests still queued or running end "cancelled"."""
        with self._lock:
            self._stop = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._step_lock:
            for slot in self.slots:  # first: a leader ending requeues its choices
                if slot.job is not None:
                    self.stats.requests_cancelled += 1
                    self._end(slot.job, "cancelled")
            with self._lock:
                waiting, self._waiting = list(self._waiting), deque()
            for entry in waiting:
                for handle in entry.handles:
                    self.stats.requests_cancelled += 1
                    handle.end("cancelled")
        if self._masks is not None:
            self._masks.shutdown()
            self._masks = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the cache holds ------------------------------------------------------------------

    @property
    def n_running(self) -> int:
        return sum(s.job is not None for s in self.slots)

    @property
    def n_waiting(self) -> int:
        """Requests queued; thread-safe (the server asks it for every request while
        other threads submit: iterating the queue unlocked raised "deque mutated during
        iteration", a 500, under the load test)."""
        with self._lock:
            waiting = list(self._waiting)
        return sum(len(e.handles) for e in waiting)

    def cached_tokens(self) -> int:
        """Tokens idle slots hold for prefix reuse (a cell shared by two counts twice)."""
        return sum(len(s.cached) for s in self.slots if s.job is None)

    # -- one step -----------------------------------------------------------------------------

    def step(self) -> bool:
        """Admit waiting requests, run one decode of every generating request plus
        prompt chunks within the token budget, sample, emit events. Returns whether
        there was anything to do."""
        with self._step_lock:
            self._reap_cancelled()
            self._admit()
            jobs = [s.job for s in self.slots if s.job is not None]
            if not jobs:
                return False
            self._run(jobs)
            self.stats.steps += 1
            return True

    def _reap_cancelled(self) -> None:
        cancelled: list[RequestHandle] = []
        with self._lock:
            for e in list(self._waiting):
                alive = [h for h in e.handles if not h.cancelled]
                cancelled += [h for h in e.handles if h.cancelled]
                if not alive:
                    self._waiting.remove(e)
                elif len(alive) < len(e.handles):  # the next choice leads the group
                    e.handle, e.followers = alive[0], alive[1:]
        for h in cancelled:
            self.stats.requests_cancelled += 1
            h.end("cancelled")
        for slot in self.slots:
            if slot.job is not None and slot.job.handle.cancelled:
                self.stats.requests_cancelled += 1
                self._end(slot.job, "cancelled")

    def _admit(self) -> None:
        """Waiting requests into idle slots, first come first served. A request takes
        the idle slot sharing the longest prefix with it, and shares a longer prefix
        another slot holds, running or idle (``seq_cp``: the same cells, nothing
        computed or copied). It waits while a running request is still evaluating a
        longer shared prefix, and while the cache cannot take the rest of its prompt
        (counting idle slots' cells as free). A preempted job resumes the same way, its
        prompt being what it had in the cache plus its last sampled token."""
        while True:
            with self._lock:
                if not self._waiting:
                    return
                entry = self._waiting[0]
            idle = [s for s in self.slots if s.job is None]
            if len(idle) < len(entry.handles):
                return  # a group is admitted whole: its choices share one prompt step
            handle = entry.handle
            prompt = entry.tokens()
            if handle.request.embed:
                if not self._admit_embedding(entry, idle, prompt):
                    return
                continue
            slot = self._best_slot(idle, prompt)
            limit = len(prompt) - 1  # the last prompt token is evaluated: its logits
            own = min(common_prefix(slot.cached, prompt), limit)
            donor = max(
                (s for s in self.slots if s is not slot),
                key=lambda s: common_prefix(s.cached, prompt),
                default=None,
            )
            shared = min(common_prefix(donor.cached, prompt), limit) if donor else 0
            use_donor = donor is not None and shared > own
            reuse = shared if use_donor else own
            if self._prefix_coming(prompt, reuse):
                return  # share it next step rather than compute it twice
            if self.n_running and self._spare(slot, donor, 0 if use_donor else own) < (
                len(prompt) - reuse + len(entry.handles)
            ):
                return  # wait for running requests to end
            with self._lock:
                self._waiting.popleft()
            kv = self.llama.kv
            if use_donor:
                assert donor is not None
                kv.seq_rm(slot.seq)
                kv.seq_cp(donor.seq, slot.seq, 0, reuse)
                slot.cached[:] = prompt[:reuse]
            else:
                kv.seq_rm(slot.seq, reuse)
                del slot.cached[reuse:]
            if entry.resumed is not None:
                job = entry.resumed
                job.slot, job.pending, job.next_token = slot, prompt[reuse:], None
                slot.job = job
                continue
            handle.prompt_tokens_reused = reuse
            self.stats.prompt_tokens_reused += reuse
            slot.job = leader = self._new_job(handle, slot, prompt[reuse:])
            for other in entry.followers:  # the other choices: cells shared at the fork
                free = [s for s in self.slots if s.job is None]
                fslot = min(free, key=lambda s: (s is donor, bool(s.cached), s.last_used))
                kv.seq_rm(fslot.seq)
                fslot.cached.clear()
                fslot.job = job = self._new_job(other, fslot, [])
                job.leader = leader
                leader.followers.append(job)
                other.prompt_tokens_reused = len(prompt)
                self.stats.prompt_tokens_reused += len(prompt)

    def _admit_embedding(self, entry: _Waiting, idle: list[_Slot], tokens: list[int]) -> bool:
        """An embedding into the idle slot whose cache matters least (empty, else least
        recently used), once the cache can take all its tokens: it needs every token's
        hidden state, so no cached prefix is of use to it."""
        slot = min(idle, key=lambda s: (bool(s.cached), s.last_used))
        if self.n_running and self._spare(slot, None, 0) < len(tokens):
            return False
        with self._lock:
            self._waiting.popleft()
        self.llama.kv.seq_rm(slot.seq)
        slot.cached.clear()
        job = entry.resumed or self._new_job(entry.handle, slot, [])
        job.slot, job.pending, job.hidden = slot, tokens, []
        slot.job = job
        return True

    def _new_job(self, handle: RequestHandle, slot: _Slot, pending: list[int]) -> _Job:
        request, vocab = handle.request, self.llama.vocab
        return _Job(
            handle=handle,
            slot=slot,
            pending=pending,
            sampler=request.sampler or GreedySampler(request.n_probs),
            stop_tokens=(
                request.stop_tokens
                if request.stop_tokens is not None
                else (vocab.eog if vocab is not None else frozenset())
            ),
            decoder=StreamDecoder(vocab) if vocab is not None else None,
            admitted=next(self._tick),
        )

    def _prefix_coming(self, prompt: list[int], reuse: int) -> bool:
        """Whether a running request is still evaluating a prompt that shares more of
        ``prompt`` than the ``reuse`` tokens available now, and enough of it to count
        (``similarity``): a burst of requests with one system prompt then computes it
        once, the others share it a step or a few later."""
        for s in self.slots:
            if s.job is not None and s.job.pending and not s.job.embed:
                n = min(common_prefix(s.cached + s.job.pending, prompt), len(prompt) - 1)
                if n > reuse and n >= self.similarity * len(prompt):
                    return True
        return False

    def _spare(self, slot: _Slot, donor: _Slot | None, kept: int) -> int:
        """Cells a request entering ``slot`` (keeping its first ``kept`` positions)
        could have: the free ones, those only other idle slots hold (they can be
        evicted), the slot's own beyond ``kept``; less what the running requests'
        unevaluated prompts and next tokens will take."""
        kv = self.llama.kv
        others = [s.seq for s in self.slots if s.job is None and s is not slot and s is not donor]
        spare = kv.n_ctx - kv.n_used + kv.n_held_only_by(others)
        spare += kv.n_held_only_by([slot.seq], kept)
        return spare - sum(len(s.job.pending) + 1 for s in self.slots if s.job is not None)

    def _best_slot(self, idle: list[_Slot], prompt: list[int]) -> _Slot:
        """The idle slot with the longest common prefix (ties: least recently used). A
        prefix shorter than ``similarity`` of the prompt counts as none (llama-server's
        rule): a shared BOS or a word must not make a request overwrite a slot whose
        cache another conversation will want."""

        def useful(slot: _Slot) -> int:
            n = common_prefix(slot.cached, prompt)
            return n if n >= self.similarity * len(prompt) else 0

        return max(idle, key=lambda s: (useful(s), -s.last_used))

    def _make_room(self, needed: int) -> None:
        """Free cells for ``needed`` tokens: idle slots give up theirs, least recently
        used first (a preempted job's slot, the most recent, only its tail: as many
        cells as are missing). Running requests are never touched here."""
        kv = self.llama.kv
        for slot in sorted(self.slots, key=lambda s: s.last_used):
            short = needed - (kv.n_ctx - kv.n_used)
            if short <= 0:
                return
            if slot.job is None and slot.cached:
                keep = self._tail_kept(slot, short) if slot.preempted else 0
                kv.seq_rm(slot.seq, keep)
                del slot.cached[keep:]
                self.stats.slots_evicted += keep == 0

    def _tail_kept(self, slot: _Slot, short: int) -> int:
        """The longest prefix of ``slot`` whose removal beyond frees ``short`` cells (a
        cell shared with another sequence frees nothing); 0 if none does."""
        kv, lo, hi = self.llama.kv, 0, len(slot.cached)
        if kv.n_held_only_by([slot.seq], 0) < short:
            return 0
        while lo < hi:  # cells freed by removing positions >= k fall as k grows
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if kv.n_held_only_by([slot.seq], mid) >= short else (lo, mid - 1)
        return lo

    def _fit(self, jobs: list[_Job]) -> list[_Job]:
        """The jobs that can step, after freeing cells for them: idle slots' first (LRU),
        then the newest running jobs' (preempted, back to the queue) until every
        generating job has a cell for its next token and, when none generates, the
        oldest prompt has one for a chunk. One job alone always fits (the context holds
        its prompt, and generation ends when the context is full), so the oldest job
        always progresses: no livelock."""
        kv = self.llama.kv
        jobs = list(jobs)
        while True:
            decoding = sum(j.next_token is not None for j in jobs)
            wanted = decoding + sum(len(j.pending) for j in jobs)
            self._make_room(min(wanted, max(self.n_batch, decoding)))
            free = kv.n_ctx - kv.n_used
            if decoding <= free and (decoding or free or not wanted):
                return jobs
            holders = [j for j in jobs if j.leader is None]  # a waiting choice holds nothing
            newest = max(holders, key=lambda j: j.admitted)
            if len(holders) == 1:  # cannot happen (see above); fail clearly rather than loop
                held = len(newest.slot.cached)
                self._fail(
                    newest,
                    RequestError(
                        f"the request needs {held + wanted} KV cells and the context holds "
                        f"{kv.n_ctx} (n_ctx): use a larger context (-c) or fewer tokens"
                    ),
                )
                return []
            for gone in (newest, *newest.followers):
                jobs.remove(gone)
            self._preempt(newest)

    def _preempt(self, job: _Job) -> None:
        """``job`` gives its slot up and goes back to the head of the queue with its
        state. Its cells stay as an idle slot's (the most recently used: evicted after
        the others), so if they survive it resumes from them."""
        slot = job.slot
        slot.job = None
        slot.last_used = next(self._tick)
        slot.preempted = True
        job.evaluated = max(job.evaluated, len(slot.cached))
        if job.next_token is None:  # mid-prompt: what was evaluated is kept cached
            job.pending = []
        if job.embed:  # its hidden states so far are dropped with its cells
            self.llama.kv.seq_rm(slot.seq)
            slot.cached.clear()
        job.preempted += 1
        self.stats.preemptions += 1
        self._requeue_followers(job)
        with self._lock:
            self._waiting.appendleft(_Waiting(job.handle, job))

    def _requeue_followers(self, leader: _Job) -> None:
        """A leader leaves before its prompt is done (preempted, cancelled, failed): its
        waiting choices have done nothing yet, so they go back to the head of the queue
        as a group of their own (sharing whatever of the prompt is cached)."""
        followers, leader.followers = leader.followers, []
        for f in followers:
            f.slot.job = None
            f.leader = None
        if followers:
            with self._lock:
                self._waiting.appendleft(
                    _Waiting(followers[0].handle, followers=[f.handle for f in followers[1:]])
                )

    def _run(self, jobs: list[_Job]) -> None:
        kv = self.llama.kv
        jobs = self._fit(jobs)
        if not jobs:
            return
        decoding = [j for j in jobs if j.next_token is not None]
        budget = min(self.n_batch, kv.n_ctx - kv.n_used)
        batch = BatchBuilder()
        rows: list[tuple[_Job, list[int]]] = []  # per flagged token: its job, tokens added
        for job in decoding:
            assert job.next_token is not None
            batch.add(job.next_token, len(job.slot.cached), (job.slot.seq,), logits=True)
            rows.append((job, [job.next_token]))
            job.next_token = None
        budget -= len(decoding)
        evaluated: list[tuple[_Job, list[int]]] = []
        embedding = BatchBuilder()  # chunks of embeddings: a decode of their own
        embedded: list[tuple[_Job, list[int]]] = []
        encoder = self.llama.config.arch.encoder
        for job in sorted((j for j in jobs if j.pending), key=lambda j: j.admitted):
            if budget <= 0:
                break
            if encoder and len(job.pending) > budget:
                continue  # an encoder sees a text whole, in one step
            chunk, job.pending = job.pending[:budget], job.pending[budget:]
            p0 = len(job.slot.cached)
            for i, tok in enumerate(chunk):
                if job.embed:  # every row's hidden state is pooled
                    embedding.add(tok, p0 + i, (job.slot.seq,), logits=True)
                    continue
                batch.add(
                    tok, p0 + i, (job.slot.seq,), logits=not job.pending and i == len(chunk) - 1
                )
            budget -= len(chunk)
            self._count(job, p0, len(chunk))
            (embedded if job.embed else evaluated if job.pending else rows).append((job, chunk))
        if len(batch):
            self._decode(batch, len(decoding), rows, evaluated)
        if len(embedding):
            self._embed(embedding, embedded)

    def _count(self, job: _Job, p0: int, n: int) -> None:
        """Count ``n`` tokens evaluated from position ``p0``: those a preempted job had
        in the cache before as recomputed, new prompt tokens as prompt (a resumed job's
        last sampled token is neither: a decode step would have evaluated it)."""
        end = p0 + n
        again = max(0, min(end, job.evaluated) - p0)
        fresh = max(0, min(end, len(job.handle.request.prompt)) - max(p0, job.evaluated))
        self.stats.tokens_recomputed += again
        job.handle.prompt_tokens_evaluated += fresh
        self.stats.prompt_tokens_evaluated += fresh

    def _decode(
        self,
        batch: BatchBuilder,
        n_decoding: int,
        rows: list[tuple[_Job, list[int]]],
        evaluated: list[tuple[_Job, list[int]]],
    ) -> None:
        """The step's generation decode: sample each flagged row."""
        kv = self.llama.kv
        # each flagged row is sampled by its job, and by the choices waiting for it
        samples = [(j, i) for i, (job, _) in enumerate(rows) for j in (job, *job.followers)]
        masks = self._masks_for([job for job, _ in samples])
        try:
            # a step with prompt tokens counts as prompt time, decode steps as generation;
            # it is padded to a few sizes, so that prompt chunks of every length replay
            # kept graphs (decode steps take one size per number of running requests)
            prompt = len(batch) > n_decoding
            logits = self.llama.decode(batch.build(), prompt=prompt, pad=prompt)
        except Exception as e:  # the step failed: its requests fail, the engine goes on
            for job, _ in (*rows, *evaluated):
                kv.seq_rm(job.slot.seq)
                job.slot.cached.clear()
                self._fail(job, RequestError(f"the step failed: {e}"), e)
            return
        for job, chunk in evaluated:
            job.slot.cached.extend(chunk)
        for job, chunk in rows:
            job.slot.cached.extend(chunk)
            for f in job.followers:  # the prompt is in the cache: the choices share it
                kv.seq_cp(job.slot.seq, f.slot.seq)
                f.slot.cached[:] = job.slot.cached
                f.leader = None
            job.followers = []
        for (job, i), mask in zip(samples, masks, strict=True):
            self._sample(job, logits[i], mask)

    def _embed(self, batch: BatchBuilder, embedded: list[tuple[_Job, list[int]]]) -> None:
        """The step's embedding chunks: their hidden states kept; a finished embedding
        is pooled as ``ModelRunner.embed`` pools and its cells removed."""
        try:
            hidden = self.llama.decode(batch.build(), prompt=True, embeddings=True)
        except Exception as e:
            for job, _ in embedded:
                self._fail(job, RequestError(f"the step failed: {e}"), e)
            return
        row = 0
        for job, chunk in embedded:
            job.hidden.append(hidden[row : row + len(chunk)])
            row += len(chunk)
            job.slot.cached.extend(chunk)
            if job.pending:
                continue
            request = job.handle.request
            kind = pooling_kind(request.pooling, self.llama.config.pooling)
            job.handle.embedding = pool(np.concatenate(job.hidden), kind)
            self.stats.requests_finished += 1
            self._end(job, "stop")

    def _masks_for(self, jobs: list[_Job]) -> list[Future[np.ndarray] | None]:
        """Each constrained job's allowed-token mask, computed on a helper thread while
        the step's decode runs (the mask depends only on the tokens accepted so far)."""
        if all(j.handle.request.constraint is None for j in jobs):
            return [None] * len(jobs)
        if self._masks is None:
            self._masks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tp-masks")
        return [
            self._masks.submit(c.allowed) if (c := j.handle.request.constraint) else None
            for j in jobs
        ]

    def _sample(self, job: _Job, logits: np.ndarray, mask: Future[np.ndarray] | None) -> None:
        request = job.handle.request
        try:
            allowed = mask.result() if mask is not None else None
            picked = job.sampler.sample(logits, allowed)
            token = int(picked.token)
            job.sampler.accept(token)
            constraint_done = False
            if request.constraint is not None:
                request.constraint.accept(token)
                constraint_done = request.constraint.done()
        except Exception as e:
            self._fail(job, RequestError(f"sampling failed: {e}"), e)
            return
        job.n_generated += 1
        self.stats.generated_tokens += 1
        finish = None
        if token in job.stop_tokens or constraint_done:
            finish = "stop"
        elif job.n_generated == request.max_tokens or len(job.slot.cached) >= self.llama.n_ctx:
            finish = "length"
        text = None
        if job.decoder is not None:
            text = "" if token in job.stop_tokens else job.decoder.feed(token)
            if finish is not None:
                text += job.decoder.flush()
        event = TokenEvent(token, text, picked.logprob, picked.top_logprobs, finish)
        try:
            job.handle.deliver(event)
        except Exception as e:  # on_event raised
            self._fail(job, RequestError(f"the request's on_event callback failed: {e}"), e)
            return
        if finish is not None:
            self.stats.requests_finished += 1
            self._end(job, finish)
        else:
            job.next_token = token

    def _fail(self, job: _Job, error: RequestError, cause: BaseException | None = None) -> None:
        if cause is not None:
            error.__cause__ = cause
        self.stats.requests_failed += 1
        self._end(job, "error", error)

    def _end(self, job: _Job, reason: str, error: RequestError | None = None) -> None:
        """The slot goes idle; its cells stay cached (what they hold: ``slot.cached``)."""
        job.slot.preempted = False
        self._requeue_followers(job)
        if job.leader is not None:
            job.leader.followers.remove(job)
            job.leader = None
        slot = job.slot
        if job.embed:  # its cells were for its hidden states: they go
            self.llama.kv.seq_rm(slot.seq)
            slot.cached.clear()
            job.hidden = []
        slot.job = None
        slot.last_used = next(self._tick)
        job.handle.end(reason, error)

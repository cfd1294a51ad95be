"""Many requests on one model: continuous batching over slots, with prefix reuse.

llama-server's design in our names, split as vLLM v1 splits its engine. The
:class:`Engine` owns ``n_parallel`` *slots*, sequence ids ``0 .. n_parallel - 1`` of the
model's one KV cache. Each step is three parts: the :class:`~.scheduler.Scheduler` turns
the queue, the slots and the cells into a plan (which requests decode, which prompt
chunks are evaluated, within the step's token budget: its module docstring is the
policy), the :class:`~.executor.StepExecutor` runs the plan as one
:meth:`ModelRunner.decode <tensorplug_llm.runner.ModelRunner.decode>` carrying the next
token of every generating request plus the chunks, and the
:class:`~.update.StepUpdate` applies the results (tokens sampled and streamed, requests
ended). Requests join and leave between steps; a batched decode reads each weight once
for all of its streams, which is where the throughput comes from.

Prefix reuse: a slot remembers the tokens its cells hold after its request ends. A new
request takes the idle slot whose tokens share the longest prefix with its prompt (ties:
the least recently used), keeps those cells and evaluates only the rest (at least the
last prompt token, whose logits it needs). When the cache runs out of cells, idle slots
give theirs back, least recently used first. With a prompt cache (``prompt_cache``,
:mod:`~tensorplug_llm.engine.prompt_cache`) the prompts a slot let go of stay in cells
of their own sequence ids beyond the slots', and a request takes its longest prefix
from them or from any slot.

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
(:mod:`~tensorplug_llm.pooling`), and their cells removed (``seq_rm``). So one loaded model serves
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

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.errors import RunError

from ..kv_cells import MAX_SEQUENCES
from ..pooling import pooling_kind
from ..request import Request, RequestError, RequestHandle
from .executor import StepExecutor
from .prompt_cache import PromptCache
from .scheduler import Scheduler
from .slot_file import (
    SlotFileError,
    SlotState,
    read_rows,
    read_slot_file,
    write_rows,
    write_slot_file,
)
from .state import EngineStats, Slot, Waiting
from .update import StepUpdate

if TYPE_CHECKING:
    from ..runner import ModelRunner

__all__ = ["Engine"]

log = logging.getLogger("tensorplug.engine")


class Engine:
    """Continuous batching over ``n_parallel`` slots of one :class:`ModelRunner`.

    ``n_batch`` is the token budget of a step (default: the model's ``n_batch``).
    ``max_prefill_tokens``: prompt tokens a step may carry beside running decodes (None:
    what ``n_batch`` leaves; see :mod:`~tensorplug_llm.engine.scheduler`).
    ``similarity``: the share of a prompt a slot's cached prefix must cover for the
    request to prefer that slot (llama-server's ``--slot-prompt-similarity``, 0.5).
    ``n_ctx_seq``: the tokens one request's sequence may hold (llama-server's context
    per slot; None: the whole cache, ``n_ctx``); a prompt longer is refused and a
    generation that fills it ends "length".
    ``prompt_cache``: the cells the prompt cache's entries may hold beyond the slots'
    (:mod:`~tensorplug_llm.engine.prompt_cache`; 0: no prompt cache, None: as many as
    the KV cache has spare). ``cache_idle_slots``: with a prompt cache, a request that
    starts moves every other idle slot's tokens into it (llama-server's
    ``--cache-idle-slots``). ``context_shift``: a request whose slot is full drops half
    of its tokens past its ``n_keep`` first and goes on, as llama-server's
    ``--context-shift`` (else it ends "length"). ``cache_reuse``: past the prefix a
    prompt shares with its slot, runs of at least this many cached tokens that the
    prompt has next move to their place, their K rows re-roped (llama-server's
    ``--cache-reuse``; 0: off; a request's ``cache_reuse`` wins).
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
        max_prefill_tokens: int | None = None,
        n_ctx_seq: int | None = None,
        prompt_cache: int | None = 0,
        cache_idle_slots: bool = False,
        context_shift: bool = False,
        cache_reuse: int = 0,
    ) -> None:
        if not 1 <= n_parallel <= MAX_SEQUENCES:
            raise RunError(f"n_parallel must be 1..{MAX_SEQUENCES}, got {n_parallel}")
        if n_batch is not None and n_batch < 1:
            raise RunError(f"n_batch must be at least 1, got {n_batch}")
        if not 0.0 <= similarity <= 1.0:
            raise RunError(f"similarity is a share of the prompt, 0..1; got {similarity}")
        if cache_reuse < 0:
            raise RunError(f"cache_reuse is a number of tokens (0: off), got {cache_reuse}")
        if n_ctx_seq is not None and not 1 <= n_ctx_seq <= llama.n_ctx:
            raise RunError(f"n_ctx_seq must be 1..n_ctx = {llama.n_ctx}, got {n_ctx_seq}")
        self.llama = llama
        # a request's numbers depend on neither the requests decoded beside it nor the
        # prefix it found cached (ModelRunner.set_batch_invariant)
        llama.set_batch_invariant(True)
        # a step has at most one output per slot: prompt steps beside a few decodes or
        # many are two shapes, not one per count (ModelRunner.set_step_outputs)
        llama.set_step_outputs(n_parallel)
        self.n_parallel = n_parallel
        self.n_batch = n_batch or llama.n_batch
        self.similarity = similarity
        self.n_ctx_seq = n_ctx_seq or llama.n_ctx
        if prompt_cache is not None and prompt_cache < 0:
            raise RunError(f"prompt_cache is a number of cells (0: none), got {prompt_cache}")
        self.stats = EngineStats()
        cache = (
            PromptCache(llama.kv, range(n_parallel, MAX_SEQUENCES), prompt_cache)
            if prompt_cache != 0 and n_parallel < MAX_SEQUENCES
            else None
        )
        if cache is not None:
            bound = "no bound" if prompt_cache is None else f"at most {prompt_cache} cells"
            n_entries = MAX_SEQUENCES - n_parallel
            log.debug("prompt cache: %d entries, %s beyond the slots'", n_entries, bound)
            if cache_idle_slots:  # llama-server's suite looks for this tag in its debug log
                log.debug("idle slots will be saved to the prompt cache and cleared when a "
                          "request starts (__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__)")  # fmt: skip
        self.scheduler = Scheduler(
            llama.kv,
            n_parallel,
            self.n_batch,
            max_prefill_tokens=max_prefill_tokens,
            similarity=similarity,
            encoder=llama.config.arch.encoder,
            vocab=llama.vocab,
            stats=self.stats,
            prompt_cache=cache,
            cache_idle_slots=cache_idle_slots,
            cache_reuse=cache_reuse,
        )
        self.executor = StepExecutor(llama)
        self.update = StepUpdate(
            self.scheduler, self.n_ctx_seq, llama.config.pooling, context_shift
        )
        self._lock = self.scheduler.lock  # guards the queue
        self._step_lock = threading.Lock()  # one step at a time
        self._wakeup = threading.Condition(self._lock)
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = False
        llama.reset()

    @property
    def slots(self) -> list[Slot]:
        """The slots, in sequence-id order (``job`` None: idle)."""
        return self.scheduler.slots

    @property
    def max_prefill_tokens(self) -> int | None:
        return self.scheduler.max_prefill_tokens

    # -- submitting --------------------------------------------------------------------------

    def submit(self, request: Request) -> RequestHandle:
        """Queue ``request``; thread-safe. A request that can never run (no prompt, a
        token outside the vocabulary, longer than the context, a bad ``max_tokens``)
        raises :class:`RequestError` here, naming what is wrong."""
        self._check(request)
        handle = RequestHandle(self, request, next(self._ids))
        self.scheduler.enqueue(Waiting(handle))
        self.wake()
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
        if len(requests) > 1 and any(r.slot is not None for r in requests):
            raise RequestError("a group runs in several slots: its requests cannot name one")
        prompt = [int(t) for t in requests[0].prompt]
        if any([int(t) for t in r.prompt] != prompt for r in requests[1:]):
            raise RequestError("the requests of a group must have the same prompt")
        handles = [RequestHandle(self, r, next(self._ids)) for r in requests]
        self.scheduler.enqueue(Waiting(handles[0], followers=handles[1:]))
        self.wake()
        return handles

    def _check(self, request: Request) -> None:
        try:
            prompt = np.asarray(request.prompt, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            raise RequestError(
                f"the prompt must be a list of token ids (ints), got {request.prompt!r:.80}"
            ) from None
        n_vocab, n_ctx = self.llama.config.n_vocab, self.n_ctx_seq
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
        if request.slot is not None and not 0 <= request.slot < self.n_parallel:
            raise RequestError(
                f"slot {request.slot} does not exist: the slots are 0..{self.n_parallel - 1}"
            )
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
        """Build the steps a server runs first (:meth:`StepExecutor.warm_up
        <tensorplug_llm.engine.executor.StepExecutor.warm_up>`) before serving. Does
        nothing once the engine holds anything."""
        with self._step_lock:
            if self.scheduler.has_work() or self.llama.kv.n_used:
                return
            llama = self.llama
            # a prompt cache fills the cache: steps of every context length come back
            levels = len(llama.kv_widths()) + 1 if self.scheduler.cache else 0
            self.executor.warm_up(self.n_parallel, self.n_batch, levels)

    # -- a slot's state in a file ------------------------------------------------------------------

    def save_slot(self, index: int, path: Path, timeout: float = 600.0) -> tuple[int, int]:
        """Write slot ``index``'s tokens and their K/V rows to ``path``
        (:mod:`~tensorplug_llm.engine.slot_file`), once the slot is idle (waiting at most
        ``timeout`` seconds); the tokens saved and the bytes written."""
        with self._idle_slot(index, timeout) as slot:
            if not slot.cached:
                raise RequestError(f"slot {index} holds no tokens: there is nothing to save")
            cells = self.scheduler.cells_of(slot)
            k, v = read_rows(self.llama, cells)
            state = SlotState(np.asarray(slot.cached, dtype=np.int32), k, v)
            return len(slot.cached), write_slot_file(path, self.llama, state)

    def restore_slot(self, index: int, path: Path, timeout: float = 600.0) -> tuple[int, int]:
        """Load the state :meth:`save_slot` wrote into slot ``index`` (once idle), its
        tokens' cells taken from the free ones, then the prompt cache's and idle slots'
        (least recently used first); the tokens restored and the bytes read. A file that
        does not fit this model or the slot raises :class:`RequestError` and leaves the
        slot empty."""
        with self._idle_slot(index, timeout) as slot:
            self.scheduler.clear_slot(slot)
            try:
                state, size = read_slot_file(path, self.llama, self.n_ctx_seq)
            except SlotFileError as e:
                raise RequestError(f"{path.name}: {e}") from None
            n = int(state.tokens.size)
            cells = self.scheduler.take_cells(n)
            if cells is None:
                raise RequestError(
                    f"the KV cache has no room for the {n} tokens of {path.name} beside the "
                    "running requests: retry when they end, or use a larger context (-c)"
                )
            write_rows(self.llama, cells, state.k, state.v)
            self.scheduler.fill_slot(slot, cells, [int(t) for t in state.tokens])
            return n, size

    def erase_slot(self, index: int, timeout: float = 600.0) -> int:
        """Empty slot ``index`` (once idle); the tokens it held."""
        with self._idle_slot(index, timeout) as slot:
            n = len(slot.cached)
            self.scheduler.clear_slot(slot)
            return n

    @contextlib.contextmanager
    def _idle_slot(self, index: int, timeout: float) -> Iterator[Slot]:
        """Slot ``index``, held idle between steps (the step lock taken) for the caller;
        waits while a request runs in it, as llama-server defers a slot action."""
        if not 0 <= index < self.n_parallel:
            raise RequestError(f"Invalid slot ID: {index} (the slots are 0..{self.n_parallel - 1})")
        deadline = time.monotonic() + timeout
        while True:
            with self._step_lock:
                slot = self.slots[index]
                if slot.job is None:
                    self.llama.restore()  # asleep: the model first
                    yield slot
                    return
            if time.monotonic() > deadline:
                raise RequestError(f"slot {index} stayed busy for {timeout:g} s")
            time.sleep(0.01)

    # -- LoRA ------------------------------------------------------------------------------------

    def set_lora_scales(self, scales: Sequence[float], timeout: float = 600.0) -> None:
        """Apply the model's LoRA adapters at ``scales`` to the requests admitted from
        now on (llama-server's ``POST /lora-adapters``). A request keeps the scales it
        started with, as on llama-server: admission pauses until the running requests
        end (at most ``timeout`` seconds), then the scales change and what the slots and
        the prompt cache held is dropped (its K/V were computed with the old ones)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self.scheduler.paused = True
        try:
            while True:
                with self._step_lock:
                    if self.scheduler.n_running == 0:
                        self.llama.set_lora_scales(scales)
                        self.scheduler.forget_cached()
                        return
                if time.monotonic() > deadline:
                    raise RequestError(
                        f"requests were still running after {timeout:g} s: the LoRA scales "
                        "are unchanged"
                    )
                time.sleep(0.01)
        finally:
            with self._lock:
                self.scheduler.paused = False
            self.wake()

    # -- asleep ----------------------------------------------------------------------------------

    @property
    def unloaded(self) -> bool:
        """Whether the model's memory is given back (:meth:`unload`)."""
        return self.llama.released

    def unload(self) -> bool:
        """Give the model's memory back while nothing runs or waits (a server asleep,
        llama-server's ``--sleep-idle-seconds``): the weights, the KV cache and what the
        slots and the prompt cache held. Returns False, changing nothing, when some
        request is queued or running. The next step loads the model again
        (:meth:`reload`), so a request submitted meanwhile is served all the same."""
        with self._step_lock:
            with self._lock:
                if self.scheduler.has_work():
                    return False
            self.scheduler.forget_cached()
            self.llama.release()
            return True

    def reload(self) -> None:
        """Take the model's memory again after :meth:`unload` (nothing if it has it)."""
        with self._step_lock:
            self.llama.restore()

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
                while not self._stop and not self.scheduler.has_work():
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
                    error = RequestError(f"the engine's step failed: {cause}")
                    self.update.fail(slot.job, error, cause)

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
                    self.update.finish(slot.job, "cancelled")
            for entry in self.scheduler.drain():
                for handle in entry.handles:
                    self.stats.requests_cancelled += 1
                    handle.end("cancelled")
        self.update.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the cache holds ------------------------------------------------------------------

    @property
    def n_running(self) -> int:
        return self.scheduler.n_running

    @property
    def n_waiting(self) -> int:
        """Requests queued; thread-safe (the server asks it for every request while
        other threads submit)."""
        return self.scheduler.n_waiting()

    def cached_tokens(self) -> int:
        """Tokens idle slots and the prompt cache hold for prefix reuse (a cell shared
        by two counts twice)."""
        cache = self.scheduler.cache
        held = cache.n_tokens() if cache is not None else 0
        return held + sum(len(s.cached) for s in self.slots if s.job is None)

    # -- one step -----------------------------------------------------------------------------

    def step(self) -> bool:
        """One step: plan it (cancelled requests leave, waiting ones are admitted, the
        decodes and prompt chunks chosen), run it, apply its results (sample, emit
        events, end requests). Returns whether there was anything to do."""
        with self._step_lock:
            self.llama.restore()  # after unload: the model first (nothing when loaded)
            plan = self.scheduler.schedule()
            self.update.dropped(plan)
            if not plan.busy:
                return False
            masks = self.update.masks(plan)
            out = self.executor.execute(plan)
            self.update.apply(plan, out, masks)
            self.stats.steps += 1
            chunks = (*plan.decodes, *plan.prefills, *plan.embeds)
            self.stats.slot_steps += len({c.job.slot.seq for c in chunks})
            return True

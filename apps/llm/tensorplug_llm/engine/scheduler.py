"""The scheduling policy: the queue, the slots and the KV cells in, one step's plan out.

:meth:`Scheduler.schedule` is vLLM v1's ``Scheduler.schedule()`` in our names. It reads
and moves bookkeeping only — the queue, the slots, the cells' :class:`KVCells` (no
model, no tensor) — and returns a :class:`StepPlan`: which requests decode a token,
which prompt chunks are evaluated and how many tokens each, which requests were
cancelled, preempted or failed. The executor runs the plan on the model; the update
applies its results. So the policy is testable with no model at all.

The policy, in the order a step applies it:

1. **Cancelled requests go first**: queued ones leave the queue, running ones free their
   slot (their cells stay cached for prefix reuse).
2. **Admission, first come first served.** The request at the head of the queue takes
   an idle slot (the one whose cached tokens share the longest prefix with its prompt,
   at least ``similarity`` of it; ties: least recently used) and shares a longer
   prefix another slot or the prompt cache holds (``seq_cp``). What the slot held
   beyond the prefix it keeps goes to the prompt cache (when there is one); with
   ``cache_idle_slots`` so does every other idle slot's, and those slots are cleared.
   A request that names its slot (``Request.slot``, llama-server's ``id_slot``) takes
   that one, and while it is busy the requests behind pass it. With ``cache_reuse``
   (llama-server's ``--cache-reuse N``) the slot's cached tokens past the common prefix
   are searched for runs of at least N tokens the prompt has next, in order: each moves
   to its place in the prompt (its cells' positions shift; the runner re-ropes their K
   rows before the next step reads them), the cells between are let go, and the prompt
   is evaluated from the end of the last run moved. A conversation edited in its middle
   keeps what follows the edit. It *waits*, and every
   request behind it
   with it (no overtaking: first come first served), while
   - no slot is idle (a group of choices waits for as many idle slots as it has),
   - a running request is still evaluating a longer prefix of its prompt (it shares
     it once it is cached, rather than computing it twice), or
   - requests are running and the cache cannot take the rest of its prompt beside
     theirs (cells of idle slots count as free: they are evicted, least recently used
     first).
3. **Room for the step.** Every decoding request needs one cell. If the running
   requests outgrow the cache, the prompt cache's entries and idle slots give their
   cells up first (least recently used first), then the most
   recently admitted running request is *preempted* (vLLM's recompute preemption): it
   goes back to the head of the queue with its state and resumes later from what
   stayed cached. The oldest request is never preempted for a younger one, so one
   request always progresses.
4. **Decodes first.** The next token of every generating request is in the step: a
   running stream never waits for a prompt.
5. **Prompt chunks within the budget (chunked prefill).** The step's tokens are at most
   ``n_batch`` (``-b`` / ``-ub``), the running decodes included. Beside running
   decodes a step carries at most ``max_prefill_tokens`` prompt tokens (default: the
   whole rest of ``n_batch``, as llama-server does); with no decode running, a prompt
   takes the whole ``n_batch``. The chunks go to the admitted prompts oldest first; a
   prompt longer than what is left is split and goes on in the next steps. An
   embedding's tokens count in the same budget; an encoder's text is never split (its
   attention sees the whole text).

How decode latency is protected: the decodes are always in the step, and the prompt
tokens beside them are bounded, so a step's cost — the gap between two tokens of every
running stream — is bounded by ``max_prefill_tokens`` rows of prompt however long the
new prompts are; a smaller bound is a smoother stream and a later first token for the
new request. The bound that serves a deployment best is measured, not guessed:
``benchmarks/bench_serve.py`` prints time to first token and inter-token latency at
each ``-np``.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.errors import RunError

from ..kv_cells import KVCells
from ..prefix import common_prefix
from ..request import GreedySampler, RequestError, RequestHandle
from ..tokenizer import StreamDecoder
from .prompt_cache import PromptCache
from .state import EngineStats, Job, Slot, Waiting

if TYPE_CHECKING:
    from ..tokenizer import Vocab

__all__ = ["Chunk", "Scheduler", "StepPlan"]

log = logging.getLogger("tensorplug.engine")


@dataclass(frozen=True)
class Chunk:
    """Consecutive tokens of one job, evaluated from position ``pos0`` of sequence
    ``seq``; ``logits``: its last token's logits are sampled (a decode token, or the
    last chunk of a prompt)."""

    job: Job
    seq: int
    pos0: int
    tokens: list[int]
    logits: bool


@dataclass
class StepPlan:
    """One step: what the executor evaluates and what the update ends.

    ``busy``: some request held a slot (a step was taken, even if the plan evaluates
    nothing: the room for it went to an older request)."""

    decodes: list[Chunk] = field(default_factory=list)
    prefills: list[Chunk] = field(default_factory=list)
    embeds: list[Chunk] = field(default_factory=list)
    cancelled: list[RequestHandle] = field(default_factory=list)
    failed: list[tuple[Job, RequestError]] = field(default_factory=list)
    preempted: list[Job] = field(default_factory=list)
    busy: bool = False

    @property
    def n_prefill_tokens(self) -> int:
        """Prompt (and embedding) tokens the step evaluates."""
        return sum(len(c.tokens) for c in (*self.prefills, *self.embeds))

    def sampled(self) -> list[tuple[Job, int]]:
        """Who samples which logits row: each flagged chunk's job, and the choices
        waiting for its prompt (they sample the same row with their own samplers)."""
        flagged = [c.job for c in (*self.decodes, *self.prefills) if c.logits]
        return [(j, row) for row, job in enumerate(flagged) for j in (job, *job.followers)]


class Scheduler:
    """The slots of one KV cache, the queue in front of them, and the policy above.

    ``kv``: the cache's cells (bookkeeping; the scheduler frees, shares and evicts
    cells, the executor fills them). ``n_batch``: tokens a step may carry.
    ``max_prefill_tokens``: prompt tokens a step may carry beside running decodes
    (None: what ``n_batch`` leaves). ``encoder``: the model is a bidirectional encoder
    (a text is evaluated whole). ``vocab``: the stop tokens and text decoder of new
    requests (None: no text, no default stop tokens).
    """

    def __init__(
        self,
        kv: KVCells,
        n_parallel: int,
        n_batch: int,
        *,
        max_prefill_tokens: int | None = None,
        similarity: float = 0.5,
        encoder: bool = False,
        vocab: Vocab | None = None,
        stats: EngineStats | None = None,
        prompt_cache: PromptCache | None = None,
        cache_idle_slots: bool = False,
        cache_reuse: int = 0,
    ) -> None:
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise RunError(
                f"max_prefill_tokens must be at least 1 (or None: what n_batch leaves), got "
                f"{max_prefill_tokens}"
            )
        self.kv = kv
        self.n_batch = n_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.similarity = similarity
        self.encoder = encoder
        self.vocab = vocab
        self.stats = stats if stats is not None else EngineStats()
        self.slots = [Slot(i) for i in range(n_parallel)]
        self.cache = prompt_cache
        self.cache_idle_slots = cache_idle_slots and prompt_cache is not None
        #: the shortest run of cached tokens moved to its place in a new prompt (0: none)
        self.cache_reuse = cache_reuse
        #: admission held (the engine changes what every new request runs with)
        self.paused = False
        self.waiting: deque[Waiting] = deque()
        #: guards ``waiting`` (submitting threads append, the step thread takes)
        self.lock = threading.Lock()
        self._tick = itertools.count()

    # -- the queue -------------------------------------------------------------------------

    def enqueue(self, entry: Waiting) -> None:
        """Queue ``entry`` at the tail; thread-safe."""
        with self.lock:
            self.waiting.append(entry)
            self.stats.requests_submitted += len(entry.handles)

    def drain(self) -> list[Waiting]:
        """Empty the queue; its entries, in order."""
        with self.lock:
            waiting, self.waiting = list(self.waiting), deque()
        return waiting

    @property
    def n_running(self) -> int:
        return sum(s.job is not None for s in self.slots)

    def n_waiting(self) -> int:
        """Requests queued; thread-safe."""
        with self.lock:
            waiting = list(self.waiting)
        return sum(len(e.handles) for e in waiting)

    def has_work(self) -> bool:
        """Whether a step has anything to do (the caller holds ``lock`` or does not care)."""
        waiting = bool(self.waiting) and not self.paused
        return waiting or any(s.job is not None for s in self.slots)

    # -- a slot's cells, for its state in a file ------------------------------------------------

    def cells_of(self, slot: Slot) -> np.ndarray:
        """The cells of ``slot``'s tokens, in position order (position ``p``'s at ``p``)."""
        kv = self.kv
        held = np.flatnonzero((kv.seqs & np.uint64(1 << slot.seq)) != 0)
        cells = held[np.argsort(kv.pos[held], kind="stable")]
        if cells.size != len(slot.cached) or not np.array_equal(
            kv.pos[cells], np.arange(cells.size)
        ):
            last = len(slot.cached) - 1
            raise RunError(f"slot {slot.seq}'s cells do not hold positions 0..{last}")
        return cells

    def clear_slot(self, slot: Slot) -> None:
        """``slot`` (idle) lets go of its cells."""
        self.kv.seq_rm(slot.seq)
        slot.cached.clear()
        slot.preempted = False

    def take_cells(self, n: int) -> np.ndarray | None:
        """``n`` free cells, made free as a step's are (the prompt cache's entries and
        idle slots give theirs, least recently used first) beside what the running
        requests will need; None when they cannot be."""
        needed = n + sum(len(s.job.pending) + 1 for s in self.slots if s.job is not None)
        self._make_room(needed)
        if self.kv.n_ctx - self.kv.n_used < needed:
            return None
        return self.kv.find_slot(n)

    def fill_slot(self, slot: Slot, cells: np.ndarray, tokens: list[int]) -> None:
        """``slot`` (emptied) now holds ``tokens`` at positions 0.., in ``cells``."""
        self.kv.assign(cells, np.arange(len(tokens)), [(slot.seq,)] * len(tokens))
        slot.cached[:] = tokens
        slot.last_used = next(self._tick)

    def forget_cached(self) -> None:
        """Idle slots and the prompt cache let go of every cell (the model's memory is
        about to go); only while nothing runs."""
        assert not any(s.job is not None for s in self.slots), "a request is running"
        for slot in self.slots:
            self.kv.seq_rm(slot.seq)
            slot.cached.clear()
            slot.preempted = False
        if self.cache is not None:
            self.cache.clear()

    # -- the plan ---------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """The next step's plan; the state moves as the plan says (cancelled requests
        leave, waiting ones are admitted, chunks are taken from the prompts)."""
        plan = StepPlan()
        self._reap_cancelled(plan)
        self._admit()
        jobs = [s.job for s in self.slots if s.job is not None]
        if not jobs:
            return plan
        plan.busy = True
        jobs = self._fit(jobs, plan)
        if jobs:
            self._take_chunks(jobs, plan)
        return plan

    def _take_chunks(self, jobs: list[Job], plan: StepPlan) -> None:
        """Decodes first, then prompt chunks oldest first within the budget (the
        module's policy, points 4 and 5)."""
        kv = self.kv
        decoding = [j for j in jobs if j.next_token is not None]
        budget = min(self.n_batch, kv.n_ctx - kv.n_used) - len(decoding)
        if decoding and self.max_prefill_tokens is not None:
            budget = min(budget, self.max_prefill_tokens)
        for job in decoding:
            assert job.next_token is not None
            seq = job.slot.seq
            plan.decodes.append(Chunk(job, seq, len(job.slot.cached), [job.next_token], True))
            job.next_token = None
        for job in sorted((j for j in jobs if j.pending), key=lambda j: j.admitted):
            if budget <= 0:
                break
            if self.encoder and len(job.pending) > budget:
                continue  # an encoder sees a text whole, in one step
            chunk, job.pending = job.pending[:budget], job.pending[budget:]
            p0 = len(job.slot.cached)
            budget -= len(chunk)
            self._count(job, p0, len(chunk))
            last = not job.embed and not job.pending
            (plan.embeds if job.embed else plan.prefills).append(
                Chunk(job, job.slot.seq, p0, chunk, last)
            )

    def _count(self, job: Job, p0: int, n: int) -> None:
        """Count ``n`` tokens evaluated from position ``p0``: those a preempted job had
        in the cache before as recomputed, new prompt tokens as prompt (a resumed job's
        last sampled token is neither: a decode step would have evaluated it)."""
        end = p0 + n
        again = max(0, min(end, job.evaluated) - p0)
        fresh = max(0, min(end, len(job.handle.request.prompt)) - max(p0, job.evaluated))
        self.stats.tokens_recomputed += again
        job.handle.prompt_tokens_evaluated += fresh
        self.stats.prompt_tokens_evaluated += fresh

    # -- 1. cancelled requests ---------------------------------------------------------------

    def _reap_cancelled(self, plan: StepPlan) -> None:
        with self.lock:
            for e in list(self.waiting):
                alive = [h for h in e.handles if not h.cancelled]
                plan.cancelled += [h for h in e.handles if h.cancelled]
                if not alive:
                    self.waiting.remove(e)
                elif len(alive) < len(e.handles):  # the next choice leads the group
                    e.handle, e.followers = alive[0], alive[1:]
        for slot in self.slots:
            if slot.job is not None and slot.job.handle.cancelled:
                plan.cancelled.append(slot.job.handle)
                self.release(slot.job)

    def release(self, job: Job) -> None:
        """``job`` ends: its slot goes idle, its cells stay cached (what they hold:
        ``slot.cached``; an embedding's go, they held its hidden states); its waiting
        choices go back to the queue."""
        job.slot.preempted = False
        self._requeue_followers(job)
        if job.leader is not None:
            job.leader.followers.remove(job)
            job.leader = None
        slot = job.slot
        if job.embed:
            self.kv.seq_rm(slot.seq)
            slot.cached.clear()
            job.hidden = []
        slot.job = None
        slot.last_used = next(self._tick)

    # -- 2. admission ---------------------------------------------------------------------

    def _admit(self) -> None:
        """Waiting requests into idle slots, first come first served (the module's
        policy, point 2). A preempted job resumes the same way, its prompt being what
        it had in the cache plus its last sampled token."""
        while True:
            with self.lock:
                entry = None if self.paused else self._next_entry()
                if entry is None:
                    return
            idle = [s for s in self.slots if s.job is None]
            if len(idle) < len(entry.handles):
                return  # a group is admitted whole: its choices share one prompt step
            handle = entry.handle
            prompt = entry.tokens()
            if handle.request.embed:
                if not self._admit_embedding(entry, idle, prompt):
                    return
                continue
            pinned = handle.request.slot
            slot = self.slots[pinned] if pinned is not None else self._best_slot(idle, prompt)
            limit = len(prompt) - 1  # the last prompt token is evaluated: its logits
            own = min(common_prefix(slot.cached, prompt), limit)
            donor = max(
                (s for s in (*self.slots, *self._entries()) if s is not slot),
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
            with self.lock:
                self.waiting.remove(entry)
            kv = self.kv
            size = handle.request.cache_reuse
            size = self.cache_reuse if size is None else size
            if not use_donor and size > 0 and not self.encoder:
                moved = self._reuse_chunks(slot, prompt, own, limit, size)
                if moved > own:  # the slot's content is the prompt's now: nothing to save
                    reuse = own = moved
                    kv.seq_rm(slot.seq, reuse)
                    del slot.cached[reuse:]
            loaded = donor is not None and use_donor and self._is_entry(donor)
            if loaded:  # the most recently used now: saving the slot's cannot evict it
                assert donor is not None
                donor.last_used = next(self._tick)
            self._keep_in_cache(slot, 0 if use_donor else own, reuse if loaded else 0)
            if use_donor:
                assert donor is not None
                kv.seq_rm(slot.seq)
                kv.seq_cp(donor.seq, slot.seq, 0, reuse)
                slot.cached[:] = prompt[:reuse]
            else:
                kv.seq_rm(slot.seq, reuse)
                del slot.cached[reuse:]
            if self.cache is not None:
                self.cache.trim()
            if entry.resumed is not None:
                job = entry.resumed
                job.slot, job.pending, job.next_token = slot, prompt[reuse:], None
                slot.job = job
                self._cache_idle_slots()
                continue
            handle.prompt_tokens_reused = reuse
            self.stats.prompt_tokens_reused += reuse
            handle.progress(reuse, reuse)
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
            self._cache_idle_slots()

    def _reuse_chunks(self, slot: Slot, prompt: list[int], n_past: int, limit: int,
                      size: int) -> int:  # fmt: skip
        """llama-server's cache reuse past the common prefix ``n_past``: runs of at least
        ``size`` of the slot's cached tokens that the prompt has next move there (the
        cells between let go), as ``slot.cached`` records; returns where the prompt's
        evaluation starts. A run whose cells another sequence shares (a prompt cache
        entry, a fork) cannot move for this slot alone: the search ends there."""
        cached, kv = slot.cached, self.kv
        head_c = head_p = n_past
        while head_c < len(cached) and head_p < limit:
            n = 0
            while (head_c + n < len(cached) and head_p + n < limit
                   and cached[head_c + n] == prompt[head_p + n]):  # fmt: skip
                n += 1
            if n < size:
                head_c += 1
                continue
            if kv.is_shared(slot.seq, head_c, head_c + n):
                break
            log.debug("slot %d: reusing a chunk of %d tokens, shifting the KV cache [%d, %d) "
                      "-> [%d, %d)", slot.seq, n, head_c, head_c + n, head_p,
                      head_p + n)  # fmt: skip
            kv.seq_rm(slot.seq, head_p, head_c)
            kv.seq_add(slot.seq, head_c, head_c + n, head_p - head_c)
            cached[head_p : head_p + n] = cached[head_c : head_c + n]
            head_c, head_p = head_c + n, head_p + n
        return head_p

    def _is_entry(self, record: Slot) -> bool:
        """Whether ``record`` is a prompt cache entry rather than a slot."""
        return self.cache is not None and self.cache.holds(record)

    def _next_entry(self) -> Waiting | None:
        """The request admission considers (the caller holds ``lock``): the head of the
        queue, passing over requests that must run in a slot still busy (llama-server's
        ``id_slot``; they keep their place, and go first once it is idle)."""
        for entry in self.waiting:
            pinned = entry.handle.request.slot
            if pinned is None or self.slots[pinned].job is None:
                return entry
        return None

    def _entries(self) -> list[Slot]:
        """The prompt cache's entries (none without a cache)."""
        return self.cache.entries if self.cache is not None else []

    def _keep_in_cache(self, slot: Slot, kept: int, loaded: int) -> None:
        """The prompt cache's part in a request's admission into ``slot``: before the
        slot drops what it holds past its first ``kept`` tokens, the cache keeps it (the
        conversation it held may come back); ``loaded``: the request's prefix the cache
        gave it (0: none)."""
        if self.cache is None:
            return
        saved = len(slot.cached) > kept and self.cache.save(slot)
        if len(slot.cached) <= kept and not loaded:
            return
        log.debug(
            "updating prompt cache: slot %d's %d tokens %s, %d prompt tokens loaded; %d "
            "entries hold %d tokens (%d cells no slot holds)",
            slot.seq, len(slot.cached), "saved" if saved else "not saved", loaded,
            len(self.cache), self.cache.n_tokens(), self.cache.cells_alone(),
        )  # fmt: skip

    def _cache_idle_slots(self) -> None:
        """A request has started: every other idle slot's tokens go to the prompt cache
        and the slot is cleared (llama-server's ``--cache-idle-slots``). The tokens stay
        where they were, in the entry's cells; the next request finds them there
        whichever slot it takes. A preempted request's slot keeps its cells (they are
        evicted from the tail, for it to resume from the rest)."""
        if not self.cache_idle_slots:
            return
        assert self.cache is not None
        for slot in self.slots:
            if slot.job is not None or slot.preempted or not slot.cached:
                continue
            if self.cache.save(slot):
                # llama-server's suite looks for this tag in the server's debug log
                log.debug(
                    "slot %d: idle, its %d tokens saved to the prompt cache and cleared "
                    "(__TEST_TAG_CACHE_IDLE_SLOT__)", slot.seq, len(slot.cached),
                )  # fmt: skip
            self.kv.seq_rm(slot.seq)
            slot.cached.clear()
        self.cache.trim()

    def _admit_embedding(self, entry: Waiting, idle: list[Slot], tokens: list[int]) -> bool:
        """An embedding into the idle slot whose cache matters least (empty, else least
        recently used), once the cache can take all its tokens: it needs every token's
        hidden state, so no cached prefix is of use to it."""
        slot = min(idle, key=lambda s: (bool(s.cached), s.last_used))
        if self.n_running and self._spare(slot, None, 0) < len(tokens):
            return False
        with self.lock:
            self.waiting.remove(entry)
        self.kv.seq_rm(slot.seq)
        slot.cached.clear()
        job = entry.resumed or self._new_job(entry.handle, slot, [])
        job.slot, job.pending, job.hidden = slot, tokens, []
        slot.job = job
        return True

    def _new_job(self, handle: RequestHandle, slot: Slot, pending: list[int]) -> Job:
        request, vocab = handle.request, self.vocab
        return Job(
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

    def _spare(self, slot: Slot, donor: Slot | None, kept: int) -> int:
        """Cells a request entering ``slot`` (keeping its first ``kept`` positions)
        could have: the free ones, those only other idle slots hold (they can be
        evicted), the slot's own beyond ``kept``; less what the running requests'
        unevaluated prompts and next tokens will take."""
        kv = self.kv
        others = [
            s.seq
            for s in (*self.slots, *self._entries())
            if s.job is None and s is not slot and s is not donor
        ]
        spare = kv.n_ctx - kv.n_used + kv.n_held_only_by(others)
        spare += kv.n_held_only_by([slot.seq], kept)
        return spare - sum(len(s.job.pending) + 1 for s in self.slots if s.job is not None)

    def _best_slot(self, idle: list[Slot], prompt: list[int]) -> Slot:
        """The idle slot with the longest common prefix (ties: least recently used). A
        prefix shorter than ``similarity`` of the prompt counts as none (llama-server's
        rule): a shared BOS or a word must not make a request overwrite a slot whose
        cache another conversation will want."""

        def useful(slot: Slot) -> int:
            n = common_prefix(slot.cached, prompt)
            return n if n >= self.similarity * len(prompt) else 0

        return max(idle, key=lambda s: (useful(s), -s.last_used))

    # -- 3. room for the step -----------------------------------------------------------------

    def _make_room(self, needed: int) -> None:
        """Free cells for ``needed`` tokens: the prompt cache's entries and idle slots
        give up theirs, least recently used first (a preempted job's slot, the most
        recent, only its tail: as many cells as are missing). Running requests are never
        touched here."""
        kv = self.kv
        for slot in sorted((*self.slots, *self._entries()), key=lambda s: s.last_used):
            short = needed - (kv.n_ctx - kv.n_used)
            if short <= 0:
                return
            if self.cache is not None and self._is_entry(slot):
                self.cache.drop(slot)
            elif slot.job is None and slot.cached:
                keep = self._tail_kept(slot, short) if slot.preempted else 0
                kv.seq_rm(slot.seq, keep)
                del slot.cached[keep:]
                self.stats.slots_evicted += keep == 0

    def _tail_kept(self, slot: Slot, short: int) -> int:
        """The longest prefix of ``slot`` whose removal beyond frees ``short`` cells (a
        cell shared with another sequence frees nothing); 0 if none does."""
        kv, lo, hi = self.kv, 0, len(slot.cached)
        if kv.n_held_only_by([slot.seq], 0) < short:
            return 0
        while lo < hi:  # cells freed by removing positions >= k fall as k grows
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if kv.n_held_only_by([slot.seq], mid) >= short else (lo, mid - 1)
        return lo

    def _fit(self, jobs: list[Job], plan: StepPlan) -> list[Job]:
        """The jobs that can step, after freeing cells for them: idle slots' first (LRU),
        then the newest running jobs' (preempted, back to the queue) until every
        generating job has a cell for its next token and, when none generates, the
        oldest prompt has one for a chunk. One job alone always fits (the context holds
        its prompt, and generation ends when the context is full), so the oldest job
        always progresses: no livelock."""
        kv = self.kv
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
                error = RequestError(
                    f"the request needs {held + wanted} KV cells and the context holds "
                    f"{kv.n_ctx} (n_ctx): use a larger context (-c) or fewer tokens"
                )
                self.release(newest)
                plan.failed.append((newest, error))
                return []
            for gone in (newest, *newest.followers):
                jobs.remove(gone)
            self._preempt(newest)
            plan.preempted.append(newest)

    def _preempt(self, job: Job) -> None:
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
            self.kv.seq_rm(slot.seq)
            slot.cached.clear()
        job.preempted += 1
        self.stats.preemptions += 1
        self._requeue_followers(job)
        with self.lock:
            self.waiting.appendleft(Waiting(job.handle, job))

    def _requeue_followers(self, leader: Job) -> None:
        """A leader leaves before its prompt is done (preempted, cancelled, failed): its
        waiting choices have done nothing yet, so they go back to the head of the queue
        as a group of their own (sharing whatever of the prompt is cached)."""
        followers, leader.followers = leader.followers, []
        for f in followers:
            f.slot.job = None
            f.leader = None
        if followers:
            with self.lock:
                self.waiting.appendleft(
                    Waiting(followers[0].handle, followers=[f.handle for f in followers[1:]])
                )

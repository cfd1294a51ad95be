"""The engine's scheduling policy, without a model: the plans for given queues.

A step here is the engine's with the model replaced by what its decode does to the
cache's bookkeeping (the chunks' cells taken at their positions) and logits that pick
token 9: the scheduler plans, the real :class:`StepUpdate` applies the results.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorplug.errors import RunError
from tensorplug_llm.engine import Scheduler, StepOutput, StepPlan, StepUpdate
from tensorplug_llm.engine.prompt_cache import PromptCache
from tensorplug_llm.engine.state import Waiting
from tensorplug_llm.kv_cells import MAX_SEQUENCES, KVCells
from tensorplug_llm.request import Request, RequestHandle

TOKEN = 9
N_VOCAB = 16
NONE: frozenset[int] = frozenset()


class _Caller:
    """A handle's engine as the scheduler's tests need it: the test drives the steps."""

    loop_running = True

    def step(self) -> bool:
        return False

    def wake(self) -> None:
        """Nothing to wake: the test steps."""


class _Bench:
    """A scheduler and its update over a cache of ``n_ctx`` cells."""

    def __init__(
        self,
        n_parallel: int,
        n_ctx: int,
        n_batch: int,
        max_prefill_tokens: int | None = None,
        *,
        cache_cells: int | None = 0,
        cache_idle_slots: bool = False,
        n_ctx_seq: int | None = None,
        context_shift: bool = False,
        cache_reuse: int = 0,
    ) -> None:
        cells = KVCells(n_ctx)
        cache = (
            PromptCache(cells, range(n_parallel, MAX_SEQUENCES), cache_cells)
            if cache_cells != 0
            else None
        )
        self.sched = Scheduler(
            cells, n_parallel, n_batch, max_prefill_tokens=max_prefill_tokens,
            prompt_cache=cache, cache_idle_slots=cache_idle_slots, cache_reuse=cache_reuse,
        )  # fmt: skip
        self.update = StepUpdate(self.sched, n_ctx_seq or n_ctx, "none", context_shift)
        self._ids = 0

    def submit(self, n_prompt: int, max_tokens: int = 50) -> RequestHandle:
        # distinct first tokens: no prompt shares a prefix with another
        prompt = [self._ids % N_VOCAB, *(1 + i % 5 for i in range(n_prompt - 1))]
        return self.submit_prompt(prompt, max_tokens)

    def submit_prompt(self, prompt: list[int], max_tokens: int = 50) -> RequestHandle:
        handle = RequestHandle(_Caller(), Request(prompt, max_tokens, stop_tokens=NONE), self._ids)
        self._ids += 1
        self.sched.enqueue(Waiting(handle))
        return handle

    def step(self) -> StepPlan:
        plan = self.sched.schedule()
        self.update.dropped(plan)
        masks = self.update.masks(plan)
        kv = self.sched.kv
        for c in (*plan.decodes, *plan.prefills):  # what the model's decode records
            n = len(c.tokens)
            kv.assign(kv.find_slot(n), np.arange(c.pos0, c.pos0 + n), [(c.seq,)] * n)
        logits = np.zeros((sum(c.logits for c in (*plan.decodes, *plan.prefills)), N_VOCAB))
        logits[:, TOKEN] = 1.0
        self.update.apply(plan, StepOutput(logits=logits), masks)
        return plan


def _shape(plan: StepPlan) -> tuple[list[int], list[tuple[int, int]]]:
    """(request ids decoding, [(request id, prompt tokens)] in the step's order)."""
    return (
        [c.job.handle.id for c in plan.decodes],
        [(c.job.handle.id, len(c.tokens)) for c in plan.prefills],
    )


def test_decodes_first_then_prompt_chunks_oldest_first_within_the_budget() -> None:
    bench = _Bench(n_parallel=4, n_ctx=256, n_batch=16)
    a, b = bench.submit(5), bench.submit(5)
    assert _shape(bench.step()) == ([], [(0, 5), (1, 5)])
    bench.submit(20), bench.submit(20)  # new requests while two decode
    assert _shape(bench.step()) == ([0, 1], [(2, 14)])  # 16 - 2 decodes
    assert _shape(bench.step()) == ([0, 1], [(2, 6), (3, 8)])  # the oldest prompt first
    assert _shape(bench.step()) == ([0, 1, 2], [(3, 12)])  # 2's prompt done: it decodes
    assert _shape(bench.step()) == ([0, 1, 2, 3], [])
    assert a.tokens == b.tokens == [TOKEN] * 5


def test_prompt_tokens_beside_decodes_are_bounded_by_max_prefill_tokens() -> None:
    bench = _Bench(n_parallel=2, n_ctx=256, n_batch=16, max_prefill_tokens=4)
    bench.submit(12)
    assert _shape(bench.step()) == ([], [(0, 12)])  # nothing decodes: the whole budget
    long = bench.submit(10)
    plans = [_shape(bench.step()) for _ in range(4)]
    assert plans == [([0], [(1, 4)]), ([0], [(1, 4)]), ([0], [(1, 2)]), ([0, 1], [])]
    assert long.prompt_tokens_evaluated == 10


def test_without_max_prefill_tokens_a_prompt_takes_what_the_decodes_leave() -> None:
    bench = _Bench(n_parallel=2, n_ctx=256, n_batch=16)
    bench.submit(12)
    bench.step()
    bench.submit(30)
    assert [_shape(bench.step()) for _ in range(2)] == [([0], [(1, 15)]), ([0], [(1, 15)])]


def test_a_request_waits_for_an_idle_slot_first_come_first_served() -> None:
    bench = _Bench(n_parallel=1, n_ctx=256, n_batch=16)
    first = bench.submit(4, max_tokens=2)
    second, third = bench.submit(3), bench.submit(3)
    assert _shape(bench.step()) == ([], [(0, 4)])
    assert bench.sched.n_waiting() == 2
    assert _shape(bench.step()) == ([0], [])  # its second token ends it
    assert first.done and first.finish_reason == "length"
    assert _shape(bench.step()) == ([], [(1, 3)])  # the older of the two waiting
    assert bench.sched.n_waiting() == 1 and not third.done and not second.done


def test_a_request_the_cache_cannot_hold_beside_the_running_ones_waits_and_blocks_later_ones() -> (
    None
):
    bench = _Bench(n_parallel=3, n_ctx=24, n_batch=32)
    bench.submit(12, max_tokens=3)
    assert _shape(bench.step()) == ([], [(0, 12)])
    bench.submit(11)  # 12 cells + the next token held: 11 free, it needs 11 + 1 more
    bench.submit(2)  # would fit, but comes later
    assert _shape(bench.step()) == ([0], [])
    assert bench.sched.n_waiting() == 2
    bench.step()  # request 0's third token: it ends, its cells stay cached (evictable)
    assert _shape(bench.step()) == ([], [(1, 11)])  # request 0's cached cells make room
    assert bench.sched.stats.slots_evicted == 1
    assert _shape(bench.step()) == ([1], [(2, 2)])


def test_running_requests_that_outgrow_the_cache_preempt_the_newest() -> None:
    bench = _Bench(n_parallel=2, n_ctx=16, n_batch=16)
    old, new = bench.submit(6), bench.submit(6)
    assert _shape(bench.step()) == ([], [(0, 6), (1, 6)])  # 12 cells used
    for _ in range(2):
        assert _shape(bench.step()) == ([0, 1], [])  # 14, then 16: the cache is full
    plan = bench.step()
    assert [j.handle for j in plan.preempted] == [new]
    assert _shape(plan) == ([0], [])  # the oldest goes on in the newest's cells
    assert bench.sched.n_waiting() == 1 and not new.done
    assert bench.sched.stats.preemptions == 1 and len(old.tokens) == 4


def test_cancelled_requests_leave_the_queue_and_their_slots() -> None:
    bench = _Bench(n_parallel=1, n_ctx=64, n_batch=16)
    running, queued, after = bench.submit(4), bench.submit(4), bench.submit(3)
    bench.step()
    running.cancel()
    queued.cancel()
    plan = bench.step()
    assert plan.cancelled == [queued, running]
    assert running.finish_reason == queued.finish_reason == "cancelled"
    assert _shape(plan) == ([], [(2, 3)])  # the slot is free for the next one
    assert bench.sched.stats.requests_cancelled == 2
    assert after.prompt_tokens_evaluated == 3


def test_a_plan_with_nothing_to_run_is_not_busy() -> None:
    bench = _Bench(n_parallel=2, n_ctx=64, n_batch=16)
    plan = bench.step()
    assert not plan.busy and _shape(plan) == ([], [])


def test_max_prefill_tokens_below_one_is_refused_with_the_fix() -> None:
    with pytest.raises(RunError, match="max_prefill_tokens must be at least 1"):
        Scheduler(KVCells(8), 1, 8, max_prefill_tokens=0)


# -- the prompt cache ----------------------------------------------------------------------------

#: three prompts with no common prefix, of 12 tokens each
PROMPT_A = [1, *range(2, 13)]
PROMPT_B = [2, *range(2, 13)]
PROMPT_C = [3, *range(2, 13)]


def _run(bench: _Bench, prompt: list[int], max_tokens: int = 2) -> RequestHandle:
    """``prompt`` submitted and stepped to its end; its handle."""
    handle = bench.submit_prompt(prompt, max_tokens)
    while bench.sched.has_work():
        bench.step()
    assert handle.tokens == [TOKEN] * max_tokens
    return handle


def test_without_a_prompt_cache_one_slot_keeps_only_its_last_prompt() -> None:
    bench = _Bench(n_parallel=1, n_ctx=256, n_batch=64)
    _run(bench, PROMPT_A), _run(bench, PROMPT_B)
    again = _run(bench, PROMPT_A)
    assert again.prompt_tokens_reused == 0 and again.prompt_tokens_evaluated == 12


def test_the_prompt_cache_finds_a_prompt_the_slot_let_go_of() -> None:
    bench = _Bench(n_parallel=1, n_ctx=256, n_batch=64, cache_cells=None)
    first = _run(bench, PROMPT_A)
    _run(bench, PROMPT_B), _run(bench, PROMPT_C)  # A's slot overwritten twice
    cache = bench.sched.cache
    assert cache is not None and sorted(e.cached[0] for e in cache.entries) == [1, 2]
    again = _run(bench, PROMPT_A)
    # everything but the last prompt token (its logits are needed) comes from the cache
    assert again.prompt_tokens_reused == 11 and again.prompt_tokens_evaluated == 1
    assert first.prompt_tokens_evaluated == 12
    # a longer prompt that begins with a cached one takes that prefix too
    longer = _run(bench, [*PROMPT_B, *range(5, 10)])
    assert longer.prompt_tokens_reused == 12


def test_an_entry_holding_a_prompt_the_slot_extends_is_replaced_by_it() -> None:
    bench = _Bench(n_parallel=1, n_ctx=256, n_batch=64, cache_cells=None)
    _run(bench, PROMPT_A)
    _run(bench, PROMPT_B)  # A (and its 2 generated tokens) saved
    _run(bench, [*PROMPT_A, TOKEN, TOKEN, 4, 4])  # a conversation's next turn
    _run(bench, PROMPT_C)
    cache = bench.sched.cache
    assert cache is not None
    held = sorted(len(e.cached) for e in cache.entries if e.cached[0] == 1)
    assert held == [17]  # the longer A replaced the shorter: one entry per conversation


def test_the_prompt_cache_keeps_at_most_its_cells_dropping_the_least_recently_used() -> None:
    # each finished request holds 12 + 2 - 1 = 13 cells (its last token is not evaluated)
    bench = _Bench(n_parallel=1, n_ctx=256, n_batch=64, cache_cells=30)
    for prompt in (PROMPT_A, PROMPT_B, PROMPT_C, [4, *range(2, 13)]):
        _run(bench, prompt)
    cache = bench.sched.cache
    assert cache is not None and cache.cells_alone() <= 30
    assert sorted(e.cached[0] for e in cache.entries) == [2, 3]  # A went first
    assert _run(bench, PROMPT_A).prompt_tokens_reused == 0
    assert _run(bench, PROMPT_C).prompt_tokens_reused == 11


def test_running_requests_evict_the_prompt_cache_before_they_wait() -> None:
    bench = _Bench(n_parallel=2, n_ctx=40, n_batch=64, cache_cells=None)
    for prompt in (PROMPT_A, PROMPT_B, PROMPT_C):
        _run(bench, prompt)
    kv = bench.sched.kv
    assert kv.n_used == 39  # three prompts of 13 cells each, two cached, one in a slot
    long = bench.submit_prompt([5, *range(2, 30)], max_tokens=4)
    plan = bench.step()
    assert [(c.job.handle.id, len(c.tokens)) for c in plan.prefills] == [(long.id, 29)]
    while bench.sched.has_work():
        bench.step()
    assert long.tokens == [TOKEN] * 4


def test_idle_slots_move_to_the_prompt_cache_when_a_request_starts() -> None:
    bench = _Bench(n_parallel=2, n_ctx=256, n_batch=64, cache_cells=None, cache_idle_slots=True)
    _run(bench, PROMPT_A)
    a_slot = next(s for s in bench.sched.slots if s.cached)
    _run(bench, PROMPT_B)  # starts in the other slot: A's is saved and cleared
    assert a_slot.cached == []
    cache = bench.sched.cache
    assert cache is not None and [e.cached[:12] for e in cache.entries] == [PROMPT_A]
    again = _run(bench, PROMPT_A)
    assert again.prompt_tokens_reused == 11


def test_a_request_naming_its_slot_runs_there_and_the_queue_passes_it_while_busy() -> None:
    bench = _Bench(n_parallel=2, n_ctx=256, n_batch=64)
    first = bench.submit_prompt(PROMPT_A, max_tokens=3)
    bench.step()
    (busy,) = [s.seq for s in bench.sched.slots if s.job is not None]
    pinned = RequestHandle(_Caller(), Request(PROMPT_B, 2, stop_tokens=NONE, slot=busy), 100)
    bench.sched.enqueue(Waiting(pinned))
    later = bench.submit_prompt(PROMPT_C, max_tokens=2)
    plan = bench.step()  # the named slot is busy: the request behind goes first
    assert [c.job.handle for c in plan.prefills] == [later]
    assert [e.handle for e in bench.sched.waiting] == [pinned]
    while bench.sched.has_work():
        bench.step()
    assert first.tokens == [TOKEN] * 3 and pinned.tokens == [TOKEN] * 2
    assert bench.sched.slots[busy].cached[: len(PROMPT_B)] == PROMPT_B  # it ran there


def test_a_full_slot_shifts_its_context_and_goes_on_when_asked() -> None:
    for shift in (False, True):
        bench = _Bench(n_parallel=1, n_ctx=64, n_batch=64, n_ctx_seq=16, context_shift=shift)
        handle = RequestHandle(
            _Caller(), Request(list(range(1, 9)), 20, stop_tokens=NONE, n_keep=2), 0
        )
        bench.sched.enqueue(Waiting(handle))
        while bench.sched.has_work():
            bench.step()
        slot = bench.sched.slots[0]
        if not shift:  # the slot's 16 cells hold 8 prompt tokens and 8 generated
            assert len(handle.tokens) == 9 and handle.finish_reason == "length"
            continue
        assert handle.tokens == [TOKEN] * 20 and handle.finish_reason == "length"
        assert bench.sched.stats.context_shifts >= 1
        # the first n_keep tokens survive every shift, and the cells hold positions 0..
        assert slot.cached[:2] == [1, 2] and len(slot.cached) < 16
        assert bench.sched.kv.seq_pos_max(slot.seq) == len(slot.cached) - 1
        assert handle.prompt_tokens_evaluated == 8  # the tail evaluated again is not prompt


def test_cache_reuse_moves_cached_runs_to_their_place_in_an_edited_prompt() -> None:
    """llama-server's ``--cache-reuse 4``: a conversation with a part cut out keeps the
    runs of at least 4 cached tokens that follow the cut; they move to their new
    positions (a K-shift the runner applies), the cells between are let go, and only
    the rest is evaluated. (As llama-server's, the search moves through the cache, not
    the prompt: text inserted before a run hides it.)"""
    old = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    edited = [1, 2, 3, 8, 9, 10, 11, 12, 13, 99, 15, 16, 17]  # 4..7 cut out, 14 edited
    for reuse, evaluated in ((0, 10), (4, 4)):
        bench = _Bench(n_parallel=1, n_ctx=64, n_batch=64, cache_reuse=reuse)
        bench.submit_prompt(old, max_tokens=1)
        while bench.sched.has_work():
            bench.step()
        kv, slot = bench.sched.kv, bench.sched.slots[0]
        bench.submit_prompt(edited, max_tokens=1)
        first = bench.sched.schedule()
        (chunk,) = first.prefills
        assert len(chunk.tokens) == evaluated, reuse
        if reuse:
            # 8..13 (6 tokens) moved from positions 7..12 to 3..8; the run 15, 16 is
            # shorter than 4: evaluated again, after 99
            assert chunk.pos0 == 9 and chunk.tokens == [99, 15, 16, 17]
            assert slot.cached[:9] == edited[:9]
            assert kv.seq_pos_max(slot.seq) == 8 and kv.has_shift
            cells, deltas = kv.take_shift()
            assert cells.size == 6 and deltas.tolist() == [-4] * 6
            assert first.prefills[0].job.handle.prompt_tokens_reused == 9


def test_cache_reuse_leaves_cells_another_sequence_shares() -> None:
    """A run whose cells the prompt cache also holds cannot move for one sequence: the
    prompt is evaluated past the common prefix, as without reuse."""
    bench = _Bench(n_parallel=1, n_ctx=64, n_batch=64, cache_cells=None, cache_reuse=2)
    old = [1, 2, 3, 4, 5, 6, 7, 8]
    bench.submit_prompt(old, max_tokens=1)
    while bench.sched.has_work():
        bench.step()
    slot = bench.sched.slots[0]
    bench.sched.kv.seq_cp(slot.seq, 5)  # another sequence shares every cell
    bench.submit_prompt([1, 2, 30, 4, 5, 6, 7, 8, 9], max_tokens=1)
    (chunk,) = bench.sched.schedule().prefills
    assert chunk.pos0 == 2 and len(chunk.tokens) == 7

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
from tensorplug_llm.engine.state import Waiting
from tensorplug_llm.kv_cells import KVCells
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
        self, n_parallel: int, n_ctx: int, n_batch: int, max_prefill_tokens: int | None = None
    ) -> None:
        cells = KVCells(n_ctx)
        self.sched = Scheduler(cells, n_parallel, n_batch, max_prefill_tokens=max_prefill_tokens)
        self.update = StepUpdate(self.sched, n_ctx, "none")
        self._ids = 0

    def submit(self, n_prompt: int, max_tokens: int = 50) -> RequestHandle:
        # distinct first tokens: no prompt shares a prefix with another
        prompt = [self._ids % N_VOCAB, *(1 + i % 5 for i in range(n_prompt - 1))]
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

"""Applying a step's results: cells recorded, tokens sampled and streamed, requests ended.

vLLM v1's ``update_from_output``. After the executor has run a plan, the update
records what the step put in each slot's cells, forks a finished prompt's cells to its
waiting choices (``seq_cp``), samples each flagged row with its request's sampler
(constraint masks are computed on a helper thread while the step runs:
:meth:`StepUpdate.masks`), delivers a :class:`TokenEvent` to the request's handle
(its streaming callback included), and ends the requests that stopped, reached their
length, failed or were cancelled. A finished embedding is pooled here.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..pooling import pool, pooling_kind
from ..request import RequestError, TokenEvent
from .executor import StepOutput
from .scheduler import Scheduler, StepPlan
from .state import Job

__all__ = ["StepUpdate"]


class StepUpdate:
    """Applies plans' results to ``scheduler``'s slots and the requests' handles.
    ``n_ctx``: a request whose slot holds that many tokens ends ("length"), or with
    ``context_shift`` drops half of what it holds past its ``n_keep`` first tokens and
    goes on (llama-server's ``--context-shift``); ``pooling``: the model file's pooling
    type (an embedding's default)."""

    def __init__(
        self, scheduler: Scheduler, n_ctx: int, pooling: str, context_shift: bool = False
    ) -> None:
        self.scheduler = scheduler
        self.stats = scheduler.stats
        self.n_ctx = n_ctx
        self.pooling = pooling
        self.context_shift = context_shift
        self._masks: ThreadPoolExecutor | None = None

    # -- ending requests ----------------------------------------------------------------------

    def finish(self, job: Job, reason: str, error: RequestError | None = None) -> None:
        """``job`` ends with ``reason``: its slot is released, its reader's iteration stops."""
        self.scheduler.release(job)
        job.handle.end(reason, error)

    def fail(self, job: Job, error: RequestError, cause: BaseException | None = None) -> None:
        if cause is not None:
            error.__cause__ = cause
        self.stats.requests_failed += 1
        self.finish(job, "error", error)

    def dropped(self, plan: StepPlan) -> None:
        """End what the plan left out: cancelled requests, and one the cache could not
        hold (the scheduler already released their slots)."""
        for handle in plan.cancelled:
            self.stats.requests_cancelled += 1
            handle.end("cancelled")
        for job, error in plan.failed:
            self.stats.requests_failed += 1
            job.handle.end("error", error)

    # -- a step's results ---------------------------------------------------------------------

    def masks(self, plan: StepPlan) -> list[Future[np.ndarray] | None]:
        """Each sampling job's allowed-token mask (:meth:`StepPlan.sampled`), started on a
        helper thread before the step runs (a mask depends only on the tokens accepted
        so far)."""
        jobs = [job for job, _ in plan.sampled()]
        if all(j.handle.request.constraint is None for j in jobs):
            return [None] * len(jobs)
        if self._masks is None:
            self._masks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tp-masks")
        return [
            self._masks.submit(c.allowed) if (c := j.handle.request.constraint) else None
            for j in jobs
        ]

    def apply(
        self, plan: StepPlan, out: StepOutput, masks: list[Future[np.ndarray] | None]
    ) -> None:
        """Record, sample and deliver what the step computed (``masks`` from
        :meth:`masks` on the same plan, before it ran)."""
        generation = [*plan.decodes, *plan.prefills]
        if generation:
            self._generated(plan, out, masks)
        if plan.embeds:
            self._embedded(plan, out)

    def _generated(
        self, plan: StepPlan, out: StepOutput, masks: list[Future[np.ndarray] | None]
    ) -> None:
        kv = self.scheduler.kv
        chunks = [*plan.decodes, *plan.prefills]
        samples = plan.sampled()
        if out.error is not None:
            cause = out.error
            for c in chunks:  # what the failed step left in their cells is unknown
                kv.seq_rm(c.seq)
                c.job.slot.cached.clear()
                self.fail(c.job, RequestError(f"the step failed: {cause}"), cause)
            return
        assert out.logits is not None
        for c in chunks:
            c.job.slot.cached.extend(c.tokens)
        for c in plan.prefills:  # a first evaluation's prompt (not a preempted one's redo)
            handle = c.job.handle
            if not handle.tokens:
                handle.progress(handle.prompt_tokens_reused, len(c.job.slot.cached))
        for c in chunks:
            job = c.job
            if not c.logits:
                continue
            for f in job.followers:  # the prompt is in the cache: the choices share it
                kv.seq_cp(job.slot.seq, f.slot.seq)
                f.slot.cached[:] = job.slot.cached
                f.leader = None
            job.followers = []
        for (job, row), mask in zip(samples, masks, strict=True):
            self._sample(job, out.logits[row], mask)

    def _embedded(self, plan: StepPlan, out: StepOutput) -> None:
        """Keep the chunks' hidden states; pool a finished embedding."""
        if out.embed_error is not None:
            for c in plan.embeds:
                error = RequestError(f"the step failed: {out.embed_error}")
                self.fail(c.job, error, out.embed_error)
            return
        assert out.hidden is not None
        row = 0
        for c in plan.embeds:
            job = c.job
            job.hidden.append(out.hidden[row : row + len(c.tokens)])
            row += len(c.tokens)
            job.slot.cached.extend(c.tokens)
            if job.pending:
                continue
            kind = pooling_kind(job.handle.request.pooling, self.pooling)
            job.handle.embedding = pool(np.concatenate(job.hidden), kind)
            self.stats.requests_finished += 1
            self.finish(job, "stop")

    def _sample(self, job: Job, logits: np.ndarray, mask: Future[np.ndarray] | None) -> None:
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
            self.fail(job, RequestError(f"sampling failed: {e}"), e)
            return
        job.n_generated += 1
        self.stats.generated_tokens += 1
        finish = None
        if token in job.stop_tokens or constraint_done:
            finish = "stop"
        elif job.n_generated == request.max_tokens:
            finish = "length"
        elif len(job.slot.cached) >= self.n_ctx:
            shifted = self.context_shift and self._shift(job)  # else the slot is full
            finish = None if shifted else "length"
        text = None
        if job.decoder is not None:
            text = "" if token in job.stop_tokens else job.decoder.feed(token)
            if finish is not None:
                text += job.decoder.flush()
        event = TokenEvent(token, text, picked.logprob, picked.top_logprobs, finish)
        try:
            job.handle.deliver(event)
        except Exception as e:  # on_event raised
            self.fail(job, RequestError(f"the request's on_event callback failed: {e}"), e)
            return
        if finish is not None:
            self.stats.requests_finished += 1
            self.finish(job, finish)
        elif job.pending:  # shifted: the kept tail is evaluated again, then this token
            job.pending.append(token)
        else:
            job.next_token = token

    def _shift(self, job: Job) -> bool:
        """llama.cpp's context shift of ``job``'s full slot: keep its first ``n_keep``
        tokens, drop half of the rest, and evaluate the remaining tail again at its new
        positions (as ``tensorplug run --context-shift``: the same numbers as a prompt of
        those tokens). False when there is nothing to drop."""
        request, slot = job.handle.request, job.slot
        held = len(slot.cached)
        keep = len(request.prompt) if request.n_keep < 0 else request.n_keep
        keep = min(max(keep, 0), held)
        n_discard = (held - keep) // 2
        if n_discard < 1:
            return False
        tail = slot.cached[keep + n_discard :]
        self.scheduler.kv.seq_rm(slot.seq, keep)
        del slot.cached[keep:]
        job.evaluated = max(job.evaluated, held)  # evaluated again, not new prompt
        job.pending = tail
        self.stats.context_shifts += 1
        return True

    def close(self) -> None:
        """Stop the mask helper thread."""
        if self._masks is not None:
            self._masks.shutdown()
            self._masks = None

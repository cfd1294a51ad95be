"""What the engine knows between steps: its slots, the jobs in them, its queue, its totals.

Plain records shared by the scheduler (which moves jobs between the queue and the
slots), the update (which applies a step's results to them) and the engine; none of
them holds a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..request import RequestHandle, TokenSampler
from ..tokenizer import StreamDecoder

__all__ = ["EngineStats", "Job", "Slot", "Waiting"]


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
    #: the slots each step computed for, summed over the steps
    slot_steps: int = 0
    #: times a full slot dropped half of its tokens and went on (context shift)
    context_shifts: int = 0


@dataclass
class Slot:
    """A sequence id of the KV cache, and the job running in it (None: idle)."""

    seq: int
    #: the tokens whose K/V the slot's cells hold, at positions 0 .. len - 1
    cached: list[int] = field(default_factory=list)
    job: Job | None = None
    last_used: int = -1
    #: its cells are a preempted job's: evicted from the tail, as few as needed, so the
    #: job resumes from the prefix that survives
    preempted: bool = False


@dataclass(eq=False)
class Job:
    """A request in a slot: its prompt still to evaluate, then generation."""

    handle: RequestHandle
    slot: Slot
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
    leader: Job | None = None
    #: the other choices of this job's prompt, forked when its last prompt token is done
    followers: list[Job] = field(default_factory=list)
    #: an embedding's final hidden states so far, a block per evaluated chunk
    hidden: list[np.ndarray] = field(default_factory=list)

    @property
    def embed(self) -> bool:
        return self.handle.request.embed


@dataclass
class Waiting:
    """A queue entry: a request (with ``followers``: other choices of its prompt,
    admitted with it), or a preempted job that resumes with its state."""

    handle: RequestHandle
    resumed: Job | None = None
    followers: list[RequestHandle] = field(default_factory=list)

    @property
    def handles(self) -> list[RequestHandle]:
        return [self.handle, *self.followers]

    def tokens(self) -> list[int]:
        """What the cache must hold for it to go on: the prompt, and for a resumed job
        the tokens it generated (the last one sampled but not yet evaluated)."""
        prompt = [int(t) for t in self.handle.request.prompt]
        return prompt + self.handle.tokens if self.resumed is not None else prompt

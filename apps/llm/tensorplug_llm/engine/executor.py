"""Running a step's plan on the model: the batches it describes, decoded.

The executor knows no policy: it turns a :class:`~.scheduler.StepPlan` into at most two
:meth:`ModelRunner.decode <tensorplug_llm.runner.ModelRunner.decode>` calls — one for the
generation tokens (decodes and prompt chunks, logits for the flagged rows), one for
the embedding chunks (their final hidden states) — and returns what came out, or the
error each raised. It also builds the first steps' graphs before serving (warm-up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..batch import Batch, BatchBuilder
from ..kv_cells import MAX_SEQUENCES
from ..runner import PADDED_OUTPUTS
from .scheduler import Chunk, StepPlan

if TYPE_CHECKING:
    from ..runner import ModelRunner

__all__ = ["WARM_UP_LEVELS", "WARM_UP_ROWS", "StepExecutor", "StepOutput"]


#: The largest prompt step :meth:`StepExecutor.warm_up` prepares: a chat turn's new
#: tokens, once a shared prefix is reused, are fewer; longer prompts pay for their graph
#: once, and computing a larger step costs more than building its graph.
WARM_UP_ROWS = 64
#: How many context widths (``n_kv``: :meth:`ModelRunner.kv_width
#: <tensorplug_llm.runner.ModelRunner.kv_width>`, the model's ``kv_pad`` doubled) the
#: warm-up builds its steps at: four reach 2048 cells of 256. A server's slots spread
#: their cells (and its prompt cache fills the cache) well before its requests are
#: long, so its steps soon read the widest widths; a width left out costs each step
#: shape a graph build on the first request that reaches it.
WARM_UP_LEVELS = 4


@dataclass
class StepOutput:
    """What a step's decodes returned: ``logits`` one row per flagged generation token
    (decodes first, then prompts' last chunks, in the plan's order), ``hidden`` one row
    per embedding token; ``error``/``embed_error`` what the decode raised instead."""

    logits: np.ndarray | None = None
    hidden: np.ndarray | None = None
    error: Exception | None = None
    embed_error: Exception | None = None


def build_batch(chunks: Sequence[Chunk], *, every_row: bool = False) -> Batch:
    """The chunks' tokens at their positions and sequences; logits for each flagged
    chunk's last token (``every_row``: for every token)."""
    batch = BatchBuilder()
    for c in chunks:
        last = len(c.tokens) - 1
        for i, tok in enumerate(c.tokens):
            batch.add(tok, c.pos0 + i, (c.seq,), logits=every_row or (c.logits and i == last))
    return batch.build()


class StepExecutor:
    """Executes plans on ``llama`` (whose ``kv`` the scheduler plans over)."""

    def __init__(self, llama: ModelRunner) -> None:
        self.llama = llama

    def execute(self, plan: StepPlan) -> StepOutput:
        """Decode the plan's generation tokens, then its embedding chunks."""
        out = StepOutput()
        generation = [*plan.decodes, *plan.prefills]
        if generation:
            # a step with prompt tokens counts as prompt time, decode steps as generation;
            # it is padded to a few sizes, so that prompt chunks of every length replay
            # kept graphs (decode steps take one size per number of running requests)
            prompt = bool(plan.prefills)
            try:
                out.logits = self.llama.decode(build_batch(generation), prompt=prompt, pad=prompt)
            except Exception as e:  # the step's requests fail, the engine goes on
                out.error = e
        if plan.embeds:
            try:
                out.hidden = self.llama.decode(
                    build_batch(plan.embeds, every_row=True), prompt=True, embeddings=True
                )
            except Exception as e:
                out.embed_error = e
        return out

    # -- warm-up ------------------------------------------------------------------------------

    def warm_up(self, n_parallel: int, n_batch: int, levels_kept: int = WARM_UP_LEVELS + 1) -> None:
        """Build the graphs, allocations and CPU plans of the steps a server runs —
        a prompt step of every padded size (:meth:`ModelRunner.step_rows`) from 2 rows up
        to :data:`WARM_UP_ROWS`, beside a few decodes and beside many
        (:meth:`ModelRunner.set_step_outputs`), and a decode step of 1 .. ``n_parallel``
        requests — at
        the first :data:`WARM_UP_LEVELS` widths a step reads (``n_kv``,
        :meth:`ModelRunner.kv_widths`), by preparing them (:meth:`ModelRunner.prepare`)
        in an empty cache, which it leaves empty. Each new step shape otherwise costs
        the request that meets it a graph build: most of a short prompt's time to first
        token, and a stall of every running stream. ``levels_kept``: the widths whose
        steps stay built once a request has built them (a prompt cache spreads the
        slots' cells over the whole cache). Nothing for an encoder (it has no logits to
        decode; its embedding steps are not padded)."""
        llama = self.llama
        if llama.config.arch.encoder:
            return
        top = min(n_batch, WARM_UP_ROWS)
        # from 2 rows: a new request's last prompt token beside a few decoding ones
        sizes = sorted({llama.step_rows(n) for n in range(2, top + 1)})
        decodes = min(n_parallel, n_batch)
        # every shape prepared stays built, and the steps of a later context length
        # beside them (many slots' shapes outnumber what a runner keeps by default)
        llama.keep_graphs(max(levels_kept, WARM_UP_LEVELS + 1) * (2 * len(sizes) + decodes))
        try:
            widths = llama.kv_widths()[:WARM_UP_LEVELS]
            for level in range(len(widths)):
                if level and not self._reach_width(widths[level - 1], n_parallel):
                    break
                for n in sizes:
                    llama.prepare(n, pad=True)  # beside up to 3 decodes
                    if n > PADDED_OUTPUTS and n_parallel > PADDED_OUTPUTS:  # beside more
                        llama.prepare(n, n_outputs=min(n, n_parallel), pad=True)
                for n in range(1, decodes + 1):
                    llama.prepare(n, n_outputs=n)
        finally:
            llama.kv.clear()

    def _reach_width(self, narrower: int, n_parallel: int) -> bool:
        """Make steps read the width after ``narrower`` cells: a placeholder sequence
        (no slot's) takes the first cell past them, without computing anything there
        (no token attends to it). False when the context is not that long or every
        sequence id is a slot's."""
        kv = self.llama.kv
        if narrower >= kv.n_ctx or n_parallel >= MAX_SEQUENCES:
            return False
        kv.seq_rm(n_parallel, 0, -1)  # one placeholder cell, the last width's gone
        kv.assign(np.array([narrower]), np.array([0]), [(n_parallel,)])
        return True

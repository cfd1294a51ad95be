"""A plan's steps and how they combine: the unit every builder returns.

A step is a zero-argument callable that does (part of) one node's work, prepared once
when the plan is built; these helpers compose steps, split a step's rows over the
worker pool, and view arrays the way the kernels take them. A leaf: the builders, the
compiled kernels and the job programs all build on it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from ..workers import POOL

__all__ = ["F32", "ROWS_PARALLEL_MIN", "Scratch", "SplitRows", "Step", "StepSequence", "block_rows",
           "padded4", "reshape_view", "sequence", "split_rows"]  # fmt: skip

#: A prepared unit of work: call it to run (part of) one node.
Step = Callable[[], object]
#: ``scratch(shape, dtype=float32)``: a plan's temporaries for the node being bound
#: (:meth:`.common.BuildContext.scratch`), as a builder hands them to a provider
Scratch = Callable[..., np.ndarray]

F32 = np.dtype(np.float32)


#: Values a row kernel must touch before its rows are split over the worker pool. A
#: sleeping helper takes tens of microseconds to wake, about what a small row job takes:
#: a small model's 128-token prompt runs its SwiGLU (262,144 values) faster on two
#: threads than on one, but its rms_norm and rope (98,304 values) no faster, so they stay
#: whole.
#: Where a step's row job is ready, a numba region shares its rows out instead, from
#: fewer values (:func:`.program.rows_regions`); this is a first run's way meanwhile.
ROWS_PARALLEL_MIN = 1 << 18


def split_rows(n_rows: int, n_values: int, bind: Callable[[slice], Step]) -> Step:
    """A row kernel's step, its rows split in chunks over the worker pool when it has
    work enough and the pool more than one thread (a :class:`SplitRows`); ``bind(rows)``
    is the kernel on those rows (bound once per chunk, here). The kernel must release
    the GIL (numba's ``nogil``). Rows are independent, so a split changes no number."""
    whole = bind(slice(None))
    if n_values < ROWS_PARALLEL_MIN or n_rows < 2 or POOL.max_threads == 1:
        return whole
    n = min(n_rows, 2 * POOL.max_threads)
    per = -(-n_rows // n)
    return SplitRows(whole, [bind(slice(r, min(n_rows, r + per))) for r in range(0, n_rows, per)])


class SplitRows:
    """A row kernel's step whose rows the worker pool shares out (:func:`split_rows`);
    ``whole`` is the kernel on every row, what a job form is made of (:mod:`.program`)."""

    __slots__ = ("_parts", "whole")

    def __init__(self, whole: Step, parts: list[Step]) -> None:
        self.whole, self._parts = whole, parts

    def __call__(self) -> None:
        if POOL.n_threads == 1:  # the thread count at each run: it may change between runs
            self.whole()
        else:
            POOL.run(len(self._parts), self._task)

    def _task(self, i: int, slot: int) -> None:
        self._parts[i]()


class StepSequence:
    """Steps run in order as one (:func:`sequence`); a program lowers each of them to its
    job (:mod:`.program`)."""

    __slots__ = ("steps",)

    def __init__(self, steps: tuple[Step, ...]) -> None:
        self.steps = steps

    def __call__(self) -> None:
        for s in self.steps:
            s()

    def settle(self, called: Collection[str]) -> None:
        """Each of its steps' ``settle`` (:func:`.jit_steps.settle`), where it has one."""
        for s in self.steps:
            own = getattr(s, "settle", None)
            if own is not None:
                own(called)


def sequence(*steps: Step | None) -> Step:
    """One step running ``steps`` in order (``None`` entries are skipped)."""
    todo = tuple(s for s in steps if s is not None)
    if len(todo) == 1:
        return todo[0]
    return StepSequence(todo)


def block_rows(blocks: np.ndarray) -> np.ndarray | None:
    """``(n_out, nblocks, type_size)`` blocks as ``(n_out, nblocks·type_size)`` byte rows
    without copying, or None when a row's blocks are not contiguous."""
    n_out, nblocks, size = blocks.shape
    if blocks.strides[2] != 1 or blocks.strides[1] != size:
        return None
    # a view, since each row's bytes are contiguous (checked above); reshape is much cheaper
    # than as_strided, and a prompt's plan takes this for every chunk of every product
    return blocks.reshape(n_out, nblocks * size)


def reshape_view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` reshaped without copying, or ``None`` when only a copy could do it.

    Plans keep views into buffers; a reshape that silently copied would freeze the
    values seen when the plan was built, so callers must know which one they got.
    """
    r = a.reshape(shape)
    # a copy is fresh memory, so it cannot even lie within a's bounds
    if r.size and not np.may_share_memory(r, a):
        return None
    return r


def padded4(a: np.ndarray, core: int = 0) -> np.ndarray:
    """``a`` with leading unit axes so that it has 4 (+ ``core``) dimensions (a view)."""
    want = 4 + core
    return a.reshape((1,) * (want - a.ndim) + a.shape) if a.ndim < want else a

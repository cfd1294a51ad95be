"""A step as a job of the spinning helpers: the records the job programs
(:mod:`.program`) and the compiled kernels (:mod:`.jit`) hand each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["JobCall", "JobSpec"]


@dataclass(frozen=True)
class JobCall:
    """One step as a job (:mod:`._numba_pool`'s protocol): its function's address; its
    argument block and chunk count on one thread and on more; whether its chunks are
    shared with the helpers; whether its block's first field says it refused its input.
    ``arrays``: what the blocks name by address, kept alive with the program."""

    fn: int
    one: tuple[np.ndarray, int]
    many: tuple[np.ndarray, int]
    shared: bool = False
    checked: bool = False
    arrays: tuple[np.ndarray, ...] = ()

    @staticmethod
    def alone(fn: int, block: np.ndarray, arrays: tuple[np.ndarray, ...],
              checked: bool = False) -> JobCall:  # fmt: skip
        """A small job: one chunk, run by the caller at any thread count."""
        return JobCall(fn, (block, 1), (block, 1), False, checked, arrays)


@dataclass(frozen=True)
class JobSpec:
    """A step as the step job ``name`` (:func:`._numba_jobs.jobs`) runs it: its block's
    4-d ``arrays``, integers and float scalars; ``values``: the elements the step
    writes; ``rows``: a row job's rows (:data:`.job_blocks.CHUNKED`), which chunks
    share out; ``checked``: its block's status says whether it refused its input."""

    name: str
    arrays: tuple[np.ndarray, ...]
    ints: tuple[int, ...] = ()
    scalars: tuple[float, ...] = ()
    values: int = 0
    rows: int = 1
    checked: bool = False

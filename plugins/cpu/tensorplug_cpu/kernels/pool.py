"""Helper threads that stay awake between a generation step's parallel kernels.

A generation step on more than one thread runs its few-row products as jobs here
rather than as numba parallel regions: the helpers (the thread count less one) spin on
a shared mailbox for ~2 ms after each job, so the next product reaches them in under a
microsecond where a TBB region takes microseconds to wake its sleeping worker, dozens of
times a token (:mod:`._numba_pool` has the protocol and the reasons). After that they sleep on
an event until the next job wakes them, so an idle process burns no core. Where a yield
shows that another thread wanted their core (a busy machine: spinning there takes the
calling thread's share of it), they nap between looks at the mailbox rather than spin.

The protocol is claim-based: the caller computes every chunk nobody else has claimed,
and waits only for chunks a helper has started. A helper descheduled by a busy machine,
still asleep, or not started costs the job its share of speed, never a hang; two
Python threads may share one pool (one runs its job here, the other its numba region:
:meth:`SpinPool.run` says which).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .job_blocks import AWAKE, MAILBOX_SIZE, SPIN_NS, SPIN_ROUNDS, STOP, WANTED

__all__ = ["PoolKernels", "SpinPool", "spin_pool"]


class PoolKernels(NamedTuple):
    """The compiled side of the pool (:mod:`._numba_pool`'s kernels of these names), by
    reference (:class:`.kernel_refs.KernelRef`: callable before numba is imported)."""

    helper_loop: Any
    run_shared: Any
    run_program: Any


#: Chunks per thread of a job at least: enough that a late helper still finds work, few
#: enough that claiming (a compare-and-swap on a line every core touches) stays cheap.
CHUNKS_PER_THREAD = 4
#: Work units (groups of eight weight rows) per chunk at least, and chunks at most: a
#: large product (the output layer's 4,000 groups) in chunks of a few microseconds, so
#: the thread that finishes first waits for at most one of them.
UNITS_PER_CHUNK, MAX_CHUNKS = 32, 64


class SpinPool:
    """One process's spinning helpers (:mod:`._numba_pool` runs them), started lazily."""

    def __init__(self, kernels: PoolKernels) -> None:
        self.kernels = kernels
        self.mailbox = np.zeros(MAILBOX_SIZE, np.int64)
        self._lock = threading.Lock()  # one job at a time
        self._events: list[threading.Event] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False
        #: :func:`._numba_pool.run_shared` for this mailbox (its arguments' types are
        #: always the same), found at the first job
        self._run_shared: Callable[..., None] | None = None

    @property
    def helpers(self) -> int:
        """How many helper threads this process has started."""
        return len(self._threads)

    def chunks(self, n_threads: int, units: int) -> int:
        """How many chunks a job of ``units`` work units for ``n_threads`` threads is
        cut into (any count gives the same bits: each unit is computed alone)."""
        return max(CHUNKS_PER_THREAD * n_threads, min(MAX_CHUNKS, units // UNITS_PER_CHUNK))

    def run(self, n_threads: int, fn: int, job: int, chunks: int) -> bool:
        """Run the job ``fn(job, ...)`` (:mod:`._numba_pool`) on this thread and
        ``n_threads - 1`` helpers; False, having done nothing, while another thread's job
        holds the pool (the caller then runs its numba region instead)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._wake(n_threads - 1)
            run_shared = self._run_shared
            if run_shared is None:
                run_shared = self._run_shared = self.kernels.run_shared.for_types(
                    self.mailbox, 0, 0, 0
                )
            run_shared(self.mailbox, fn, job, chunks)
        finally:
            self._lock.release()
        return True

    def run_program(self, n_threads: int, program: np.ndarray) -> int | None:
        """Run a program's jobs (:func:`._numba_pool.run_program`) on this thread and
        ``n_threads - 1`` helpers: -1, or the row of a job that refused its input; None,
        having done nothing, while another thread's job holds the pool."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._wake(n_threads - 1)
            return int(self.kernels.run_program(self.mailbox, program, n_threads - 1))
        finally:
            self._lock.release()

    def _wake(self, helpers: int) -> None:
        box = self.mailbox
        box[WANTED] = helpers
        if box[AWAKE] >= helpers or self._stopped:
            return
        while len(self._threads) < helpers:
            self._start(len(self._threads))
        for event in self._events[:helpers]:
            event.set()

    def _start(self, rank: int) -> None:
        event = threading.Event()
        thread = threading.Thread(target=self._helper, args=(rank, event), daemon=True,
                                  name=f"tensorplug-cpu-helper-{rank}")  # fmt: skip
        self._events.append(event)
        self._threads.append(thread)
        thread.start()

    def _helper(self, rank: int, event: threading.Event) -> None:
        while True:
            event.wait()
            event.clear()
            if self._stopped:
                return
            self.kernels.helper_loop(self.mailbox, rank, SPIN_NS, SPIN_ROUNDS)

    def stop(self) -> None:
        """End the helpers (at exit: none spins while the interpreter shuts down)."""
        self._stopped = True
        self.mailbox[STOP] = 1
        for event in self._events:
            event.set()
        for thread in self._threads:
            thread.join(timeout=1.0)

    def after_fork(self) -> None:
        """In a forked child: it has the parent's mailbox (whatever a job left in it)
        and none of its threads; start afresh (helpers start at the next job)."""
        self.mailbox[:] = 0
        self._events, self._threads = [], []
        self._lock = threading.Lock()


_state: dict[str, Any] = {}
_state_lock = threading.Lock()


def _load_kernels(kernels: PoolKernels) -> None:
    """Load (or compile) the pool's two kernels now, while the first plan that may use
    the pool is bound (a model's warm-up): a helper's first call loaded its loop on
    the helper's own thread, after the warm-up, whenever the first job ran then (a
    job the compile-ahead process had just made)."""
    args = (np.zeros(MAILBOX_SIZE, np.int64), 0, 0, 0)
    for kernel in (kernels.helper_loop, kernels.run_shared):
        kernel.ready(args)


def spin_pool(kernels: PoolKernels) -> SpinPool:
    """The process's pool, made at first use (running ``kernels``), started afresh in a
    forked child, and stopped at exit."""
    with _state_lock:
        if "pool" not in _state:
            _load_kernels(kernels)
            pool = SpinPool(kernels)
            atexit.register(pool.stop)
            if hasattr(os, "register_at_fork"):  # POSIX
                os.register_at_fork(after_in_child=pool.after_fork)
            _state["pool"] = pool
        return _state["pool"]  # type: ignore[no-any-return]

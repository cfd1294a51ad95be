"""The threads the CPU backend splits big products over, in place of BLAS's own.

numpy's BLAS (OpenBLAS) threads a large product itself, and that served badly:

* its workers keep spinning for up to a few hundred milliseconds after each call, and a
  numba kernel started meanwhile waits for the cores they hold: the first generation
  step after a prompt took 25× its time on 2 cores;
* its result depends on its thread count, so a prompt's logits changed with ``-t``;
* it partitions statically: one descheduled thread on a busy machine holds up the call.

So while the backend computes, BLAS runs on the calling thread only
(:meth:`~.system.ThreadControl.blas_single`), and a product is cut into chunks of
output rows fixed by its shape alone. :class:`WorkerPool` runs the chunks: the caller
and ``n_threads - 1`` helpers claim them one at a time until none is left. Chunks are
the same at any thread count, so the numbers are too; an idle helper sleeps on a lock
instead of spinning; a slow thread delays only the chunk it holds, and a helper the OS
has not scheduled yet delays nothing: the caller takes the chunks left and returns.

The work must release the GIL to run in parallel: BLAS calls and numpy's loops do, and
the numba decoders that feed them are compiled ``nogil``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tensorplug.host import available_cores

__all__ = ["POOL", "WorkerPool"]

#: ``task(index, slot)``: run chunk ``index``; ``slot`` (< the pool's ``max_threads``)
#: is unique among the threads running at once, to pick per-thread scratch.
Task = Callable[[int, int], object]


class WorkerPool:
    """Runs a list of chunks on the calling thread and up to ``n_threads - 1`` helpers."""

    def __init__(self, max_threads: int) -> None:
        #: the most threads a run uses; scratch is sized for this many slots
        self.max_threads = max(1, max_threads)
        self.n_threads = self.max_threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._inside = threading.local()

    def set_threads(self, n: int) -> None:
        """Threads per run from now on (clamped to ``1..max_threads``)."""
        self.n_threads = max(1, min(int(n), self.max_threads))

    def run(self, n_tasks: int, task: Task) -> None:
        """Call ``task(i, slot)`` for every ``i`` in ``range(n_tasks)``; return when all
        have run. The first exception raised by a chunk stops the others from starting
        new chunks and is raised here once the chunks already started have ended.

        The caller waits for chunks, not for helpers: a helper the OS has not scheduled
        yet when the caller has taken the last chunk finds nothing to do and is never
        waited for (on a busy machine a wait for a descheduled thread is a time slice).
        """
        helpers = min(self.n_threads, n_tasks) - 1
        if helpers <= 0 or getattr(self._inside, "active", False):
            # nothing to share, or a chunk running a product of its own: a nested run
            # waiting for helpers that wait for this thread would never end
            for i in range(n_tasks):
                task(i, 0)
            return
        shared = _Run(n_tasks, task, self._inside)
        executor = self._executor or self._start()
        for slot in range(1, helpers + 1):
            executor.submit(shared.work, slot)
        shared.work(0)
        shared.wait()
        if shared.error is not None:
            raise shared.error

    def _start(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.max_threads - 1 or 1, thread_name_prefix="tensorplug-cpu"
                )
            return self._executor


class _Run:
    """One :meth:`WorkerPool.run`: the chunks still to claim and those running."""

    def __init__(self, n_tasks: int, task: Task, inside: threading.local) -> None:
        self.n_tasks, self.task, self.inside = n_tasks, task, inside
        self.claim = itertools.count()
        self.running = 0
        self.error: BaseException | None = None
        self.idle = threading.Condition()

    def work(self, slot: int) -> None:
        self.inside.active = True
        try:
            while True:
                with self.idle:
                    if self.error is not None:
                        return
                    i = next(self.claim)
                    if i >= self.n_tasks:
                        return
                    self.running += 1
                try:
                    self.task(i, slot)
                except BaseException as e:
                    with self.idle:
                        if self.error is None:
                            self.error = e
                finally:
                    with self.idle:
                        self.running -= 1
                        if not self.running:
                            self.idle.notify_all()
        finally:
            self.inside.active = False

    def wait(self) -> None:
        """Block until no chunk is running (the caller has claimed the last one)."""
        with self.idle:
            while self.running:
                self.idle.wait()


#: The process's pool: the CPU backend's ``set_n_threads`` sets its thread count.
POOL = WorkerPool(available_cores())

"""The threads the CPU backend splits big products over, in place of BLAS's own.

numpy's BLAS (OpenBLAS) threads a large product itself, and that served badly:

* its workers keep spinning for up to a few hundred milliseconds after each call, and a
  numba kernel started meanwhile waits for the cores they hold: on a machine with few
  cores, the first generation step after a prompt takes many times its own time;
* its result depends on its thread count, so a prompt's logits changed with ``-t``;
* it partitions statically: one descheduled thread on a busy machine holds up the call.

So while the backend computes, BLAS runs on the calling thread only
(:meth:`~.thread_control.ThreadControl.blas_single`), and a product is cut into chunks of
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
import queue
import threading
import time
from collections.abc import Callable

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
        self._requests: queue.SimpleQueue[tuple[_Run, int]] | None = None
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
        try:
            requests = self._requests or self._start()
            for slot in range(1, helpers + 1):
                requests.put((shared, slot))
            shared.work(0)
            shared.wait()
        except BaseException as e:  # Ctrl-C in the caller's own bookkeeping
            shared.abandon(e)
            raise
        if shared.errors:
            raise shared.errors[0]

    def _start(self) -> queue.SimpleQueue[tuple[_Run, int]]:
        """The helpers, started on first use. Not a ``ThreadPoolExecutor``: its
        ``submit`` takes a ``threading.Semaphore`` (a ``Condition``), whose lock a Ctrl-C
        in the caller can leave held (bpo-29988); the helpers then blocked on it for ever
        and the interpreter, which joins an executor's threads at exit, never ended.
        ``SimpleQueue.put`` is one C call, and the helpers are daemon threads, idle
        unless a run is on, which :class:`_Run` never leaves running."""
        with self._lock:
            if self._requests is None:
                self._requests = queue.SimpleQueue()
                for k in range(self.max_threads - 1):
                    threading.Thread(target=_serve, args=(self._requests,), daemon=True,
                                     name=f"tensorplug-cpu_{k}").start()  # fmt: skip
            return self._requests


def _serve(requests: queue.SimpleQueue[tuple[_Run, int]]) -> None:
    """A helper thread: joins each run it is asked to, in the slot it is given."""
    while True:
        shared, slot = requests.get()
        shared.helper(slot)


class _Run:
    """One :meth:`WorkerPool.run`: the chunks still to claim and those running.

    Ctrl-C is a ``KeyboardInterrupt`` raised in the caller (the main thread) between any
    two bytecodes, including inside a ``with`` on a ``threading.Condition`` before its
    lock is released (CPython bpo-29988): the lock stayed held, the helpers blocked on it
    for ever, and the interpreter, which joins the pool's threads at exit, never ended
    (an interrupted ``tensorplug run`` hung until it was killed). So nothing here is a
    lock the caller holds: chunks are claimed and counted with ``itertools.count``
    (atomic under the GIL), the caller waits on a plain lock that the thread finishing
    the last chunk releases, and an interrupt is raised only once no helper is still
    writing an output (chat's Ctrl-C goes back to the prompt and computes again).
    """

    def __init__(self, n_tasks: int, task: Task, inside: threading.local) -> None:
        self.n_tasks, self.task, self.inside = n_tasks, task, inside
        self.claim = itertools.count()
        self.finished = itertools.count(1)
        #: what the chunks raised; after the first, the chunks left are skipped
        self.errors: list[BaseException] = []
        #: the helpers' slots while they are in :meth:`work`
        self.busy: list[int] = []
        #: every chunk has finished; ``all_finished`` is released just after
        self.complete = False
        self.all_finished = threading.Lock()
        self.all_finished.acquire()

    def helper(self, slot: int) -> None:
        self.busy.append(slot)
        try:
            self.work(slot)
        finally:
            self.busy.remove(slot)

    def work(self, slot: int) -> None:
        self.inside.active = True
        try:
            while (i := next(self.claim)) < self.n_tasks:
                if not self.errors:
                    try:
                        self.task(i, slot)
                    except BaseException as e:
                        self.errors.append(e)
                if next(self.finished) == self.n_tasks:
                    self.complete = True
                    self.all_finished.release()
        finally:
            self.inside.active = False

    def wait(self) -> None:
        """Block until every chunk has finished (the caller has claimed the last one, so
        each is finishing); a Ctrl-C meanwhile is raised after, by :meth:`WorkerPool.run`.
        ``complete`` and not the lock says when: the interrupt can be raised just after
        ``acquire`` has taken the lock, and a second ``acquire`` would wait for ever."""
        while not self.complete:
            try:
                self.all_finished.acquire()
            except KeyboardInterrupt as e:
                self.errors.append(e)

    def abandon(self, error: BaseException) -> None:
        """The caller stops early: helpers skip the chunks left; return once none is
        still running one (so none writes after the caller has gone on)."""
        self.errors.append(error)
        while self.busy:
            time.sleep(0.0005)


#: The process's pool: the CPU backend's ``set_n_threads`` sets its thread count.
POOL = WorkerPool(available_cores())

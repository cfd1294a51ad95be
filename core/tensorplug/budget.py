"""A plugin's code under a time budget: a worker thread that its caller waits for.

A plugin's import, ``score()`` or ``init()`` may never return (a driver that does not
answer, a lock held by a stuck process); discovery must. Each runs in a daemon thread
joined with a timeout. Past it, the thread is left behind: Python cannot stop a thread,
and a daemon thread does not keep the process alive at exit.

The registry holds its lock while it waits. A worker acts for the thread that waits for
it (:class:`OwnerLock`), so that a plugin calling back into the registry from its own
``init()`` sees what is registered so far instead of waiting for itself.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

__all__ = ["OwnerLock", "Overrun", "run_within"]

T = TypeVar("T")


class OwnerLock:
    """A re-entrant lock whose owner lends it to the worker threads it waits for.

    A thread lent the lock passes through ``with lock:`` while its lender holds the
    lock; once the lender takes it back (the worker finished or overran its budget),
    the worker waits for the lock like any other thread.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0
        self._lent: dict[threading.Thread, int] = {}
        self._through = threading.local()  # per thread: was each entry a pass-through

    def __enter__(self) -> OwnerLock:
        lender = self._lent.get(threading.current_thread())
        through = lender is not None and lender == self._owner
        if not through:
            self._lock.acquire()
            self._owner, self._depth = threading.get_ident(), self._depth + 1
        self._entries().append(through)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._entries().pop():
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
            self._lock.release()

    def _entries(self) -> list[bool]:
        entries: list[bool] | None = getattr(self._through, "entries", None)
        if entries is None:
            entries = self._through.entries = []
        return entries

    def lend(self, worker: threading.Thread) -> None:
        """Let ``worker`` act for the calling thread while it holds the lock."""
        self._lent[worker] = threading.get_ident()

    def take_back(self, worker: threading.Thread) -> None:
        self._lent.pop(worker, None)


class Overrun(Exception):
    """``fn`` ran past its budget; ``thread`` is still running it, ``stack`` says where."""

    def __init__(self, thread: threading.Thread, seconds: float) -> None:
        super().__init__(f"still running after {seconds:g} s")
        self.thread, self.seconds = thread, seconds
        frame = sys._current_frames().get(thread.ident or -1)  # documented in sys
        self.stack = "".join(traceback.format_stack(frame)) if frame is not None else ""


def run_within(
    fn: Callable[[], T], seconds: float, *, name: str, lock: OwnerLock | None = None
) -> T:
    """``fn()`` run in a daemon thread called ``name``: its result, or its exception
    (KeyboardInterrupt and SystemExit included) raised here, or :class:`Overrun` when it
    has not returned after ``seconds``. ``lock``, held by the caller, is lent to it."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            outcome.append(fn())
        except BaseException as e:  # handed to the waiting thread, which decides
            failure.append(e)

    worker = threading.Thread(target=work, name=name, daemon=True)
    if lock is not None:
        lock.lend(worker)
    try:
        worker.start()
        worker.join(seconds)
    finally:
        if lock is not None:
            lock.take_back(worker)
    if worker.is_alive():
        raise Overrun(worker, seconds)
    if failure:
        raise failure[0]
    return outcome[0]

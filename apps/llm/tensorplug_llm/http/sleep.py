"""A server that sleeps when nobody uses it (llama-server's ``--sleep-idle-seconds``):
after that many seconds with no request for the model, the model's memory is given
back (:meth:`Engine.unload <tensorplug_llm.engine.Engine.unload>`); the next request
that needs the model loads it again before it is served.

What does not need the model never wakes it, and does not count as use: a health
check, ``/props``, the model list, ``/metrics``, ``/slots``, the chat page and a CORS
preflight. While asleep ``/props`` says ``is_sleeping: true`` and ``/metrics`` gives
the generator's figures as they stood when the server went to sleep (the cells the
slots held are gone, but a dashboard sees the last state rather than an empty server),
as llama-server's do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from ..generation import GeneratorStats

__all__ = ["READ_ONLY_ROUTES", "IdleSleep", "SleepGuard"]

#: GET routes answered without the model: they neither wake it nor count as its use
READ_ONLY_ROUTES = frozenset(
    {"/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/slots",
     "/api/tags", "/", "/index.html"}
)  # fmt: skip

#: how often the watcher looks at the idle time (a sleep is at most this late)
POLL_SECONDS = 0.1


class IdleSleep:
    """Puts the model to sleep after ``seconds`` without use and wakes it for the next.

    ``unload()`` gives the model's memory back and returns whether it could (False while
    a request runs or waits), ``reload()`` takes it again, ``stats()`` is the
    generator's counters (snapshotted when the server goes to sleep)."""

    def __init__(
        self,
        seconds: float,
        unload: Callable[[], bool],
        reload: Callable[[], None],
        stats: Callable[[], GeneratorStats],
    ) -> None:
        if seconds <= 0:
            raise ValueError(f"sleep after a positive number of idle seconds, got {seconds}")
        self.seconds = seconds
        self._unload, self._reload, self._stats = unload, reload, stats
        self._lock = threading.Lock()  # one of sleep and wake at a time
        self._active = 0  # requests for the model in flight
        self._last_use = time.monotonic()
        self._snapshot: GeneratorStats | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def asleep(self) -> bool:
        return self._snapshot is not None

    def stats(self) -> GeneratorStats:
        """The generator's counters, or while asleep, as they were at the sleep."""
        snapshot = self._snapshot
        return snapshot if snapshot is not None else self._stats()

    def start(self) -> None:
        """Watch the idle time on a daemon thread, until :meth:`stop`."""
        if self._thread is None:
            watcher = threading.Thread(target=self._watch, name="tensorplug-sleep", daemon=True)
            self._thread = watcher
            watcher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            idle = time.monotonic() - self._last_use
            if not self.asleep and self._active == 0 and idle >= self.seconds:
                self.sleep()

    def sleep(self) -> bool:
        """Go to sleep now if no request for the model is in flight; whether it did."""
        with self._lock:
            if self.asleep or self._active:
                return self.asleep
            snapshot = self._stats()
            if not self._unload():
                return False
            self._snapshot = snapshot
            return True

    def wake(self) -> None:
        """Load the model again if it sleeps (on the calling thread: it takes a while)."""
        with self._lock:
            if self.asleep:
                self._reload()
                self._snapshot = None

    def begin(self) -> None:
        """A request for the model starts (it is counted before it wakes the model, so
        the watcher cannot put it back to sleep under it)."""
        with self._lock:
            self._active += 1

    def end(self) -> None:
        with self._lock:
            self._active -= 1
            self._last_use = time.monotonic()


class SleepGuard:
    """ASGI middleware: a request for the model wakes it first and counts as its use
    until its response has been sent (a stream's last event included)."""

    def __init__(self, app: ASGIApp, sleep: IdleSleep) -> None:
        self.app, self.sleep = app, sleep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _read_only(scope):
            await self.app(scope, receive, send)
            return
        self.sleep.begin()
        try:
            if self.sleep.asleep:
                await anyio.to_thread.run_sync(self.sleep.wake)
            await self.app(scope, receive, send)
        finally:
            self.sleep.end()


def _read_only(scope: Scope) -> bool:
    method = scope["method"]
    if method == "OPTIONS":
        return True
    path = scope["path"].rstrip("/") or "/"
    return method in ("GET", "HEAD") and path in READ_ONLY_ROUTES

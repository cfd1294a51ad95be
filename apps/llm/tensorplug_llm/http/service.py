"""What every route shares: the model, the settings, admission to the bounded queue,
and answering a generation as one JSON body or as server-sent events.

At most ``n_parallel + max_queue`` requests are admitted; the next gets 503 with
``Retry-After`` (clients back off instead of piling up)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response

from ..api import LLM, InvalidRequestError, Stream
from ..engine import Engine
from ..request import RequestStopped
from .config import ServerConfig
from .errors import ApiError, refused
from .merge import merge_chunks
from .metrics import Metrics, RequestCounts
from .relay import Encoder, EventStream, Relay, in_thread, watch_disconnect
from .sleep import IdleSleep

__all__ = ["Service", "ServiceDep", "service"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Service:
    """``sleep``: the server's idle sleep (``--sleep-idle-seconds``), None without."""

    def __init__(self, llm: LLM, config: ServerConfig, sleep: IdleSleep | None = None) -> None:
        self.llm, self.config, self.sleep = llm, config, sleep
        self.in_flight = 0
        self.metrics = Metrics(sleep.stats if sleep is not None else llm.stats,
                               lambda: self.in_flight)  # fmt: skip

    @property
    def asleep(self) -> bool:
        return self.sleep is not None and self.sleep.asleep

    @property
    def engine(self) -> Engine | None:
        """The server's engine, where the generator has one (None for another
        generator, which the routes that act on slots and adapters refuse)."""
        engine = getattr(self.llm.generator, "engine", None)
        return engine if isinstance(engine, Engine) else None

    def admit(self) -> Callable[[], None]:
        """A place in the queue, or 503; returns its release (idempotent)."""
        limit = self.llm.stats().n_parallel + self.config.max_queue
        if self.in_flight >= limit:
            self.metrics.rejected.inc()
            retry = self.config.retry_after
            raise ApiError(
                503,
                f"the server is busy ({self.in_flight} requests admitted, at most {limit}); "
                f"retry after {retry} s",
                "server_overloaded",
                headers={"Retry-After": str(retry)},
            )
        self.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= 1

        return release

    async def call(self, fn: Callable[[], Any], rename: dict[str, str] | None = None) -> Any:
        """``fn()`` on a thread, admitted to the queue like a generation."""
        release = self.admit()
        try:
            return await in_thread(fn)
        except InvalidRequestError as e:
            raise refused(e, rename) from None
        finally:
            release()

    async def call_watched(
        self,
        request: Request,
        fn: Callable[[Callable[[], bool]], Any],
        rename: dict[str, str] | None = None,
    ) -> Any:
        """``fn(stopped)`` on a thread, admitted to the queue like a generation, for work
        the engine does on the request's behalf (embeddings): ``stopped()`` turns true
        when the client goes away or the server's ``--timeout`` passes, and ``fn`` stops
        its work then (raising :class:`~tensorplug_llm.request.RequestStopped`). Past
        the deadline the answer is a 504, as a generation's."""
        release = self.admit()
        stop = threading.Event()
        watcher = asyncio.create_task(watch_disconnect(request, stop.set))
        work = asyncio.ensure_future(in_thread(lambda: fn(stop.is_set)))
        try:
            await asyncio.wait({work}, timeout=self.config.request_timeout)
            if not work.done():  # past the deadline: answered once the work has stopped
                stop.set()
                with contextlib.suppress(Exception):
                    await work
                raise ApiError(504, "the request ran past the server's --timeout", "timeout")
            return work.result()
        except RequestStopped:  # the client left: nobody reads this
            raise ApiError(499, "the client closed the request", "cancelled") from None
        except InvalidRequestError as e:
            raise refused(e, rename) from None
        finally:
            stop.set()
            watcher.cancel()
            release()

    def default(self, name: str, given: Any, is_set: bool) -> Any:
        """A request field's value: ``given`` if the request set it, else the server's
        default for ``name`` (``n_predict``: ``-n``, ``temperature``: ``--temp``...), else
        ``given`` (the field's own default)."""
        return given if is_set else self.config.defaults.get(name, given)

    async def answer(
        self,
        request: Request,
        stream: bool,
        start: Callable[[], dict[str, Any] | Stream],
        *,
        merge: Callable[[list[dict[str, Any]]], Any] = merge_chunks,
        done: bytes | None = b"data: [DONE]\n\n",
        rename: dict[str, str] | None = None,
        encode: Encoder | None = None,
    ) -> Response:
        """Run ``start`` (it submits the request and returns a :class:`Stream`) and
        answer with server-sent events (written by ``encode``) ending with ``done``, or
        with ``stream`` false the chunks joined by ``merge``. ``rename``: the API's field
        names in errors mapped to the route's."""
        release = self.admit()
        relay = Relay(start, time.monotonic() + self.config.request_timeout)
        try:
            answer = await relay.begun()
        except InvalidRequestError as e:
            release()
            raise refused(e, rename) from None
        except BaseException:
            release()
            raise
        if answer is not None:
            release()
            return JSONResponse(answer)
        finished = False

        def finish() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            release()
            prompt_s, predicted_s = relay.seconds()
            self.metrics.timings.add(prompt_s, predicted_s, RequestCounts.of(relay.last))

        if not stream:
            try:
                return JSONResponse(merge(await relay.gather(request)))
            finally:
                finish()

        def close() -> None:
            relay.cancel()
            finish()

        return EventStream(
            relay.events(request, finish, done, encode),
            on_close=close,
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )


async def service(request: Request) -> Service:
    """The app's :class:`Service` (a FastAPI dependency)."""
    found: Service = request.app.state.service
    return found


ServiceDep = Annotated[Service, Depends(service)]

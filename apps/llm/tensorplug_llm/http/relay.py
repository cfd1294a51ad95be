"""Carrying a generation from its thread to the event loop, and on to the client.

Generation runs on the generator's thread; each request is submitted and its chunks
carried to the event loop by a thread of its own (so 64 waiting clients do not exhaust a
shared pool). A client that disconnects cancels its request, so its sequence stops taking a
slot; a request running past its deadline is cancelled too (504, or an error event on
a stream)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..api import InvalidRequestError, Stream
from .errors import ApiError, error_body, log, refused

__all__ = ["Canceller", "Encoder", "EventStream", "Relay", "data_event", "hand_over",
           "in_thread", "watch_disconnect"]  # fmt: skip

_DONE = object()
#: put in a relay's queue by its deadline's timer: the reader stops waiting
_EXPIRED = object()

#: how a stream's item (a chunk, or an error body ``{"error": ...}``) is written as a
#: server-sent event: OpenAI's and llama-server's are ``data:`` lines, Anthropic's and the
#: Responses API's carry an ``event:`` name too
Encoder = Callable[[dict[str, Any]], bytes]


async def in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread of its own (tokenizing and template rendering take time)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            value = fn()
        except BaseException as e:  # handed to the awaiting coroutine
            hand_over(loop, _settle, done, None, e)
        else:
            hand_over(loop, _settle, done, value, None)

    threading.Thread(target=run, daemon=True).start()
    return await done


def hand_over(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> bool:
    """``fn(*args)`` on the loop's thread; False when the loop has closed: the server
    has stopped and nobody is left to read what a thread carries (raising there would
    end the thread with a traceback on the server's stderr)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # "Event loop is closed"
        return False
    return True


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class EventStream(StreamingResponse):
    """A streamed response that cleans up however it ends: the event generator's own
    ``finally`` does not run if the client is gone before the first event is sent (a
    generator never started has nothing to finalize), and the request would keep its
    place in the queue for ever."""

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class Relay:
    """``start()`` (it submits a request: a whole answer as a dict, or a :class:`Stream`)
    run on a thread of its own, and the stream's chunks carried by that same thread into
    an asyncio queue, ending with a marker (or an exception): one thread and one hand-over
    to the event loop per request, where a thread for ``start`` and another for the
    chunks would put two between the request and its first token. ``started``,
    ``first`` and ``ended`` are when the stream began (``start`` returned), its first
    chunk came and its last (monotonic seconds)."""

    def __init__(self, start: Callable[[], dict[str, Any] | Stream], deadline: float) -> None:
        self.deadline = deadline
        self.stream: Stream | None = None
        self.started = time.monotonic()
        self.first: float | None = None
        self.ended: float | None = None
        self.last: dict[str, Any] | None = None
        self._abandoned = threading.Event()
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._begun: asyncio.Future[dict[str, Any] | None] = loop.create_future()

        def begin(answer: dict[str, Any] | None, error: BaseException | None) -> bool:
            return hand_over(loop, _settle, self._begun, answer, error)

        def run() -> None:
            try:
                result = start()
            except BaseException as e:  # re-raised on the loop
                begin(None, e)
                return
            if isinstance(result, dict):
                begin(result, None)
                return
            self.stream, self.started = result, time.monotonic()
            if not begin(None, None) or self._abandoned.is_set():  # nobody waits for it
                result.cancel()
            try:
                for chunk in result:
                    if self.first is None:
                        self.first = time.monotonic()
                    self.last = chunk
                    if not hand_over(loop, self.queue.put_nowait, chunk):
                        result.cancel()  # the server has stopped: the rest goes nowhere
                        return
            except BaseException as e:  # re-raised on the loop
                hand_over(loop, self.queue.put_nowait, e)
            self.ended = time.monotonic()
            hand_over(loop, self.queue.put_nowait, _DONE)

        threading.Thread(target=run, daemon=True).start()

    async def begun(self) -> dict[str, Any] | None:
        """Waits for ``start()``: its whole answer, or None when it returned a stream
        (its chunks come by :meth:`gather` or :meth:`events`); raises what it raised. A
        caller cancelled meanwhile leaves the stream cancelled as soon as it exists."""
        try:
            return await asyncio.shield(self._begun)
        except asyncio.CancelledError:
            self.cancel()
            self._begun.add_done_callback(_retrieved)  # what start raised, read by nobody
            raise

    def cancel(self) -> None:
        """Stop the generation (now, or as soon as ``start()`` has submitted it)."""
        self._abandoned.set()
        if self.stream is not None:
            self.stream.cancel()

    def seconds(self) -> tuple[float, float]:
        """Seconds until the first chunk (the prompt), and from there to the end."""
        first = self.first if self.first is not None else self.started
        ended = self.ended if self.ended is not None else time.monotonic()
        return first - self.started, max(ended - first, 0.0)

    async def _next(self) -> Any:
        """The next item. The deadline is one timer for the whole request, armed the
        first time the queue is found empty, which puts a marker in the queue: a
        ``wait_for`` per item made a task and a timer for every token on the loop."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if self._deadline_timer is None and self.queue.empty():
            self._deadline_timer = asyncio.get_running_loop().call_later(
                remaining, self.queue.put_nowait, _EXPIRED
            )
        item = await self.queue.get()
        if item is _EXPIRED:
            raise TimeoutError
        if isinstance(item, BaseException):
            raise item
        return item

    def _disarm(self) -> None:
        """Drop the deadline's timer: the reader is done, and a pending timer would keep
        its handle on the loop and the relay's queue alive until the deadline."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()

    async def gather(self, request: Request) -> list[dict[str, Any]]:
        """Every chunk; the request is cancelled if the client goes away or the
        deadline passes."""
        watcher = asyncio.create_task(watch_disconnect(request, self.cancel))
        got: list[dict[str, Any]] = []
        try:
            while (item := await self._next()) is not _DONE:
                got.append(item)
        except TimeoutError:
            self.cancel()
            raise ApiError(504, "the request ran past the server's --timeout", "timeout") from None
        except InvalidRequestError as e:
            raise refused(e) from None
        finally:
            watcher.cancel()
            self._disarm()
        return got

    async def events(
        self,
        request: Request,
        release: Callable[[], None],
        done: bytes | None = b"data: [DONE]\n\n",
        encode: Encoder | None = None,
    ) -> AsyncIterator[bytes]:
        """Server-sent events written by ``encode`` (``data:`` lines by default), ending
        with ``done``, after an error event too (a client reads to it); a client that
        disconnects cancels the request, as does the deadline. Sending to a client that
        went away fails, but a request still waiting for a slot sends nothing: the
        watcher notices the disconnect meanwhile."""
        write = encode or data_event
        watcher = asyncio.create_task(watch_disconnect(request, self.cancel))
        try:
            try:
                while (item := await self._next()) is not _DONE:
                    yield write(item)
            except TimeoutError:
                self.cancel()
                yield write(error_body("the request ran past the server's --timeout", "timeout"))
            except InvalidRequestError as e:
                yield write(refused(e).body())
            except Exception as e:  # the headers are sent: the error can only be an event
                log.exception("a stream failed")
                yield write(error_body(f"internal error: {type(e).__name__}", "server_error"))
            if done is not None:  # a client reads to the end marker, error or not
                yield done
        finally:
            watcher.cancel()
            self._disarm()
            self.cancel()
            release()


def data_event(item: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(item)}\n\n".encode()


async def watch_disconnect(request: Request, gone: Callable[[], None]) -> None:
    """Call ``gone()`` when ``request``'s client goes away. It waits for the connection's
    ``http.disconnect`` (the body is read by then, so nothing else can come), where
    polling ``is_disconnected`` a few times a second per request takes a large share of
    the event loop's time with many clients: time the engine's thread waits for the
    GIL."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone()


class Canceller:
    """The handle of a :class:`Stream` made over another: cancelling it cancels the
    inner one (the generation)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def cancel(self) -> None:
        self.stream.cancel()

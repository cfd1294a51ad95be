"""The relay between a request's generation and the event loop: ``start`` (which
submits the request) and the stream's chunks share one thread, so a token reaches the
loop by one hand-over; a request given up before ``start`` returns is cancelled as soon
as it exists."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tensorplug_llm.api import InvalidRequestError, Stream
from tensorplug_llm.http.errors import ApiError
from tensorplug_llm.http.relay import Relay

#: how long a test waits for a thread (reached only when something is wrong)
WAIT_S = 30.0


class _Handle:
    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


def _stream(chunks: list[dict[str, Any]], threads: list[int], handle: _Handle) -> Stream:
    def chunked() -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            threads.append(threading.get_ident())
            yield chunk

    return Stream(chunked(), handle)  # type: ignore[arg-type]


async def _drained(relay: Relay) -> None:
    """Reads the relay's queue to its end marker: its thread is done with the loop."""
    while isinstance(await asyncio.wait_for(relay.queue.get(), WAIT_S), dict):
        pass


def test_start_and_the_chunks_run_on_one_thread() -> None:
    threads: list[int] = []
    handle = _Handle()

    def start() -> Stream:
        threads.append(threading.get_ident())
        return _stream([{"n": 1}, {"n": 2}], threads, handle)

    async def main() -> list[Any]:
        relay = Relay(start, time.monotonic() + WAIT_S)
        assert await relay.begun() is None  # a stream: its chunks follow
        return [await relay.queue.get() for _ in range(3)]

    *chunks, end = asyncio.run(main())
    assert chunks == [{"n": 1}, {"n": 2}]
    assert not isinstance(end, dict)  # the end marker
    assert len(threads) == 3 and len(set(threads)) == 1
    assert threading.get_ident() not in threads
    assert not handle.cancelled.is_set()


def test_a_whole_answer_and_an_error_come_back_from_begun() -> None:
    async def main() -> None:
        relay = Relay(lambda: {"answer": 42}, time.monotonic() + WAIT_S)
        assert await relay.begun() == {"answer": 42}

        def refused() -> Stream:
            raise InvalidRequestError("'max_tokens' must be at least 1", "max_tokens")

        with pytest.raises(InvalidRequestError, match="max_tokens"):
            await Relay(refused, time.monotonic() + WAIT_S).begun()

    asyncio.run(main())


def test_a_request_given_up_before_start_returns_is_cancelled_once_submitted() -> None:
    release = threading.Event()
    handle = _Handle()

    def start() -> Stream:
        assert release.wait(WAIT_S)
        return _stream([{"n": 1}], [], handle)

    async def main() -> None:
        relay = Relay(start, time.monotonic() + WAIT_S)
        waiting = asyncio.ensure_future(relay.begun())
        await asyncio.sleep(0)  # begun() is waiting for start
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not handle.cancelled.is_set()  # nothing submitted yet
        release.set()
        assert await asyncio.to_thread(handle.cancelled.wait, WAIT_S)
        await _drained(relay)

    asyncio.run(main())


def test_cancel_stops_a_running_stream() -> None:
    handle = _Handle()

    async def main() -> None:
        relay = Relay(lambda: _stream([{"n": 1}], [], handle), time.monotonic() + WAIT_S)
        assert await relay.begun() is None
        relay.cancel()
        await _drained(relay)

    asyncio.run(main())
    assert handle.cancelled.is_set()


def _wait_for_threads(count: int) -> None:
    """Wait (at most ``WAIT_S``) until at most ``count`` threads are running."""
    deadline = time.monotonic() + WAIT_S
    while threading.active_count() > count and time.monotonic() < deadline:
        time.sleep(0.01)


class _Connected:
    """A request whose client stays connected: its ``receive`` never returns."""

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def _stalled(handle: _Handle, release: threading.Event) -> Stream:
    """A stream that sends one chunk, then nothing until ``release`` is set."""

    def chunked() -> Iterator[dict[str, Any]]:
        yield {"n": 1}
        release.wait(WAIT_S)

    return Stream(chunked(), handle)  # type: ignore[arg-type]


def test_a_stream_that_stalls_past_the_deadline_is_a_504_and_cancelled() -> None:
    handle, release = _Handle(), threading.Event()

    async def main() -> None:
        relay = Relay(lambda: _stalled(handle, release), time.monotonic() + 0.2)
        assert await relay.begun() is None
        with pytest.raises(ApiError) as raised:
            await relay.gather(_Connected())  # type: ignore[arg-type]
        assert raised.value.status == 504
        assert handle.cancelled.is_set()
        release.set()
        await _drained(relay)

    asyncio.run(main())


def test_a_streams_events_end_with_a_timeout_event_past_the_deadline() -> None:
    handle, release = _Handle(), threading.Event()

    async def main() -> list[bytes]:
        relay = Relay(lambda: _stalled(handle, release), time.monotonic() + 0.2)
        assert await relay.begun() is None
        sent = [e async for e in relay.events(_Connected(), lambda: None)]  # type: ignore[arg-type]
        release.set()
        return sent

    first, error, done = asyncio.run(main())
    assert json.loads(first.removeprefix(b"data: ")) == {"n": 1}
    assert json.loads(error.removeprefix(b"data: "))["error"]["type"] == "timeout"
    assert done == b"data: [DONE]\n\n"
    assert handle.cancelled.is_set()


def test_a_finished_requests_queue_is_not_kept_alive_by_its_deadline() -> None:
    """The deadline's timer goes with the request: a server with a long ``--timeout``
    would otherwise keep a timer and a queue for every request it answered until then."""
    threads = threading.active_count()
    release = threading.Event()

    def delayed() -> Iterator[dict[str, Any]]:
        release.wait(WAIT_S)
        yield {"n": 1}

    class Watched(_Connected):
        async def receive(self) -> dict[str, Any]:
            # the watcher starts once gather waits on an empty queue: the timer is armed
            release.set()
            return await super().receive()

    async def main() -> None:
        relay = Relay(lambda: Stream(delayed(), _Handle()), time.monotonic() + 3600)  # type: ignore[arg-type]
        assert await relay.begun() is None
        assert await relay.gather(Watched()) == [{"n": 1}]  # type: ignore[arg-type]
        queue = weakref.ref(relay.queue)
        del relay
        await asyncio.sleep(0)  # the disconnect watcher's cancellation runs
        await asyncio.to_thread(_wait_for_threads, threads + 1)  # the relay's thread ended
        gc.collect()
        assert queue() is None

    asyncio.run(main())


def test_a_stream_outliving_its_event_loop_is_cancelled_and_its_thread_ends_quietly() -> None:
    """The server stopped (its loop closed) while a generation still streams: the
    relay's thread cancels it at its next chunk and ends without an exception (one
    reached the server's stderr as a traceback from a thread)."""
    handle, release = _Handle(), threading.Event()

    def chunked() -> Iterator[dict[str, Any]]:
        yield {"n": 1}
        release.wait(WAIT_S)
        yield {"n": 2}  # finds the loop closed
        yield {"n": 3}

    raised: list[BaseException | None] = []
    before = threading.excepthook
    threading.excepthook = lambda hook: raised.append(hook.exc_value)
    threads = threading.active_count()
    try:

        async def main() -> Relay:
            relay = Relay(lambda: Stream(chunked(), handle), time.monotonic() + WAIT_S)  # type: ignore[arg-type]
            assert await relay.begun() is None
            assert await asyncio.wait_for(relay.queue.get(), WAIT_S) == {"n": 1}
            return relay  # the loop closes with the stream still running

        relay = asyncio.run(main())
        release.set()
        _wait_for_threads(threads)
    finally:
        threading.excepthook = before
    assert raised == []
    assert threading.active_count() == threads
    assert handle.cancelled.is_set()
    assert relay.last == {"n": 2} and relay.ended is None  # nothing read after the drop

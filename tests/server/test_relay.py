"""The relay between a request's generation and the event loop: ``start`` (which
submits the request) and the stream's chunks share one thread, so a token reaches the
loop by one hand-over; a request given up before ``start`` returns is cancelled as soon
as it exists."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tensorplug_llm.api import InvalidRequestError, Stream
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

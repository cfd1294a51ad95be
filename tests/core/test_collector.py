"""tensorplug.collector.paused: the cyclic collector held off while plans are built."""

from __future__ import annotations

import gc
import threading

import pytest

from tensorplug import collector


@pytest.fixture(autouse=True)
def _collector_on() -> object:
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_off_inside_and_back_on_after() -> None:
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_back_on_after_an_exception() -> None:
    with pytest.raises(KeyError), collector.paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_nested_blocks_turn_it_on_once_the_outer_one_ends() -> None:
    with collector.paused():
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_program_that_turned_it_off_keeps_it_off() -> None:
    gc.disable()
    with collector.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_the_last_thread_out_turns_it_back_on() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector.paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with collector.paused():
        pass
    assert not gc.isenabled()  # the other thread is still planning
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_no_collection_runs_inside() -> None:
    collections: list[str] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(phase)

    gc.callbacks.append(note)
    try:
        with collector.paused():
            junk = [[i] for i in range(50_000)]  # ~70 young collections' worth
            inside = len(collections)
        del junk
        gc.collect(0)
    finally:
        gc.callbacks.remove(note)
    assert inside == 0
    assert collections  # the callback does see collections

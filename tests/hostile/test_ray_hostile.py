"""The Ray actor's calls and graph descriptions come over the network: whatever they
hold, the answer is an error that names what was wrong — never a MemoryError from a
size taken on trust, a RecursionError, or a bare TypeError."""

from __future__ import annotations

import pytest

import tensorplug as tp
from tensorplug.host import host_buffer_type

pytest.importorskip("tensorplug_ray", reason="tensorplug-ray is not installed")
from tensorplug_ray.server import DeviceServer


def _server() -> DeviceServer:
    """An actor's object without Ray or a backend: its buffers are plain host buffers
    (``__init__`` would also rewrite this process's environment)."""
    server = DeviceServer.__new__(DeviceServer)
    server.buffers = {h: host_buffer_type().alloc_buffer(64) for h in (1, 2)}
    server.buffers[1].clear(7)
    server.buffers[2].clear(0)
    return server


@pytest.mark.parametrize("size", [-5, 1 << 40, 65])
def test_a_read_outside_the_buffer_is_refused_before_memory_is_taken(size: int) -> None:
    with pytest.raises(tp.OutOfBoundsError, match="outside buffer 1"):
        _server().read(1, 0, size)


def test_a_copy_outside_either_buffer_is_refused_and_writes_nothing() -> None:
    server = _server()
    with pytest.raises(tp.OutOfBoundsError, match="outside buffer"):
        server.copy(1, 0, 2, 0, 1 << 40)
    with pytest.raises(tp.OutOfBoundsError, match="outside buffer 2"):
        server.copy(1, 0, 2, 60, 8)
    assert server.read(2, 0, 64) == bytes(64)
    server.copy(1, 0, 2, 0, 8)
    assert server.read(2, 0, 8) == bytes([7] * 8)

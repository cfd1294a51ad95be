"""The Ray actor's calls and graph descriptions come over the network: whatever they
hold, the answer is an error that names what was wrong — never a MemoryError from a
size taken on trust, a RecursionError, or a bare TypeError."""

from __future__ import annotations

from typing import Any

import pytest

import tensorplug as tp
from tensorplug import ops
from tensorplug.host import host_buffer_type

pytest.importorskip("tensorplug_ray", reason="tensorplug-ray is not installed")
from tensorplug_ray import wire
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


def _description() -> tuple[dict[str, Any], dict[int, Any]]:
    """A small graph's description and the host buffer (handle 7) it is placed in."""
    x = tp.new_tensor("f32", (3, 8), "x")
    g = tp.Graph(ops.scale(ops.neg(x), 0.5))
    buf = tp.alloc_tensors([x, *g.nodes], host_buffer_type())
    return wire.encode_graph(g, lambda t: 7), {7: buf}


def _deep(depth: int) -> list[Any]:
    nested: list[Any] = []
    for _ in range(depth):
        nested = [nested]
    return nested


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(nodes=5), "'nodes' must be a list"),
        (lambda d: d.update(nodes="0"), "'nodes' must be a list"),
        (lambda d: d["tensors"][0].update(shape=_deep(100_000)), "shape: expected a whole number"),
        (lambda d: d["tensors"][0].update(strides=[_deep(100_000)] * 2), "whole number"),
        (lambda d: d["tensors"][1].update(params=[_deep(100_000)]), "malformed param"),
        (lambda d: d["tensors"][1].update(op=_deep(100_000)), "unknown op"),
        (lambda d: d["tensors"][0].update(kind=_deep(100_000)), "kind must be"),
        (lambda d: d.update(nodes=[_deep(100_000)]), "node list"),
    ],
    ids=[
        "nodes-int",
        "nodes-str",
        "deep-shape",
        "deep-strides",
        "deep-param",
        "deep-op",
        "deep-kind",
        "deep-node",
    ],
)
def test_a_hostile_description_is_a_description_error(mutate: Any, match: str) -> None:
    desc, buffers = _description()
    mutate(desc)
    with pytest.raises(wire.DescriptionError, match=match) as info:
        wire.decode_graph(desc, buffers)
    assert len(str(info.value)) < 1000  # the message shows the value, briefly

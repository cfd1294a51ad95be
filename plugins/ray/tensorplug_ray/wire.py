"""The graph description that crosses to a remote device: plain data, validated on arrival.

A graph travels as a table of tensors made only of lists, dicts, strings, ints, floats
and bools — no pickled objects, no function pointers (ggml-rpc's `op_params` carry a
function pointer for custom ops; ours carry typed values only). The actor does not trust
the table: it checks every field's type and range, keeps every tensor's bytes inside a
buffer it owns, and rebuilds each node by calling the core's own op builder on the
node's rebuilt sources, so a node is exactly what :mod:`tensorplug.ops` would build and
its shape checks run again on the actor's side. An op without a builder here is
reported as unsupported instead of being trusted.

Two kinds of entries:

- *placed* tensors — a graph's inputs and leafs, anything a node reads that the graph
  does not compute: type, shape, byte strides, buffer handle and absolute byte offset;
- *nodes*: op name, typed params, source indices (always earlier entries), name, flags,
  the geometry the client expects (checked against the rebuilt node) and, unless the
  node is a view, its buffer handle and offset.
"""

from __future__ import annotations

import enum
import hashlib
import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorplug import opcodes
from tensorplug.errors import TensorplugError, UnsupportedError
from tensorplug.opcodes import Op
from tensorplug.rebuild import BUILDERS
from tensorplug.tensor import MAX_DIMS, Tensor, TensorFlag
from tensorplug.types import Type

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer
    from tensorplug.graph import Graph

__all__ = [
    "BUILDERS",
    "DescriptionError",
    "VERSION",
    "decode_graph",
    "decode_op",
    "digest",
    "encode_graph",
    "encode_op",
    "op_key",
]

#: Bumped whenever the table's layout changes; an actor refuses any other version.
VERSION = 1
#: Bounds that keep a hostile description from costing the actor unbounded work.
MAX_TENSORS = 1 << 20
MAX_NAME = 256

Params = dict[str, Any]


class DescriptionError(TensorplugError, ValueError):
    """A graph description is malformed or asks for memory the device does not own."""


#: The enum types a param may hold, by name: every enum the op vocabulary defines.
_ENUMS: dict[str, type[enum.Enum]] = {
    name: obj
    for name, obj in vars(opcodes).items()
    if isinstance(obj, type) and issubclass(obj, enum.Enum) and obj is not Op
}


# -- client side: encode --------------------------------------------------------------------


def _encode_value(key: str, value: Any) -> list[Any]:
    if isinstance(value, enum.Enum):
        cls = type(value).__name__
        if _ENUMS.get(cls) is not type(value):
            raise UnsupportedError(f"op param {key!r}: enum {cls} cannot cross to a remote device")
        return ["e", cls, value.value]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", value]
    if isinstance(value, float):
        return ["f", value]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return ["ti", list(value)]
    raise UnsupportedError(
        f"op param {key!r} = {value!r} ({type(value).__name__}) cannot cross to a remote device"
    )


def encode_params(params: Mapping[str, Any]) -> list[list[Any]]:
    return [[key, *_encode_value(key, params[key])] for key in sorted(params)]


def op_key(node: Tensor) -> tuple[Any, ...]:
    """What a device's answer to ``supports_op`` depends on: op, params, types, layouts.

    Extents are left out on purpose — a decode step's attention changes its length every
    token, and asking the remote side again each time would cost a round trip per node.
    """

    def layout(t: Tensor) -> tuple[Any, ...]:
        return (t.type, t.ndim, t.is_contiguous, t.rows_contiguous)

    params = tuple((k, repr(v)) for k, v in sorted(node.op_params.items()))
    return (node.op, params, layout(node), tuple(layout(s) for s in node.src))


class _Table:
    """Assigns each tensor one entry, sources first."""

    def __init__(self, handle_of: Callable[[Tensor], int]) -> None:
        self.entries: list[dict[str, Any]] = []
        self.index: dict[int, int] = {}
        self.handle_of = handle_of

    def geometry(self, t: Tensor) -> dict[str, Any]:
        return {"type": t.type.name, "shape": list(t.shape), "strides": list(t.strides)}

    def placed(self, t: Tensor) -> int:
        if (i := self.index.get(id(t))) is not None:
            return i
        entry = self.geometry(t)
        entry.update(kind="placed", buf=self.handle_of(t), off=t.offset)
        return self._add(t, entry)

    def node(self, t: Tensor, nodes: set[int]) -> int:
        if (i := self.index.get(id(t))) is not None:
            return i
        # graph nodes come sources first, so this recursion is one level deep
        src = [self.node(s, nodes) if id(s) in nodes else self.placed(s) for s in t.src]
        entry = self.geometry(t)
        entry.update(
            kind="node", op=t.op.value, params=encode_params(t.op_params), src=src,
            name=t.name[:MAX_NAME], flags=int(t.flags),
        )  # fmt: skip
        if t.view_src is None:
            entry.update(buf=self.handle_of(t), off=t.offset)
        return self._add(t, entry)

    def _add(self, t: Tensor, entry: dict[str, Any]) -> int:
        self.index[id(t)] = len(self.entries)
        self.entries.append(entry)
        return len(self.entries) - 1


def encode_graph(graph: Graph, handle_of: Callable[[Tensor], int]) -> dict[str, Any]:
    """The description of ``graph``; ``handle_of`` maps a tensor to its remote buffer handle
    (and raises when the tensor does not live on the remote device)."""
    table = _Table(handle_of)
    computed = {id(t) for t in graph.nodes if t.op is not Op.NONE}
    nodes = [table.node(t, computed) if id(t) in computed else table.placed(t)
             for t in graph.nodes]  # fmt: skip
    return {"v": VERSION, "tensors": table.entries, "nodes": nodes}


def encode_op(node: Tensor) -> dict[str, Any]:
    """A one-node description with unplaced sources, for asking ``supports_op`` remotely."""
    table = _Table(lambda t: -1)
    for s in node.src:
        table.placed(s)
    index = table.node(node, {id(node)})
    table.entries[index].pop("buf", None)
    table.entries[index].pop("off", None)
    return {"v": VERSION, "tensors": table.entries, "nodes": [index]}


def digest(description: Mapping[str, Any]) -> str:
    """A content hash that names a description in the actor's cache."""
    return hashlib.blake2b(repr(description).encode(), digest_size=16).hexdigest()


# -- actor side: decode and validate ----------------------------------------------------------


def _fail(where: str, message: str) -> DescriptionError:
    return DescriptionError(f"graph description, {where}: {message}")


_REPR = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 80, 80


def _brief(value: Any) -> str:
    """``repr(value)`` cut short — nested three levels, eight items, 80 characters: a
    hostile value nested 100000 deep made ``repr`` itself raise RecursionError while
    the error about it was being built."""
    return _REPR.repr(value)


def _int(value: Any, where: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise _fail(where, f"expected a whole number in [{lo}, {hi}], got {_brief(value)}")
    return value


def _ints(value: Any, where: str, n_min: int, n_max: int) -> tuple[int, ...]:
    if type(value) is not list or not n_min <= len(value) <= n_max:
        raise _fail(
            where, f"expected a list of {n_min} to {n_max} whole numbers, got {_brief(value)}"
        )
    return tuple(_int(v, where) for v in value)


#: Scalar param kinds and the exact Python type each must arrive as.
_SCALARS: dict[str, type] = {"b": bool, "i": int, "f": float, "s": str}


def _decode_params(raw: Any, where: str) -> Params:
    if type(raw) is not list or len(raw) > 64:
        raise _fail(where, "params must be a list of at most 64 [key, kind, value...] items")
    params: Params = {}
    for item in raw:
        if type(item) is not list or len(item) < 3 or type(item[0]) is not str:
            raise _fail(where, f"malformed param {_brief(item)}")
        key, kind, *rest = item
        if type(kind) is not str:  # (a list would not even hash, for the lookups below)
            raise _fail(where, f"param {_brief(key)} has an unknown kind: {_brief(kind)}")
        if kind == "e" and len(rest) == 2 and type(rest[0]) is str and rest[0] in _ENUMS:
            try:
                params[key] = _ENUMS[rest[0]](rest[1])
            except ValueError:
                raise _fail(
                    where, f"param {_brief(key)}: {_brief(rest[1])} is no {rest[0]}"
                ) from None
        elif kind in _SCALARS and len(rest) == 1 and type(rest[0]) is _SCALARS[kind]:
            if isinstance(rest[0], str) and len(rest[0]) > MAX_NAME:
                raise _fail(where, f"param {_brief(key)}: string longer than {MAX_NAME} characters")
            params[key] = rest[0]
        elif kind == "ti" and len(rest) == 1:
            params[key] = _ints(rest[0], f"{where}, param {_brief(key)}", 0, MAX_DIMS)
        else:
            raise _fail(where, f"param {_brief(key)} has an unknown kind or value: {_brief(item)}")
    return params


Geometry = tuple[Type, tuple[int, ...], tuple[int, ...]]


def _geometry(entry: Mapping[str, Any], where: str) -> Geometry:
    try:
        t = Type.parse(entry["type"])
    except (KeyError, ValueError, TypeError) as e:
        raise _fail(where, f"bad tensor type ({e})") from None
    shape = _ints(entry.get("shape"), f"{where}, shape", 1, MAX_DIMS)
    strides = _ints(entry.get("strides"), f"{where}, strides", len(shape), len(shape))
    if math.prod(shape) > 1 << 48:
        raise _fail(where, f"shape {shape} is impossibly large")
    return t, shape, strides


class _Placer:
    """Puts decoded tensors into the actor's buffers, refusing anything out of bounds."""

    def __init__(self, buffers: Mapping[int, Buffer] | None) -> None:
        self.buffers = buffers

    def place(self, t: Tensor, entry: Mapping[str, Any], where: str) -> None:
        if self.buffers is None:  # a supports_op question: nothing is placed
            return
        handle = _int(entry.get("buf"), f"{where}, buffer handle", 0)
        offset = _int(entry.get("off"), f"{where}, offset", 0)
        buffer = self.buffers.get(handle)
        if buffer is None:
            raise _fail(where, f"buffer handle {handle} is not allocated on this device")
        if offset + t.nbytes > buffer.size:
            raise _fail(
                where,
                f"{t.describe()} spans bytes [{offset}, {offset + t.nbytes}) but buffer "
                f"{handle} has {buffer.size} bytes",
            )
        t.buffer = buffer
        t.offset = offset
        buffer.init_tensor(t)

    def place_view(self, t: Tensor) -> None:
        if self.buffers is None:
            return
        base = t.base
        t.buffer = base.buffer
        t.offset = base.offset + t.view_offs
        if base.buffer is not None:
            base.buffer.init_tensor(t)


def _decode(desc: Any, buffers: Mapping[int, Buffer] | None) -> tuple[list[Tensor], list[Tensor]]:
    if type(desc) is not dict or desc.get("v") != VERSION:
        raise _fail(
            "header", f"expected a dict with v={VERSION} (do client and actor versions differ?)"
        )
    entries = desc.get("tensors")
    if type(entries) is not list or len(entries) > MAX_TENSORS:
        raise _fail("header", f"'tensors' must be a list of at most {MAX_TENSORS} entries")
    placer = _Placer(buffers)
    tensors: list[Tensor] = []
    for i, entry in enumerate(entries):
        where = f"tensor {i}"
        if type(entry) is not dict:
            raise _fail(where, "each entry must be a dict")
        t_type, shape, strides = _geometry(entry, where)
        kind = entry.get("kind")
        if kind == "placed":
            try:
                t = Tensor(t_type, shape, strides=strides)
            except TensorplugError as e:
                raise _fail(where, str(e)) from None
            placer.place(t, entry, where)
        elif kind == "node":
            t = _rebuild(entry, tensors, i, (t_type, shape, strides))
            if t.view_src is None:
                placer.place(t, entry, where)
            else:
                placer.place_view(t)
        else:
            raise _fail(where, f"kind must be 'placed' or 'node', got {_brief(kind)}")
        tensors.append(t)
    listed = desc.get("nodes", [])
    if type(listed) is not list or len(listed) > MAX_TENSORS:
        raise _fail("header", f"'nodes' must be a list of at most {MAX_TENSORS} entry indices")
    nodes = [tensors[_int(n, "node list", 0, len(tensors) - 1)] for n in listed]
    return tensors, nodes


def _rebuild(
    entry: Mapping[str, Any],
    earlier: Sequence[Tensor],
    index: int,
    expected: Geometry,
) -> Tensor:
    where = f"node {index}"
    name_of_op = entry.get("op")
    try:  # Op(a list) would search by value and repr it in its error
        op = Op(name_of_op) if type(name_of_op) is str else None
    except ValueError:
        op = None
    if op is None:
        raise _fail(where, f"unknown op {_brief(name_of_op)}")
    builder = BUILDERS.get(op)
    if builder is None:
        raise UnsupportedError(f"{where}: op {op.value} cannot run on a remote device yet")
    src_ids = _ints(entry.get("src"), f"{where}, sources", 0, 8)
    if any(s >= index for s in src_ids):
        raise _fail(where, f"sources {src_ids} must be earlier entries (no cycles)")
    params = _decode_params(entry.get("params"), where)
    name = entry.get("name", "")
    if type(name) is not str or len(name) > MAX_NAME:
        raise _fail(where, f"name must be a string of at most {MAX_NAME} characters")
    t_type, shape, strides = expected
    try:
        node = builder([earlier[s] for s in src_ids], params, shape, strides)
    except KeyError as e:
        raise _fail(where, f"op {op.value} is missing its param {e}") from None
    except (TensorplugError, TypeError, ValueError, IndexError) as e:
        raise _fail(where, f"op {op.value} cannot be built from its sources: {e}") from None
    if node.op is not op or (node.type, node.shape, node.strides) != expected:
        raise _fail(
            where,
            f"op {op.value} builds {node.type.name}{list(node.shape)} strides {node.strides} "
            f"from its sources, not the described {t_type.name}{list(shape)} strides {strides}",
        )
    node.name = name
    node.flags = TensorFlag(_int(entry.get("flags", 0), f"{where}, flags", 0, 7))
    return node


def decode_graph(desc: Any, buffers: Mapping[int, Buffer]) -> list[Tensor]:
    """The nodes to compute, rebuilt and placed in ``buffers``; raises on any doubt."""
    return _decode(desc, buffers)[1]


def decode_op(desc: Any) -> Tensor:
    """The single node of an :func:`encode_op` description, unplaced."""
    _, nodes = _decode(desc, None)
    if len(nodes) != 1:
        raise _fail("header", "a supports_op question names exactly one node")
    return nodes[0]

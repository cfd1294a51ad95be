"""What runs inside a Ray actor: one ordinary tensorplug backend behind handles.

The client never sees a pointer or a Python object of the actor's: buffers are small
integers, data moves as bytes, and graphs arrive as the validated plain-data
description of :mod:`tensorplug_ray.wire`, cached by content so that repeated steps
send only the digest. Ray runs an actor's calls one at a time in the order one caller
submitted them, which is the stream ordering a backend needs.
"""

from __future__ import annotations

import os
import socket
from collections import OrderedDict
from typing import Any

__all__ = ["BATCHABLE", "GRAPH_CACHE", "DeviceServer"]

#: Calls a client may queue and send together through :meth:`DeviceServer.run`.
BATCHABLE = frozenset({"write", "memset", "clear", "free", "copy", "compute"})

#: Descriptions kept per actor; the client mirrors this exact LRU to know what to resend.
GRAPH_CACHE = 32


class DeviceServer:
    """A remote device: ``backend`` names the plugin to run, ``index`` picks its device."""

    def __init__(self, backend: str, index: int) -> None:
        # The actor's own registry must not load this plugin again (an actor starting
        # actors), and should not initialise backends it was not asked for.
        os.environ["TENSORPLUG_DISABLE"] = "Ray"
        os.environ["TENSORPLUG_BACKENDS"] = backend
        os.environ.pop("TENSORPLUG_RAY_ADDRESS", None)
        import tensorplug as tp

        wanted = backend.casefold()
        devices = [d for d in tp.devices() if d.reg is not None and d.reg.name.casefold() == wanted]
        if not devices:
            found = ", ".join(d.name for d in tp.devices()) or "none"
            raise tp.BackendNotFoundError(
                f"node {socket.gethostname()} has no {backend} device (devices there: {found}); "
                "install that backend's plugin on every node, or ask for another backend in "
                "TENSORPLUG_RAY_DEVICES"
            )
        self.device = devices[index % len(devices)]
        self.backend = self.device.init_backend()
        self.buffers: dict[int, Any] = {}
        self.graphs: OrderedDict[str, list[Any]] = OrderedDict()

    # -- description of the device ------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        import ray

        import tensorplug

        props = self.device.props()
        buft = self.device.buffer_type()
        caps = props.caps
        return {
            "device": props.name,
            "backend": self.device.reg.name if self.device.reg is not None else "",
            "description": props.description,
            "type": props.type.value,
            "memory_free": props.memory_free,
            "memory_total": props.memory_total,
            "device_id": props.device_id,
            "caps": {"asynchronous": caps.asynchronous, "events": caps.events},
            "alignment": buft.alignment,
            "max_size": buft.max_size,
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "tensorplug": tensorplug.__version__,
        }

    def memory(self) -> tuple[int, int]:
        return self.device.memory()

    def supports(self, desc: Any) -> bool:
        from tensorplug.errors import TensorplugError

        from .wire import decode_op

        try:
            return bool(self.device.supports_op(decode_op(desc)))
        except TensorplugError:
            return False

    # -- buffers ------------------------------------------------------------------------

    def alloc(self, handle: int, size: int) -> None:
        if type(handle) is not int or handle in self.buffers:
            raise ValueError(f"buffer handle {handle!r} is not a fresh whole number")
        if type(size) is not int or size < 0:
            raise ValueError(f"buffer size {size!r} must be a whole number of bytes")
        self.buffers[handle] = self.device.buffer_type().alloc_buffer(size)

    def free(self, handle: int) -> None:
        buffer = self.buffers.pop(handle, None)
        if buffer is not None:
            buffer.free()

    def _span(self, handle: int, offset: int, size: int) -> Any:
        """A raw byte span of a buffer as a placed I8 tensor (bounds-checked)."""
        from tensorplug.errors import OutOfBoundsError
        from tensorplug.tensor import Tensor

        buffer = self.buffers.get(handle)
        if buffer is None:
            raise OutOfBoundsError(f"buffer handle {handle!r} is not allocated on this device")
        if type(offset) is not int or type(size) is not int or offset < 0 or size < 0 \
                or offset + size > buffer.size:  # fmt: skip
            raise OutOfBoundsError(
                f"bytes [{offset}, {offset}+{size}) are outside buffer {handle} "
                f"({buffer.size} bytes)"
            )
        span = Tensor("i8", (size,))
        span.buffer, span.offset = buffer, offset
        return span

    def write(self, handle: int, offset: int, data: Any) -> None:
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"write takes bytes, got {type(data).__name__}")
        if data:
            span = self._span(handle, offset, len(data))
            span.buffer.set_tensor(span, memoryview(data), 0)

    def read(self, handle: int, offset: int, size: int) -> bytes:
        span = self._span(handle, offset, size)  # checked before any memory is taken
        out = bytearray(size)
        if out:
            span.buffer.get_tensor(span, memoryview(out), 0)
        return bytes(out)

    def copy(self, src: int, src_offset: int, dst: int, dst_offset: int, size: int) -> None:
        """A copy between two buffers of this actor, without leaving the process. Both
        spans are checked first: nothing is read for a copy that cannot be written."""
        self._span(dst, dst_offset, size)
        self.write(dst, dst_offset, self.read(src, src_offset, size))

    def memset(self, handle: int, offset: int, size: int, value: int) -> None:
        if size:
            span = self._span(handle, offset, size)
            span.buffer.memset_tensor(span, value, 0, size)

    def clear(self, handle: int, value: int) -> None:
        buffer = self.buffers.get(handle)
        if buffer is None:
            raise ValueError(f"buffer handle {handle!r} is not allocated on this device")
        buffer.clear(value)

    # -- compute ------------------------------------------------------------------------

    def compute(self, key: str, desc: Any) -> str:
        from tensorplug.graph import Graph

        from .wire import decode_graph

        if desc is not None:
            nodes = decode_graph(desc, self.buffers)
            self.graphs[key] = nodes
            while len(self.graphs) > GRAPH_CACHE:
                self.graphs.popitem(last=False)
        elif key in self.graphs:
            nodes = self.graphs[key]
        else:
            raise KeyError(f"graph {key} is not cached on this device; the client must resend it")
        self.graphs.move_to_end(key)
        status = self.backend.graph_compute(Graph.from_parts(nodes, ()))
        return str(status.value)

    def run(self, calls: Any) -> None:
        """Several queued calls in one round trip, in order (the client batches a step's
        small writes with its graph compute)."""
        if type(calls) is not list:
            raise TypeError("run takes a list of [method, args] pairs")
        for item in calls:
            if type(item) is not list or len(item) != 2 or item[0] not in BATCHABLE \
                    or type(item[1]) is not list:  # fmt: skip
                raise ValueError(
                    f"run: {item!r} is not a [method, args] pair of {sorted(BATCHABLE)}"
                )
            getattr(self, item[0])(*item[1])

    def forget_graphs(self) -> None:
        self.graphs.clear()

    def synchronize(self) -> None:
        self.backend.synchronize()

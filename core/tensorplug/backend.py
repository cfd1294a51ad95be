"""Backends (streams) and events: where graphs are computed (ggml's backend / event).

A backend is one execution stream on a device. Operations that ggml makes optional
fall back to their synchronous forms here, so a simple plugin implements only
``_graph_compute``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from .errors import UnsupportedError

if TYPE_CHECKING:
    from .buffer import BufferType
    from .device import Device
    from .graph import Graph
    from .tensor import Tensor

__all__ = ["Backend", "Event", "GraphPlan", "Status"]


class Status(enum.Enum):
    SUCCESS = "success"
    FAILED = "failed"
    ALLOC_FAILED = "alloc_failed"
    ABORTED = "aborted"


class GraphPlan:
    """A graph prepared for repeated computation on one backend; plugins subclass it."""

    def __init__(self, backend: Backend, graph: Graph) -> None:
        self.backend = backend
        self.graph = graph


class Event:
    """A marker recorded on one backend's stream that others can wait for."""

    def __init__(self, device: Device, context: Any = None) -> None:
        self.device = device
        self.context = context

    def record(self, backend: Backend) -> None:
        backend.event_record(self)

    def wait(self, backend: Backend) -> None:
        backend.event_wait(self)

    def synchronize(self) -> None:
        self.device.event_synchronize(self)

    def free(self) -> None:
        self.device.event_free(self)


class Backend(ABC):
    """One stream of work on a device."""

    def __init__(self, device: Device) -> None:
        self.device = device

    # -- required -----------------------------------------------------------------------

    @abstractmethod
    def _graph_compute(self, graph: Graph) -> Status:
        """Start computing every node of ``graph`` (may return before it finishes)."""

    # -- optional, with ggml's defaults -------------------------------------------------

    @property
    def name(self) -> str:
        return self.device.name

    def free(self) -> None:
        """Release the stream's resources."""

    def synchronize(self) -> None:
        """Wait until all queued work has finished (required for async backends)."""

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        tensor.require_allocated().set_tensor(tensor, data, offset)

    def _get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        tensor.require_allocated().get_tensor(tensor, out, offset)

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Copy ``src`` (on ``backend_src``) to ``dst`` (on this backend); False if unsupported."""
        return False

    def graph_plan_create(self, graph: Graph) -> GraphPlan:
        raise UnsupportedError(f"backend {self.name!r} does not support graph plans")

    def graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        raise UnsupportedError(f"backend {self.name!r} does not support graph plans")

    def graph_plan_compute(self, plan: GraphPlan) -> Status:
        raise UnsupportedError(f"backend {self.name!r} does not support graph plans")

    def graph_plan_free(self, plan: GraphPlan) -> None:
        """Release a plan's resources."""

    def event_record(self, event: Event) -> None:
        raise UnsupportedError(f"backend {self.name!r} does not support events")

    def event_wait(self, event: Event) -> None:
        raise UnsupportedError(f"backend {self.name!r} does not support events")

    # -- public -------------------------------------------------------------------------

    def set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int = 0) -> None:
        buf = tensor.require_allocated()
        buf._check_range(tensor, offset, len(data), "set_tensor_async")
        self._set_tensor_async(tensor, data, offset)

    def get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int = 0) -> None:
        buf = tensor.require_allocated()
        buf._check_range(tensor, offset, len(out), "get_tensor_async")
        self._get_tensor_async(tensor, out, offset)

    def graph_compute_async(self, graph: Graph) -> Status:
        return self._graph_compute(graph)

    def graph_compute(self, graph: Graph) -> Status:
        """Compute ``graph`` and wait for it (``ggml_backend_graph_compute``)."""
        status = self._graph_compute(graph)
        self.synchronize()
        return status

    def supports_op(self, op: Tensor) -> bool:
        return self.device.supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        return self.device.supports_buft(buft)

    def offload_op(self, op: Tensor) -> bool:
        return self.device.offload_op(op)

    def buffer_type(self) -> BufferType:
        return self.device.buffer_type()

    def alloc_buffer(self, size: int) -> Any:
        return self.device.buffer_type().alloc_buffer(size)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

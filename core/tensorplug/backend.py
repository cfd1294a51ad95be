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
from .hooknames import Guard, adopt_old_names, guarded, public

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
    """One stream of work on a device (``ggml_backend``).

    For plugin authors — the hooks a subclass implements (``help()`` lists the
    underscore ones here because applications never call them directly):

    * required: ``_graph_compute(graph)`` — compute every node of ``graph`` in order
      (or queue the work and return; then also implement ``synchronize``).
    * optional, with their defaults: ``synchronize()`` (nothing: compute is synchronous),
      ``free()`` (nothing), ``_set_tensor_async`` / ``_get_tensor_async`` (the buffer's
      synchronous copy), ``_cpy_tensor_async`` (False: the scheduler copies through the
      host), ``_graph_plan_create/_update/_compute/_free`` (UnsupportedError: graph
      plans are optional; callers fall back to ``graph_compute``),
      ``_event_record/_event_wait`` (UnsupportedError: declare
      ``DeviceCaps(events=True)`` when you have them).

    Applications call the public methods: ``graph_compute`` (compute and wait),
    ``graph_compute_async``, ``set/get_tensor_async``, ``cpy_tensor_async``,
    ``graph_plan_*``, ``event_record/wait``, ``synchronize``, ``free``. API 1.0's hook
    names (``graph_plan_create`` ... as hooks) still work, with a warning
    (:mod:`tensorplug.hooknames`). See docs/writing-a-backend.md.
    """

    def __init__(self, device: Device) -> None:
        self.device = device

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_old_names(cls, _BACKEND_RENAMED)
        own = cls.__dict__.get("supports_op")
        if own is not None and not getattr(own, "__tensorplug_public__", False):
            # a backend answering for its device still sees the device's op contract first
            cls.supports_op = guarded(own, _within_contract)  # type: ignore[method-assign]

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

    def cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Queue a copy of ``src`` (on ``backend_src``) into ``dst`` (on this backend).

        True when this backend queued it; False when it cannot, and the caller copies
        through host memory after synchronizing both streams (ggml's fallback; see
        :func:`tensorplug.tensor_copy_async`). Backends implement ``_cpy_tensor_async``.
        """
        return self._cpy_tensor_async(backend_src, src, dst)

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """The hook behind :meth:`cpy_tensor_async`; False (not supported) by default."""
        return False

    def _graph_prepare(self, graph: Graph) -> None:
        """Do now what the first ``graph_compute`` of a graph of this shape would do
        before computing (bind kernels, build a plan, load compiled code), and keep it
        for that compute; compute nothing. Nothing by default. A backend that keeps
        such per-graph work behind ``graph_compute`` (the CPU's plans) implements it, so
        that an application which knows its next graph's shape ahead (``tensorplug
        run``, its prompt's length) has it done while loading instead of computing a
        throw-away step of that shape."""

    def _graph_plan_create(self, graph: Graph) -> GraphPlan:
        """Prepare ``graph`` for repeated computation (bind kernels and arguments once).
        Optional: backends without plans raise UnsupportedError and callers use
        ``graph_compute``. The plan stays valid until the graph's memory changes
        (re-allocation: ``graph_plan_update``)."""
        raise UnsupportedError(f"backend {self.name!r} does not support graph plans")

    def _graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        """Rebind ``plan`` to ``graph`` (same structure, tensors possibly moved)."""
        raise UnsupportedError(f"backend {self.name!r} does not support graph plans")

    def _graph_plan_compute(self, plan: GraphPlan) -> Status:
        """Compute a prepared plan (may return before it finishes, like ``_graph_compute``)."""
        raise UnsupportedError(f"backend {self.name!r} does not support graph plans")

    def _graph_plan_free(self, plan: GraphPlan) -> None:
        """Release a plan's resources."""

    def _event_record(self, event: Event) -> None:
        """Mark the point in this stream that ``event`` stands for."""
        raise UnsupportedError(f"backend {self.name!r} does not support events")

    def _event_wait(self, event: Event) -> None:
        """Make work queued after this call wait until ``event`` has happened."""
        raise UnsupportedError(f"backend {self.name!r} does not support events")

    # -- public -------------------------------------------------------------------------

    @public
    def graph_prepare(self, graph: Graph) -> None:
        """Get ready to compute ``graph`` without computing it (:meth:`_graph_prepare`);
        its tensors must have their memory, as for ``graph_compute``."""
        self._graph_prepare(graph)

    @public
    def graph_plan_create(self, graph: Graph) -> GraphPlan:
        """``graph`` prepared for repeated computation (``ggml_backend_graph_plan_create``);
        UnsupportedError when the backend has no plans (then use ``graph_compute``)."""
        return self._graph_plan_create(graph)

    @public
    def graph_plan_update(self, plan: GraphPlan, graph: Graph) -> None:
        """Rebind ``plan`` (made by this backend) to ``graph`` after its tensors moved."""
        self._graph_plan_update(plan, graph)

    @public
    def graph_plan_compute(self, plan: GraphPlan) -> Status:
        """Start computing ``plan`` (made by this backend); ready after ``synchronize``."""
        return self._graph_plan_compute(plan)

    @public
    def graph_plan_free(self, plan: GraphPlan) -> None:
        """Release ``plan`` (made by this backend)."""
        self._graph_plan_free(plan)

    @public
    def event_record(self, event: Event) -> None:
        """Record ``event`` at this point of the stream (``ggml_backend_event_record``)."""
        self._event_record(event)

    @public
    def event_wait(self, event: Event) -> None:
        """Make work queued on this stream after now wait for ``event`` (any device's)."""
        self._event_wait(event)

    def set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int = 0) -> None:
        """Queue a write of ``data`` into ``tensor`` at byte ``offset``; ``data`` must stay
        alive and unchanged until ``synchronize``."""
        buf = tensor.require_allocated()
        buf.check_range(tensor, offset, len(data), "set_tensor_async")
        self._set_tensor_async(tensor, data, offset)

    def get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int = 0) -> None:
        """Queue a read of ``tensor`` from byte ``offset`` into ``out``, complete after
        ``synchronize``."""
        buf = tensor.require_allocated()
        buf.check_range(tensor, offset, len(out), "get_tensor_async")
        self._get_tensor_async(tensor, out, offset)

    def graph_compute_async(self, graph: Graph) -> Status:
        """Start computing ``graph``; results are ready after ``synchronize``."""
        return self._graph_compute(graph)

    def graph_compute(self, graph: Graph) -> Status:
        """Compute ``graph`` and wait for it (``ggml_backend_graph_compute``)."""
        status = self._graph_compute(graph)
        self.synchronize()
        return status

    @public
    def supports_op(self, op: Tensor) -> bool:
        """The device's answer (:meth:`Device.supports_op`: the op contract, then the
        plugin). A subclass may answer itself; the contract still comes first."""
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


def _within_contract(backend: Backend, op: Tensor, *_: Any) -> bool:
    from .contract import missing_feature

    return missing_feature(op, backend.device.api_version) is None


#: API 1.0's hook names and (hook, guard) in 1.3: see :mod:`tensorplug.hooknames`.
_BACKEND_RENAMED: dict[str, tuple[str, Guard | None]] = {
    "graph_plan_create": ("_graph_plan_create", None),
    "graph_plan_update": ("_graph_plan_update", None),
    "graph_plan_compute": ("_graph_plan_compute", None),
    "graph_plan_free": ("_graph_plan_free", None),
    "event_record": ("_event_record", None),
    "event_wait": ("_event_wait", None),
}

"""The TESTACCEL devices: private memory, a deferred stream and events.

What makes it a useful second backend for the scheduler tests:

* memory is a private numpy array that is *not* host memory (``is_host`` is False and
  ``host_array`` refuses), so every transfer really goes through set/get or copies;
* each backend is a stream whose work is *deferred*: computes, async transfers and
  copies are queued and run only when something synchronizes (the backend, an event
  recorded on it, or another stream waiting on such an event). Reading a result
  without synchronizing sees stale memory, exactly the bug an async GPU would show;
* events are supported, and so are async copies between two TESTACCEL devices (queued
  on the source stream, which the destination then waits for, as CUDA does);
* ``supports_op`` is deliberately partial: no soft_max, rope, flash attention, argmax
  or argsort, no quantized or BF16 tensors at all (``TestAccelReg(partial=False)``
  adds plain soft_max and rope);
* ``offload_op`` asks for mul_mat and get_rows with at least ``min_batch`` rows
  (init params ``"min_batch=N"``, default 32), like ggml's CUDA backend.

``TestAccelReg(n_devices=2)`` has two devices, each with its own buffer type, so the
scheduler must copy between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.backend import Backend, Event, Status
from tensorplug.buffer import Buffer, BufferType
from tensorplug.device import Device, DeviceCaps, DeviceType, Reg
from tensorplug.errors import AllocationError
from tensorplug.opcodes import Op
from tensorplug.types import Type

from . import kernels

if TYPE_CHECKING:
    from tensorplug.graph import Graph
    from tensorplug.tensor import Tensor

ALIGNMENT = 128
# tuples, not sets: the scheduler asks supports_op for every node, and tuple membership
# compares identities where a set would call the enum's (Python-level) __hash__
_TYPES = (Type.F32, Type.F16, Type.I32)
_NEVER = (Op.FLASH_ATTN_EXT, Op.ARGMAX, Op.ARGSORT)
#: ops a "partial" device (the default) also refuses, so that the scheduler must split
_PARTIAL = (Op.SOFT_MAX, Op.ROPE)
_VIEWS = (Op.NONE, Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE)
# ops that may produce integers: the kernels treat I32 only as row indices to move around
_INT_OK = (
    Op.NONE,
    Op.VIEW,
    Op.RESHAPE,
    Op.PERMUTE,
    Op.TRANSPOSE,
    Op.GET_ROWS,
    Op.CPY,
    Op.CONT,
    Op.DUP,
)


class AccelBufferType(BufferType):
    """Private device memory; ``max_size`` can be capped to exercise multi-buffers."""

    def __init__(self, device: AccelDevice, max_size: int | None = None) -> None:
        super().__init__(device)
        self.dev = device
        self._max_size = max_size

    @property
    def name(self) -> str:
        return f"{self.dev.name}_VRAM"

    @property
    def alignment(self) -> int:
        return ALIGNMENT

    @property
    def max_size(self) -> int:
        return self._max_size if self._max_size is not None else super().max_size

    def _alloc_buffer(self, size: int) -> Buffer:
        if size > self.dev.capacity - self.dev.used:
            raise AllocationError(
                f"{self.name}: {size} bytes requested, {self.dev.capacity - self.dev.used} free"
            )
        return AccelBuffer(self, size)


class AccelBuffer(Buffer):
    def __init__(self, buft: AccelBufferType, size: int) -> None:
        super().__init__(buft, size)
        self.dev = buft.dev
        self.mem = np.zeros(size, dtype=np.uint8)
        self.dev.used += size

    def _range(self, tensor: Tensor, offset: int, size: int) -> np.ndarray:
        start = tensor.offset + offset
        return self.mem[start : start + size]

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        self._range(tensor, offset, len(data))[...] = np.frombuffer(data, dtype=np.uint8)

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        np.frombuffer(out, dtype=np.uint8)[...] = self._range(tensor, offset, len(out))

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._range(tensor, offset, size)[...] = value

    def _clear(self, value: int) -> None:
        self.mem[...] = value

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        if not isinstance(src.buffer, AccelBuffer):
            return False
        self._range(dst, 0, dst.nbytes)[...] = src.buffer._range(src, 0, src.nbytes)
        return True

    def _free(self) -> None:
        self.dev.used -= self.size
        self.mem = np.zeros(0, dtype=np.uint8)


class _EventState:
    """Where an event was last recorded and whether the stream got past that point."""

    __slots__ = ("done", "stream")

    def __init__(self) -> None:
        self.stream: AccelBackend | None = None
        self.done = True  # an event never recorded is complete, as in CUDA


class AccelBackend(Backend):
    """A stream: work is queued and runs in order when someone synchronizes."""

    def __init__(self, device: AccelDevice, min_batch: int) -> None:
        super().__init__(device)
        self.dev = device
        self.min_batch = min_batch
        self.queue: list[Callable[[], None]] = []
        #: what ran, for tests: "compute:<n nodes>", "copy", "set", "get", "record", "wait"
        self.log: list[str] = []

    def _push(self, what: str, fn: Callable[[], None]) -> None:
        def run() -> None:
            self.log.append(what)
            fn()

        self.queue.append(run)

    def _run_until(self, stop: Callable[[], bool] | None = None) -> None:
        while self.queue and not (stop is not None and stop()):
            self.queue.pop(0)()

    def synchronize(self) -> None:
        self._run_until()

    def _graph_compute(self, graph: Graph) -> Status:
        nodes = list(graph.nodes)
        for node in nodes:
            if not self.dev.supports_op(node):
                return Status.FAILED
        self._push(f"compute:{len(nodes)}", kernels.prepare(nodes))
        return Status.SUCCESS

    # Like a GPU stream, queued transfers hold device addresses resolved now (the numpy
    # slices), not tensors: the tensor may be placed elsewhere before the work runs.

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        dst = _span(tensor, offset, len(data))
        src = np.frombuffer(data, dtype=np.uint8)
        self._push("set", lambda: dst.__setitem__(..., src))

    def _get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        src = _span(tensor, offset, len(out))
        dst = np.frombuffer(out, dtype=np.uint8)
        self._push("get", lambda: dst.__setitem__(..., src))

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        if not (
            isinstance(backend_src, AccelBackend)
            and isinstance(src.buffer, AccelBuffer)
            and isinstance(dst.buffer, AccelBuffer)
        ):
            return False
        # copy on the source stream (after the work that produces src), then make this
        # stream wait for it: nothing later on either stream can overtake the copy
        to, frm = _span(dst, 0, dst.nbytes), _span(src, 0, src.nbytes)
        backend_src._push("copy", lambda: to.__setitem__(..., frm))
        marker = Event(self.dev, _EventState())
        backend_src.event_record(marker)
        self.event_wait(marker)
        return True

    def _event_record(self, event: Event) -> None:
        state: _EventState = event.context
        state.stream, state.done = self, False

        def mark() -> None:
            state.done = True

        self._push("record", mark)

    def _event_wait(self, event: Event) -> None:
        state: _EventState = event.context
        if state.done or state.stream is None:
            return
        self._push("wait", lambda: _complete(state))

    def offload_op(self, op: Tensor) -> bool:
        return self.dev.offload_op(op, self.min_batch)


def _span(tensor: Tensor, offset: int, size: int) -> np.ndarray:
    """The bytes ``[offset, offset + size)`` of a tensor in its device buffer."""
    buf = tensor.require_allocated()
    assert isinstance(buf, AccelBuffer)
    return buf._range(tensor, offset, size)


def _complete(state: _EventState) -> None:
    """Run the recording stream until it has passed the event."""
    if state.stream is not None and not state.done:
        state.stream._run_until(lambda: state.done)


class AccelDevice(Device):
    def __init__(
        self, reg: TestAccelReg, index: int, capacity: int, max_size: int | None, partial: bool
    ) -> None:
        super().__init__(reg)
        self.index = index
        self.capacity = capacity
        self.used = 0
        self._buft = AccelBufferType(self, max_size)
        self._refused = _NEVER + _PARTIAL if partial else _NEVER

    @property
    def name(self) -> str:
        return f"TestAccel{self.index}"

    @property
    def description(self) -> str:
        return "tensorplug scheduler test accelerator (numpy kernels, private memory)"

    @property
    def type(self) -> DeviceType:
        return DeviceType.GPU

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(asynchronous=True, events=True)

    def memory(self) -> tuple[int, int]:
        return self.capacity - self.used, self.capacity

    def _init_backend(self, params: str | None) -> Backend:
        min_batch = 32
        for item in (params or "").split(","):
            key, _, value = item.partition("=")
            if key.strip() == "min_batch":
                min_batch = int(value)
        return AccelBackend(self, min_batch)

    def buffer_type(self) -> BufferType:
        return self._buft

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self._buft

    def _supports_op(self, op: Tensor) -> bool:
        o = op.op
        if o in _VIEWS:
            return True  # nothing runs: any type can be described
        t = op.type
        if o in self._refused or t not in _TYPES or (t is Type.I32 and o not in _INT_OK):
            return False
        if (o is Op.ROPE and not kernels.rope_supported(op)) or (
            o is Op.SOFT_MAX and op.op_params["max_bias"] != 0.0
        ):
            return False
        return all(s.type in _TYPES for s in op.src)

    def offload_op(self, op: Tensor, min_batch: int = 32) -> bool:
        if op.op not in (Op.MUL_MAT, Op.GET_ROWS):
            return False
        rows = op.shape[-2] if op.ndim >= 2 else 1
        return rows >= min_batch

    def _event_new(self) -> Event:
        return Event(self, _EventState())

    def _event_synchronize(self, event: Event) -> None:
        _complete(event.context)


class TestAccelReg(Reg):
    """``n_devices`` devices of ``capacity`` bytes; ``max_size`` caps one buffer.

    ``partial=False`` makes the devices run soft_max and rope too (plain cases only),
    for a setup where everything but the inputs stays on the "accelerator".
    """

    def __init__(
        self,
        n_devices: int = 2,
        capacity: int = 1 << 30,
        max_size: int | None = None,
        partial: bool = True,
    ) -> None:
        self._devices = [
            AccelDevice(self, i, capacity, max_size, partial) for i in range(n_devices)
        ]

    @property
    def name(self) -> str:
        return "TESTACCEL"

    def devices(self) -> Sequence[Device]:
        return self._devices

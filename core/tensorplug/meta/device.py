"""The meta device: one device made of several, each tensor split over them.

``meta_device([A, B], split_state)`` is a :class:`~tensorplug.Device` like any other:
its buffer type allocates one buffer per member (each of the same "meta" size — a
tensor at meta offset ``o`` has its part at offset ``o`` of every member's buffer, and
takes as many bytes there as its largest part), and its backend runs each graph on
every member with the member's parts (:mod:`tensorplug.meta.backend`). Weights and
caches get their layout from ``split_state(tensor)``; every computed tensor's layout
follows from its op (:mod:`tensorplug.meta.rules`). What cannot be split is
*unsupported*, with the reason, so a scheduler places it on a plain device.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..buffer import Buffer, BufferType
from ..device import Device, DeviceCaps, DeviceType
from ..errors import InvalidArgumentError, UnsupportedError
from ..tensor import Tensor
from .rules import MetaUnsupported, Plan, plan
from .split import (
    SplitAxis,
    SplitState,
    check_state,
    host_assemble,
    host_slice,
    member_offset,
    slice_shape,
)

if TYPE_CHECKING:
    from .backend import MetaBackend

__all__ = ["MetaBuffer", "MetaBufferType", "MetaDevice", "SplitStateFn", "meta_device"]

#: The user's layout for tensors that are not computed (weights, caches, inputs): a
#: state, or None for mirrored.
SplitStateFn = Callable[[Tensor], "SplitState | None"]

_TYPE_RANK = {DeviceType.GPU: 0, DeviceType.IGPU: 1, DeviceType.ACCEL: 2, DeviceType.CPU: 3}


class MetaDevice(Device):
    """Several devices acting as one (``ggml_backend_meta_device``)."""

    def __init__(self, members: Sequence[Device], split_state: SplitStateFn | None = None) -> None:
        super().__init__(None)
        if len(members) < 2:
            raise InvalidArgumentError("a meta device needs at least two member devices")
        if len({id(d) for d in members}) != len(members):
            raise InvalidArgumentError("each member device may appear only once in a meta device")
        self.members: tuple[Device, ...] = tuple(members)
        self.split_state = split_state
        self._buft = MetaBufferType(self)
        self._plans: weakref.WeakKeyDictionary[Tensor, tuple[tuple[int, ...], Plan]] = (
            weakref.WeakKeyDictionary()
        )
        self._leaf_states: weakref.WeakKeyDictionary[Tensor, SplitState] = (
            weakref.WeakKeyDictionary()
        )
        self._why: dict[int, str] = {}

    # -- Device -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "Meta(" + ",".join(d.name for d in self.members) + ")"

    @property
    def description(self) -> str:
        return "tensors split over " + ", ".join(
            f"{d.name} ({d.description})" for d in self.members
        )

    @property
    def type(self) -> DeviceType:
        return min((d.type for d in self.members), key=lambda t: _TYPE_RANK.get(t, 9))

    def memory(self) -> tuple[int, int]:
        """The members' memory, each pool of it once: the host CPU backend and an OpenCL
        CPU driver (or an integrated GPU) both report the host's RAM, and two members
        with one ``device_id`` are one device. A pool counts as its largest report."""
        pools: dict[object, tuple[int, int]] = {}
        for d in self.members:
            f, t = d.memory()
            key = _memory_pool(d)
            seen_free, seen_total = pools.get(key, (0, 0))
            pools[key] = (max(seen_free, f), max(seen_total, t))
        return sum(f for f, _ in pools.values()), sum(t for _, t in pools.values())

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(asynchronous=False, host_buffer=False, events=False)

    def _init_backend(self, params: str | None) -> MetaBackend:
        from .backend import MetaBackend

        if params:
            raise InvalidArgumentError(f"{self.name} takes no backend parameters, got {params!r}")
        return MetaBackend(self)

    def buffer_type(self) -> MetaBufferType:
        return self._buft

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self._buft

    def _supports_op(self, op: Tensor) -> bool:
        try:
            self.plan_of(op)
        except UnsupportedError as e:
            self._why[id(op)] = str(e)
            return False
        for d in self.members:
            if not d.supports_op(op):
                self._why[id(op)] = f"member {d.name} does not support {op.describe()}"
                return False
        self._why.pop(id(op), None)
        return True

    def unsupported_reason(self, op: Tensor) -> str | None:
        """Why :meth:`supports_op` last said no for ``op`` (None if it said yes)."""
        return self._why.get(id(op))

    # -- layouts ------------------------------------------------------------------------

    def state_of(self, tensor: Tensor) -> SplitState:
        """The layout of ``tensor`` over the members, as stored after its node ran (a
        partial sum is all-reduced at once, so a stored tensor is never partial)."""
        if tensor.op.value == "none" and tensor.view_src is None:
            return self._leaf_state(tensor)
        out = self.plan_of(tensor).out
        return SplitState.mirrored() if out.axis is SplitAxis.PARTIAL else out

    def plan_of(self, node: Tensor) -> Plan:
        key = tuple(id(s) for s in node.src)
        hit = self._plans.get(node)
        if hit is not None and hit[0] == key:
            return hit[1]
        result = plan(node, [self.state_of(s) for s in node.src])
        if result.out.is_split:
            check_state(node, result.out, len(self.members))
        self._plans[node] = (key, result)
        return result

    def _leaf_state(self, tensor: Tensor) -> SplitState:
        state = self._leaf_states.get(tensor)
        if state is None:
            state = (
                self.split_state(tensor) if self.split_state else None
            ) or SplitState.mirrored()
            if state.axis is SplitAxis.PARTIAL:
                raise MetaUnsupported(f"{tensor.describe()}: a stored tensor cannot be partial")
            check_state(tensor, state, len(self.members))
            self._leaf_states[tensor] = state
        return state

    def part(self, tensor: Tensor, member: int) -> Tensor:
        """An unplaced tensor shaped like member ``member``'s part of ``tensor``."""
        state = self.state_of(tensor)
        return Tensor(tensor.type, slice_shape(tensor, state, member), name=tensor.name)

    def __repr__(self) -> str:
        return f"<MetaDevice {self.name}>"


class MetaBufferType(BufferType):
    """Memory on every member at once; a tensor's size here is its largest part."""

    def __init__(self, device: MetaDevice) -> None:
        super().__init__(device)
        self.meta = device

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def alignment(self) -> int:
        return max(d.buffer_type().alignment for d in self.meta.members)

    @property
    def max_size(self) -> int:
        return min(d.buffer_type().max_size for d in self.meta.members)

    def alloc_size(self, tensor: Tensor) -> int:
        try:
            parts = [self.meta.part(tensor, i) for i in range(len(self.meta.members))]
        except UnsupportedError:
            # memory may be planned before anyone asks supports_op; such a node will be
            # refused then, so any room that fits the whole tensor will do
            return max(d.buffer_type().alloc_size(tensor) for d in self.meta.members)
        return max(
            d.buffer_type().alloc_size(p) for d, p in zip(self.meta.members, parts, strict=True)
        )

    def _alloc_buffer(self, size: int) -> MetaBuffer:
        members: list[Buffer] = []
        try:
            for d in self.meta.members:
                members.append(d.buffer_type().alloc_buffer(size))
        except BaseException:
            for b in members:
                b.free()
            raise
        return MetaBuffer(self, size, members)


class MetaBuffer(Buffer):
    """One buffer per member; tensor data is split or mirrored on its way in and out."""

    def __init__(self, buft: MetaBufferType, size: int, members: Sequence[Buffer]) -> None:
        super().__init__(buft, size)
        self.meta = buft.meta
        self.members: tuple[Buffer, ...] = tuple(members)
        self._parts: weakref.WeakKeyDictionary[Tensor, tuple[int, list[Tensor]]] = (
            weakref.WeakKeyDictionary()
        )

    def parts(self, tensor: Tensor) -> list[Tensor]:
        """Each member's placed part of ``tensor`` (which lives in this buffer)."""
        hit = self._parts.get(tensor)
        if hit is not None and hit[0] == tensor.offset:
            return hit[1]  # (an allocator may move a tensor between graphs)
        state = self.meta.state_of(tensor)
        base = tensor.view_src
        out = []
        for i, buf in enumerate(self.members):
            offset = tensor.offset
            if state.is_split:
                t = self.meta.part(tensor, i)
                if base is not None:  # a split view: its start within the base's part
                    base_state = self.meta.state_of(base)
                    offset = base.offset + member_offset(base, base_state, i, tensor.view_offs)
            else:  # a mirrored tensor keeps its layout (a view keeps its strides)
                t = Tensor(tensor.type, tensor.shape, strides=tensor.strides, name=tensor.name)
            t.buffer, t.offset = buf, offset
            buf.init_tensor(t)
            out.append(t)
        self._parts[tensor] = (tensor.offset, out)
        return out

    def _whole(self, tensor: Tensor, offset: int, size: int, what: str) -> SplitState:
        state = self.meta.state_of(tensor)
        if state.is_split and (offset != 0 or size != tensor.nbytes or not tensor.is_contiguous):
            raise UnsupportedError(
                f"{what} of {tensor.describe()}, which is split over {self.meta.name} "
                f"({state.describe()}): only whole contiguous tensors can be {what.split('_')[0]}"
                " here; copy the tensor to a plain device to work on part of it"
            )
        return state

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        state = self._whole(tensor, offset, len(data), "set_tensor")
        parts = self.parts(tensor)
        if not state.is_split:
            for p in parts:
                p.buffer.set_tensor(p, data, offset)  # type: ignore[union-attr]
            return
        full = np.frombuffer(data, np.uint8)
        for i, p in enumerate(parts):
            p.buffer.set_tensor(p, host_slice(tensor, state, i, full).data, 0)  # type: ignore[union-attr]

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        state = self.meta.state_of(tensor)
        parts = self.parts(tensor)
        if not state.is_split:
            parts[0].buffer.get_tensor(parts[0], out, offset)  # type: ignore[union-attr]
            return
        if not tensor.is_contiguous:
            self._whole(tensor, 0, -1, "get_tensor")
        pieces = []
        for p in parts:
            mem = np.empty(p.nbytes, np.uint8)
            p.buffer.get_tensor(p, mem.data, 0)  # type: ignore[union-attr]
            pieces.append(mem)
        whole = host_assemble(tensor, state, pieces)
        out[:] = whole[offset : offset + len(out)].data

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        state = self._whole(tensor, offset, size, "memset_tensor")
        for p in self.parts(tensor):
            n = p.nbytes if state.is_split else size
            p.buffer.memset_tensor(p, value, offset, n)  # type: ignore[union-attr]

    def _clear(self, value: int) -> None:
        for b in self.members:
            b.clear(value)

    def _reset(self) -> None:
        self._parts = weakref.WeakKeyDictionary()
        for b in self.members:
            b.reset()

    def _free(self) -> None:
        for b in self.members:
            b.free()


def _memory_pool(dev: Device) -> object:
    """What ``dev``'s memory is: the host's RAM for CPU-type devices and integrated
    GPUs, else the device itself (its ``device_id`` when it has one)."""
    if dev.type in (DeviceType.CPU, DeviceType.IGPU):
        return "host"
    return dev.device_id or id(dev)


def meta_device(devices: Sequence[Device], split_state: SplitStateFn | None = None) -> MetaDevice:
    """One device made of ``devices`` (tensor parallelism), like ggml's meta device.

    ``split_state(tensor)`` gives the layout of every tensor that is not computed —
    weights, KV caches, inputs — as a :class:`SplitState` (``SplitState.split(1,
    [2048, 2048])`` splits a weight's rows in half), or None to mirror it. Computed
    tensors get their layout from their op. The device is not registered: hand its
    backend to a :class:`~tensorplug.Scheduler` with a plain backend for what it cannot
    split.
    """
    return MetaDevice(devices, split_state)

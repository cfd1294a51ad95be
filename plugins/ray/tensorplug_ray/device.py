"""The client side: each Ray actor seen as an ordinary tensorplug device (``Ray0``, ...).

Every operation is an actor call. Calls that return nothing (writes, memsets, graph
computes) are queued without waiting, in order, and :meth:`RayDevice.sync` drains
them, turning the first remote failure into a Python exception that names the device
and its node. A copy between two remote devices hands Ray's object reference from
one actor to the other, so the bytes never pass through this process.

What this process receives from an actor is bytes, numbers, strings and the exceptions
Ray re-raises — no object of ours is ever unpickled here — but Ray's own transport
serialises with pickle, so a Ray cluster is a trust boundary: whoever can join it can
run code on every member. Use it only on a cluster you control.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tensorplug.backend import Backend, Event, Status
from tensorplug.buffer import Buffer, BufferType
from tensorplug.device import Device, DeviceCaps, DeviceType, Reg
from tensorplug.errors import (
    InvalidArgumentError,
    OutOfBoundsError,
    PluginError,
    TensorplugError,
)

from . import wire
from .server import BATCHABLE, GRAPH_CACHE
from .settings import ADDRESS, DEVICES, LOCAL, START_TIMEOUT, DeviceRequest

if TYPE_CHECKING:
    from tensorplug.graph import Graph
    from tensorplug.tensor import Tensor

__all__ = ["RayBackend", "RayBuffer", "RayBufferType", "RayDevice", "RayReg", "RemoteDeviceError",
           "RemoteDeviceLostError", "create_reg"]  # fmt: skip

#: Writes at least this large go through the object store once (``ray.put``) instead of
#: inside the call, so one upload serves every reader on a node.
PUT_THRESHOLD = 1 << 20
#: Queued calls after which finished ones are reaped (their failures surface early).
_REAP_AT = 256
#: Small calls are held back and sent together, up to this many or this many bytes.
_BATCH_CALLS = 64
_BATCH_BYTES = 1 << 20


class RemoteDeviceError(TensorplugError, RuntimeError):
    """An operation failed on a remote device."""


class RemoteDeviceLostError(RemoteDeviceError):
    """A remote device's actor died (its node went away, or it was killed)."""


class RayDevice(Device):
    """One remote device: an actor holding a backend on some node of the cluster."""

    def __init__(self, reg: RayReg, index: int, actor: Any, hello: dict[str, Any]) -> None:
        super().__init__(reg)
        self.index = index
        self.actor = actor
        self.hello = hello
        self._pending: list[Any] = []
        self._batch: list[list[Any]] = []
        self._batch_bytes = 0
        self._lost: str | None = None
        self._supports: dict[tuple[Any, ...], bool] = {}
        self._graphs: OrderedDict[str, None] = OrderedDict()  # mirrors the actor's LRU
        self._buffer_type = RayBufferType(self)

    # -- Device -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"Ray{self.index}"

    @property
    def description(self) -> str:
        h = self.hello
        return (
            f"{h['device']} ({h['description']}) through {h['backend']} "
            f"on node {h['node_ip']} ({h['hostname']})"
        )

    @property
    def type(self) -> DeviceType:
        return DeviceType(self.hello["type"])

    @property
    def node(self) -> str:
        return f"{self.hello['node_ip']} ({self.hello['hostname']})"

    @property
    def device_id(self) -> str | None:
        remote = self.hello["device_id"]
        return f"ray-node-{self.hello['node_id']}:{remote}" if remote else None

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(asynchronous=True, host_buffer=False, events=True)

    def memory(self) -> tuple[int, int]:
        free, total = self.ask("memory")
        return int(free), int(total)

    def _init_backend(self, params: str | None) -> RayBackend:
        if params:
            raise InvalidArgumentError(f"{self.name} takes no backend parameters, got {params!r}")
        return RayBackend(self)

    def buffer_type(self) -> RayBufferType:
        return self._buffer_type

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self._buffer_type

    def _supports_op(self, op: Tensor) -> bool:
        if op.op not in wire.BUILDERS:
            return False
        key = wire.op_key(op)
        answer = self._supports.get(key)
        if answer is None:
            try:
                desc = wire.encode_op(op)
            except TensorplugError:
                answer = False
            else:
                answer = bool(self.ask("supports", desc))
            self._supports[key] = answer
        return answer

    def _event_new(self) -> Event:
        return Event(self, [])

    def _event_synchronize(self, event: Event) -> None:
        self._get(list(event.context), "waiting for an event")

    # -- calls --------------------------------------------------------------------------

    def call(self, method: str, *args: Any) -> None:
        """Queue ``method`` on the actor; failures surface at the next :meth:`sync`.

        Small calls wait in a batch that goes out as one actor call with the next graph
        compute, read or synchronize: a decode step's input writes and its compute then
        cost one round trip, not one each.
        """
        self._check_alive()
        if method not in BATCHABLE or any(isinstance(a, ray_object_ref()) for a in args):
            self.submit(method, *args)
            return
        self._batch.append([method, list(args)])
        self._batch_bytes += sum(len(a) for a in args if isinstance(a, bytes))
        if method == "compute" or len(self._batch) >= _BATCH_CALLS \
                or self._batch_bytes >= _BATCH_BYTES:  # fmt: skip
            self.flush()

    def submit(self, method: str, *args: Any) -> Any:
        """Send ``method`` now (after the batch) and return its ObjectRef, unawaited."""
        self._check_alive()
        self.flush()
        ref = getattr(self.actor, method).remote(*args)
        self._pending.append(ref)
        if len(self._pending) >= _REAP_AT:
            self._reap()
        return ref

    def flush(self) -> None:
        if self._batch:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
            self._pending.append(self.actor.run.remote(batch))

    def ask(self, method: str, *args: Any) -> Any:
        """Run ``method`` on the actor and return its result, after everything queued."""
        self._check_alive()
        self.flush()
        ref = getattr(self.actor, method).remote(*args)
        pending, self._pending = self._pending, []
        return self._get([*pending, ref], method)[-1]

    def sync(self) -> None:
        """Wait for every call sent so far.

        Calls still in the batch stay there: this process already holds their data (a
        write's bytes are copied when it is queued), and the actor runs them, in order,
        before anything sent later — so waiting for them would only add a round trip to
        each of the Scheduler's input writes. Their failures surface at the next sync.
        """
        pending, self._pending = self._pending, []
        if pending:
            self._get(pending, "synchronize")

    def pending(self) -> list[Any]:
        self.flush()
        return list(self._pending)

    def _reap(self) -> None:
        import ray

        done, self._pending = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        if done:
            self._get(done, "a queued operation")

    def _check_alive(self) -> None:
        if self._lost is not None:
            raise RemoteDeviceLostError(self._lost)

    def _get(self, refs: Sequence[Any], what: str) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return list(ray.get(list(refs)))
        except RayActorError as e:
            self._lost = (
                f"remote device {self.name} ({self.hello['device']} on node {self.node}) is "
                f"gone: its Ray actor died ({type(e).__name__}). The other devices keep "
                "working; create the model's backends again on the devices that remain"
            )
            self._pending.clear()
            self._batch.clear()
            raise RemoteDeviceLostError(self._lost) from None
        except RayTaskError as e:
            self._graphs.clear()  # the actor may not have cached what failed
            self.actor.forget_graphs.remote()
            cause = e.cause if isinstance(e.cause, BaseException) else None
            text = f"{type(cause).__name__}: {cause}" if cause is not None else str(e)
            message = f"remote device {self.name} (node {self.node}), {what}: {text}"
            if isinstance(cause, TensorplugError):
                raise type(cause)(message) from None
            raise RemoteDeviceError(message) from None

    # -- graphs -------------------------------------------------------------------------

    def compute(self, graph: Graph) -> None:
        desc = wire.encode_graph(graph, self._handle_of)
        key = wire.digest(desc)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            self.call("compute", key, None)
            return
        self.call("compute", key, desc)
        self._graphs[key] = None
        while len(self._graphs) > GRAPH_CACHE:
            self._graphs.popitem(last=False)

    def _handle_of(self, tensor: Tensor) -> int:
        buf = tensor.require_allocated()
        if not isinstance(buf, RayBuffer) or buf.buft.device is not self:
            raise OutOfBoundsError(
                f"{tensor.describe()} lives in buffer {buf.name!r}, not on {self.name}; copy it "
                "there first (the Scheduler does this for split inputs)"
            )
        return buf.handle


def ray_object_ref() -> type:
    import ray

    return ray.ObjectRef  # type: ignore[no-any-return]


class RayBufferType(BufferType):
    """Memory of one remote device, cut into buffers the actor holds by handle."""

    _handles = itertools.count(1)

    def __init__(self, device: RayDevice) -> None:
        super().__init__(device)
        self.remote = device

    @property
    def name(self) -> str:
        return self.remote.name

    @property
    def alignment(self) -> int:
        return int(self.remote.hello["alignment"])

    @property
    def max_size(self) -> int:
        return int(self.remote.hello["max_size"])

    def _alloc_buffer(self, size: int) -> RayBuffer:
        handle = next(self._handles)
        self.remote.ask("alloc", handle, size)  # waits: out-of-memory must show here
        return RayBuffer(self, size, handle)


class RayBuffer(Buffer):
    """A buffer that lives in an actor; ``handle`` names it there."""

    def __init__(self, buft: RayBufferType, size: int, handle: int) -> None:
        super().__init__(buft, size)
        self.handle = handle
        self.remote = buft.remote

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        import ray

        payload: Any = bytes(data)
        if len(payload) >= PUT_THRESHOLD:
            payload = ray.put(payload)
        self.remote.call("write", self.handle, tensor.offset + offset, payload)

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        data = self.remote.ask("read", self.handle, tensor.offset + offset, len(out))
        out[:] = data

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.remote.call("memset", self.handle, tensor.offset + offset, size, value)

    def _clear(self, value: int) -> None:
        self.remote.call("clear", self.handle, value)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return copy_between(src, dst)

    def _free(self) -> None:
        if self.remote._lost is None:
            self.remote.call("free", self.handle)


def copy_between(src: Tensor, dst: Tensor) -> bool:
    """Copy ``src`` to ``dst`` actor to actor when both are remote; False otherwise."""
    sbuf, dbuf = src.buffer, dst.buffer
    if not isinstance(sbuf, RayBuffer) or not isinstance(dbuf, RayBuffer):
        return False
    n = src.nbytes
    if sbuf.remote is dbuf.remote:
        dbuf.remote.call("copy", sbuf.handle, src.offset, dbuf.handle, dst.offset, n)
        return True
    # the ObjectRef goes to the destination actor, which fetches the bytes itself
    ref = sbuf.remote.submit("read", sbuf.handle, src.offset, n)
    dbuf.remote.call("write", dbuf.handle, dst.offset, ref)
    return True


class RayBackend(Backend):
    """A stream on a remote device: every call is queued on its actor, in order."""

    def __init__(self, device: RayDevice) -> None:
        super().__init__(device)
        self.remote = device
        self._reads: list[tuple[Any, memoryview]] = []

    def _graph_compute(self, graph: Graph) -> Status:
        self.remote.compute(graph)
        return Status.SUCCESS

    def synchronize(self) -> None:
        reads, self._reads = self._reads, []
        self.remote.sync()
        if reads:
            for (_, out), data in zip(reads, self.remote._get([r for r, _ in reads], "a read"),
                                      strict=True):  # fmt: skip
                out[:] = data

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        tensor.require_allocated().set_tensor(tensor, data, offset)  # already queued

    def _get_tensor_async(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        buf = tensor.require_allocated()
        if not isinstance(buf, RayBuffer):
            buf.get_tensor(tensor, out, offset)
            return
        ref = self.remote.submit("read", buf.handle, tensor.offset + offset, len(out))
        self._reads.append((ref, out))

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        return copy_between(src, dst)

    def _event_record(self, event: Event) -> None:
        event.context = self.remote.pending()

    def _event_wait(self, event: Event) -> None:
        # Ray orders calls per actor, not across actors: wait here for the recorded work
        event.synchronize()


class RayReg(Reg):
    """The Ray registration: one device per actor, created when the plugin loads."""

    def __init__(self, devices: Sequence[tuple[Any, dict[str, Any]]], address: str) -> None:
        self.address = address
        self._devices = tuple(RayDevice(self, i, a, h) for i, (a, h) in enumerate(devices))

    @property
    def name(self) -> str:
        return "Ray"

    def devices(self) -> Sequence[Device]:
        return self._devices

    def features(self) -> dict[str, str]:
        import ray

        nodes = sorted({d.node for d in self._devices})
        return {"ray": ray.__version__, "address": self.address, "nodes": ", ".join(nodes)}


def connect(address: str) -> None:
    """Join the cluster at ``address``, or start a private one for ``local``."""
    import os

    import ray

    if ray.is_initialized():
        return
    if address == LOCAL:
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)  # fmt: skip
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def start_devices(
    requests: Sequence[DeviceRequest], timeout: float
) -> list[tuple[Any, dict[str, Any]]]:
    """One actor per requested device, each answering ``hello`` within ``timeout``."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    from .server import DeviceServer

    remote_cls = ray.remote(DeviceServer)
    actors: list[Any] = []
    for req in requests:
        gpu = req.backend.upper() == "CUDA"
        resources = {"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 1}
        actors += [remote_cls.options(**resources).remote(req.backend, i) for i in range(req.count)]
    try:
        hellos = ray.get([a.hello.remote() for a in actors], timeout=timeout)
    except GetTimeoutError:
        for a in actors:
            ray.kill(a)
        raise PluginError(
            f"the Ray cluster did not start {len(actors)} remote device(s) within {timeout:g} s; "
            "it may have no room for them (each CPU device takes a CPU, each CUDA device a GPU): "
            f"ask for fewer in {DEVICES.env}, or wait longer with {START_TIMEOUT.env}"
        ) from None
    except (RayActorError, RayTaskError) as e:
        for a in actors:
            ray.kill(a)
        cause = getattr(e, "cause", None) or e
        raise PluginError(f"a remote device could not start: {cause}") from None
    return list(zip(actors, hellos, strict=True))


def create_reg() -> RayReg:
    address = ADDRESS.get()
    if not address:
        raise PluginError(
            f"set {ADDRESS.env} to a Ray address (or '{LOCAL}') to use remote devices"
        )
    connect(address)
    return RayReg(start_devices(DEVICES.get(), START_TIMEOUT.get()), address)

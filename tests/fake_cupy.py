"""A fake of the part of cupy that tensorplug-cuda uses. It is NOT CUDA.

CI has no NVIDIA GPU, so the CUDA plugin's host code — which kernel each node becomes,
how its arguments struct is packed and passed, which allocation every pointer names,
the grid, the stream order, events, copies between GPUs, graph capture and its
fallback, cuBLAS calls, error and out-of-memory handling — runs here against this
double, handed to the plugin in place of the ``cupy`` module (``CUDAReg(FakeCupy())``).
The plugin's code is the code a GPU runs; only cupy is replaced.

What the fake does, so that the plugin's mistakes show:

* device memory is numpy bytes at made-up 256-aligned addresses, filled with 0xFF
  (NaN as floats) so reading memory nothing wrote shows; pointers are resolved on use,
  and one outside every live allocation is CUDA's "illegal address";
* each GPU has a capacity; an allocation past it raises cudaErrorMemoryAllocation;
* streams **defer** their work until synchronized (or until an event recorded on them
  is waited for), so a missing synchronize, a wait on the wrong stream or host memory
  released too early gives wrong numbers, as on a GPU; a kernel launched or memory
  allocated with another GPU current is refused as CUDA refuses it;
* a kernel launch checks what cupy passes to ``cuLaunchKernel`` — a one-element numpy
  array holding exactly the kernel's arguments struct, then one pointer per buffer —
  and runs the kernel on PoCL through :class:`tensorplug_kernels.emulate.PoclEmulator`
  (the same kernel bodies, in the portable dialect) over the allocations' bytes;
* ``cupy.ndarray``/``cupy.matmul`` are numpy over the same bytes (F16 operands summed in
  F32 and the result rounded to F16, as cuBLAS's ``CUBLAS_COMPUTE_32F``); ``matmul`` refuses to
  run inside a stream capture as cupy does, and can be made to fail as a missing
  libcublas does;
* stream capture records the work instead of running it; the graph replays it.

What it cannot show: anything about NVRTC's or the GPU's code, warps, real concurrency,
timing, or CUDA behaviour the fake does not model. Tests built on it say so.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from tensorplug_kernels import kernel_abis
from tensorplug_kernels.emulate import PoclEmulator

_RUNTIME_ERRORS = {
    1: ("cudaErrorInvalidValue", "invalid argument"),
    2: ("cudaErrorMemoryAllocation", "out of memory"),
    400: ("cudaErrorInvalidResourceHandle", "invalid resource handle"),
    700: ("cudaErrorIllegalAddress", "an illegal memory access was encountered"),
    704: ("cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled"),
    900: ("cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"),
}
_DRIVER_ERRORS = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
}


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        name, text = _RUNTIME_ERRORS.get(status, (f"cudaError{status}", "unknown error"))
        super().__init__(f"{name}: {text}")


class CUDADriverError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"{_DRIVER_ERRORS.get(status, status)}: fake driver error")


class OutOfMemoryError(MemoryError):
    def __init__(self, size: int, total: int, limit: int = 0) -> None:
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,})")


class CompileException(Exception):
    def __init__(self, msg: str, source: str, name: str, options: tuple[str, ...]) -> None:
        super().__init__(msg)
        self.source, self.name, self.options = source, name, options


@dataclass(frozen=True)
class FakeGPU:
    """What the fake driver reports for one GPU."""

    name: str = "Fake GPU (not CUDA)"
    memory: int = 256 * 2**20
    major: int = 9
    minor: int = 0
    sms: int = 132
    pci: tuple[int, int, int] = (0, 0x65, 0)
    clock_khz: int = 2_619_000
    bus_width: int = 5120


@dataclass
class LaunchRecord:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    stream: int
    captured: bool


@dataclass
class _State:
    gpus: tuple[FakeGPU, ...]
    emulator: PoclEmulator
    allocations: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)
    bases: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    next_address: list[int] = field(default_factory=list)
    pinned: dict[int, np.ndarray] = field(default_factory=dict)
    streams: dict[int, Any] = field(default_factory=dict)
    peers: set[tuple[int, int]] = field(default_factory=set)
    launches: list[LaunchRecord] = field(default_factory=list)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    fail_next_launch: BaseException | None = None
    compile_error: str | None = None
    cublas_missing: bool = False
    local: threading.local = field(default_factory=threading.local)

    def __post_init__(self) -> None:
        self.used = [0] * len(self.gpus)
        self.next_address = [0x7F00_0000_0000 + (i << 40) for i in range(len(self.gpus))]

    # -- current device and stream (per thread, as in CUDA) ------------------------------

    def device_stack(self) -> list[int]:
        if not hasattr(self.local, "devices"):
            self.local.devices = [0]
        stack: list[int] = self.local.devices
        return stack

    def current_device(self) -> int:
        return self.device_stack()[-1]

    def stream_stack(self) -> list[Any]:
        if not hasattr(self.local, "streams"):
            self.local.streams = []
        stack: list[Any] = self.local.streams
        return stack

    # -- memory ------------------------------------------------------------------------------

    def malloc(self, device: int, size: int) -> int:
        if self.used[device] + size > self.gpus[device].memory:
            raise CUDARuntimeError(2)
        address = self.next_address[device]
        self.next_address[device] += -(-size // 256) * 256 + 256  # a guard gap between
        self.allocations[address] = (device, np.full(size, 0xFF, np.uint8))
        bisect.insort(self.bases, address)
        self.used[device] += size
        return address

    def free(self, address: int) -> None:
        if _IN_FLIGHT.depth:  # freed by the garbage collector while a stream runs work
            _IN_FLIGHT.frees.append((self, address))
            return
        device, mem = self.allocations[address]
        for stream in list(self.streams.values()):  # cudaFree waits for the device
            if stream.device_id == device:
                stream.flush()
        del self.allocations[address]
        self.bases.remove(address)
        self.used[device] -= mem.size

    def device_bytes(self, ptr: int, size: int | None = None) -> np.ndarray:
        """The bytes from device address ``ptr`` to the end of its allocation."""
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i >= 0:
            base = self.bases[i]
            _, mem = self.allocations[base]
            if ptr - base < mem.size and (size is None or ptr - base + size <= mem.size):
                return mem[ptr - base :]
        raise CUDADriverError(700)

    def owner(self, ptr: int) -> int:
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i < 0:
            raise CUDADriverError(700)
        return self.allocations[self.bases[i]][0]


class _InFlight:
    """Streams of every fake running queued work now, and memory freed meanwhile.

    cupy frees an allocation when its last reference goes, which may be the garbage
    collector's doing at any moment — in the middle of a stream's work here, where
    work runs on the host. ``cudaFree`` waits for the device's queued work; the fake
    frees once the stream work in progress is done, instead of running more of it from
    inside a launch (which would re-enter the emulator)."""

    def __init__(self) -> None:
        self.depth = 0
        self.frees: list[tuple[_State, int]] = []

    def done(self) -> None:
        self.depth -= 1
        while not self.depth and self.frees:
            state, address = self.frees.pop()
            state.free(address)


_IN_FLIGHT = _InFlight()


def host_bytes(address: int, size: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))


def _fake_module(state: _State) -> SimpleNamespace:
    """The ``cupy`` namespace over one fake driver state."""

    def enqueue(stream_ptr: int, op: Callable[[], None]) -> None:
        state.streams[stream_ptr].enqueue(op)

    def copy(dst: int, src: int, size: int, kind: int) -> None:
        if kind == 1:
            state.device_bytes(dst, size)[:size] = host_bytes(src, size)
        elif kind == 2:
            host_bytes(dst, size)[:] = state.device_bytes(src, size)[:size]
        elif kind == 3:
            data = state.device_bytes(src, size)[:size].copy()
            state.device_bytes(dst, size)[:size] = data
        else:
            raise CUDARuntimeError(1)

    # -- runtime -----------------------------------------------------------------------------

    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        state.calls["memcpyAsync"] += 1
        enqueue(stream, lambda: copy(dst, src, size, kind))

    def memsetAsync(ptr: int, value: int, size: int, stream: int) -> None:
        def fill() -> None:
            state.device_bytes(ptr, size)[:size] = value

        enqueue(stream, fill)

    def memcpyPeerAsync(
        dst: int, dst_device: int, src: int, src_device: int, size: int, stream: int
    ) -> None:
        state.calls["memcpyPeerAsync"] += 1
        if state.owner(dst) != dst_device or state.owner(src) != src_device:
            raise CUDARuntimeError(1)
        enqueue(stream, lambda: copy(dst, src, size, 3))

    def memGetInfo() -> tuple[int, int]:
        dev = state.current_device()
        total = state.gpus[dev].memory
        return total - state.used[dev], total

    def getDeviceProperties(index: int) -> dict[str, Any]:
        g = state.gpus[index]
        return {
            "name": g.name.encode(), "totalGlobalMem": g.memory, "sharedMemPerBlock": 49152,
            "major": g.major, "minor": g.minor, "multiProcessorCount": g.sms, "integrated": 0,
            "maxThreadsPerBlock": 1024, "pciDomainID": g.pci[0], "pciBusID": g.pci[1],
            "pciDeviceID": g.pci[2], "memoryClockRate": g.clock_khz,
            "memoryBusWidth": g.bus_width,
        }  # fmt: skip

    def hostAlloc(size: int, flags: int) -> int:
        state.calls["hostAlloc"] += 1
        mem = np.zeros(size + 256, np.uint8)
        address = int(mem.ctypes.data) + (-int(mem.ctypes.data) % 256)
        state.pinned[address] = mem
        return address

    def freeHost(address: int) -> None:
        state.calls["freeHost"] += 1
        if state.pinned.pop(address, None) is None:
            raise CUDARuntimeError(1)

    def deviceEnablePeerAccess(peer: int) -> None:
        pair = (state.current_device(), peer)
        if pair in state.peers:
            raise CUDARuntimeError(704)
        state.peers.add(pair)

    runtime = SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError,
        getDeviceCount=lambda: len(state.gpus),
        getDeviceProperties=getDeviceProperties,
        runtimeGetVersion=lambda: 12090,
        driverGetVersion=lambda: 12090,
        memGetInfo=memGetInfo,
        memcpyAsync=memcpyAsync,
        memsetAsync=memsetAsync,
        memcpyPeerAsync=memcpyPeerAsync,
        hostAlloc=hostAlloc,
        freeHost=freeHost,
        hostAllocPortable=1,
        deviceCanAccessPeer=lambda a, b: int(a != b),
        deviceEnablePeerAccess=deviceEnablePeerAccess,
    )

    # -- memory objects ------------------------------------------------------------------------

    class Memory:
        def __init__(self, size: int) -> None:
            self.device_id = state.current_device()
            self.size = size
            self.ptr = state.malloc(self.device_id, size) if size else 0

        def __del__(self) -> None:
            if sys.is_finalizing():  # the process is ending: nothing to free into
                return
            ptr = getattr(self, "ptr", 0)  # 0 when the allocation failed
            if ptr and ptr in state.allocations:
                state.free(ptr)

    class MemoryPointer:
        def __init__(self, mem: Memory, offset: int) -> None:
            self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id

    # -- devices, streams, events, graphs -----------------------------------------------------

    class Device:
        def __init__(self, device: int | None = None) -> None:
            self.id = state.current_device() if device is None else device

        def __enter__(self) -> Device:
            state.device_stack().append(self.id)
            return self

        def __exit__(self, *exc: object) -> None:
            state.device_stack().pop()

        def synchronize(self) -> None:
            for stream in list(state.streams.values()):
                if stream.device_id == self.id:
                    stream.flush()

        @property
        def compute_capability(self) -> str:
            g = state.gpus[self.id]
            return f"{g.major}{g.minor}"

    class Stream:
        def __init__(self, null: bool = False, non_blocking: bool = False, **kw: Any) -> None:
            self.device_id = state.current_device()
            self.null = null
            self.ptr = 0 if null else id(self)
            self.queue: collections.deque[Callable[[], None]] = collections.deque()
            self.captured: list[Callable[[], None]] | None = None
            state.streams[self.ptr] = self

        def enqueue(self, op: Callable[[], None]) -> None:
            if self.captured is not None:
                self.captured.append(op)
            elif self.null:
                _IN_FLIGHT.depth += 1
                try:
                    op()
                finally:
                    _IN_FLIGHT.done()
            else:
                self.queue.append(op)

        def flush(self) -> None:
            _IN_FLIGHT.depth += 1
            try:
                while self.queue:
                    op = self.queue.popleft()
                    try:
                        op()
                    except BaseException:
                        self.queue.clear()  # a fault ends the stream's work, as CUDA's does
                        raise
            finally:
                _IN_FLIGHT.done()

        def synchronize(self) -> None:
            if self.captured is not None:
                raise CUDARuntimeError(900)
            self.flush()

        def wait_event(self, event: Event) -> None:
            self.enqueue(event.synchronize)

        def begin_capture(self, mode: Any = None) -> None:
            state.calls["begin_capture"] += 1
            self.captured = []

        def end_capture(self) -> Graph:
            ops, self.captured = self.captured, None
            if ops is None:
                raise CUDARuntimeError(1)
            return Graph(ops)

        def is_capturing(self) -> bool:
            return self.captured is not None

        def __enter__(self) -> Stream:
            state.stream_stack().append(self)
            return self

        def __exit__(self, *exc: object) -> None:
            state.stream_stack().pop()

    null_stream = Stream(null=True)

    def current_stream() -> Stream:
        stack = state.stream_stack()
        return stack[-1] if stack else null_stream

    class Event:
        def __init__(self, block: bool = False, disable_timing: bool = False, **kw: Any) -> None:
            self.device_id = state.current_device()
            self.stream: Stream | None = None
            self.fired = True
            self.token: object = None

        def record(self, stream: Stream | None = None) -> None:
            stream = stream or current_stream()
            token = self.token = object()
            self.fired, self.stream = False, stream

            def fire() -> None:
                if self.token is token:
                    self.fired = True

            stream.enqueue(fire)

        def synchronize(self) -> None:
            if not self.fired and self.stream is not None:
                self.stream.flush()

        @property
        def done(self) -> bool:
            return self.fired

    class Graph:
        def __init__(self, ops: list[Callable[[], None]]) -> None:
            self.ops = ops

        def launch(self, stream: Stream | None = None) -> None:
            state.calls["graph_launch"] += 1
            stream = stream or current_stream()
            for op in self.ops:
                stream.enqueue(op)

    # -- kernels -----------------------------------------------------------------------------

    def pointer(arg: Any) -> int:
        if isinstance(arg, MemoryPointer):
            return arg.ptr
        if isinstance(arg, (int, np.integer)) and not isinstance(arg, bool):
            return int(arg)
        raise TypeError(f"Unsupported type {type(arg)}")

    class RawKernel:
        def __init__(self, module: RawModule, name: str) -> None:
            self.module, self.name = module, name

        def __call__(
            self,
            grid: tuple[int, ...],
            block: tuple[int, ...],
            args: tuple[Any, ...],
            shared_mem: int = 0,
            stream: Stream | None = None,
        ) -> None:
            stream = stream or current_stream()
            dev = state.current_device()
            if stream.device_id != dev or dev not in self.module.compiled_for:
                raise CUDADriverError(400)  # the stream or function is another GPU's
            if state.fail_next_launch is not None:
                err, state.fail_next_launch = state.fail_next_launch, None
                raise err
            # three entries each: the plugin's grid and block have one to three
            grid3 = cast("tuple[int, int, int]", (*grid, 1, 1)[:3])
            block3 = cast("tuple[int, int, int]", (*block, 1, 1)[:3])
            if int(np.prod(block3)) > 1024 or max(grid3[1:]) > 65535:
                raise CUDADriverError(1)
            abi = kernel_abis()[self.name]
            struct = args[0]
            if not (isinstance(struct, np.ndarray) and struct.size == 1):
                raise TypeError(f"{self.name}: the struct must be a one-element numpy array")
            if struct.dtype.itemsize != abi.dtype.itemsize or len(args) != 1 + len(abi.buffers):
                raise CUDADriverError(1)
            data = struct.tobytes()  # cuLaunchKernel copies the parameters now
            pointers = [pointer(a) for a in args[1:]]
            state.launches.append(
                LaunchRecord(self.name, grid3, block3, stream.ptr, stream.captured is not None)
            )
            global_size = tuple(g * b for g, b in zip(grid3, block3, strict=True))

            def run() -> None:
                memory = [state.device_bytes(p) for p in pointers]
                state.emulator.launch(self.name, data, memory, global_size, block3)

            stream.enqueue(run)

    class RawModule:
        def __init__(
            self, *, code: str, options: tuple[str, ...] = (), backend: str = "nvrtc", **kw: Any
        ) -> None:
            self.code, self.options, self.backend = code, options, backend
            self.compiled_for: set[int] = set()

        def compile(self, log_stream: Any = None) -> None:
            state.calls["compile"] += 1
            if state.compile_error is not None:
                raise CompileException(state.compile_error, self.code, "kern.cu", self.options)
            self.compiled_for.add(state.current_device())

        def get_function(self, name: str) -> RawKernel:
            if name not in kernel_abis():
                raise CUDADriverError(500)
            if state.current_device() not in self.compiled_for:
                self.compile()
            return RawKernel(self, name)

    # -- arrays and cuBLAS -------------------------------------------------------------------

    def ndarray(
        shape: tuple[int, ...], dtype: Any, memptr: MemoryPointer, strides: tuple[int, ...]
    ) -> np.ndarray:
        current_stream().flush()  # numpy computes now: what the stream queued comes first
        return np.ndarray(shape, dtype, buffer=state.device_bytes(memptr.ptr), strides=strides)

    def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        stream = current_stream()
        if stream.captured is not None:
            raise NotImplementedError(
                "calling cuBLAS API during stream capture is currently unsupported"
            )
        if state.cublas_missing:
            raise RuntimeError("CuPy failed to load libcublas.so.12 (fake: no cuBLAS)")
        state.calls["matmul"] += 1
        stream.flush()
        if a.dtype == np.float16 and b.dtype == np.float16:
            # cupy's F16 product is gemmEx with CUBLAS_COMPUTE_32F: F32 sums, F16 result
            state.calls["matmul_f16"] += 1
            product = np.matmul(a.astype(np.float32), b.astype(np.float32))
            if out is None:
                return product.astype(np.float16)
            out[...] = product
            return out
        return np.matmul(a, b, out=out)

    cuda = SimpleNamespace(
        runtime=runtime,
        driver=SimpleNamespace(CUDADriverError=CUDADriverError),
        memory=SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
        compiler=SimpleNamespace(CompileException=CompileException),
        nvrtc=SimpleNamespace(getVersion=lambda: (12, 9)),
        Memory=Memory,
        MemoryPointer=MemoryPointer,
        Device=Device,
        Stream=Stream,
        Event=Event,
        get_current_stream=current_stream,
    )
    return SimpleNamespace(
        __version__="0.0.0-fake",
        cuda=cuda,
        RawModule=RawModule,
        ndarray=ndarray,
        matmul=matmul,
        asarray=np.array,  # "device" arrays of the references are host numpy arrays here
        asnumpy=np.asarray,
    )


class FakeCupy(SimpleNamespace):
    """``FakeCupy(emulator, FakeGPU(), FakeGPU(...))``: a cupy-shaped object; ``state``
    holds the fake driver (launch records, call counts, fault injection)."""

    def __init__(self, emulator: PoclEmulator, *gpus: FakeGPU) -> None:
        state = _State(gpus or (FakeGPU(),), emulator)
        super().__init__(**vars(_fake_module(state)))
        self.state = state

"""A fake of the part of pyobjc's Metal that tensorplug-metal uses. It is NOT Metal.

CI has no Mac, so the Metal plugin's host code — which kernel each node becomes, the
argument bytes at index 0 and the buffers at 1, 2, …, the threadgroup grid, command
buffers and their order, blits, shared events, no-copy views over mapped files, the
ownership metadata and autorelease pools, out of memory and GPU faults — runs against
this double, handed to the plugin in place of the ``Metal`` and ``objc`` modules
(``MetalReg(FakeMetal(emulator), FakeObjC())``). The plugin's code is the code a Mac
runs; only pyobjc is replaced.

What the fake does, so that the plugin's mistakes show:

* shared buffers are numpy bytes behind ``contents().as_buffer(n)``, filled with 0xFF
  (NaN as floats) so reading what nothing wrote shows;
* a device has a capacity: ``newBufferWithLength`` past it returns nil, and
  ``currentAllocatedSize`` counts the buffers still alive — unless pyobjc's ownership
  metadata for a ``new*`` selector was never registered, in which case, as with the
  real pyobjc (issue 690), the object is leaked and stays counted forever;
* ``commandBuffer`` and the encoders must be created inside ``objc.autorelease_pool()``;
* command buffers **defer** their work: a queue runs its committed command buffers in
  order only when one of them is waited for (or when another queue waits on an event
  they signal), so a missing wait or a host read before the GPU ran gives wrong
  numbers, as on a GPU;
* a dispatch checks the argument bytes against the kernel's struct and that every
  buffer index is bound, then runs the kernel on PoCL through
  :class:`tensorplug_kernels.emulate.PoclEmulator` (the same kernel bodies in the
  portable dialect) over the bound buffers' bytes, honouring each binding's offset;
* ``newBufferWithBytesNoCopy`` shares the caller's memory, and refuses (nil) a pointer
  or length that is not whole pages or a length past ``maxBufferLength``, as Metal does;
* a command buffer can be made to fail (``FakeMetalState.fail_next_command_buffer``).

What it cannot show: anything about Apple's compiler, simdgroups, the memory model,
real concurrency or speed. Tests built on it say so.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorplug_kernels import kernel_abis
from tensorplug_kernels.emulate import PoclEmulator

SHARED = 0
STATUS_COMMITTED, STATUS_COMPLETED, STATUS_ERROR = 2, 4, 5


@dataclass
class MTLSize:
    width: int
    height: int
    depth: int


@dataclass
class FakeDeviceSpec:
    name: str = "Fake Apple M0 (a test double, not Metal)"
    unified: bool = True
    capacity: int = 1 << 30
    max_buffer: int = 1 << 28
    local_mem: int = 32 * 1024
    max_threads: int = 1024
    pipeline_threads: int = 1024
    wraps_memory: bool = True  # False: newBufferWithBytesNoCopy refuses everything


@dataclass
class Dispatch:
    kernel: str
    groups: tuple[int, int, int]
    threads: tuple[int, int, int]


@dataclass
class FakeMetalState:
    emulator: PoclEmulator
    objc: FakeObjC
    registered: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    dispatches: list[Dispatch] = field(default_factory=list)
    command_buffers: int = 0
    leaked: list[Any] = field(default_factory=list)
    fail_next_command_buffer: str | None = None
    compile_log: str | None = None  # set: the next library compile fails with this log
    compiled: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def created(self, selector: bytes, obj: Any) -> Any:
        """pyobjc's handling of a +1 object from an instance ``new*`` method: without
        ``already_retained`` metadata it is retained once more and never freed."""
        if obj is not None and not self.registered.get(selector, {}).get("retval", {}).get(
            "already_retained"
        ):
            self.leaked.append(obj)
        return obj


class FakeObjC:
    """The two things of the ``objc`` module the plugin uses."""

    __version__ = "fake"

    def __init__(self) -> None:
        self.pool_depth = 0
        self.pools = 0
        self.state: FakeMetalState | None = None

    def registerMetaDataForSelector(
        self, class_name: bytes, selector: bytes, metadata: dict[str, Any]
    ) -> None:
        assert class_name == b"NSObject"
        assert self.state is not None
        self.state.registered[selector] = metadata

    @contextlib.contextmanager
    def autorelease_pool(self) -> Iterator[None]:
        self.pool_depth += 1
        self.pools += 1
        try:
            yield
        finally:
            self.pool_depth -= 1

    def require_pool(self, what: str) -> None:
        if self.pool_depth == 0:
            raise AssertionError(f"{what} created outside an autorelease pool: it would leak")


# -- memory -------------------------------------------------------------------------------------


class _Contents:
    def __init__(self, data: np.ndarray) -> None:
        self._data = data

    def as_buffer(self, n: int) -> memoryview:
        return self._data[:n].data


class FakeBuffer:
    def __init__(self, device: FakeDevice, data: np.ndarray, no_copy: bool = False) -> None:
        self.device = device
        self.data = data
        self.size = int(data.size)
        self.no_copy = no_copy  # someone else's memory (maybe a read-only mapping)
        if not no_copy:
            device.allocated += self.size
            weakref.finalize(self, device.release, self.size)

    def contents(self) -> _Contents:
        return _Contents(self.data)

    def length(self) -> int:
        return self.size


class FakeSharedEvent:
    def __init__(self) -> None:
        self.value = 0
        self.signalers: list[tuple[int, FakeQueue]] = []

    def signaledValue(self) -> int:
        return self.value


# -- commands ---------------------------------------------------------------------------------


class FakeComputeEncoder:
    def __init__(self, cb: FakeCommandBuffer) -> None:
        self.cb = cb
        self.pipeline: FakePipeline | None = None
        self.bytes: bytes | None = None
        self.buffers: dict[int, tuple[FakeBuffer, int]] = {}
        self.ended = False

    def setComputePipelineState_(self, pipeline: FakePipeline) -> None:
        self.pipeline = pipeline

    def setBytes_length_atIndex_(self, data: bytes, n: int, index: int) -> None:
        assert len(data) == n and index == 0, "the arguments struct is index 0"
        self.bytes = bytes(data)  # Metal copies the bytes now

    def setBuffer_offset_atIndex_(self, buf: FakeBuffer, offset: int, index: int) -> None:
        assert isinstance(buf, FakeBuffer) and 0 <= offset <= buf.size
        self.buffers[index] = (buf, offset)

    def dispatchThreadgroups_threadsPerThreadgroup_(
        self, groups: MTLSize, threads: MTLSize
    ) -> None:
        assert self.pipeline is not None and self.bytes is not None, "dispatch before binding"
        kernel = self.pipeline.name
        abi = kernel_abis()[kernel]
        if len(self.bytes) != abi.dtype.itemsize:
            raise AssertionError(
                f"{kernel}: {len(self.bytes)} argument bytes, its struct has {abi.dtype.itemsize}"
            )
        missing = [i for i in range(1, len(abi.buffers) + 1) if i not in self.buffers]
        if missing:
            raise AssertionError(f"{kernel}: buffer indices {missing} are not bound")
        g = (groups.width, groups.height, groups.depth)
        t = (threads.width, threads.height, threads.depth)
        if t[0] * t[1] * t[2] > self.pipeline.max_threads:
            raise AssertionError(f"{kernel}: threadgroup {t} is larger than the pipeline allows")
        data = self.bytes
        bound = [self.buffers[i] for i in range(1, len(abi.buffers) + 1)]
        state = self.cb.queue.device.state
        state.dispatches.append(Dispatch(kernel, g, t))

        def run() -> None:
            memory = [_kernel_view(buf, offset) for buf, offset in bound]
            size = tuple(a * b for a, b in zip(g, t, strict=True))
            state.emulator.launch(kernel, data, memory, size, t)

        self.cb.work.append(run)

    def endEncoding(self) -> None:
        self.ended = True


def _kernel_view(buf: FakeBuffer, offset: int) -> np.ndarray:
    """What a kernel's ``device uchar *`` sees: the buffer from the binding's offset.
    Wrapped memory (maybe a read-only mapping, which the emulator's write-back would
    fault on) is given as a copy: kernels only read weights."""
    view = buf.data[offset:]
    return view.copy() if buf.no_copy else view


class FakeBlitEncoder:
    def __init__(self, cb: FakeCommandBuffer) -> None:
        self.cb = cb

    def copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size_(
        self, src: FakeBuffer, s_off: int, dst: FakeBuffer, d_off: int, n: int
    ) -> None:
        assert s_off + n <= src.size and d_off + n <= dst.size, "blit out of range"
        assert not dst.no_copy, "a blit into wrapped (maybe read-only) memory"

        def run() -> None:
            dst.data[d_off : d_off + n] = src.data[s_off : s_off + n]

        self.cb.work.append(run)

    def endEncoding(self) -> None:
        pass


class FakeError:
    def __init__(self, text: str) -> None:
        self.text = text

    def localizedDescription(self) -> str:
        return self.text

    def localizedFailureReason(self) -> None:
        return None


class FakeCommandBuffer:
    def __init__(self, queue: FakeQueue) -> None:
        queue.device.state.objc.require_pool("a command buffer")
        self.queue = queue
        self.work: list[Callable[[], None]] = []
        self.waits: list[tuple[FakeSharedEvent, int]] = []
        self.signals: list[tuple[FakeSharedEvent, int]] = []
        self._status = 0
        self._error: FakeError | None = None
        queue.device.state.command_buffers += 1

    def computeCommandEncoder(self) -> FakeComputeEncoder:
        self.queue.device.state.objc.require_pool("a compute encoder")
        return FakeComputeEncoder(self)

    def blitCommandEncoder(self) -> FakeBlitEncoder:
        self.queue.device.state.objc.require_pool("a blit encoder")
        return FakeBlitEncoder(self)

    def encodeSignalEvent_value_(self, event: FakeSharedEvent, value: int) -> None:
        self.signals.append((event, value))
        event.signalers.append((value, self.queue))

    def encodeWaitForEvent_value_(self, event: FakeSharedEvent, value: int) -> None:
        self.waits.append((event, value))

    def commit(self) -> None:
        assert self._status == 0, "a command buffer is committed once"
        self._status = STATUS_COMMITTED
        self.queue.pending.append(self)

    def waitUntilCompleted(self) -> None:
        assert self._status != 0, "waiting for a command buffer that was never committed"
        self.queue.run_until(self)

    def status(self) -> int:
        return self._status

    def error(self) -> FakeError | None:
        return self._error

    def execute(self) -> None:
        for event, value in self.waits:
            while event.value < value:  # run the queue that signals it
                pending = [q for v, q in event.signalers if v >= value and q.pending]
                if not pending:
                    raise AssertionError("waiting for an event nothing will signal: a deadlock")
                pending[0].run_one()
        state = self.queue.device.state
        if state.fail_next_command_buffer is not None:
            text, state.fail_next_command_buffer = state.fail_next_command_buffer, None
            self._status, self._error = STATUS_ERROR, FakeError(text)
        else:
            for run in self.work:
                run()
            self._status = STATUS_COMPLETED
        for event, value in self.signals:
            event.value = max(event.value, value)


class FakeQueue:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.pending: list[FakeCommandBuffer] = []

    def commandBuffer(self) -> FakeCommandBuffer:
        return FakeCommandBuffer(self)

    def run_one(self) -> None:
        self.pending.pop(0).execute()

    def run_until(self, cb: FakeCommandBuffer) -> None:
        while cb in self.pending:
            self.run_one()


# -- compiling ----------------------------------------------------------------------------------


@dataclass
class FakePipeline:
    name: str
    max_threads: int

    def maxTotalThreadsPerThreadgroup(self) -> int:
        return self.max_threads


@dataclass
class FakeFunction:
    name: str


class FakeLibrary:
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def newFunctionWithName_(self, name: str) -> FakeFunction | None:
        return FakeFunction(name) if name in self.names else None


class FakeCompileOptions:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    @classmethod
    def alloc(cls) -> FakeCompileOptions:
        return cls()

    def init(self) -> FakeCompileOptions:
        return self

    def setMathMode_(self, mode: int) -> None:
        self.values["mathMode"] = mode

    def setPreprocessorMacros_(self, macros: dict[str, Any]) -> None:
        self.values["macros"] = dict(macros)


# -- the device -----------------------------------------------------------------------------------


class FakeDevice:
    def __init__(self, state: FakeMetalState, spec: FakeDeviceSpec, registry_id: int) -> None:
        self.state, self.spec, self.registry_id = state, spec, registry_id
        self.allocated = 0

    def release(self, n: int) -> None:
        self.allocated -= n

    def name(self) -> str:
        return self.spec.name

    def hasUnifiedMemory(self) -> bool:
        return self.spec.unified

    def recommendedMaxWorkingSetSize(self) -> int:
        return self.spec.capacity

    def maxBufferLength(self) -> int:
        return self.spec.max_buffer

    def maxThreadgroupMemoryLength(self) -> int:
        return self.spec.local_mem

    def maxThreadsPerThreadgroup(self) -> MTLSize:
        return MTLSize(self.spec.max_threads, self.spec.max_threads, 64)

    def registryID(self) -> int:
        return self.registry_id

    def currentAllocatedSize(self) -> int:
        return self.allocated

    def _new(self, selector: bytes, obj: Any) -> Any:
        return self.state.created(selector, obj)

    def newBufferWithLength_options_(self, n: int, options: int) -> FakeBuffer | None:
        assert options == SHARED, "tensorplug's buffers are shared storage"
        if n > self.spec.max_buffer or self.allocated + n > self.spec.capacity:
            return None
        data = np.full(n, 0xFF, dtype=np.uint8)
        return self._new(b"newBufferWithLength:options:", FakeBuffer(self, data))

    def newBufferWithBytes_length_options_(
        self, data: bytes, n: int, options: int
    ) -> FakeBuffer | None:
        assert options == SHARED and len(data) == n
        if self.allocated + n > self.spec.capacity:
            return None
        copy = np.frombuffer(bytes(data), dtype=np.uint8).copy()
        return self._new(b"newBufferWithBytes:length:options:", FakeBuffer(self, copy))

    def newBufferWithBytesNoCopy_length_options_deallocator_(
        self, memory: Any, n: int, options: int, deallocator: Any
    ) -> FakeBuffer | None:
        assert options == SHARED and deallocator is None
        page = mmap.PAGESIZE
        address = ctypes.addressof(memory)
        aligned = not (address % page or n % page)
        if not self.spec.wraps_memory or not aligned or n > self.spec.max_buffer:
            return None
        data = np.frombuffer(memory, dtype=np.uint8, count=n)
        selector = b"newBufferWithBytesNoCopy:length:options:deallocator:"
        return self._new(selector, FakeBuffer(self, data, no_copy=True))

    def newCommandQueue(self) -> FakeQueue:
        return self._new(b"newCommandQueue", FakeQueue(self))

    def newSharedEvent(self) -> FakeSharedEvent:
        return self._new(b"newSharedEvent", FakeSharedEvent())

    def newLibraryWithSource_options_error_(
        self, text: str, options: FakeCompileOptions, error: None
    ) -> tuple[FakeLibrary | None, FakeError | None]:
        assert error is None
        self.state.compiled.append((text, dict(options.values)))
        if self.state.compile_log is not None:
            log, self.state.compile_log = self.state.compile_log, None
            return None, FakeError(log)
        assert "#define TP_DIALECT_METAL 1" in text, "the library's source is not the MSL text"
        library = FakeLibrary(set(kernel_abis()))
        return self._new(b"newLibraryWithSource:options:error:", library), None

    def newComputePipelineStateWithFunction_error_(
        self, function: FakeFunction, error: None
    ) -> tuple[FakePipeline | None, FakeError | None]:
        selector = b"newComputePipelineStateWithFunction:error:"
        return self._new(selector, FakePipeline(function.name, self.spec.pipeline_threads)), None


class FakeMetal:
    """``FakeMetal(emulator, objc, FakeDeviceSpec(), …)``: a ``Metal``-module-shaped
    object; ``state`` records what the plugin asked of it."""

    MTLSize = MTLSize
    MTLCompileOptions = FakeCompileOptions

    def __init__(self, emulator: PoclEmulator, objc: FakeObjC, *specs: FakeDeviceSpec) -> None:
        self.state = FakeMetalState(emulator, objc)
        objc.state = self.state
        specs = specs or (FakeDeviceSpec(),)
        self.devices = [FakeDevice(self.state, s, 0x1000 + i) for i, s in enumerate(specs)]

    def MTLCopyAllDevices(self) -> list[FakeDevice]:
        return list(self.devices)

    def MTLCreateSystemDefaultDevice(self) -> FakeDevice | None:
        return self.devices[0] if self.devices else None

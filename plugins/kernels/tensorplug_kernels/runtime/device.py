"""A GPU device and its registration, written once for every runtime.

:class:`GPUDevice` holds what does not depend on the API: the name (``<reg><index>``),
the buffer type, the kernel program built on first use (once, whatever thread asks),
which ops and buffer types it takes (the kernel library's ``supports``), the backends
it made (a freed buffer is announced to them), and the one way driver calls are made:
``with device.driver(what):`` runs them with the device current and turns the driver's
exceptions into tensorplug ones that say what was being done.

A runtime fills in: ``memory``, ``description``, ``type``, ``caps`` (the ``Device``
protocol's own), ``_alloc`` (the allocator), ``buffer_class`` and ``kernel_arg`` (what
its buffers are and what a launch passes for one), ``_build_program``, ``backend_class``,
``driver_errors`` and ``translate`` (its driver's exceptions), ``event_new`` and
``event_synchronize``; where the API keeps a current device per thread (CUDA),
``current``; where its buffers are host memory (Metal), ``wait_idle``; and where its
devices are described without asking the driver (OpenCL, WebGPU: :mod:`.probe`),
``_open_driver``, whose objects ``handle`` opens on first use.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from tensorplug.device import Device, Reg
from tensorplug.opcodes import Op

from .errors import KernelLaunchError
from .memory import GPUBufferType

if TYPE_CHECKING:
    from tensorplug.backend import Event
    from tensorplug.buffer import Buffer, BufferType
    from tensorplug.tensor import Tensor

    from ..launch import Limits
    from .backend import GPUBackend
    from .program import KernelProgram

__all__ = ["OFFLOAD_MIN_BATCH", "GPUDevice", "GPUReg", "pci_address", "process_wide"]

#: ggml's rule for GPU backends: ops over at least this many rows pay for the transfer.
OFFLOAD_MIN_BATCH = 32

R = TypeVar("R", bound=Reg)


def pci_address(domain: int, bus: int, device: int, function: int = 0) -> str:
    """``dddd:bb:dd.f`` in lower-case hex: the form every runtime reports as ``device_id``,
    so the registry sees one GPU reached through two backends (CUDA, OpenCL) as one."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


class BufferClass(Protocol):
    """A runtime's buffer class: made from its buffer type, a size and ``_alloc``'s memory."""

    def __call__(self, buft: GPUBufferType, size: int, mem: Any, /) -> Buffer: ...


class GPUDevice(Device):
    """One device of a GPU runtime, seen as ``<reg name><index>``.

    Set by the runtime's ``__init__`` before anything is allocated: ``limits`` (what
    the encoder may use), ``alignment`` and ``max_alloc`` (its buffers'), and
    ``host_memory`` when its buffers are host memory the CPU reads in place (Metal).
    """

    #: the runtime's buffer class
    buffer_class: ClassVar[BufferClass]

    @property
    @abstractmethod
    def backend_class(self) -> type[GPUBackend]:
        """The runtime's backend class: a class attribute, or a property that imports it
        when first asked (OpenCL, WebGPU), so that describing the devices at discovery
        imports no kernel code."""

    #: the exceptions the driver raises, which ``translate`` turns into tensorplug ones
    driver_errors: tuple[type[BaseException], ...] = ()
    #: what the device is called in messages ("this GPU's kernels cannot read ...")
    noun: ClassVar[str] = "GPU"

    reg: GPUReg
    limits: Limits
    alignment: int
    max_alloc: int
    host_memory: bool = False

    def __init__(self, reg: GPUReg, index: int) -> None:
        super().__init__(reg)
        self.index = index
        self._buft = GPUBufferType(self)
        self._program: KernelProgram | None = None
        self._lock = threading.Lock()
        self._handle: Any = None
        self._open_lock = threading.Lock()  # not _lock: building the program opens
        self._backends: weakref.WeakSet[GPUBackend] = weakref.WeakSet()

    # -- hooks ---------------------------------------------------------------------------

    @abstractmethod
    def _alloc(self, nbytes: int) -> Any:
        """``nbytes`` of new device memory, as the buffer class and ``kernel_arg`` take
        it; freed when the last reference goes (or by the buffer's ``_release``)."""

    def kernel_arg(self, mem: Any) -> Any:
        """What a launch passes for memory from ``_alloc`` (default: the memory itself)."""
        return mem

    @abstractmethod
    def _build_program(self) -> KernelProgram:
        """Compile this device's kernel program (called once, under a lock)."""

    def _open_driver(self) -> Any:
        """The driver objects this device works through (context, queues, the API's
        device), for a runtime that describes its devices without asking the driver
        (:class:`~.probe.DeviceProbe`) and opens one on first use: called once, under a
        lock, inside ``driver("opening the device")`` (so set ``driver_errors`` first).
        Default: nothing to open, for runtimes that open their devices when made."""
        raise NotImplementedError(f"{type(self).__name__} opens its device when made")

    def translate(self, err: BaseException, what: str, kernel: str | None = None) -> Exception:
        """The tensorplug exception for a driver error raised while doing ``what``."""
        return KernelLaunchError(f"{what}: {err}", kernel=kernel)

    def wait_idle(self) -> None:
        """Wait until the work queued on this device has finished, so that the host may
        touch memory its kernels may be using (``host_memory`` devices); failures are
        left for the backends' ``synchronize``. Default: nothing to wait for (the host
        reaches device memory only through the driver, which orders the accesses)."""

    def current(self) -> contextlib.AbstractContextManager[Any]:
        """This device made the calling thread's current one, where the API keeps one
        per thread (CUDA); nothing elsewhere."""
        return contextlib.nullcontext()

    # -- written once ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        assert self.reg is not None
        return f"{self.reg.name}{self.index}"

    @contextlib.contextmanager
    def driver(self, what: str, kernel: str | None = None) -> Iterator[None]:
        """Driver calls made inside run with this device current; their failures come
        out as tensorplug exceptions saying ``what`` was being done on which device."""
        try:
            with self.current():
                yield
        except self.driver_errors as e:
            raise self.translate(e, f"{self.name}: {what}", kernel) from e

    def alloc(self, nbytes: int, what: str) -> Any:
        """``_alloc`` with the device current and its failure said in full."""
        with self.driver(what):
            return self._alloc(nbytes)

    @property
    def handle(self) -> Any:
        """What :meth:`_open_driver` gave, asked for on first use (once per device)."""
        if self._handle is None:
            with self._open_lock:
                if self._handle is None:
                    with self.driver("opening the device"):
                        self._handle = self._open_driver()
        return self._handle

    @property
    def opened(self) -> bool:
        """Whether :attr:`handle` has been opened in this process."""
        return self._handle is not None

    @property
    def program(self) -> KernelProgram:
        """The kernel program, built on first use (once per device)."""
        if self._program is None:
            with self._lock:
                if self._program is None:
                    self._program = self._build_program()
        return self._program

    def _init_backend(self, params: str | None) -> GPUBackend:
        return self.backend_class(self)

    def buffer_type(self) -> GPUBufferType:
        return self._buft

    def owns(self, buf: Buffer | None, write: bool = False) -> bool:
        """True for a buffer of this device (``write``: one a queued copy may write,
        which a mapped file never is: it may be a read-only mapping)."""
        if buf is None or buf.buft is not self._buft:
            return False
        if not write:
            return True
        from .mapped import MappedBuffer  # (it imports the launch helpers: not at discovery)

        return not isinstance(buf, MappedBuffer)

    def reaches(self, buf: Buffer) -> bool:
        """True when a device-side copy here can read ``buf`` (default: this device's
        own; CUDA reaches every GPU of the process)."""
        return self.owns(buf)

    def _supports_op(self, op: Tensor) -> bool:
        from ..encode import supports  # the encoders: imported once a device is asked

        return supports(op, self.limits)

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self._buft

    def offload_op(self, op: Tensor) -> bool:
        """Worth moving a large batch here (ggml: at least 32 rows; not a row lookup)."""
        return op.op is not Op.GET_ROWS and op.ne()[1] >= OFFLOAD_MIN_BATCH

    def _event_free(self, event: Event) -> None:
        event.context = None

    # -- the backends it made ----------------------------------------------------------------

    def track_backend(self, backend: GPUBackend) -> None:
        self._backends.add(backend)

    def backends(self) -> list[GPUBackend]:
        return list(self._backends)

    def buffer_freed(self, buffer: Buffer) -> None:
        """``buffer`` is being freed: no backend may keep work bound to it (a cached plan
        would keep its memory allocated, or point at memory given to another buffer)."""
        for backend in self.backends():
            backend.forget(buffer)


class GPUReg(Reg):
    """The devices of one GPU runtime, named after it (``runtime``)."""

    runtime: ClassVar[str]
    _devices: Sequence[GPUDevice]

    @property
    def name(self) -> str:
        return self.runtime

    def devices(self) -> Sequence[GPUDevice]:
        return tuple(self._devices)


def process_wide(make: Callable[[], R]) -> Callable[[], R]:
    """A ``create_reg`` for the ``tensorplug.backends`` entry point: the registration
    made once per process, by whichever thread asks first (contexts and compiled
    programs belong to it and are shared)."""
    lock = threading.Lock()
    made: list[R] = []

    def create_reg() -> R:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return create_reg

"""Buffer types and buffers: where tensor memory comes from (ggml's buft / buffer).

Both are template-method base classes. The public method checks its arguments and
adds error context, then calls the underscore hook a plugin implements. Required
hooks are abstract, so a plugin class that forgets one cannot be instantiated: the
mistake shows when the plugin registers, not at its first use. Optional hooks have
the defaults ggml documents.
"""

from __future__ import annotations

import enum
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import (
    AllocationError,
    BufferFreedError,
    InvalidArgumentError,
    OutOfBoundsError,
    UnsupportedError,
)

if TYPE_CHECKING:
    import numpy as np

    from .device import Device
    from .tensor import Tensor

__all__ = ["Buffer", "BufferType", "BufferUsage", "MultiBuffer", "UNBOUNDED"]

#: ``get_max_size``'s default: no limit on one buffer.
UNBOUNDED = sys.maxsize


class BufferUsage(enum.Enum):
    ANY = "any"
    WEIGHTS = "weights"
    COMPUTE = "compute"


class BufferType(ABC):
    """A kind of memory (device VRAM, pinned host memory...) that buffers are cut from.

    For plugin authors — required: ``name`` (name it after the device: ``"OpenCL0"``),
    ``alignment``, ``_alloc_buffer(size)`` (a new :class:`Buffer`; applications call
    ``alloc_buffer``, which checks the size). Optional: ``max_size`` (unbounded),
    ``alloc_size(tensor)`` (``tensor.nbytes``; more when kernels read past the end),
    ``is_host`` (False; True lets the CPU backend read the memory directly),
    ``zeroed`` (False; True when new buffers' bytes are all 0),
    ``accepts(tensor)`` (True; an extra buffer type says which weights it holds). A device
    computing in host memory need not write one: use
    ``tensorplug.host.HostBufferType(device, name=...)``.
    """

    def __init__(self, device: Device | None = None) -> None:
        self.device = device

    # -- required ---------------------------------------------------------------------

    @property
    @abstractmethod
    def name(self) -> str:
        """Short name shown in listings and errors, usually the device's."""

    @property
    @abstractmethod
    def alignment(self) -> int:
        """Byte alignment every tensor placed in this memory must start at."""

    @abstractmethod
    def _alloc_buffer(self, size: int) -> Buffer:
        """Allocate ``size`` bytes; raise :class:`AllocationError` when out of memory."""

    # -- optional, with ggml's defaults -------------------------------------------------

    @property
    def max_size(self) -> int:
        """Largest single buffer this type can allocate (default: unbounded)."""
        return UNBOUNDED

    def alloc_size(self, tensor: Tensor) -> int:
        """Bytes a tensor needs here, padding included (default: its ``nbytes``)."""
        return tensor.nbytes

    @property
    def is_host(self) -> bool:
        """True when buffers live in host memory with ggml's standard tensor layout."""
        return False

    @property
    def zeroed(self) -> bool:
        """True when every byte of a new buffer is 0 (default: False), so that an
        application need not ``clear(0)`` it: host memory from ``calloc``, whose pages
        the OS maps as zeros when first touched, costs nothing until used, and clearing
        it wrote (and made resident) every page of a KV cache at load."""
        return False

    def accepts(self, tensor: Tensor) -> bool:
        """Whether a tensor of ``tensor``'s type and shape can be placed here (default:
        any). An extra buffer type that holds particular weights in a layout of its
        own (the CPU's ``CPU_REPACK``) answers for the ones it takes, so that a model
        loader can ask before it places a weight there."""
        return True

    # -- public -------------------------------------------------------------------------

    def alloc_buffer(self, size: int) -> Buffer:
        """A new buffer of at least ``size`` bytes (``ggml_backend_buft_alloc_buffer``)."""
        if size < 0:
            raise AllocationError(f"{self.name}: cannot allocate a negative size ({size} bytes)")
        if size > self.max_size:
            raise AllocationError(
                f"{self.name}: {size} bytes requested but one buffer of this type holds at most "
                f"{self.max_size} bytes; split the tensors over several buffers (the graph "
                "allocator does this for you) or use smaller tensors"
            )
        try:
            return self._alloc_buffer(size)
        except AllocationError:
            raise
        except MemoryError as e:
            raise AllocationError(f"{self.name}: could not allocate {size} bytes: {e}") from e

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class Buffer(ABC):
    """A block of memory of one :class:`BufferType`; tensors live at byte offsets in it.

    For plugin authors — required hooks: ``_set_tensor``, ``_get_tensor``,
    ``_memset_tensor``, ``_clear`` (the public ``set_tensor``/``get_tensor``/... check
    bounds and liveness first, so hooks get valid ranges). Optional: ``base``,
    ``_init_tensor`` / ``_reset`` (per-tensor state), ``_cpy_tensor`` (a fast path for
    copies into this buffer; False falls back through the host), ``_free``,
    ``host_array`` (host memory only).
    """

    def __init__(self, buft: BufferType, size: int, usage: BufferUsage = BufferUsage.ANY) -> None:
        self.buft = buft
        self.size = size
        self._usage = usage
        self._freed = False

    # -- required hooks -----------------------------------------------------------------

    @abstractmethod
    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        """Write ``data`` at byte ``offset`` of ``tensor``'s memory (already bounds-checked)."""

    @abstractmethod
    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        """Read ``len(out)`` bytes from byte ``offset`` of ``tensor`` into ``out``."""

    @abstractmethod
    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        """Fill ``size`` bytes from byte ``offset`` of ``tensor`` with ``value``."""

    @abstractmethod
    def _clear(self, value: int) -> None:
        """Fill the whole buffer with the byte ``value``."""

    # -- optional hooks -----------------------------------------------------------------

    @property
    def base(self) -> int:
        """Address of the first byte where that means something (host memory), else 0."""
        return 0

    def _init_tensor(self, tensor: Tensor) -> None:
        """Attach per-tensor state (``tensor.extra``) when a tensor is placed here."""

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy ``src`` (any buffer) into ``dst`` (this buffer); False when not supported."""
        return False

    def _reset(self) -> None:
        """Drop per-tensor state created by :meth:`_init_tensor`."""

    def _free(self) -> None:
        """Release the memory."""

    def host_array(self) -> np.ndarray:
        """The buffer's bytes as a numpy ``uint8`` array; only host buffers have one."""
        raise UnsupportedError(
            f"buffer {self.name!r} is not in host memory; copy tensors out with tensor_get()"
        )

    # -- public -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.buft.name

    @property
    def is_host(self) -> bool:
        return self.buft.is_host

    @property
    def alignment(self) -> int:
        return self.buft.alignment

    @property
    def max_size(self) -> int:
        return self.buft.max_size

    @property
    def usage(self) -> BufferUsage:
        return self._usage

    @usage.setter
    def usage(self, usage: BufferUsage) -> None:
        self._usage = BufferUsage(usage)

    @property
    def is_freed(self) -> bool:
        return self._freed

    def alloc_size(self, tensor: Tensor) -> int:
        return self.buft.alloc_size(tensor)

    def check_live(self) -> None:
        """Raise :class:`BufferFreedError` if the buffer was freed.

        Backends call it before handing a buffer's memory to a kernel or a copy: a freed
        buffer's handle may already belong to another allocation.
        """
        if self._freed:
            raise BufferFreedError(
                f"buffer {self.name!r} ({self.size} bytes) was freed; allocate a new one"
            )

    def check_range(self, tensor: Tensor, offset: int, size: int, what: str) -> None:
        """Raise unless the buffer is live and ``size`` bytes at ``offset`` lie within
        ``tensor``, allocated here; ``what`` names the call in the message."""
        self.check_live()
        if tensor.buffer is not self:
            raise OutOfBoundsError(
                f"{what}: tensor {tensor.describe()} is not allocated in buffer {self.name!r}"
            )
        if size < 0:
            raise OutOfBoundsError(
                f"{what}: size {size} is negative (tensor {tensor.describe()} spans "
                f"{tensor.nbytes} bytes); pass the number of bytes, or None for the rest"
            )
        if offset < 0 or offset + size > tensor.nbytes:
            raise OutOfBoundsError(
                f"{what}: bytes [{offset}, {offset + size}) are outside tensor "
                f"{tensor.describe()}, which spans {tensor.nbytes} bytes"
            )

    def set_tensor(self, tensor: Tensor, data: memoryview, offset: int = 0) -> None:
        """Write ``data`` into ``tensor`` (in this buffer) from byte ``offset``."""
        self.check_range(tensor, offset, len(data), "set_tensor")
        self._set_tensor(tensor, data, offset)

    def get_tensor(self, tensor: Tensor, out: memoryview, offset: int = 0) -> None:
        """Read ``len(out)`` bytes of ``tensor`` from byte ``offset`` into ``out``."""
        self.check_range(tensor, offset, len(out), "get_tensor")
        self._get_tensor(tensor, out, offset)

    def memset_tensor(
        self, tensor: Tensor, value: int, offset: int = 0, size: int | None = None
    ) -> None:
        """Fill ``size`` bytes of ``tensor`` from ``offset`` (default: to its end) with
        the byte ``value``. A negative size is an error, not "to the end": ``-5`` is
        more likely a miscalculation than a request to fill everything."""
        if size is None:
            size = tensor.nbytes - offset
        if not 0 <= value <= 255:
            raise InvalidArgumentError(f"memset_tensor: value must be a byte (0..255), got {value}")
        self.check_range(tensor, offset, size, "memset_tensor")
        self._memset_tensor(tensor, value, offset, size)

    def init_tensor(self, tensor: Tensor) -> None:
        """Called when ``tensor`` is placed in this buffer (``tensor_alloc``, view_init)."""
        self.check_live()
        self._init_tensor(tensor)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy ``src`` into ``dst`` (in this buffer) by the buffer's fast path; False
        when it has none for ``src``'s memory (the caller copies through the host)."""
        self.check_live()
        return self._cpy_tensor(src, dst)

    def clear(self, value: int = 0) -> None:
        """Fill the whole buffer with the byte ``value``."""
        self.check_live()
        if not 0 <= value <= 255:
            raise InvalidArgumentError(f"clear: value must be a byte (0..255), got {value}")
        self._clear(value)

    def reset(self) -> None:
        """Forget per-tensor state (before the buffer's tensors are placed anew)."""
        self.check_live()
        self._reset()

    def free(self) -> None:
        """Release the memory; every later use of this buffer raises. Idempotent."""
        if not self._freed:
            self._freed = True
            self._free()

    def __repr__(self) -> str:
        state = ", freed" if self._freed else ""
        return f"<{type(self).__name__} {self.name!r} {self.size} bytes{state}>"


class MultiBuffer(Buffer):
    """Several buffers of one type allocated together (``ggml_backend_multi_buffer``).

    Tensors live in the member buffers, never in the multi-buffer itself, so tensor
    access hooks refuse; clearing, usage and freeing apply to every member.
    """

    def __init__(self, buffers: Sequence[Buffer]) -> None:
        if not buffers:
            raise InvalidArgumentError("MultiBuffer needs at least one buffer")
        buft = buffers[0].buft
        if any(b.buft is not buft for b in buffers):
            raise InvalidArgumentError("MultiBuffer: every member must have the same buffer type")
        super().__init__(buft, sum(b.size for b in buffers), buffers[0].usage)
        self.buffers: tuple[Buffer, ...] = tuple(buffers)

    def _refuse(self) -> None:
        raise UnsupportedError(
            "a MultiBuffer holds no tensors itself; access the tensor through its own buffer"
        )

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        self._refuse()

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        self._refuse()

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._refuse()

    def _clear(self, value: int) -> None:
        for b in self.buffers:
            b.clear(value)

    def _free(self) -> None:
        for b in self.buffers:
            b.free()

    @Buffer.usage.setter  # type: ignore[attr-defined,untyped-decorator]
    def usage(self, usage: BufferUsage) -> None:
        self._usage = BufferUsage(usage)
        for b in self.buffers:
            b.usage = usage

"""The host buffer type: plain process memory as numpy arrays, always available.

Every CPU-side backend uses it (ggml's ``ggml_backend_cpu_buffer_type``), and buffers
can also wrap memory someone else owns — a numpy array, a memoryview, an ``mmap`` of a
model file — without copying, keeping that owner alive for as long as the buffer is.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .buffer import Buffer, BufferType, BufferUsage
from .errors import AllocationError, LayoutMismatchError, TypeMismatchError, UnsupportedError
from .prefault import populate_in_background

if TYPE_CHECKING:
    from .device import Device
    from .files import FileRange
    from .tensor import Tensor

__all__ = [
    "HOST_ALIGNMENT",
    "MAPPED_MIN",
    "aligned_bytes",
    "available_cores",
    "host_memory",
    "HostBuffer",
    "HostBufferType",
    "host_buffer_type",
    "strided_array",
    "tensor_array",
]

#: Alignment of host tensors: a cache line, enough for every SIMD width numpy uses.
HOST_ALIGNMENT = 64


class HostBufferType(BufferType):
    """Plain host memory (numpy), which every backend that computes on the host can
    use as is: ``host_buffer_type()`` is the process-wide one, named ``CPU``. A plugin
    whose device computes in host memory (a JAX-on-CPU or BLAS backend) should make its
    own, named after its device — ``HostBufferType(device, name="JAX0")`` — so that
    ``tensorplug devices``, error messages and the scheduler's placement say whose
    memory a tensor is in; the memory and the CPU backend's direct access are the same."""

    def __init__(self, device: Device | None = None, name: str = "CPU") -> None:
        super().__init__(device)
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def alignment(self) -> int:
        return HOST_ALIGNMENT

    @property
    def is_host(self) -> bool:
        return True

    @property
    def zeroed(self) -> bool:
        return True  # aligned_bytes

    def _alloc_buffer(self, size: int) -> HostBuffer:
        return HostBuffer(self, aligned_bytes(size, self.name))

    def buffer_from_host_memory(self, obj: Any, usage: BufferUsage = BufferUsage.ANY) -> HostBuffer:
        """Wrap an object exposing the buffer protocol without copying it.

        The object (numpy array, memoryview, ``mmap``, ``bytearray``) must be C-contiguous;
        read-only memory (``bytes``, a read-only mmap) gives a buffer that refuses writes.
        """
        try:
            data = np.frombuffer(obj, dtype=np.uint8)
        except (TypeError, ValueError) as e:
            raise TypeMismatchError(
                f"cannot wrap {type(obj).__name__} as host memory: it must support the buffer "
                f"protocol and be C-contiguous ({e})"
            ) from e
        buf = HostBuffer(self, data, owner=obj)
        buf.usage = usage
        return buf


class HostBuffer(Buffer):
    """Host memory held as a 1-d ``uint8`` numpy array (``self.data``)."""

    def __init__(self, buft: BufferType, data: np.ndarray, owner: Any = None) -> None:
        super().__init__(buft, int(data.nbytes))
        self.data = data
        self.owner = owner
        # Set by from_dlpack to another library's strided array (``a[:, ::2]``) whose
        # elements this memory spans: the bytes between them belong to that array's other
        # elements, so raw-byte writes here must stay on the elements' own bytes.
        self.elements: np.ndarray | None = None
        # Set by GGUFFile.map_tensors to the file bytes this memory maps, on buffers of
        # tensors read a few rows at a time (token embeddings): a backend reads such
        # rows through the file rather than the mapping (tensorplug.files.FileRange).
        self.file_rows: FileRange | None = None

    @property
    def base(self) -> int:
        return int(self.data.ctypes.data)

    def host_array(self) -> np.ndarray:
        self.check_live()
        return self.data

    def _writable(self, start: int = 0, size: int | None = None) -> np.ndarray:
        """The memory, once it is known that bytes ``start..start+size`` (default: all)
        may be written as raw bytes."""
        if not self.data.flags.writeable:
            raise UnsupportedError(
                f"buffer {self.name!r} wraps read-only memory ({type(self.owner).__name__}); "
                "wrap a writable object (bytearray, writable mmap, numpy array) to write to it"
            )
        if self.elements is not None:
            size = self.data.size - start if size is None else size
            self._check_own_bytes(self.elements, start, size)
        return self.data

    def _check_own_bytes(self, arr: np.ndarray, start: int, size: int) -> None:
        """Refuse a raw-byte write that would reach the bytes between a strided array's
        elements (the other columns of ``a[:, ::2]``: memory that is not the tensor's)."""
        own = np.zeros(self.data.size, dtype=np.bool_)
        elements = np.lib.stride_tricks.as_strided(own, (*arr.shape, arr.itemsize),
                                                   (*arr.strides, 1))  # fmt: skip
        elements[...] = True
        if not own[start : start + size].all():
            raise LayoutMismatchError(
                f"buffer {self.name!r} views a strided {arr.dtype} array of shape {arr.shape} "
                f"(strides {arr.strides}) whose bytes between elements belong to other "
                f"elements of the producer's array; writing bytes [{start}, {start + size}) "
                "as raw bytes would overwrite them. Write the values with "
                "tensorplug.set_array(t, values), or pass from_dlpack a contiguous array"
            )

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        start = tensor.offset + offset
        src = np.frombuffer(data, dtype=np.uint8)
        self._writable(start, src.size)[start : start + src.size] = src

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        start = tensor.offset + offset
        dst = np.frombuffer(out, dtype=np.uint8)
        dst[...] = self.data[start : start + dst.size]

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        start = tensor.offset + offset
        self._writable(start, size)[start : start + size] = value

    def _clear(self, value: int) -> None:
        self._writable()[...] = value

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        if src.buffer is None or not src.buffer.is_host:
            return False
        srcmem = src.buffer.host_array()[src.offset : src.offset + src.nbytes]
        self._writable(dst.offset, dst.nbytes)[dst.offset : dst.offset + dst.nbytes] = srcmem
        return True

    def _free(self) -> None:
        self.data = np.empty(0, dtype=np.uint8)
        self.owner = None


#: Blocks from this size up are anonymous mappings of their own (:func:`aligned_bytes`):
#: the size from which numpy advises huge pages for its own allocations.
MAPPED_MIN = 4 << 20


def aligned_bytes(size: int, owner: str, *, huge_pages: bool = False) -> np.ndarray:
    """``size`` bytes of new host memory, all 0, starting at a multiple of
    :data:`HOST_ALIGNMENT`; :class:`AllocationError` naming ``owner`` (a buffer type)
    when there is no room. Zeros cost nothing here: the pages come from the OS zero
    and become resident only when first written, where ``np.empty`` and a later clear
    wrote every one.

    Blocks of :data:`MAPPED_MIN` or more are an anonymous mapping of their own, as
    ggml's are plain allocations: numpy's ``zeros`` advises the kernel to back such
    blocks with 2 MiB huge pages (``madvise(MADV_HUGEPAGE)``, Linux), so writing one row
    into each layer's part of a KV cache made 2 MiB of it resident: a small model's long
    cache held a large share of the process's memory after its first token, for no
    speed. The system's own huge-page policy still applies
    (``/sys/kernel/mm/transparent_hugepage/enabled``).

    ``huge_pages`` asks for them after all, for memory written whole as soon as it is
    allocated and then read through again and again: weights. A generated token
    streams every weight from memory, and with 4 KiB pages a core walks the page
    tables every 4 KiB (in a virtual machine, two levels of them). On 2 MiB pages
    those walks are rare, so a generated token takes less time and a product by one
    row reads its weights faster (``docs/performance.md`` has the figures). Peak
    memory is the same (the pages are all written anyway). Only advice: where the
    system gives none, the memory is what it was. Such memory's pages are also made
    resident by a thread of their own as the caller starts writing (:mod:`.prefault`):
    finding 2 MiB pages is otherwise most of the time a large model takes to load."""
    try:
        if size >= MAPPED_MIN:  # page-aligned, which HOST_ALIGNMENT divides
            mapping = _anonymous_mapping(size)
            memory = np.frombuffer(mapping, dtype=np.uint8)
            if huge_pages:
                _advise_huge_pages(mapping)
                populate_in_background(memory)
            return memory
        raw = np.zeros(size + HOST_ALIGNMENT, dtype=np.uint8)
    except (MemoryError, OSError) as e:
        raise AllocationError(f"{owner}: could not allocate {size} bytes of host memory") from e
    skip = -raw.ctypes.data % HOST_ALIGNMENT
    return raw[skip : skip + size]


def _anonymous_mapping(size: int) -> mmap.mmap:
    """``size`` zero bytes of the process's own: private (``mmap(-1, n)`` alone shares
    its pages with a forked child, which would then write into this process's cache)."""
    if hasattr(mmap, "MAP_PRIVATE"):  # POSIX; Windows' anonymous maps are private
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, size)


def _advise_huge_pages(mapping: mmap.mmap) -> None:
    """Ask the kernel to back ``mapping`` with huge pages where it can (Linux's
    ``MADV_HUGEPAGE``); a system without the advice, or one that refuses it, keeps
    ordinary pages."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return
    with contextlib.suppress(OSError):  # EINVAL where transparent huge pages are not built in
        mapping.madvise(advice)


_HOST_BUFFER_TYPE = HostBufferType()


def host_buffer_type() -> HostBufferType:
    """The process-wide host buffer type (``ggml_backend_cpu_buffer_type``)."""
    return _HOST_BUFFER_TYPE


def tensor_array(tensor: Tensor) -> np.ndarray:
    """A numpy view (no copy) of a tensor that lives in host memory (see :func:`strided_array`)."""
    return strided_array(tensor, tensor.require_allocated().host_array(), tensor.offset)


def strided_array(tensor: Tensor, mem: np.ndarray, offset: int = 0) -> np.ndarray:
    """The tensor's elements in the host bytes ``mem``, its first byte at ``offset``; no copy.

    Float and integer tensors get their own dtype, shape and strides (BF16 shows as
    ``uint16``). A quantized tensor shows as raw blocks: shape ``(*shape[:-1], n_blocks,
    type_size)`` of ``uint8``, which is what quantized kernels consume.
    """
    t = tensor.type
    if t.is_quantized:
        nblocks = tensor.shape[-1] // t.block_size
        shape = (*tensor.shape[:-1], nblocks, t.type_size)
        strides = (*tensor.strides, 1)
        dtype = np.dtype(np.uint8)
    else:
        shape, strides, dtype = tensor.shape, tensor.strides, t.numpy_dtype
    if tensor.nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    return np.ndarray(shape, dtype=dtype, buffer=mem, offset=offset, strides=strides)


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one): what a
    thread count defaults to, for the CPU backend's pool and the runner's governor."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def host_memory() -> tuple[int, int]:
    """``(available, total)`` bytes of the machine's memory (0, 0 when it cannot be
    known): what a device computing in host memory reports from ``Device.memory()``."""
    try:
        info: dict[str, int] = {}
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                info[key] = int(value.split()[0]) * 1024
        return info.get("MemAvailable", info.get("MemFree", 0)), info.get("MemTotal", 0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        free = os.sysconf("SC_AVPHYS_PAGES") * page if "SC_AVPHYS_PAGES" in os.sysconf_names else 0
        return free, total
    except (ValueError, OSError, AttributeError):
        return 0, 0

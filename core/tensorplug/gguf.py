"""GGUF model files: metadata, tensor descriptions, and weights without copying.

:class:`GGUFFile` opens a file with the ``gguf`` package's reader, which memory-maps it
(metadata arrays are parsed in bulk: item by item, the stock reader takes seconds over a
large vocabulary), and turns what it finds into tensorplug terms: metadata values as
Python objects, tensors as :class:`TensorInfo` (numpy-order shape,
:class:`~tensorplug.Type`, byte range in the file). Weights then get memory in one of
two ways:

* :meth:`GGUFFile.map_tensors` wraps the file's mapping itself as host buffers
  (``Device.buffer_from_host_ptr``), so a CPU device computes straight from the page
  cache, as llama.cpp does with ``--mmap``: nothing is read until it is used, nothing
  is copied.
* :meth:`GGUFFile.upload_tensors` allocates them in a device's buffer type with
  ``WEIGHTS`` usage and reads the bytes there with file reads (``pread``), not through
  the mapping.

A mapped file that is truncated while in use makes the next read of a page past its new
end a SIGBUS, which no Python code can catch. So reads go through a checked path: the
file's size is compared with the size it had when opened (one ``fstat``) before the
mapping is read here, and the runner does the same before each step that computes from
mapped weights; a shrunken file is a :class:`GGUFError` ("the model file changed or was
truncated while in use"). Only a truncation in the few milliseconds of a step itself
still ends the process; copies (``--no-mmap``) are never read through the mapping.

Quantized tensors keep their bytes: ggml's block layouts are tensorplug's, so there is
no conversion either way. A file the reader rejects is walked again by a small header
parser whose only job is to say precisely what is wrong — which key or tensor, which
bytes are missing — instead of the reader's bare numpy error.

``gguf`` is imported when a file is parsed, never with :mod:`tensorplug` (its import is
a noticeable share of a launch). What the header held is kept for later processes
(:mod:`.gguf_index`), which open the same unchanged file without importing ``gguf`` or
parsing it again. ``gguf`` is an optional dependency
(``pip install 'tensorplug[gguf]'``): without it, parsing a file raises
:class:`~tensorplug.errors.MissingDependencyError`.
"""

from __future__ import annotations

import array
import math
import mmap
import os
import struct
import sys
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import gguf_index
from .alloc import alloc_tensors
from .buffer import Buffer, BufferType, BufferUsage
from .errors import TensorplugError
from .extras import require
from .files import FileRange, pread_fully
from .host import HostBuffer, host_memory
from .tensor import Tensor, new_tensor
from .transfer import tensor_alloc, tensor_set
from .types import Type

if TYPE_CHECKING:
    from os import PathLike

    from .device import Device

__all__ = [
    "GGUFError",
    "GGUFFile",
    "GGUFStringError",
    "StringArray",
    "TensorInfo",
    "TensorSet",
    "populate_mapping",
    "release_mapping",
    "row_chunks",
]

_MISSING: Any = object()

#: Tensors to load: GGUF name -> tensor, or (name, tensor) pairs when a name repeats.
TensorSet = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]


class GGUFError(TensorplugError, ValueError):
    """A GGUF file is malformed, or does not hold what the model needs."""


class GGUFStringError(GGUFError):
    """A metadata string of the file is not UTF-8, as every GGUF string is: the file is
    damaged (never a feature that a reader lacks)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ``shape`` in numpy order (GGUF's dims reversed)."""

    name: str
    type_id: int
    type_name: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def supported(self) -> bool:
        return Type.known(self.type_id)

    @property
    def type(self) -> Type:
        """The tensorplug type; raises :class:`GGUFError` for one tensorplug lacks."""
        if not self.supported:
            known = ", ".join(t.name for t in Type)
            raise GGUFError(
                f"tensor {self.name!r} is stored as {self.type_name} (ggml type {self.type_id}),"
                f" which tensorplug cannot compute with; supported types are {known}. "
                "Re-quantize the model to one of them (e.g. llama-quantize MODEL.gguf OUT.gguf "
                "Q8_0)"
            )
        return Type(self.type_id)

    def describe(self) -> str:
        return f"{self.name!r} ({self.type_name}{list(self.shape)})"


#: ``madvise`` advice that maps a range's pages in one call, reading any the page cache
#: lacks (Linux ≥ 5.14; Python names it from 3.12 on; the value is the kernel's)
MADV_POPULATE_READ: int | None = getattr(
    mmap, "MADV_POPULATE_READ", 22 if sys.platform.startswith("linux") else None
)


def populate_mapping(data: np.ndarray, start: int, end: int) -> bool:
    """Map bytes ``start..end`` of a memory-mapped file into the process now, in one
    system call, as llama.cpp's ``MAP_POPULATE`` does for the models it maps.

    Otherwise the first computation that reads the weights takes a page fault per 4 KiB
    page, and the first prompt after loading runs longer than the same prompt again, by
    an amount that varies from launch to launch; one system call over the whole range
    costs less than those faults, and always the same. Where it is missing or refused
    (older kernels, other systems), the pages fault in on first use; returns whether
    they were mapped. A range larger than the memory available now is left alone too:
    reading a model that cannot stay in memory ahead of time would only read it twice.
    """
    mem = getattr(data, "_mmap", None)  # numpy.memmap's mapping; it maps from offset 0 here
    if MADV_POPULATE_READ is None or mem is None or getattr(data, "offset", 0) != 0:
        return False
    if end - start > host_memory()[0]:  # 0 where unknown: then nothing is read ahead
        return False
    page = mmap.PAGESIZE
    first = start // page * page
    try:
        mem.madvise(MADV_POPULATE_READ, first, end - first)
    except (OSError, ValueError, AttributeError):  # EINVAL before 5.14; no madvise
        return False
    return True


def release_mapping(data: np.ndarray, start: int, end: int) -> bool:
    """Unmap the whole pages within bytes ``start..end`` of a memory-mapped file from
    this process (``MADV_DONTNEED``): the bytes stay in the OS's page cache and a later
    read maps them in again, so nothing is lost, but they no longer count in the
    process's memory. llama.cpp unmaps the parts of a model's mapping it copied out the
    same way. Returns whether anything was released."""
    mem = getattr(data, "_mmap", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None or mem is None or getattr(data, "offset", 0) != 0:
        return False
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, end // page * page  # whole pages only
    if last <= first:
        return False
    try:
        mem.madvise(advice, first, last - first)
    except (OSError, ValueError, AttributeError):
        return False
    return True


class GGUFFile:
    """An open GGUF file: ``metadata`` by key, ``tensors`` by name, weights on demand.

    The file stays mapped while this object, or any buffer made by
    :meth:`map_tensors`, is alive.
    """

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            # a FIFO or device would block open() forever; a folder fails obscurely
            raise GGUFError(f"{self.path} is not a regular file; give the path of a .gguf file")
        try:
            st = os.stat(self.path)  # before the header is read: what a kept header is of
        except OSError:
            _reader_class()  # without gguf, that is said first (whatever the path)
            raise
        kept = gguf_index.load(self.path, st)
        if kept is None or not self._open_kept(kept):
            kept = None
            self._open_with_reader()
        # the file itself, held open: size checks and reads see this inode even if the
        # path is replaced
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self._close_fd = weakref.finalize(self, os.close, self._fd)
        self._size = int(self._data.size)
        for info in self.tensors.values():
            if len(info.shape) > 4:
                raise GGUFError(
                    f"{self.path}: tensor {info.describe()} has {len(info.shape)} dimensions; "
                    "ggml tensors have at most 4"
                )
        self._check_layout()
        if kept is None:
            self._keep(st)

    def _open_with_reader(self) -> None:
        """The header parsed by the ``gguf`` package's reader (imported here)."""
        reader_class = _reader_class()  # outside the try: a missing gguf is no bad file
        try:
            reader = reader_class(self.path, "r")
        except OSError:
            raise
        except Exception as e:  # the reader raises bare ValueError/IndexError/KeyError
            raise _diagnose(self.path, e) from e
        if reader.byte_order != "I":
            raise GGUFError(
                f"{self.path}: the file is big-endian; tensorplug uses little-endian GGUF "
                "files (convert it again without --bigendian)"
            )
        self._data: np.ndarray = reader.data
        self._fields: dict[str, _ReaderField | _KeptFieldView | _OverrideField] = {
            k: _ReaderField(f) for k, f in reader.fields.items()
        }
        self.alignment: int = int(reader.alignment)
        self.data_offset: int = int(reader.data_offset)
        self.tensors: dict[str, TensorInfo] = {t.name: _info(t) for t in reader.tensors}

    def _open_kept(self, kept: gguf_index.HeaderIndex) -> bool:
        """The header as an earlier process's reader parsed it (:mod:`.gguf_index`);
        False where the file mapped now does not start as it did, or is too short for
        the kept tensors (changed between the two looks): the reader parses it then."""
        data = np.memmap(self.path, mode="r")
        tensors = {t[0]: TensorInfo(*t) for t in kept.tensors}
        if len(tensors) != len(kept.tensors) or not gguf_index.matches(kept, data):
            return False
        self._data = data
        self._fields = {k: _KeptFieldView(f, data) for k, f in kept.fields.items()}
        self.alignment = kept.alignment
        self.data_offset = kept.data_offset
        self.tensors = tensors
        return True

    def _keep(self, st: os.stat_result) -> None:
        """Keep this header for the next process that opens the file (where every
        metadata string is UTF-8: a damaged one keeps its error for when it is read)."""
        fields: dict[str, gguf_index.KeptField] = {}
        try:
            for key, field in self._fields.items():
                assert isinstance(field, _ReaderField)
                fields[key] = field.kept(self._data)
        except UnicodeDecodeError:
            return
        tensors = tuple((i.name, i.type_id, i.type_name, i.shape, i.offset, i.nbytes)
                        for i in self.tensors.values())  # fmt: skip
        head = bytes(self._data[: gguf_index.HEAD_BYTES])
        header = gguf_index.digest(self._data.data[: self.data_offset])
        index = gguf_index.HeaderIndex(
            head, self.alignment, self.data_offset, tensors, fields, header
        )
        gguf_index.save(self.path, st, index)

    def _check_layout(self) -> None:
        """Every tensor's data aligned and apart from the others' (a damaged or hostile
        file could alias two weights, and one write would change both)."""
        rel = self.data_offset
        previous: TensorInfo | None = None
        for info in sorted(self.tensors.values(), key=lambda i: i.offset):
            if (info.offset - rel) % self.alignment:
                raise GGUFError(
                    f"{self.path}: tensor {info.describe()} starts at data offset "
                    f"{info.offset - rel}, not a multiple of general.alignment = "
                    f"{self.alignment}; the file is damaged"
                )
            if previous is not None and previous.offset + previous.nbytes > info.offset:
                raise GGUFError(
                    f"{self.path}: tensors {previous.describe()} and {info.describe()} overlap "
                    f"in the file (bytes {info.offset}..{previous.offset + previous.nbytes}); "
                    "the file is damaged"
                )
            previous = info

    # -- metadata -----------------------------------------------------------------------

    @property
    def data(self) -> np.ndarray:
        """The whole file, memory-mapped, as read-only ``uint8``."""
        return self._data

    @property
    def version(self) -> int:
        return int(self._fields["GGUF.version"].contents())

    def keys(self) -> list[str]:
        return [k for k in self._fields if not k.startswith("GGUF.")]

    def override(self, values: Mapping[str, bool | int | float | str]) -> None:
        """Answer ``values`` for their keys from now on (llama.cpp's metadata overrides,
        llama-cpp-python's ``kv_overrides``): every reader of this object's metadata
        sees them, the file is not touched. A value is a bool, an int, a float or a
        string, the kinds llama.cpp overrides; a key the file holds keeps its kind (an
        integer for an integer key...), as llama.cpp's loader checks an override against
        the key it replaces. Raises :class:`GGUFError` naming a key whose value cannot
        stand for it."""
        checked: dict[str, _OverrideField] = {}
        for key, value in values.items():
            if not isinstance(key, str) or not key or len(key.encode()) >= 128:
                raise GGUFError(f"override key {key!r}: a metadata key is a non-empty string "
                                "of at most 127 bytes")  # fmt: skip
            kind = _override_kind(value)
            if kind is None:
                raise GGUFError(
                    f"override {key!r} = {_short(value)}: the value must be a bool, int, float "
                    f"or str, not {type(value).__name__}"
                )
            if kind == "str" and len(str(value).encode()) >= 128:
                raise GGUFError(f"override {key!r}: a string value has at most 127 bytes")
            field = self._fields.get(key)
            if field is not None and not isinstance(field, _OverrideField):
                held = _override_kind(self._contents(key, field))
                if held != kind:
                    raise GGUFError(
                        f"override {key!r} = {_short(value)} is {_a(kind)}, but the file's "
                        f"{key!r} is {_a(held or 'array')}: an override keeps the key's kind"
                    )
            checked[key] = _OverrideField(value)
        self._fields.update(checked)

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        """The value of metadata ``key`` (str, int, float, bool or list), or ``default``."""
        field = self._fields.get(key)
        return default if field is None else self._contents(key, field)

    def _contents(self, key: str, field: _ReaderField | _KeptFieldView | _OverrideField) -> Any:
        try:
            return field.contents()
        except UnicodeDecodeError as e:
            raise GGUFStringError(
                f"{self.path}: metadata key {key!r} holds a string that is not valid UTF-8 "
                f"({e.reason} at byte {e.start}); GGUF strings are UTF-8, so the file is "
                "damaged or was not written by a GGUF writer"
            ) from None

    def numbers(self, key: str) -> np.ndarray | None:
        """Metadata array ``key`` as one numpy array of the file's item type (a copy),
        where it is an array of integers or floats read whole; else None (missing, or
        anything else: :meth:`get` reads it item by item). A vocabulary's scores and
        token types as lists held an object an item (Gemma 3's 262,144 scores: 6 MB of
        floats) and took a pass of their own to be checked."""
        field = self._fields.get(key)
        items = None if field is None else field.numbers()
        return None if items is None else np.array(items)  # a view of the mapped file

    def length(self, key: str) -> int | None:
        """How many items metadata array ``key`` holds, read from its header without
        reading the items (None: missing, or not an array). A model's vocabulary size
        needs no decoded tokens."""
        field = self._fields.get(key)
        return None if field is None else field.length()

    def strings(self, key: str) -> list[str] | None:
        """Metadata array ``key`` of strings where it was read whole (every item is
        text by then: nothing to check item by item); else None, as :meth:`numbers`."""
        field = self._fields.get(key)
        if field is None or field.string_array() is None:
            return None
        strings: list[str] = self._contents(key, field)
        return strings

    def value(self, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        """The value of ``key``, checked to be of ``kind``; a missing key without a
        ``default`` is a :class:`GGUFError` naming it."""
        field = self._fields.get(key)
        if field is None:
            if default is not _MISSING:
                return default
            raise GGUFError(
                f"{self.path}: required metadata key {key!r} is missing (the file has "
                f"{len(self.keys())} keys; `python -m gguf.scripts.gguf_dump` lists them)"
            )
        value = self._contents(key, field)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise GGUFError(
                f"{self.path}: metadata key {key!r} should be {names}, but holds "
                f"{type(value).__name__} {_short(value)}"
            )
        return value

    @property
    def architecture(self) -> str:
        return str(self.value("general.architecture", str))

    # -- tensors ------------------------------------------------------------------------

    def tensor_info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(
                f"{self.path}: tensor {name!r} is missing (the file has {len(self.tensors)} "
                f"tensors{_examples(self.tensors)})"
            )
        return info

    def check_unchanged(self) -> None:
        """Raise :class:`GGUFError` when the file has shrunk since it was opened: reading
        its mapping past the new end would be a SIGBUS, not an exception."""
        size = os.fstat(self._fd).st_size
        if size < self._size:
            raise GGUFError(
                f"{self.path}: the model file changed or was truncated while in use (it had "
                f"{self._size} bytes when opened, it has {size} now); do not rewrite a model "
                "while it runs, or load it with --no-mmap (use_mmap=False)"
            )

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's stored bytes: a read-only ``uint8`` view of the mapping (checked
        against truncation first, :meth:`check_unchanged`)."""
        info = self.tensor_info(name)
        self.check_unchanged()
        return self.data[info.offset : info.offset + info.nbytes]

    def read_tensor(self, name: str) -> np.ndarray:
        """The tensor's stored bytes read from the file (``pread``), not the mapping: a
        file truncated meanwhile is a :class:`GGUFError`, never a SIGBUS."""
        info = self.tensor_info(name)
        out = np.empty(info.nbytes, np.uint8)
        self.read_into(name, out)
        return out

    def read_into(self, name: str, out: np.ndarray, start: int = 0) -> None:
        """Bytes ``start..start + out.size`` of the tensor read from the file (as
        :meth:`read_tensor`) into ``out``, a contiguous ``uint8`` array."""
        info = self.tensor_info(name)
        if not 0 <= start <= start + out.size <= info.nbytes:
            raise GGUFError(
                f"read_into: bytes {start}..{start + out.size} are not within tensor "
                f"{info.describe()} ({info.nbytes} bytes)"
            )
        if pread_fully(self._fd, memoryview(out.data), info.offset + start) < out.size:
            self.check_unchanged()
            raise GGUFError(f"{self.path}: the file ends inside tensor {info.describe()}")

    def new_tensor(self, name: str, shape: tuple[int, ...] | None = None, what: str = "") -> Tensor:
        """An unallocated :class:`~tensorplug.Tensor` with the stored type and shape.

        ``shape`` is what the caller needs: a file that disagrees is a
        :class:`GGUFError` naming the tensor, both shapes, and ``what`` (where the
        expectation comes from, e.g. the metadata keys).
        """
        info = self.tensor_info(name)
        if shape is not None and tuple(shape) != info.shape:
            why = f" ({what})" if what else ""
            raise GGUFError(
                f"{self.path}: tensor {info.describe()} has shape {info.shape}, but the model "
                f"needs {tuple(shape)}{why}; the file's tensors do not match its metadata"
            )
        return new_tensor(info.type, info.shape, name)

    def _pairs(self, tensors: TensorSet) -> list[tuple[str, Tensor]]:
        pairs = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
        for name, t in pairs:
            self._check_same(name, t)
        return pairs

    def _check_same(self, name: str, tensor: Tensor) -> TensorInfo:
        info = self.tensor_info(name)
        if tensor.type != info.type or tensor.shape != info.shape or not tensor.is_contiguous:
            raise GGUFError(
                f"{self.path}: tensor {tensor.describe()} cannot hold the file's {info.describe()}:"
                " create it with GGUFFile.new_tensor so that type and shape match"
            )
        return info

    def map_tensors(
        self, tensors: TensorSet, device: Device, sparse: Collection[str] = ()
    ) -> list[Buffer]:
        """Give ``tensors`` (file name → unallocated tensor, as a mapping or pairs; one
        name may serve several tensors) the file's memory itself.

        Each buffer wraps a run of the mapping (``device.buffer_from_host_ptr``) with
        ``WEIGHTS`` usage. A run covers consecutive tensors whose offsets keep the
        buffer's alignment; GGUF aligns tensors to 32 bytes, so a file whose tensor
        sizes are not multiples of the device's alignment gets a few runs. The buffers
        are read-only and keep the mapping alive. Their pages are mapped into the
        process here, at once (:func:`populate_mapping`), except those of the tensors
        named in ``sparse``: tensors read a few rows at a time, like token embeddings
        that only ``get_rows`` reads. Each of those gets a buffer of its own, which
        says where its bytes are in the file (``HostBuffer.file_rows``, where the device
        wraps host memory in a :class:`~tensorplug.host.HostBuffer`), so that a backend
        reads its rows with ``pread`` and never maps its pages in: Linux maps in the
        cached pages around each row read through a mapping (fault-around, and whole
        large folios: 64 KiB to 2 MiB a read), so a prompt of a hundred tokens could make
        most of a large vocabulary's token embeddings resident, depending on the kernel.
        """
        self.check_unchanged()
        order = sorted(self._pairs(tensors), key=lambda kv: self.tensors[kv[0]].offset)
        align = device.buffer_type().alignment
        runs: list[list[tuple[Tensor, TensorInfo]]] = []
        for name, t in order:
            info = self.tensors[name]
            alone = info.name in sparse
            if (runs and not alone and runs[-1][0][1].name not in sparse
                    and (info.offset - runs[-1][0][1].offset) % align == 0):  # fmt: skip
                runs[-1].append((t, info))
            else:
                runs.append([(t, info)])
        buffers: list[Buffer] = []
        for run in runs:
            start = run[0][1].offset
            end = max(info.offset + info.nbytes for _, info in run)
            largest = max(info.nbytes for _, info in run)
            for _, info in run:  # its own bytes: a run may span tensors loaded elsewhere
                if info.name not in sparse:
                    populate_mapping(self.data, info.offset, info.offset + info.nbytes)
            buf = device.buffer_from_host_ptr(self.data[start:end], largest)
            buf.usage = BufferUsage.WEIGHTS
            if run[0][1].name in sparse and isinstance(buf, HostBuffer):
                buf.file_rows = FileRange(self._fd, start, end - start, str(self.path))
            buffers.append(buf)
            for t, info in run:
                tensor_alloc(buf, t, info.offset - start)
        return buffers

    def upload_tensors(
        self,
        tensors: TensorSet,
        buffer_type: BufferType,
        on_tensor: Callable[[str], None] | None = None,
    ) -> Buffer | None:
        """Allocate ``tensors`` (as for :meth:`map_tensors`) in ``buffer_type`` with
        ``WEIGHTS`` usage and read the file's bytes into them (file reads, not the
        mapping: :meth:`read_tensor`); returns the buffer (None when there are no
        tensors). ``on_tensor(name)`` follows each copy (progress).
        Each tensor's pages of the mapping are released once copied
        (:func:`release_mapping`): a 660M model repacked for the CPU otherwise kept its
        370 MB both copied and mapped. The bytes pass through one scratch buffer of
        about :data:`UPLOAD_CHUNK` bytes, whole rows at a time (:func:`row_chunks`): a
        read of the whole tensor first held Gemma 3's 178 MB output layer twice, the
        peak of its load. The scratch buffer is allocated before the tensors' memory:
        a weights buffer's pages are made resident by a thread of its own as soon as it
        is allocated (:mod:`.prefault`), and a new allocation meanwhile waits for the
        process's memory map that thread holds, which would slow the upload in some
        launches and not others."""
        pairs = self._pairs(tensors)
        infos = [self.tensors[name] for name, _ in pairs]
        longest = max((end - start for i in infos for start, end in row_chunks(i)), default=0)
        scratch = np.empty(longest, np.uint8)  # first: see above
        buf = alloc_tensors([t for _, t in pairs], buffer_type, BufferUsage.WEIGHTS)
        for (name, t), info in zip(pairs, infos, strict=True):
            for start, end in row_chunks(info):
                part = scratch[: end - start]
                self.read_into(name, part, start)
                tensor_set(t, part, start)
            release_mapping(self.data, info.offset, info.offset + info.nbytes)
            if on_tensor is not None:
                on_tensor(name)
        return buf

    def close(self) -> None:
        """Drop this object's reference to the mapping (mapped buffers keep their own)."""
        self.tensors, self._fields = {}, {}
        self._data = np.empty(0, np.uint8)
        self._close_fd()

    def __repr__(self) -> str:
        return f"<GGUFFile {str(self.path)!r} v{self.version} {len(self.tensors)} tensors>"


#: bytes of a tensor read from the file at a time while uploading it (whole rows): about
#: a core's L2 cache, where a buffer type that converts the bytes (the CPU's repack)
#: then reads them; a larger chunk only raises the peak of a launch's memory (the LLVM
#: the CPU's compiled repack loads lands beside it), for no speed
UPLOAD_CHUNK = 2 << 20
#: rows a chunk holds a multiple of: a buffer type that stores rows interleaved in small
#: groups (the CPU's repacked one: 8) then writes whole groups, never patches one
CHUNK_ROWS = 64


def row_chunks(info: TensorInfo) -> list[tuple[int, int]]:
    """Byte ranges that cover the tensor in order: whole rows, :data:`CHUNK_ROWS` at a
    time or a multiple of them up to about :data:`UPLOAD_CHUNK` bytes (the whole tensor
    when it is that small)."""
    rows = math.prod(info.shape[:-1])
    row = info.nbytes // rows if rows else info.nbytes
    if info.nbytes <= UPLOAD_CHUNK or rows == 0:
        return [(0, info.nbytes)]
    step = max(1, UPLOAD_CHUNK // (row * CHUNK_ROWS)) * CHUNK_ROWS * row
    return [(start, min(start + step, info.nbytes)) for start in range(0, info.nbytes, step)]


_READER: type | None = None

#: A GGUF string's length field, before its bytes.
_LENGTH_BYTES = 8


@dataclass(frozen=True)
class StringArray:
    """A GGUF string array as found in the file: where it starts, and where each item
    ends (its 8-byte length, then its bytes). The items stay in the file until read: 8
    bytes an item (Gemma 3's 262,144 tokens: 2 MB), where the stock reader's two numpy
    views an item held 90 MB for the file's life."""

    data: np.ndarray  # the file, as uint8
    start: int
    ends: np.ndarray  # int64, relative to ``start``

    def decode(self) -> list[str]:
        """The items as text (``UnicodeDecodeError`` for an item that is not UTF-8).

        Decoded in one pass: each item's length but its last byte is dropped, and that
        byte, zero in any file under 2^56 bytes, is left as the separator of a single
        text that is split at zeros. Decoding item by item takes about twice as long, and
        a vocabulary is decoded at every launch. An item holding a zero itself, or one
        that is not UTF-8, is read item by item, so the error names the item as before."""
        count = len(self.ends)
        if count == 0:
            return []
        region = self.data[self.start : self.start + int(self.ends[-1])]
        heads = np.concatenate(([0], self.ends[:-1]))  # where each item's length starts
        keep = np.ones(region.size, bool)
        for byte in range(_LENGTH_BYTES - 1):
            keep[heads + byte] = False
        try:
            items = region[keep].tobytes().decode("utf-8").split("\0")
        except UnicodeDecodeError:
            return self._decode_each()
        return items[1:] if len(items) == count + 1 else self._decode_each()

    def _decode_each(self) -> list[str]:
        stop = self.start + int(self.ends[-1])
        blob, out, at = self.data[self.start : stop].tobytes(), [], 0
        for end in self.ends.tolist():
            out.append(blob[at + _LENGTH_BYTES : end].decode("utf-8"))
            at = end
        return out


def string_array(data: np.ndarray, start: int, count: int) -> StringArray:
    """The ``count`` strings from byte ``start`` of ``data`` (the file), where each item
    ends found by walking the lengths; ``ValueError`` where the file ends first."""
    raw, size, offs = data.data, data.size, start  # the memoryview over the file's bytes
    # the one loop an item that reading a vocabulary cannot avoid (each length says
    # where the next is), kept to a lookup and an append: bounds are checked by
    # ``unpack_from`` for each length and once for the last item's end
    length = struct.Struct("<Q").unpack_from
    ends = array.array("q")
    append = ends.append
    try:
        for _ in range(count):
            offs += _LENGTH_BYTES + length(raw, offs)[0]
            append(offs)
    except struct.error:
        raise ValueError("truncated string length") from None
    if offs > size:
        raise ValueError("truncated string")
    return StringArray(data, start, np.frombuffer(ends, np.int64) - start)


def _a(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def _override_kind(value: Any) -> str | None:
    """The kind of an override's (or a file value's) scalar: ``bool``, ``int``,
    ``float``, ``str``, or None (an array, or anything else)."""
    for kind in (bool, int, float, str):  # bool first: a bool is an int too
        if isinstance(value, kind):
            return kind.__name__
    return None


class _OverrideField:
    """A metadata key's value given by :meth:`GGUFFile.override`, answered as a field
    of the file is."""

    def __init__(self, value: bool | int | float | str) -> None:
        self.value = value

    def contents(self) -> Any:
        return self.value

    def numbers(self) -> np.ndarray | None:
        return None  # a scalar

    def length(self) -> int | None:
        return None

    def string_array(self) -> StringArray | None:
        return None


class _ReaderField:
    """A metadata key as the ``gguf`` reader parsed it (:func:`_reader_class`'s parts)."""

    def __init__(self, field: Any) -> None:
        self.field = field

    def contents(self) -> Any:
        parts = self.field.parts
        if parts and isinstance(parts[-1], StringArray):
            return parts[-1].decode()
        return self.field.contents()

    def numbers(self) -> np.ndarray | None:
        """An array of numbers read whole: the reader's view of the file's items."""
        field = self.field
        if len(field.data) != 1 or len(field.types) != 2:
            return None
        items = field.parts[field.data[0]]
        if not isinstance(items, np.ndarray) or items.dtype.kind not in "iuf":
            return None
        return items

    def length(self) -> int | None:
        field = self.field
        if not field.types or field.types[0] != _ARRAY or len(field.parts) < 5:
            return None
        return int(field.parts[4][0])  # the key's length and bytes, its type, the items' type

    def string_array(self) -> StringArray | None:
        parts = self.field.parts
        return parts[-1] if parts and isinstance(parts[-1], StringArray) else None

    def kept(self, data: np.ndarray) -> gguf_index.KeptField:
        """What :class:`_KeptFieldView` needs to read this key again without the reader
        (``UnicodeDecodeError`` for a string value that is not UTF-8; an array's items
        are decoded as they are read, where a bad one raises as from the reader)."""
        if (strings := self.string_array()) is not None:
            end = strings.start + (int(strings.ends[-1]) if len(strings.ends) else 0)
            return gguf_index.KeptField(strings=True, offset=strings.start,
                                        length=len(strings.ends), end=end)  # fmt: skip
        if (items := self.numbers()) is not None:
            offset = int(items.ctypes.data) - int(data.ctypes.data)
            return gguf_index.KeptField(dtype=items.dtype.str, offset=offset, length=items.size)
        return gguf_index.KeptField(value=self.contents(), length=self.length())


class _KeptFieldView:
    """A metadata key as :mod:`.gguf_index` kept it, read from the mapped file."""

    def __init__(self, kept: gguf_index.KeptField, data: np.ndarray) -> None:
        self.kept, self.data = kept, data
        self._strings: StringArray | None = None

    def contents(self) -> Any:
        if (strings := self.string_array()) is not None:
            return strings.decode()
        items = self.numbers()
        return self.kept.value if items is None else items.tolist()

    def numbers(self) -> np.ndarray | None:
        kept = self.kept
        if not kept.dtype:
            return None
        dtype = np.dtype(kept.dtype)
        count = int(kept.length or 0)
        items = self.data[kept.offset : kept.offset + count * dtype.itemsize].view(dtype)
        if items.size != count:
            raise GGUFError("the file is shorter than when its header was kept")
        return items

    def length(self) -> int | None:
        return self.kept.length

    def string_array(self) -> StringArray | None:
        if not self.kept.strings:
            return None
        if self._strings is None:
            try:
                data = self.data.view(np.ndarray)
                self._strings = string_array(data, self.kept.offset, int(self.kept.length or 0))
            except ValueError as e:
                raise GGUFError(f"the file is shorter than when its header was kept: {e}") from e
        return self._strings


def _reader_class() -> type:
    """``gguf.GGUFReader`` with metadata arrays parsed in bulk (made on first use, since
    ``gguf`` is imported lazily).

    The stock reader parses every array item on its own through several numpy views,
    so a vocabulary's tens of thousands of tokens, scores and merges take seconds to
    open, and a 128k vocabulary far longer. Here a scalar array is one numpy view, and a
    string array one pass that reads the lengths with ``struct`` into a
    :class:`StringArray` (where each item ends), decoded from the file when asked for,
    which makes opening a file a small fraction of what it was. A scalar
    array's field is a single part rather than one part per item, and a string array's
    single part is its :class:`StringArray` (``GGUFFile.get`` reads both;
    ``ReaderField.contents()`` no longer would).
    """
    global _READER
    if _READER is not None:
        return _READER
    require("gguf", "reading GGUF files")
    from gguf import GGUFReader, GGUFValueType

    class BulkArrayReader(GGUFReader):
        nesting = 0  # arrays of arrays being walked around the current one

        def _get_str(self, offset: int) -> Any:
            # the stock reader slices past the end without noticing: a length of 2^64-1 in
            # the last key gave whatever bytes were left instead of an error
            slen, data = super()._get_str(offset)
            if slen.size != 1 or data.size != int(slen[0]):
                raise ValueError("truncated string")
            return slen, data

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            if raw_itype.size != 1 or alen.size != 1:
                raise ValueError("truncated array header")
            itype, count, offs = int(raw_itype[0]), int(alen[0]), orig_offs + 12
            nptype = self.gguf_scalar_to_np.get(GGUFValueType(itype))
            if nptype is not None:
                items = self._get(offs, nptype, count)
                if items.size != count:
                    raise ValueError("truncated array")
                types = [GGUFValueType.ARRAY, GGUFValueType(itype)]
                return 12 + int(items.nbytes), [raw_itype, alen, items], [2], types
            if itype == GGUFValueType.ARRAY:  # nested: the stock walk, calling back here
                self.nesting += 1
                try:
                    return super()._get_field_parts(orig_offs, raw_type)
                finally:
                    self.nesting -= 1
            if itype != GGUFValueType.STRING or self.nesting:
                # (a string array inside an array keeps the stock parts, which the outer
                # array's contents() flattens: rare enough to cost what it costs)
                return super()._get_field_parts(orig_offs, raw_type)
            strings = string_array(self.data.view(np.ndarray), offs, count)
            types = [GGUFValueType.ARRAY, GGUFValueType.STRING]
            end = offs + (int(strings.ends[-1]) if count else 0)
            return end - orig_offs, [raw_itype, alen, strings], [2], types

    _READER = BulkArrayReader
    return _READER


def _info(t: Any) -> TensorInfo:
    return TensorInfo(
        name=t.name,
        type_id=int(t.tensor_type),
        type_name=t.tensor_type.name,
        shape=tuple(int(d) for d in reversed(t.shape)),
        offset=int(t.data_offset),
        nbytes=int(t.n_bytes),
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _examples(tensors: Mapping[str, Any]) -> str:
    names = list(tensors)[:4]
    return (": " + ", ".join(names) + (", ..." if len(tensors) > 4 else "")) if names else ""


# -- explaining a file the reader rejects ----------------------------------------------------

# GGUF scalar value types: id -> struct format (8 is a string, 9 an array)
_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
_STRING, _ARRAY = 8, 9
#: Arrays of arrays deeper than this are refused (the walker would recurse without end).
_MAX_NESTING = 16


class _Walker:
    """Reads a GGUF header field by field, raising :class:`GGUFError` with context."""

    def __init__(self, mem: bytes | mmap.mmap, path: Path) -> None:
        self.mem, self.path, self.pos, self.size = mem, path, 0, len(mem)

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{self.path} is truncated: {what} needs bytes {self.pos}..{self.pos + n} but the "
                f"file ends at byte {self.size} (re-download or re-convert it)"
            )
        out = self.mem[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", f"the length of {what}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFStringError(
                f"{self.path}: {what} is not valid UTF-8 ({raw[:40]!r})"
            ) from None

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if depth > _MAX_NESTING:
            raise GGUFError(
                f"{self.path}: {what} nests arrays more than {_MAX_NESTING} deep; GGUF metadata "
                "never does, the file is damaged"
            )
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype = self.scalar("I", f"the item type of {what}")
            count = self.scalar("Q", f"the length of {what}")
            if itype not in _SCALARS and itype not in (_STRING, _ARRAY):
                raise GGUFError(f"{self.path}: {what} is an array of unknown value type {itype}")
            if itype in _SCALARS:
                self.take(count * struct.calcsize(_SCALARS[itype]), f"the {count} items of {what}")
                return None
            for i in range(count):
                self.value(itype, f"item {i} of {what}", depth + 1)
            return None
        raise GGUFError(f"{self.path}: {what} has unknown value type {vtype}")


def _diagnose(path: Path, cause: BaseException) -> GGUFError:
    """Walk the file's header to name what the reader tripped over."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return GGUFError(f"{path} is empty (0 bytes): not a GGUF file")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mem:
            try:
                _walk(_Walker(mem, path), GGML_QUANT_SIZES, GGMLQuantizationType)
            except GGUFError as e:
                return e
    return GGUFError(f"{path}: the gguf reader rejected the file: {type(cause).__name__}: {cause}")


def _walk(w: _Walker, quant_sizes: Mapping[Any, tuple[int, int]], qtype: Any) -> None:
    magic = w.take(4, "the magic number")
    if magic != b"GGUF":
        raise GGUFError(f"{w.path} is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
    version = w.scalar("I", "the version")
    if version not in (2, 3):
        raise GGUFError(f"{w.path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors = w.scalar("Q", "the tensor count")
    n_kv = w.scalar("Q", "the metadata count")
    alignment = 32
    for i in range(n_kv):
        key = w.string(f"the name of metadata key #{i}")
        vtype = w.scalar("I", f"the type of metadata key {key!r}")
        value = w.value(vtype, f"metadata key {key!r}")
        if key == "general.alignment" and isinstance(value, int):
            alignment = value
    infos: list[tuple[str, int, int, int]] = []  # name, type, nbytes, offset
    for i in range(n_tensors):
        name = w.string(f"the name of tensor #{i}")
        n_dims = w.scalar("I", f"the dimension count of tensor {name!r}")
        if n_dims > 4:
            raise GGUFError(f"{w.path}: tensor {name!r} claims {n_dims} dimensions (at most 4)")
        dims = [w.scalar("Q", f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
        type_id = w.scalar("I", f"the type of tensor {name!r}")
        offset = w.scalar("Q", f"the data offset of tensor {name!r}")
        try:
            block, tsize = quant_sizes[qtype(type_id)]
        except (ValueError, KeyError):
            raise GGUFError(
                f"{w.path}: tensor {name!r} has unknown type id {type_id} (not a ggml type this "
                "gguf package knows; the file is damaged or newer than the gguf package)"
            ) from None
        if dims and dims[0] % block:
            raise GGUFError(
                f"{w.path}: tensor {name!r} has rows of {dims[0]} elements, not a whole number "
                f"of {qtype(type_id).name} blocks of {block}"
            )
        # Python ints: numpy's product wraps around for dims like 2^40 x 2^40
        infos.append((name, type_id, math.prod(dims or [1]) // block * tsize, offset))
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{w.path}: general.alignment = {alignment} is not a power of two")
    start = -(-w.pos // alignment) * alignment
    for name, _, nbytes, offset in infos:
        end = start + offset + nbytes
        if end > w.size:
            raise GGUFError(
                f"{w.path} is truncated: the data of tensor {name!r} needs bytes "
                f"{start + offset}..{end} but the file ends at byte {w.size} "
                "(re-download or re-convert it)"
            )

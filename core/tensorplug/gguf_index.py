"""A GGUF file's header as the reader parsed it, kept between processes.

Opening a GGUF file means importing the ``gguf`` package (and its ``yaml``) and parsing
the header, a vocabulary of tens of thousands of tokens included: a noticeable share of
launching a small model, and the same work every time the same file is opened. So what
:class:`~tensorplug.gguf.GGUFFile` reads of a header (the alignment, where the data
starts, the tensors, and each metadata key: its value, or where its array lies in the
file) is kept in a small JSON file per model path, under the file's identity (device,
inode, size, modification and change times) and a hash of its header's bytes. A later
open that finds both unchanged maps the file without the reader; a file replaced or
rewritten in place has another identity or header.

The entry is a cache, not an authority (:mod:`tensorplug.kept` reads it: a regular
file, bounded, nested at most a few levels): its values are checked in shape and range
(alignment, offsets, dtypes, sizes), and then against the header's bytes themselves
(:func:`matches`): each key in the file's order with its type, a number or string
value as the file holds it, an array where the file has it; each tensor's record
(name, type, dimensions, offset) in the tensor section, which must end where the data
starts. So an entry edited by hand, by another version or by an attacker (two
same-shaped tensors swapped, a value changed, the hash recomputed) cannot redirect a
tensor or change a value: it is a miss. Only the items of arrays are read lazily, from
the file, where the reader would have read them. Anything that does not match or
cannot be read is a miss: the reader parses the file as before, and the entry is
written anew. Only a header the reader accepted, whose string values are UTF-8, is
kept (a string array's items are decoded when read, either way): a damaged file keeps
its precise errors.

The folder is ``TENSORPLUG_CACHE``'s (:data:`tensorplug.settings.CACHE`), ``gguf/``
below it; ``TENSORPLUG_CACHE=0`` keeps nothing. An entry (a few kilobytes: a
vocabulary's strings are kept as where they lie, not as text) names the model file it
was made for; writing one drops the entries of files that are gone, or of another
format, so that downloading and deleting models does not fill the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from . import kept as kept_files
from .files import cache_folder
from .settings import CACHE
from .types import Type

__all__ = [
    "HEAD_BYTES", "HeaderIndex", "KeptField", "digest", "index_of", "load", "matches", "save",
]  # fmt: skip

_log = logging.getLogger(__name__)

#: Bumped when what an entry holds changes shape: an older entry is then a miss.
FORMAT = 3

#: The largest entry read (tens of KB in use: a vocabulary is kept as where it lies).
MAX_BYTES = 16 << 20

#: How deeply a kept key's value (an array of arrays) may nest.
MAX_NESTING = 8

#: GGUF's value types: scalar id -> struct format; 8 is a string, 9 an array.
_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
_STRING, _ARRAY = 8, 9

#: The numpy dtype (``dtype.str``) a numeric array of each GGUF type is read as.
_DTYPES = {0: "|u1", 1: "|i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
           10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip

#: The reader's own keys, first in its fields: the header's fixed start, by value.
_HEAD_KEYS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")

#: The header's fixed start: magic, version, tensor count, key count.
HEAD_BYTES = 24


@dataclass(frozen=True)
class KeptField:
    """One metadata key as :class:`~tensorplug.gguf.GGUFFile` reads it: an array of
    numbers (``dtype``) or of strings (``strings``) by where its items start in the
    file (``offset``), anything else by its ``value``; ``length`` is an array's item
    count (None: not an array)."""

    value: Any = None
    dtype: str = ""
    strings: bool = False
    offset: int = -1
    length: int | None = None
    end: int = -1  # where a string array's items end (-1: not a string array)

    def check(self) -> None:
        """Raise where the fields are not what :class:`~tensorplug.gguf.GGUFFile` keeps."""
        if not (
            isinstance(self.strings, bool) and isinstance(self.dtype, str)
            and _count(self.offset, -1) and _count(self.end, -1)
            and (self.length is None or _count(self.length, 0))
            and (not self.dtype or self.dtype in _DTYPES.values())
            and not (self.dtype and self.strings)
        ):  # fmt: skip
            raise ValueError(f"a kept key holds {self.__dict__!r:.200}")


@dataclass(frozen=True)
class HeaderIndex:
    """What a GGUF header holds, as :class:`~tensorplug.gguf.GGUFFile` uses it; each
    tensor as ``(name, type id, type name, numpy-order shape, offset, bytes)``."""

    head: bytes
    alignment: int
    data_offset: int
    tensors: tuple[tuple[str, int, str, tuple[int, ...], int, int], ...]
    fields: dict[str, KeptField]
    digest: str = ""  # of the header's bytes, data_offset of them (:func:`digest`)


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def digest(header: Any) -> str:
    """The hash a kept header is checked by: of the header's bytes (a buffer)."""
    return hashlib.sha256(header).hexdigest()


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _entry_path(path: Path) -> Path | None:
    folder = cache_folder(CACHE.get())
    if folder is None:
        return None
    name = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()[:24]
    return folder / "gguf" / f"{name}.json"


def index_of(data: Any, st: os.stat_result) -> HeaderIndex | None:
    """The index a parsed entry holds for the file ``st`` describes (None: another
    format's, or of another state of the file); raises where it is not what
    :func:`save` writes, or its values are out of range."""
    if not isinstance(data, dict):
        raise TypeError("an entry is an object")
    if data.get("format") != FORMAT or data.get("identity") != _identity(st):
        return None
    names = {f.name for f in fields(KeptField)}
    kept: dict[str, KeptField] = {}
    for key, value in data["fields"].items():
        if not isinstance(value, dict) or not set(value) <= names:
            raise ValueError(f"the key {key!r:.80} is kept as {value!r:.80}")
        kept[key] = KeptField(**value)
        kept[key].check()
    tensors = tuple((str(n), int(i), str(t), tuple(map(int, s)), int(o), int(b))
                    for n, i, t, s, o, b in data["tensors"])  # fmt: skip
    index = HeaderIndex(bytes.fromhex(data["head"]), data["alignment"], data["data_offset"],
                        tensors, kept, data["digest"])  # fmt: skip
    if not (
        len(index.head) == HEAD_BYTES and _count(index.alignment, 1)
        and _count(index.data_offset, HEAD_BYTES) and index.data_offset <= st.st_size
        and index.data_offset % index.alignment == 0
        and isinstance(index.digest, str) and len(index.digest) == 64
    ):  # fmt: skip
        raise ValueError("its alignment, offsets or hash are out of range")
    for _, _, _, shape, offset, nbytes in tensors:
        if not (index.data_offset <= offset and nbytes >= 0 and offset + nbytes <= st.st_size
                and len(shape) <= 4 and all(d >= 0 for d in shape)):  # fmt: skip
            raise ValueError("a tensor lies outside the file's data")
    return index


def load(path: Path, st: os.stat_result) -> HeaderIndex | None:
    """The header kept for the file at ``path`` as ``st`` describes it, or None (none
    kept, kept for another file or another state of it, or not what :func:`save`
    writes: then with a warning naming the entry). :func:`matches` checks it against
    the file's bytes before use."""
    folder = cache_folder(CACHE.get())
    entry = _entry_path(path)
    if folder is None or entry is None:
        return None
    return kept_files.load_json(folder, entry, MAX_BYTES, lambda data: index_of(data, st))


def matches(index: HeaderIndex, data: Any) -> bool:
    """Whether ``index`` is what the header in ``data`` (the file's bytes, mapped) says:
    its hash, then every key and tensor record read again from the bytes (the module
    says why). False (a miss: the reader parses the file) on any difference."""
    size = len(data)
    if size < index.data_offset or bytes(data[:HEAD_BYTES]) != index.head:
        return False
    if digest(memoryview(data)[: index.data_offset]) != index.digest:
        return False
    try:
        return _walk(index, memoryview(data)[: index.data_offset])
    except (struct.error, ValueError, IndexError, OverflowError, RecursionError):
        return False


def _walk(index: HeaderIndex, header: memoryview) -> bool:
    version, n_tensors, n_keys = struct.unpack_from("<IQQ", header, 4)
    keys = list(index.fields.items())
    if version not in (2, 3) or len(keys) != n_keys + len(_HEAD_KEYS):
        return False
    for (name, field), value in zip(keys, (version, n_tensors, n_keys), strict=False):
        if name not in _HEAD_KEYS or field.value != value:
            return False
    pos = HEAD_BYTES
    for name, field in keys[len(_HEAD_KEYS) :]:
        key, pos = _string(header, pos)
        (kind,) = struct.unpack_from("<I", header, pos)
        pos = _field(header, pos + 4, kind, field) if key == name else -1
        if pos < 0:
            return False
    if len(index.tensors) != n_tensors:
        return False
    for name, type_id, type_name, shape, offset, nbytes in index.tensors:
        got, pos = _string(header, pos)
        (n_dims,) = struct.unpack_from("<I", header, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", header, pos + 4)
        kind, rel = struct.unpack_from("<IQ", header, pos + 4 + 8 * n_dims)
        pos += 16 + 8 * n_dims
        read = (got, kind, tuple(reversed(dims)), index.data_offset + rel)
        if read != (name, type_id, shape, offset):
            return False
        if Type.known(type_id):
            t = Type(type_id)
            elements = 1
            for d in shape:
                elements *= d
            if (type_name, nbytes) != (t.name, elements * t.type_size // t.block_size):
                return False
    return -(-pos // index.alignment) * index.alignment == index.data_offset


def _string(header: memoryview, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", header, pos)
    if pos + 8 + n > len(header):
        raise ValueError("a string runs past the header")
    return bytes(header[pos + 8 : pos + 8 + n]).decode(), pos + 8 + n


def _field(header: memoryview, pos: int, kind: int, field: KeptField) -> int:
    """Where the value at ``pos`` (of GGUF type ``kind``) ends if ``field`` keeps it as
    it is, else -1."""
    if kind != _ARRAY or not (field.strings or field.dtype):
        value, end = _value(header, pos, kind, 0)
        length = None if kind != _ARRAY else len(value)
        return end if (value, length) == (field.value, field.length) else -1
    item, count = struct.unpack_from("<IQ", header, pos)
    pos += 12
    if count != field.length or pos != field.offset:
        return -1
    if field.strings:
        return field.end if item == _STRING and field.end >= pos else -1
    if _DTYPES.get(item) != field.dtype:
        return -1
    return pos + count * struct.calcsize(_SCALARS[item])


def _value(header: memoryview, pos: int, kind: int, depth: int) -> tuple[Any, int]:
    """The value of GGUF type ``kind`` at ``pos``, as the reader's ``contents()`` gives
    it, and where it ends."""
    if kind in _SCALARS:
        fmt = "<" + _SCALARS[kind]
        return struct.unpack_from(fmt, header, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(header, pos)
    if kind != _ARRAY or depth >= MAX_NESTING:
        raise ValueError(f"value type {kind} at byte {pos}")
    item, count = struct.unpack_from("<IQ", header, pos)
    pos += 12
    if count > len(header) - pos:
        raise ValueError("an array longer than the header")
    items = []
    for _ in range(count):
        value, pos = _value(header, pos, item, depth + 1)
        items.append(value)
    return items, pos


def save(path: Path, st: os.stat_result, index: HeaderIndex) -> None:
    """Keep ``index`` for the file at ``path`` as ``st`` (taken before it was parsed)
    describes it; nothing is kept where the folder cannot be written."""
    entry = _entry_path(path)
    if entry is None:
        return
    folder = cache_folder(CACHE.get())
    if folder is None:
        return
    data = {
        "format": FORMAT,
        "path": os.path.realpath(path),
        "identity": _identity(st),
        "head": index.head.hex(),
        "alignment": index.alignment,
        "data_offset": index.data_offset,
        "digest": index.digest,
        "tensors": index.tensors,
        "fields": {k: f.__dict__ for k, f in index.fields.items()},
    }
    try:
        text = json.dumps(data).encode()
    except (ValueError, TypeError) as e:  # a value JSON refuses
        _log.debug("could not keep the header of %s in %s: %s", path, entry, e)
        return
    if kept_files.save(folder, entry, text):
        _prune(folder, entry.parent, keep=entry)


def _prune(root: Path, folder: Path, keep: Path) -> None:
    """Remove the entries in ``folder`` (but ``keep``) whose model file is gone, that
    another format wrote, or that are not what :func:`save` writes (a FIFO, a link, a
    damaged file: read as every kept file is, so never waited on): none can be a hit
    again. Done when an entry is written, which a launch does only for a file it has
    not opened before."""
    try:
        entries = [e for e in folder.glob("*.json") if e != keep]
    except OSError:
        return
    for entry in entries:
        data, why = kept_files.read(root, entry, MAX_BYTES, kept_files.parse_json)
        if why is None and not os.path.lexists(entry):  # another process pruned it first
            continue
        # damaged (why is not None) or another format's: a miss for its file, rewritten
        # on its next open
        model = data.get("path") if isinstance(data, dict) else None
        stale = data.get("format") != FORMAT if isinstance(data, dict) else True
        if stale or not isinstance(model, str) or not os.path.exists(model):
            try:
                entry.unlink()
            except OSError as e:
                _log.debug("could not remove the stale kept header %s: %s", entry, e)

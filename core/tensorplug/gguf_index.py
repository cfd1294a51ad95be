"""A GGUF file's header as the reader parsed it, kept between processes.

Opening a GGUF file imported the ``gguf`` package (~30 ms, its ``yaml`` alone 10) and
parsed the header (~10 ms for a 100M model's 32,000-token vocabulary): a tenth of
launching a 100M model on the 2-core Zen 4 dev machine, the same work every time the same
file is opened. So what :class:`~tensorplug.gguf.GGUFFile` reads of a header (the
alignment, where the data starts, the tensors, and each metadata key: its value, or
where its array lies in the file) is kept in a small JSON file per model path, under
the file's identity (device, inode, size, modification and change times) and its first
24 bytes (magic, version, tensor and key counts). A later open that finds both unchanged
maps the file without the reader; a file replaced or rewritten in place has another
identity. Anything that does not match or cannot be read is a miss: the reader parses
the file as before, and the entry is written anew. Only a header the reader accepted,
whose string values are UTF-8, is kept (a string array's items are decoded when read,
either way): a damaged file keeps its precise errors.

The folder is ``TENSORPLUG_CACHE``'s (:data:`tensorplug.settings.CACHE`), ``gguf/``
below it; ``TENSORPLUG_CACHE=0`` keeps nothing. An entry (8-22 KB for the models the
benchmarks use: a vocabulary's strings are kept as where they lie, not as text) names
the model file it was made for; writing one drops the entries of files that are gone,
or of another format, so that downloading and deleting models does not fill the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import cache_folder, replace_file
from .settings import CACHE

__all__ = ["HEAD_BYTES", "HeaderIndex", "KeptField", "load", "save"]

_log = logging.getLogger(__name__)

#: Bumped when what an entry holds changes shape: an older entry is then a miss.
FORMAT = 2

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


@dataclass(frozen=True)
class HeaderIndex:
    """What a GGUF header holds, as :class:`~tensorplug.gguf.GGUFFile` uses it; each
    tensor as ``(name, type id, type name, numpy-order shape, offset, bytes)``."""

    head: bytes
    alignment: int
    data_offset: int
    tensors: tuple[tuple[str, int, str, tuple[int, ...], int, int], ...]
    fields: dict[str, KeptField]


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _entry_path(path: Path) -> Path | None:
    folder = cache_folder(CACHE.get())
    if folder is None:
        return None
    name = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()[:24]
    return folder / "gguf" / f"{name}.json"


def load(path: Path, st: os.stat_result) -> HeaderIndex | None:
    """The header kept for the file at ``path`` as ``st`` describes it, or None (none
    kept, kept for another file or another state of it, or unreadable)."""
    entry = _entry_path(path)
    if entry is None:
        return None
    try:
        data = json.loads(entry.read_bytes())
        if data["format"] != FORMAT or data["identity"] != _identity(st):
            return None
        fields = {str(k): KeptField(**v) for k, v in data["fields"].items()}
        tensors = tuple((str(n), int(i), str(t), tuple(map(int, s)), int(o), int(b))
                        for n, i, t, s, o, b in data["tensors"])  # fmt: skip
        return HeaderIndex(bytes.fromhex(data["head"]), int(data["alignment"]),
                           int(data["data_offset"]), tensors, fields)  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            _log.debug("ignoring the kept header of %s in %s: %s", path, entry, e)
        return None


def save(path: Path, st: os.stat_result, index: HeaderIndex) -> None:
    """Keep ``index`` for the file at ``path`` as ``st`` (taken before it was parsed)
    describes it; nothing is kept where the folder cannot be written."""
    entry = _entry_path(path)
    if entry is None:
        return
    data = {
        "format": FORMAT,
        "path": os.path.realpath(path),
        "identity": _identity(st),
        "head": index.head.hex(),
        "alignment": index.alignment,
        "data_offset": index.data_offset,
        "tensors": index.tensors,
        "fields": {k: f.__dict__ for k, f in index.fields.items()},
    }
    try:
        replace_file(entry, json.dumps(data).encode())
    except (OSError, ValueError, TypeError) as e:  # a read-only home; a value JSON refuses
        _log.debug("could not keep the header of %s in %s: %s", path, entry, e)
        return
    _prune(entry.parent, keep=entry)


def _prune(folder: Path, keep: Path) -> None:
    """Remove the entries in ``folder`` (but ``keep``) whose model file is gone, or that
    another format wrote: neither can be a hit again. Done when an entry is written,
    which a launch does only for a file it has not opened before."""
    try:
        entries = [e for e in folder.glob("*.json") if e != keep]
    except OSError:
        return
    for entry in entries:
        try:
            data = json.loads(entry.read_bytes())
            stale = data.get("format") != FORMAT or not os.path.exists(data["path"])
        except FileNotFoundError:  # another process pruned it first
            continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            stale = True  # damaged: a miss for its file, rewritten on its next open
        if stale:
            try:
                entry.unlink()
            except OSError as e:
                _log.debug("could not remove the stale kept header %s: %s", entry, e)

"""Files read and written in part: caches kept between runs, a model's rows on demand.

A cache file (a GPU plugin's device list, the CPU kernels' runtime library) is read by
every process that starts, possibly while another rewrites it. :func:`replace_file`
writes the new contents beside the old file and renames it into place, so a reader
sees the old file or the new one, never half of either.

A :class:`FileRange` reads a few bytes of a file that is also mapped into memory
without touching the mapping: Linux maps in the cached pages around every byte read
through a mapping (fault-around, and whole large folios), 64 KiB to 2 MiB a read, so a
short prompt's rows of a large vocabulary's token embeddings could make most of them
resident in the process; read with ``pread`` they stay in the page cache.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from pathlib import Path

__all__ = ["FileRange", "cache_folder", "pread_fully", "replace_file"]


def cache_folder(chosen: Path | bool) -> Path | None:
    """Where a cache setting (:func:`tensorplug.settings.parse_folder`'s value) keeps its
    files: None for off, the folder it names, else ``$XDG_CACHE_HOME/tensorplug`` (by
    default ``~/.cache/tensorplug``), which every tensorplug cache shares."""
    if chosen is False:
        return None
    if isinstance(chosen, Path):
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tensorplug"


def replace_file(path: Path, data: bytes) -> None:
    """Make ``path`` hold ``data``, whole or not at all (its folder is made if needed).
    Raises ``OSError`` where it cannot be written; nothing is left behind then."""
    import tempfile  # imports shutil, bz2, lzma and random: unpaid by launches writing nothing

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class FileRange:
    """Bytes ``offset .. offset + size`` of an open file, read in pieces with ``pread``.

    It holds a descriptor of its own (a duplicate of ``fd``, closed with it), so it
    reads the file that was opened, even if the path is later given to another.
    ``what`` names the file in errors."""

    def __init__(self, fd: int, offset: int, size: int, what: str) -> None:
        self.offset, self.size, self.what = offset, size, what
        self._fd = os.dup(fd)
        self._close = weakref.finalize(self, os.close, self._fd)

    def fileno(self) -> int:
        """The range's own descriptor, open while this object lives: for readers outside
        Python (a compiled kernel's ``pread``) that keep it alive meanwhile."""
        return self._fd

    def read(self, into: memoryview, at: int) -> None:
        """Fill ``into`` (writable bytes) from byte ``at`` of the range; ``OSError`` when
        the file no longer holds them (it was cut short while in use)."""
        n = len(into)
        if at < 0 or at + n > self.size:
            raise ValueError(f"bytes [{at}, {at + n}) are outside the range's {self.size}")
        if pread_fully(self._fd, into, self.offset + at) < n:
            raise OSError(
                f"{self.what}: the file ends before byte {self.offset + at + n}: it "
                "changed or was truncated while in use; do not rewrite a model while "
                "it runs"
            )


def pread_fully(fd: int, into: memoryview, offset: int) -> int:
    """Fill ``into`` from byte ``offset`` of ``fd``; the count read, less than
    ``len(into)`` only where the file ends first. It reads in as many calls as the OS
    needs (Linux reads at most ~2 GiB a call). Where the OS has no ``pread`` (Windows)
    it seeks, so ``fd`` must be the caller's own."""
    done = 0
    while done < len(into):
        if hasattr(os, "preadv"):
            got = os.preadv(fd, [into[done:]], offset + done)
        else:
            os.lseek(fd, offset + done, os.SEEK_SET)
            data = os.read(fd, len(into) - done)
            got = len(data)
            into[done : done + got] = data
        if got == 0:
            break
        done += got
    return done

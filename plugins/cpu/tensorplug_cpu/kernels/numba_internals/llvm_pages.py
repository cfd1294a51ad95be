"""Gives back the pages of LLVM's code that this process has no more use for.

``import numba`` loads ``libllvmlite.so`` (LLVM: tens of megabytes of code and of
read-only data) and runs its static initializers, which touch pages all over it;
loading a kernel from numba's cache or compiling one touches more. Tens of megabytes of
it are resident after the import alone, a large share of a small model's whole
footprint, counted in the process's RSS and peak RSS, for code that runs only while a
kernel is loaded or compiled.

Those pages are unmodified copies of the file. ``madvise(MADV_DONTNEED)`` drops them from
this process, and any LLVM code that runs again is mapped back from the page cache at its
first touch (a minor fault per 4 KiB page, cheap beside a compile). Only what this process
can never have written is dropped: mappings that are not writable and lie outside every
writable ``PT_LOAD`` segment of the library. The dynamic loader writes relocations into
the start of such a segment (RELRO) before making it read-only; dropped, those pages would
come back as the file's unrelocated bytes. Linux only; elsewhere, or for a library this
cannot read, nothing is dropped.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import struct
import sys

__all__ = ["LLVM_LIBRARY", "release"]

_log = logging.getLogger("tensorplug_cpu")

#: the file name of llvmlite's shared library, as it appears in ``/proc/self/maps``
LLVM_LIBRARY = "libllvmlite.so"

_MADV_DONTNEED = 4
_PT_LOAD, _PF_W = 1, 2
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.lru_cache(maxsize=4)
def _writable_segments(path: str) -> tuple[int, tuple[tuple[int, int], ...]] | None:
    """``(p_vaddr of the segment at file offset 0, writable segments' page-rounded
    virtual ranges)`` from a 64-bit little-endian ELF file's program headers, or None
    for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            (phoff,) = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return None
    first: int | None = None
    writable = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _, _, p_memsz = struct.unpack_from(
            "<IIQQQQQ", table, i * phentsize
        )
        if p_type != _PT_LOAD:
            continue
        if p_offset == 0:
            first = p_vaddr
        if p_flags & _PF_W:
            start = p_vaddr - p_vaddr % _PAGE
            end = -(-(p_vaddr + p_memsz) // _PAGE) * _PAGE
            writable.append((start, end))
    return None if first is None else (first, tuple(writable))


def _droppable(maps: list[list[str]], library: str) -> list[tuple[int, int]]:
    """The address ranges of ``library``'s mappings in ``maps`` (split lines of
    ``/proc/self/maps``) that hold only pages this process cannot have written."""
    own = [m for m in maps if len(m) >= 6 and os.path.basename(m[5]) == library]
    base_line = next((m for m in own if int(m[2], 16) == 0), None)
    if base_line is None:
        return []
    segments = _writable_segments(base_line[5])
    if segments is None:
        return []
    first_vaddr, writable = segments
    bias = int(base_line[0].split("-")[0], 16) - first_vaddr
    ranges = []
    for m in own:
        if "w" in m[1]:
            continue
        a, b = (int(x, 16) for x in m[0].split("-"))
        pieces = [(a, b)]
        for start, end in writable:  # cut every once-writable range out
            w0, w1 = bias + start, bias + end
            pieces = [p for x0, x1 in pieces for p in ((x0, min(x1, w0)), (max(x0, w1), x1))]
        ranges += [(x0, x1) for x0, x1 in pieces if x1 > x0]
    return ranges


def release(library: str = LLVM_LIBRARY) -> int:
    """Drops the resident pages of ``library`` that hold only its file's bytes (see the
    module docstring); returns the bytes of address space advised (0 where nothing
    could be: not Linux, no such library mapped, not an ELF file this reads)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = [line.split(maxsplit=5) for line in f]
        ranges = _droppable([[*m[:5], m[5].strip()] for m in maps if len(m) == 6], library)
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError) as e:
        _log.debug("could not give back %s's pages: %s", library, e)
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for a, b in ranges:
        if madvise(a, b - a, _MADV_DONTNEED) == 0:
            done += b - a
    return done

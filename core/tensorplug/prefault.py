"""New memory's pages made resident by another thread while this one fills them.

A model's repacked weights are hundreds of megabytes of new memory that the loader
writes front to back as it reads the file. Each first write of a page stops the writer
in the kernel, which must find, zero and map a page; for the 2 MiB pages weights are
advised (:func:`.host.aligned_bytes`) it may first have to compact memory to find one.
Those faults, not the copies, are most of the time repacking a model's weights takes,
and how long they last varies with how fragmented memory is.

:func:`populate_in_background` asks the kernel for every page of a block at once
(``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+) from a thread of its own, in slices from
the front, so the pages are there, or being made, by the time the loader reaches them,
and two cores share the work. The call goes through ``ctypes``, which releases the
GIL around it (Python's ``mmap.madvise`` holds it). The memory becomes resident no
sooner than it would anyway: the loader writes every byte of it. Where the call is not
available (another OS, an older kernel) nothing happens and the writer faults the pages
in itself, as before.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import numpy as np

__all__ = ["SLICE_BYTES", "populate_in_background"]

#: Linux's ``MADV_POPULATE_WRITE`` (5.14+): fault every page in as if written
_MADV_POPULATE_WRITE = 23
#: bytes asked for per call: small enough that the loader, close behind, finds the
#: slice it writes already done, large enough that calls cost nothing beside the faults
SLICE_BYTES = 16 << 20


@functools.cache
def _libc_madvise() -> Any:
    """libc's ``madvise`` through ctypes (which drops the GIL around the call), or None
    where there is none to call."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def populate_in_background(memory: np.ndarray) -> threading.Thread | None:
    """Start a thread that makes the pages of ``memory`` resident, front to back, and
    return it; None where the kernel cannot be asked (not Linux). ``memory`` must be a
    C-contiguous block that starts on a page (an anonymous mapping of its own); the
    thread holds it, so the pages stay mapped until it is done. A call the kernel
    refuses (a kernel before 5.14: ``EINVAL``) ends the thread; nothing else changes."""
    if not sys.platform.startswith("linux") or memory.nbytes == 0:
        return None
    madvise = _libc_madvise()
    if madvise is None:
        return None
    start, size = int(memory.ctypes.data), int(memory.nbytes)

    def populate(held: np.ndarray) -> None:
        for at in range(0, size, SLICE_BYTES):
            if madvise(start + at, min(SLICE_BYTES, size - at), _MADV_POPULATE_WRITE) != 0:
                return

    thread = threading.Thread(target=populate, args=(memory,), name="tensorplug-prefault",
                              daemon=True)  # fmt: skip
    thread.start()
    return thread

"""``use_mlock`` / ``--mlock``: keep the loaded model in RAM, never paged out or dropped
from the page cache, as llama.cpp's ``mlock`` does.

On Linux the process's current pages are locked (``mlockall(MCL_CURRENT)``): the
weights (their file mapping is read in whole), the copies made of them and the KV
cache. Memory mapped later is not locked, so a later allocation cannot fail for the
lock's sake. The lock is bounded by ``RLIMIT_MEMLOCK`` (``ulimit -l``); when it is too
small the lock fails, the model still runs, and the reason is returned for a warning,
as llama.cpp warns. Elsewhere nothing is locked and the reason says so."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys

__all__ = ["lock_memory"]

#: mlockall's flag for the pages mapped now (Linux's value)
MCL_CURRENT = 1


def lock_memory() -> str | None:
    """Lock the process's current pages in RAM; None when done, else why not."""
    if not sys.platform.startswith("linux"):
        return f"locking memory (mlock) is not supported on {sys.platform}: nothing was locked"
    libc_name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
    except OSError as e:
        return f"could not load the C library to lock memory: {e}"
    if libc.mlockall(MCL_CURRENT) == 0:
        return None
    err = ctypes.get_errno()
    if err in (errno.ENOMEM, errno.EPERM, errno.EAGAIN):
        return (
            f"failed to lock the model in RAM ({os.strerror(err)}): raise the limit on "
            "locked memory (ulimit -l, or LimitMEMLOCK for a service) and run again; the "
            "model runs without the lock"
        )
    return f"failed to lock the model in RAM: {os.strerror(err)}"

"""Which kernels numba's disk cache holds, as the plugin noted them.

The compile-ahead process (:mod:`.ahead`) and the binder ask, before a kernel is
called, whether numba's cache has it already (then it loads in milliseconds, else it
compiles for seconds, better in the other process). numba's public API cannot tell
without loading it. So whenever a process has a kernel from numba for a signature
(compiled or loaded), it notes that here: an empty file in the cache folder
(:func:`.cache_folder.kernel_folder`), named by the kernel's identity and the
signature. A note is only a hint: one that is wrong costs a compile in the wrong
process, never a wrong result, since numba loads or compiles the kernel either way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from .cache_folder import kernel_folder
from .kernel_identity import identity, origin_of

__all__ = ["holds", "note"]

_SUBFOLDER = "compiled"


def _path(kernel: Any, signature: tuple[Any, ...]) -> Path | None:
    origin = origin_of(kernel)
    name = None if origin is None else identity(origin)
    folder = kernel_folder() if name is not None else None
    if folder is None:
        return None
    key = hashlib.sha256(repr((name, tuple(str(t) for t in signature))).encode()).hexdigest()
    return folder / _SUBFOLDER / key[:32]


def holds(kernel: Any, signature: tuple[Any, ...]) -> bool:
    """Whether a process noted ``kernel`` (a dispatcher or job) for ``signature``
    (numba types; ``()`` for a job)."""
    path = _path(kernel, signature)
    if path is None:
        return False
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def note(kernel: Any, signature: tuple[Any, ...]) -> None:
    """Note that numba's cache now holds ``kernel`` for ``signature`` (nothing where
    the folder cannot be written: the next process compiles it where it is)."""
    path = _path(kernel, signature)
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600))

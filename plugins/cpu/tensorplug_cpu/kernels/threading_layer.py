"""Lets numba find the TBB runtime that ``pip install tbb`` put into the environment.

numba runs a parallel kernel's chunks on one of three threading layers and, unless told
otherwise, takes the first that loads: TBB, then OpenMP, then its own workqueue. OpenMP
and the workqueue hand each thread a fixed share and end in a barrier, so on a busy
machine a kernel waits for its last descheduled thread: measured on the 2-core dev
machine beside two busy processes, a 100M Q4_0 generation step on two threads took
7–520 ms (median of each run) on OpenMP and 4.6–15 ms on TBB, whose calling thread
runs the chunks a sleeping worker has not taken (``plugins/cpu/README.md``, "Threads").

The ``tbb`` wheel installs ``libtbb`` into the environment's ``lib`` folder, beside
``site-packages`` rather than in it. The dynamic loader does not look there outside
conda, so numba's ``CDLL("libtbb.so.12")`` fails and it falls back to OpenMP without a
word. Loading the library by its full path first (``RTLD_GLOBAL``) makes that name
resolve to the loaded copy. Where ``tbb`` is not installed, or the user named another
layer (``NUMBA_THREADING_LAYER`` or ``numba.config.THREADING_LAYER``), this does nothing.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import sys
from pathlib import Path

__all__ = ["TBB_LIBRARY_NAMES", "find_tbb_library", "preload_tbb"]

_log = logging.getLogger("tensorplug_cpu")

#: the file numba asks the loader for, per platform (numba/np/ufunc/parallel.py)
TBB_LIBRARY_NAMES = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}

#: the values of ``NUMBA_THREADING_LAYER`` under which numba would take TBB if it loads
_LAYERS_THAT_TRY_TBB = ("default", "tbb", "safe", "threadsafe")


def find_tbb_library() -> Path | None:
    """The TBB runtime of the installed ``tbb`` distribution, or None."""
    name = TBB_LIBRARY_NAMES.get(sys.platform)
    if name is None:
        return None
    try:
        dist = importlib.metadata.distribution("tbb")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == name:
            path = Path(str(dist.locate_file(file)))
            return path if path.is_file() else None
    return None


def preload_tbb(requested_layer: str) -> Path | None:
    """Loads the ``tbb`` distribution's runtime so that numba's threading layer can
    use it; returns the library loaded, or None when nothing was (no ``tbb``, a
    ``requested_layer`` — ``numba.config.THREADING_LAYER``, which numba reads from
    the environment — that is not TBB, or a library that would not load). Must run
    before numba starts its threads: the layer is chosen once, at the first parallel
    call."""
    if requested_layer.strip().lower() not in _LAYERS_THAT_TRY_TBB:
        return None
    path = find_tbb_library()
    if path is None:
        return None
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:  # a broken or foreign-platform install: numba takes OpenMP
        _log.warning("could not load TBB from %s (numba will use another threading "
                     "layer): %s", path, e)  # fmt: skip
        return None
    return path

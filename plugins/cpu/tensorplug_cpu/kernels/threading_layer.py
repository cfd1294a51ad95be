"""numba's threading layer: the TBB runtime that ``pip install tbb`` put into the
environment found, and the layer started.

numba runs a parallel kernel's chunks on one of three threading layers and, unless told
otherwise, takes the first that loads: TBB, then OpenMP, then its own workqueue. OpenMP
and the workqueue hand each thread a fixed share and end in a barrier, so on a busy
machine a kernel waits for its last descheduled thread; TBB's calling thread runs the
chunks a sleeping worker has not taken (``plugins/cpu/README.md``, "Threads").

The ``tbb`` wheel installs ``libtbb`` into the environment's ``lib`` folder, beside
``site-packages`` rather than in it. The dynamic loader does not look there outside
conda, so numba's ``CDLL("libtbb.so.12")`` fails and it falls back to OpenMP without a
word. Loading the library by its full path first (``RTLD_GLOBAL``) makes that name
resolve to the loaded copy. Where ``tbb`` is not installed, or the user named another
layer (``NUMBA_THREADING_LAYER`` or ``numba.config.THREADING_LAYER``), this does nothing.

:func:`start_threads` starts the layer through numba's public API (the layer asked for
set in ``numba.config``, the threads launched by ``numba.get_num_threads``); where the
fast launch is on (:mod:`.numba_internals`), it starts it without importing numba, for
kernels loaded from kept machine code.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tensorplug import installed

from ..settings import NUMBA_THREADS
from . import numba_internals
from .numba_import import numba_module
from .numba_internals import numba_private

__all__ = ["TBB_LIBRARY_NAMES", "Threads", "default_thread_count", "find_tbb_library",
           "preload_tbb", "start_threads", "started"]  # fmt: skip

_log = logging.getLogger("tensorplug_cpu")

#: the TBB runtime file numba asks the loader for, per platform
TBB_LIBRARY_NAMES = numba_private.TBB_LIBRARY_NAMES

#: the values of ``NUMBA_THREADING_LAYER`` under which numba would take TBB if it loads
_LAYERS_THAT_TRY_TBB = ("default", "tbb", "safe", "threadsafe")


def find_tbb_library() -> Path | None:
    """The TBB runtime of the installed ``tbb`` distribution, or None."""
    name = TBB_LIBRARY_NAMES.get(sys.platform)
    if name is None:
        return None
    found = installed.locate("tbb", name)  # kept between processes where it can be
    path = None if found is None else Path(found)
    return path if path is not None and path.is_file() else None


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


@dataclass(frozen=True)
class Threads:
    """A started threading layer: its name and thread count (what
    ``NUMBA_NUM_THREADS`` gives numba), and the thread count of the calling thread's
    parallel regions (thread-local, as numba's ``set_num_threads``)."""

    layer: str
    count: int
    set_num_threads: Callable[[int], None]
    get_num_threads: Callable[[], int]


_lock = threading.Lock()
_started: list[Threads] = []


def default_thread_count() -> int:
    """``NUMBA_NUM_THREADS``, else the CPUs this process may run on: numba's count."""
    given = NUMBA_THREADS.get()  # (a value it cannot read raises SettingError)
    if given is not None:
        return given
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)


def start_threads(requested_layer: str) -> Threads:
    """The threading layer, started once a process: by the fast launch where it is on
    (:func:`.numba_internals.threads.start`, numba not imported), else by numba
    (``requested_layer``: its ``NUMBA_THREADING_LAYER``). Raises ValueError where no
    layer loads."""
    with _lock:
        if _started:
            return _started[0]
        threads = numba_internals.attempt("starting numba's threads", _start_early, requested_layer)
        if threads is None:
            threads = _start_by_numba(requested_layer)
        _started.append(threads)
        return threads


def started() -> Threads | None:
    """The layer :func:`start_threads` started in this process, or None."""
    return _started[0] if _started else None


def _start_early(requested_layer: str) -> Threads | None:
    from .numba_internals.threads import start

    found = start(requested_layer.strip().lower(), default_thread_count())
    if found is None:
        return None
    layer, set_count, get_count = found
    return Threads(layer, get_count(), set_count, get_count)


def _start_by_numba(requested_layer: str) -> Threads:
    """numba's layer, started by numba's public API: the layer named in its settings
    (where no one set it there before), then its threads launched."""
    numba = numba_module()
    if not _layer_started(numba):
        numba.config.THREADING_LAYER = requested_layer.strip().lower()
    count = numba.get_num_threads()  # launches the layer's threads (ValueError: none loads)
    return Threads(str(numba.threading_layer()), count, numba.set_num_threads,
                   numba.get_num_threads)  # fmt: skip


def _layer_started(numba: object) -> bool:
    """Whether numba has started its threads already (its ``threading_layer()``
    raises ValueError until then)."""
    try:
        numba.threading_layer()  # type: ignore[attr-defined]
    except ValueError:
        return False
    return True

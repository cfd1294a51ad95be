"""numba's threading layer: the TBB runtime that ``pip install tbb`` put into the
environment found, and the layer started without importing numba.

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

A kept kernel (:mod:`.kept_code`) with a parallel loop calls the layer's C functions
(``numba_parallel_for``, the scheduler's, the thread count's) by name, and runs in a
process that need not import numba (issue 42: its import is ~120 ms of a launch).
:func:`start_threads` starts the layer as numba's ``_launch_threads`` does, from the
same extension module (loaded by its file, under numba's name for it), choosing it by
numba's rules (``NUMBA_THREADING_LAYER``, ``NUMBA_THREADING_LAYER_PRIORITY``); where
numba is imported, numba starts it. :func:`tell_numba` hands a layer started here to
numba when it is imported later, so that numba neither starts a second one nor sees
none.
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
from types import ModuleType

from tensorplug import installed

from ..settings import NUMBA_THREADS

__all__ = ["TBB_LIBRARY_NAMES", "Threads", "default_thread_count", "find_tbb_library",
           "preload_tbb", "start_threads", "started", "tell_numba"]  # fmt: skip

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


#: the layers numba tries, in its order, for each value of ``NUMBA_THREADING_LAYER``
#: other than a layer's name (numba/np/ufunc/parallel.py, Linux's and Windows' choices)
_CHOICES = {"safe": ("tbb",), "threadsafe": ("tbb", "omp"), "forksafe": ("tbb", "workqueue")}
#: the extension module of each layer
_MODULES = {"tbb": "numba.np.ufunc.tbbpool", "omp": "numba.np.ufunc.omppool",
            "workqueue": "numba.np.ufunc.workqueue"}  # fmt: skip
#: TBB's oldest interface version numba's layer takes (2021 update 6)
_TBB_INTERFACE = 12060
#: the layer's C functions numba's compiled code calls, by the names it calls them
_SYMBOLS = {"numba_parallel_for": "parallel_for", **{n: n for n in (
    "do_scheduling_signed", "do_scheduling_unsigned", "allocate_sched", "deallocate_sched",
    "get_num_threads", "set_num_threads", "get_thread_id", "set_parallel_chunksize",
    "get_parallel_chunksize", "get_sched_size")}}  # fmt: skip


@dataclass(frozen=True)
class Threads:
    """A started threading layer: its name, extension module and thread count (what
    ``NUMBA_NUM_THREADS`` gives numba), and the thread count of the calling thread's
    parallel regions (thread-local, as numba's ``set_num_threads``)."""

    layer: str
    module: ModuleType
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


def _tbb_usable() -> bool:
    """Whether TBB's runtime loads and is new enough for numba's layer (numba's check)."""
    name = TBB_LIBRARY_NAMES.get(sys.platform)
    if name is None:
        return False
    try:
        version = ctypes.CDLL(name).TBB_runtime_interface_version
    except (OSError, AttributeError):
        return False
    version.argtypes, version.restype = [], ctypes.c_int
    return int(version()) >= _TBB_INTERFACE


def _layer_module(layer: str) -> ModuleType | None:
    from .numba_extensions import extension_module

    if layer == "tbb" and not _tbb_usable():
        return None
    try:
        return extension_module(_MODULES[layer])
    except ImportError:
        return None


def _choose(requested: str, priority: list[str]) -> tuple[str, ModuleType]:
    """The layer numba would take for ``NUMBA_THREADING_LAYER=requested``: its module.
    Raises ValueError, as numba does, where none loads."""
    if requested in _MODULES:
        names: tuple[str, ...] = (requested,)
    elif requested == "default":
        names = tuple(priority)
    elif requested in _CHOICES:
        names = _CHOICES[requested]
    else:
        raise ValueError(f"The threading layer requested '{requested}' is unknown to Numba.")
    for name in names:
        module = _layer_module(name)
        if module is not None:
            return name, module
    raise ValueError(f"No threading layer could be loaded (NUMBA_THREADING_LAYER={requested})")


def start_threads(requested_layer: str) -> Threads:
    """The threading layer, started once a process: numba's where numba is imported
    (it starts it), else started here as numba would (``requested_layer``: its
    ``NUMBA_THREADING_LAYER``), its functions registered with LLVM under the names
    compiled code calls. Raises ValueError where no layer loads."""
    with _lock:
        if _started:
            return _started[0]
        if sys.modules.get("numba") is not None:
            threads = _numba_threads()
        else:
            threads = _start(requested_layer.strip().lower())
        _started.append(threads)
        return threads


def started() -> Threads | None:
    """The layer :func:`start_threads` started in this process, or None."""
    return _started[0] if _started else None


def _start(requested: str) -> Threads:
    import llvmlite.binding as ll

    priority = os.environ.get("NUMBA_THREADING_LAYER_PRIORITY", "tbb omp workqueue").split()
    if sorted(priority) != sorted(_MODULES):
        raise ValueError(f"NUMBA_THREADING_LAYER_PRIORITY={' '.join(priority)} must be a "
                         f"permutation of {' '.join(_MODULES)}")  # fmt: skip
    layer, module = _choose(requested, priority)
    for symbol, name in _SYMBOLS.items():
        ll.add_symbol(symbol, getattr(module, name))
    count = default_thread_count()
    ctypes.CFUNCTYPE(None, ctypes.c_int)(module.launch_threads)(count)
    set_count = ctypes.CFUNCTYPE(None, ctypes.c_int)(module.set_num_threads)
    set_count(count)
    get_count = ctypes.CFUNCTYPE(ctypes.c_int)(module.get_num_threads)
    return Threads(layer, module, count, set_count, get_count)


def _numba_threads() -> Threads:
    """numba's layer, started by numba (an imported numba starts its own)."""
    import numba
    from numba.np.ufunc import parallel

    parallel._launch_threads()
    layer = str(parallel.threading_layer())
    module = sys.modules[_MODULES[layer]]
    count = int(getattr(numba.config, "NUMBA_NUM_THREADS", 1))
    return Threads(layer, module, count, numba.set_num_threads, numba.get_num_threads)


def tell_numba(threads: Threads) -> None:
    """Hand the layer :func:`start_threads` started to numba, imported since: numba's
    ``_launch_threads`` then finds it started (as it would have started it), and its
    ``get_num_threads``/``set_num_threads`` and compiled parallel code use it."""
    from numba.np.ufunc import parallel

    with parallel._backend_init_thread_lock:
        if parallel._is_initialized:
            return
        n = threads.get_num_threads()
        parallel._load_threading_functions(threads.module)  # its globals, as numba sets them
        threads.set_num_threads(n)  # (numba's loader reset this thread's count)
        parallel._threading_layer = threads.layer  # type: ignore[assignment]
        parallel._is_initialized = True

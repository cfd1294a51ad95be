"""numba's threading layer started without importing numba, for kernels loaded from
kept machine code (:mod:`.kept_code`), and handed to numba when it is imported later.

A kept kernel with a parallel loop calls the layer's C functions (``numba_parallel_for``,
the scheduler's, the thread count's) by name, in a process that need not import numba.
:func:`start` starts the layer as numba's own launch does, from the same
extension module (loaded by its file, under numba's name for it), choosing it by numba's
rules (``NUMBA_THREADING_LAYER``, ``NUMBA_THREADING_LAYER_PRIORITY``). :func:`tell_numba`
hands that layer to numba when it is imported later, so that numba neither starts a
second one nor sees none: numba's private ``parallel`` globals, set as numba sets them.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType

from . import numba_private
from .numba_extensions import extension_module

__all__ = ["start", "tell_numba"]

#: the extension module of each layer
_MODULES = numba_private.THREADING_MODULES
#: TBB's oldest interface version numba's layer takes (2021 update 6)
_TBB_INTERFACE = 12060


_lock = threading.Lock()
#: the layer started here: its name and extension module
_started: list[tuple[str, ModuleType]] = []


def _tbb_usable() -> bool:
    """Whether TBB's runtime loads and is new enough for numba's layer (numba's check)."""
    name = numba_private.TBB_LIBRARY_NAMES.get(sys.platform)
    if name is None:
        return False
    try:
        version = ctypes.CDLL(name).TBB_runtime_interface_version
    except (OSError, AttributeError):
        return False
    version.argtypes, version.restype = [], ctypes.c_int
    return int(version()) >= _TBB_INTERFACE


def _layer_module(layer: str) -> ModuleType | None:
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
    elif requested in numba_private.LAYER_CHOICES:
        names = numba_private.LAYER_CHOICES[requested]
    else:
        raise ValueError(f"The threading layer requested '{requested}' is unknown to Numba.")
    for name in names:
        module = _layer_module(name)
        if module is not None:
            return name, module
    raise ValueError(f"No threading layer could be loaded (NUMBA_THREADING_LAYER={requested})")


def start(
    requested: str, count: int
) -> tuple[str, Callable[[int], None], Callable[[], int]] | None:
    """The layer numba would take for ``NUMBA_THREADING_LAYER=requested``, started with
    ``count`` threads, its functions registered with LLVM under the names compiled code
    calls: its name and the calling thread's thread-count setter and getter. None where
    numba is imported (numba starts its own). Raises ValueError where no layer loads."""
    with _lock:
        if sys.modules.get("numba") is not None and not _started:
            return None
        if _started:
            layer, module = _started[0]
        else:
            priority = os.environ.get("NUMBA_THREADING_LAYER_PRIORITY", "tbb omp workqueue").split()
            if sorted(priority) != sorted(_MODULES):
                raise ValueError(f"NUMBA_THREADING_LAYER_PRIORITY={' '.join(priority)} must be a "
                                 f"permutation of {' '.join(_MODULES)}")  # fmt: skip
            layer, module = _choose(requested, priority)
            numba_private.start_threading_layer(module, count)
            _started.append((layer, module))
    set_count, get_count = numba_private.layer_counts(module)
    set_count(count)
    return layer, set_count, get_count


def tell_numba() -> None:
    """Hand the layer :func:`start` started to numba, imported since: numba's
    launch then finds it started (as it would have started it), and its
    ``get_num_threads``/``set_num_threads`` and compiled parallel code use it. Nothing
    where this process started no layer here."""
    if _started:
        numba_private.hand_layer_to_numba(*_started[0])

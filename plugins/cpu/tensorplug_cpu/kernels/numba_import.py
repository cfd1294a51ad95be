"""numba's Python package, imported where the plugin first needs it.

A launch whose kernels are all kept (:mod:`.kept_code`) runs them without numba's Python
package, whose import is a large share of a small model's launch;
anything else (a kernel to compile or to load from numba's cache, a compile-ahead
child to feed) imports it here, once, in the same way wherever it happens: ``coverage``
hidden while it imports (:func:`_no_idle_coverage`), the threading layer the plugin
started handed over (:func:`.numba_internals.threads.tell_numba`), and whoever asked to be told
(:func:`on_import`, the kernels' compile notices) told.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import numba_internals

__all__ = ["numba_module", "on_import"]

_lock = threading.RLock()
_listeners: list[Callable[[Any], None]] = []
_done: list[Any] = []


def on_import(listener: Callable[[Any], None]) -> None:
    """Call ``listener(numba)`` once numba is imported here: now, if it is."""
    with _lock:
        if _done:
            listener(_done[0])
        else:
            _listeners.append(listener)


def numba_module() -> Any:
    """numba, imported (once a process), the threading layer handed to it, the
    listeners told. Raises what numba's import raises."""
    with _lock:
        if _done:
            return _done[0]
        with _no_idle_coverage():
            import numba
        if numba_internals.enabled():  # a layer the fast launch started, handed over
            from .numba_internals.threads import tell_numba

            numba_internals.attempt("handing the threads to numba", tell_numba)
        _done.append(numba)
        listeners, _listeners[:] = list(_listeners), []
    for listener in listeners:
        listener(numba)
    return numba


@contextlib.contextmanager
def _no_idle_coverage() -> Iterator[None]:
    """numba's import imports ``coverage`` wherever it is installed (a developer's or a
    CI's environment), only to hand the lines it compiles to a coverage run in progress:
    importing ``coverage`` makes numba's import markedly slower, at every launch.
    No run can be in progress while ``coverage`` is not imported, so
    for the length of numba's import it is not to be found (``sys.modules`` holding
    None makes ``import coverage`` fail as if it were not installed). A run that
    ``coverage`` or pytest-cov starts has imported it first, and numba sees it as ever;
    one started later in the process would not see numba's compiled lines
    (``NUMBA_JIT_COVERAGE``), which no launch of a model compiles anyway."""
    if "coverage" in sys.modules:
        yield
        return
    sys.modules["coverage"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if "coverage" in sys.modules and sys.modules["coverage"] is None:
            del sys.modules["coverage"]

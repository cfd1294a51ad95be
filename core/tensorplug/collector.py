"""Python's cyclic garbage collector held off while a plan is built.

Building a step's graph, splitting and allocating it and binding a backend's plan make
tens of thousands of objects that all live as long as the plan (SmolLM2-135M: ~850
tensors and their kernels' views a step). Every 700 new objects set off a young
collection, which walks them again, and every few of those an older one: a large share
of what a new prompt length costs, whether the process's older objects are frozen
(``gc.freeze()``) or not. Held off, the collector walks them once, at its first
collection after the plan.

Only the collector's schedule changes: nothing is kept alive that would have been
freed by reference counting, and the garbage of the cycles made meanwhile is collected
later. A program that turned the collector off keeps it off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused"]

_lock = threading.Lock()
_holders = 0  # threads inside paused() that turned the collector off


@contextmanager
def paused() -> Iterator[None]:
    """Hold off cyclic collections for the ``with`` block (nested blocks and blocks of
    other threads included: the last one out turns it back on)."""
    global _holders
    with _lock:
        if _holders == 0 and not gc.isenabled():  # off by the program's own choice
            owner = False
        else:
            owner = True
            _holders += 1
            gc.disable()
    try:
        yield
    finally:
        if owner:
            with _lock:
                _holders -= 1
                if _holders == 0:
                    gc.enable()

"""Ctrl-C stays Python's while plugins load native libraries.

A plugin's native library may install its own SIGINT handler: PoCL (the OpenCL CPU
driver CI uses) does when it creates a context, with ``SA_RESETHAND``, saving the
handler it replaced and raising the signal again from its own. A second context saves
PoCL's handler as the "old" one, and a Ctrl-C then ran PoCL's handler twice: the
second time with the default action, which killed the process (exit -2 after
``tensorplug run: interrupted``), or, landing between the two, left a
``KeyboardInterrupt`` raised inside the driver's call, printed and swallowed there.
:func:`ctrl_c_stays_python` puts Python's handler back after such a load, so every
Ctrl-C is one ``KeyboardInterrupt`` in the main thread, which ``tensorplug.cli`` turns
into one line and exit status 130.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ctrl_c_stays_python"]


@contextmanager
def ctrl_c_stays_python() -> Iterator[None]:
    """Reinstall, on leaving, the SIGINT handler Python had on entering (from the main
    thread only: only it may set handlers; another thread's load changes nothing)."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if handler is not None:  # None: a handler Python did not install; leave it
            signal.signal(signal.SIGINT, handler)

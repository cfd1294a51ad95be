"""Ctrl-C while plugins load: raised once they have loaded, and always Python's.

Loading plugins imports and initialises native libraries, and a ``KeyboardInterrupt``
raised inside them went wrong three ways (each seen by sending SIGINT at random moments
of ``tensorplug run``'s load, in about one run of 20):

* pyopencl's nanobind module aborted the process ("Critical nanobind error:
  enum_create") when the interrupt landed while it made its enums at import: exit -6;
* PoCL, the OpenCL CPU driver, installs its own SIGINT handler when it creates a
  context (``SA_RESETHAND``, re-raising through the handler it replaced), and an
  interrupt meeting that chain was now and then lost;
* after an interrupted load the process was now and then killed by SIGINT once
  ``tensorplug.cli`` had printed its line and returned 130 (exit -2; CPython's
  "unhandled KeyboardInterrupt" flag, which an interrupt inside ``exec`` of a string
  such as a ``namedtuple``'s leaves set, was set in every such run), so the CLI ends an
  interrupted command with ``os._exit(130)``.

:func:`deferred_ctrl_c` holds a first Ctrl-C back until the load is over, then raises
it as a ``KeyboardInterrupt`` where Python code can handle it; a second Ctrl-C during
the load is raised at once (a driver that hangs can still be interrupted). On leaving,
Python's handler is put back, whatever a native library installed meanwhile.

A ``KeyboardInterrupt`` raised by Python's own handler can also be lost outright: C
code that calls back into Python and clears what the call raised drops it, and
``tensorplug run`` then went on to the end of its generation as if no Ctrl-C had come
(one run in about 15 when the signal met numpy's first import of ``numpy.random``, a
Cython module, as the sampler was made). So ``run`` holds a first Ctrl-C the same way
while it generates and raises it at the next prompt chunk or token
(:meth:`HeldCtrlC.check`), where no native code is on the stack.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["HeldCtrlC", "deferred_ctrl_c"]


class HeldCtrlC:
    """While active, a first SIGINT is only recorded (:attr:`held`) and a second raises
    ``KeyboardInterrupt`` at once: work that must not be cut anywhere (a native library
    loading, a chat reply between two tokens) stops where it chooses, and a stuck one
    can still be interrupted.

    Only the main thread may set signal handlers, and SIG_IGN or SIG_DFL is the
    embedding program's choice: then the block runs with SIGINT as it is. A handler
    installed by C code (``getsignal`` gives None: PoCL's) is replaced, and Python's own
    is put back on leaving, whatever a native library installed meanwhile."""

    def __init__(self) -> None:
        self.held = False
        self._restore: Callable[[int, FrameType | None], Any] | None = None

    def __enter__(self) -> HeldCtrlC:
        self.held = False
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is None or callable(previous):
                self._restore = previous if callable(previous) else signal.default_int_handler
                signal.signal(signal.SIGINT, self._hold)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._restore is not None:
            signal.signal(signal.SIGINT, self._restore)
            self._restore = None

    def check(self) -> None:
        """Raise the held Ctrl-C here: a point where stopping leaves nothing half done."""
        if self.held:
            raise KeyboardInterrupt

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        if self.held:
            raise KeyboardInterrupt
        self.held = True


@contextmanager
def deferred_ctrl_c() -> Iterator[HeldCtrlC]:
    """Hold a first SIGINT back until the block ends, or until the block calls
    :meth:`HeldCtrlC.check` on what it is given, then raise ``KeyboardInterrupt`` (a
    second is raised at once; :class:`HeldCtrlC`)."""
    with HeldCtrlC() as ctrl_c:
        yield ctrl_c
    ctrl_c.check()

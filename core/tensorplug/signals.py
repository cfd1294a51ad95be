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
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["deferred_ctrl_c"]


@contextmanager
def deferred_ctrl_c() -> Iterator[None]:
    """Hold a first SIGINT back until the block ends, then raise ``KeyboardInterrupt``.

    Only the main thread may set signal handlers: elsewhere, or when Python does not own
    SIGINT (a handler installed by C code, or SIG_IGN / SIG_DFL chosen by the embedding
    program), the block runs with SIGINT as it is."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if not callable(previous):
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C is not held back

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt

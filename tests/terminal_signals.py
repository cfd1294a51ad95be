"""What the tests that start a CLI in a child process and press Ctrl-C share."""

from __future__ import annotations

import signal


def sigint_as_a_terminal_sends_it() -> None:
    """Run in the child before it starts (``preexec_fn``): a test run started as a
    shell's background job (``pytest &``, ``nohup … &``) has SIGINT ignored, every child
    inherits that, and a Python started with it ignored never turns Ctrl-C into
    KeyboardInterrupt; the child must get the signal as a person's terminal delivers it
    (a chat reply once ran to the end of its context, ignoring its Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

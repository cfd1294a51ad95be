"""The compile-ahead child (``python -m tensorplug_cpu.kernels.ahead_child``): the kernels
its parent hands it (:mod:`.ahead`) compiled into numba's disk cache, in order, each
said done on stdout as it is."""

from __future__ import annotations

import pickle
import sys

from ._numba_cache import use_instruction_forms
from .ahead import cached, compile_kernel, compile_target
from .kernel_refs import resolve

__all__ = ["main"]


def main() -> None:
    """Compile each job of the pickled ``(instruction forms, jobs)`` on stdin into
    numba's disk cache, saying which is done (its index, a line)."""
    forms, jobs = pickle.loads(sys.stdin.buffer.read())
    use_instruction_forms(forms)
    listening = True
    for i, job in enumerate(jobs):
        kernel = compile_target(resolve, job.origin)
        if not cached(kernel, job.signature):  # else the parent took it back (done)
            compile_kernel(kernel, job.signature)
        if listening:
            try:
                print(i, flush=True)
            except OSError:  # the parent has ended: finish the cache for its next run
                listening = False


if __name__ == "__main__":
    main()

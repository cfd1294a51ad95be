"""What numba has compiled of the kernels: asked, readied and noted, on whichever path
is on.

The binder, the kernel references and the compile-ahead process ask the same few
things of a kernel: is it in numba's disk cache (loading it is then milliseconds,
compiling it seconds), make it ready for these arguments without calling it, note that
numba now has it. On numba's public path the answers are numba's ``compile`` and the
plugin's own notes (:mod:`.compiled_ledger`); where the fast launch is on
(:mod:`.numba_internals`), its kept machine code and numba's cache index, an error
there shutting it for the process (the public answer then).
"""

from __future__ import annotations

from typing import Any

from . import compiled_ledger, numba_internals
from .cache_folder import guarded
from .numba_internals import numba_private

__all__ = ["compile_job", "guarded", "is_cached", "job_cached", "job_ready", "keep_overload",
           "load_kept", "note_compiled", "ready_overload"]  # fmt: skip


def _internal(function: Any) -> bool:
    """Whether ``function`` caches through the fast launch's cache (and it is still on)."""
    if not numba_internals.enabled():
        return False
    if getattr(function, "tensorplug_job", False):  # a JobFunction: its numba function
        function = function.internal_function()
    return numba_private.uses_kernel_cache(function)


def is_cached(dispatcher: Any, sig: tuple[Any, ...]) -> bool:
    """Whether numba's disk cache holds ``dispatcher`` compiled for ``sig`` (numba
    types), without loading it."""
    if _internal(dispatcher):
        return bool(numba_internals.attempt("reading numba's cache index",
                                            numba_private.is_cached, dispatcher, sig))  # fmt: skip
    return compiled_ledger.holds(dispatcher, sig)


def job_cached(job: Any) -> bool:
    """Whether numba's disk cache holds the job ``job`` (:func:`.job_function.job_function`),
    without loading it."""
    if _internal(job):
        return bool(
            numba_internals.attempt(
                "reading numba's cache index", numba_private.job_cached, job.internal_function()
            )
        )
    return compiled_ledger.holds(job, ())


def note_compiled(function: Any, sig: tuple[Any, ...]) -> None:
    """``function`` (a dispatcher; a job with ``sig`` ``()``) is compiled or loaded for
    ``sig`` and in numba's cache: noted for :func:`is_cached` on the public path."""
    if not _internal(function):
        compiled_ledger.note(function, sig)


def load_kept(kernel: Any, args: tuple[Any, ...]) -> bool:
    """Make ``kernel(*args)`` run the machine code the fast launch kept for these
    arguments' types; False where it has none (numba's call loads or compiles it)."""
    if not _internal(kernel):
        return False
    from .numba_internals.kept_kernels import load_kept as load

    return bool(numba_internals.attempt("loading kept code", load, kernel, args))


def ready_overload(kernel: Any, args: tuple[Any, ...]) -> None:
    """Make ``kernel(*args)`` ready to run without calling it: its kept code loaded, or
    numba's load (or compile) of it, kept or noted then."""
    if not load_kept(kernel, args):
        sig = tuple(kernel.typeof_pyval(a) for a in args)
        guarded(kernel.compile, sig)
        keep_overload(kernel, args)


def keep_overload(kernel: Any, args: tuple[Any, ...]) -> None:
    """After numba has run (or readied) ``kernel(*args)``: its code kept for later
    launches by the fast launch, or noted as cached on the public path."""
    if _internal(kernel):
        from .numba_internals.kept_kernels import keep_overload as keep

        numba_internals.attempt("keeping a kernel's code", keep, kernel, args)
        return
    typeof = getattr(kernel, "typeof_pyval", None)  # None: not numba's (a Python step)
    if typeof is not None:
        compiled_ledger.note(kernel, tuple(typeof(a) for a in args))


def job_ready(job: Any) -> bool:
    """Whether ``job`` can be called: compiled in this process, or now loaded (kept
    code, else numba's disk cache); False, compiling nothing, when neither has it."""
    if job.address is not None:  # numba's cfunc has no address until it is compiled
        return True
    if _internal(job):
        from .numba_internals.kept_kernels import job_ready as ready

        found = numba_internals.attempt("loading a kept job", ready, job)
        if found is not None:
            return bool(found)
    if not job_cached(job):
        return False
    compile_job(job)  # a load: the cache has it
    return True


def compile_job(job: Any) -> None:
    """``job.compile()``, numba's load or compile of a job, its code then kept (or noted)
    for later processes."""
    if _internal(job):
        from .numba_internals.kept_kernels import compile_job as compile_and_keep

        if numba_internals.attempt("keeping a job's code", compile_and_keep, job):
            return
    job.compile()
    note_compiled(job, ())

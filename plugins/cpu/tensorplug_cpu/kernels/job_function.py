"""A job of the spinning helpers: a Python function made a C function when asked.

The helpers (:mod:`.pool`) call a job by its address as ``void(int64, int64, int64)``.
numba's public ``cfunc`` compiles (or loads from its disk cache) the moment it
decorates, but a job is wanted by name long before it must run: the binder asks
whether numba's cache has it and, where it does not, leaves it to the compile-ahead
process (:mod:`.ahead`) while this one runs the step another way. So a
:class:`JobFunction` holds the function and makes numba's ``cfunc`` only at
:meth:`JobFunction.compile`; where the fast launch is on (:mod:`.numba_internals`) it is
made through its cache, and its address may come from kept machine code instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numba

from . import numba_internals
from ._numba_cache import CACHE_RULES
from .cache_folder import guarded, numba_cache_dir
from .numba_internals import numba_private

__all__ = ["JobFunction", "job_function"]

#: the C signature every job has
SIGNATURE = numba.types.void(numba.types.int64, numba.types.int64, numba.types.int64)


class JobFunction:
    """``py_func(job, lo, hi)`` as a C function, compiled (or loaded) by :meth:`compile`;
    ``name`` names its cache files (closures over different constants need different
    ones). Factories tag what they make with ``tensorplug_origin`` (how another process
    makes it again)."""

    #: what :func:`.kernel_identity.origin_of` knows a job by (without importing this)
    tensorplug_job = True

    def __init__(self, py_func: Callable[..., None], name: str, options: dict[str, Any]) -> None:
        py_func.__qualname__ = name
        self.py_func = py_func
        self.name = name
        self.options = dict(options)
        #: numba's C function, once made (the fast launch's, or numba's public one)
        self.numba_function: Any = None
        #: how another process makes it again, where a factory made it (else its module)
        self.tensorplug_origin: tuple[Any, ...] | None = None
        self._address: int | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"JobFunction({self.py_func.__module__}.{self.name})"

    @property
    def address(self) -> int | None:
        """The job's address, None until it is compiled or loaded."""
        return self._address

    def use_address(self, address: int) -> None:
        """Run the machine code at ``address`` (kept code, loaded) as this job."""
        with self._lock:
            self._address = int(address)

    def internal_function(self) -> Any:
        """The fast launch's C function, made (not compiled) on first need: through its
        cache, which can say what it holds before it compiles."""
        with self._lock:
            if self.numba_function is None:
                with numba_cache_dir(numba) as folder:
                    rules = CACHE_RULES if folder is not None else None
                    self.numba_function = numba_private.make_job(
                        self.py_func, SIGNATURE, self.options, rules
                    )
            return self.numba_function

    def compile(self) -> None:
        """numba's load (from its disk cache) or compile of the job; its address set."""
        with self._lock:
            if numba_internals.enabled():
                done = numba_internals.attempt("compiling a job", self._compile_fast)
                if done:
                    return
            self.numba_function = guarded(self._public_function)
            self._address = int(self.numba_function.address)

    def _public_function(self) -> Any:
        with numba_cache_dir(numba) as folder:
            decorate = numba.cfunc(SIGNATURE, cache=folder is not None, **self.options)
            return decorate(self.py_func)  # compiles now

    def _compile_fast(self) -> bool:
        function = self.internal_function()
        function.compile()
        self._address = int(function.address)
        return True


def job_function(fn: Callable[..., None], name: str, fastmath: Any = False) -> JobFunction:
    """``fn(job, lo, hi)`` (three ``int64``) as the C function ``void(int64, int64,
    int64)`` that the spinning helpers call by address (:mod:`.pool`), cached on disk as
    :func:`._numba_cache.kernel` caches. Not compiled yet (:class:`JobFunction`).
    ``name``: its cache files' name (closures over different constants need different
    ones). Its own ``fastmath`` and its float division as :func:`._numba_cache.kernel`'s
    (a C function cannot raise numba's ``ZeroDivisionError``)."""
    return JobFunction(fn, name, {"nopython": True, "fastmath": fastmath,
                                  "error_model": "numpy"})  # fmt: skip

"""Thread counts of a CPU backend, applied where they live: numba and the worker pool.

Thread counts are process-wide in numba and in the worker pool, while ggml sets them per
backend. Each backend therefore remembers the count it wants and :class:`ThreadControl`
re-applies it only when a different backend last changed it, so that alternating
backends get their own counts at no cost otherwise. BLAS is not given that count: it
runs on one thread while a backend computes a plan that calls it
(:meth:`ThreadControl.blas_single`), and the pool splits big products instead (see
:mod:`.workers`).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .workers import POOL

__all__ = ["NumbaThreads", "ThreadControl"]


class NumbaThreads(Protocol):
    """What :class:`ThreadControl` needs of the numba kernels (``JitKernels``): named as
    a protocol so that this module, which the kernels' IR reads for the CPU's features,
    does not import the kernels back."""

    def set_num_threads(self, n: int) -> None: ...


class ThreadControl:
    """Applies a backend's thread count to numba and the worker pool, and keeps BLAS on
    the computing thread while a backend computes."""

    _lock = threading.Lock()
    _applied: int | None = None
    _blas_libs: list[Any] | None = None  # threadpoolctl controllers of the BLAS numpy uses

    @classmethod
    def apply(cls, n_threads: int | None, jit: NumbaThreads | None) -> None:
        if n_threads is None or n_threads == cls._applied:
            return
        with cls._lock:
            POOL.set_threads(n_threads)
            if jit is not None:
                jit.set_num_threads(n_threads)
            cls._applied = n_threads

    @classmethod
    def blas_single(cls) -> AbstractContextManager[object]:
        """Within it, numpy's BLAS runs on one thread; after it, on as many as before
        (so the application's own numpy products keep their threads). It wraps every
        compute: threadpoolctl's ``limit`` re-reads every library's info there, a
        visible share of a generation step; this asks and sets each BLAS library's count
        directly, several times cheaper."""
        if cls._blas_libs is None:
            from threadpoolctl import ThreadpoolController

            # the BLAS libraries numpy loaded, found once
            cls._blas_libs = [lib for lib in ThreadpoolController().lib_controllers
                              if lib.user_api == "blas"]  # fmt: skip
        return _OneBlasThread(cls._blas_libs)


class _OneBlasThread:
    """:meth:`ThreadControl.blas_single`'s context: one per compute (a backend computing
    on another thread has its own)."""

    __slots__ = ("_before", "_libs")

    def __init__(self, libs: list[Any]) -> None:
        self._libs = libs
        self._before: list[int] = []

    def __enter__(self) -> None:
        self._before = [lib.get_num_threads() for lib in self._libs]
        for lib, n in zip(self._libs, self._before, strict=True):
            if n != 1:
                lib.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        for lib, n in zip(self._libs, self._before, strict=True):
            if n != 1:
                lib.set_num_threads(n)

"""numba's disk cache of the CPU kernels, reached into: what the fast launch needs of it.

:class:`KernelCache` is numba's ``FunctionCache`` whose entries also depend on the
kernels' sources hash and the instruction forms at each lookup (a process may switch
forms to build another host's code), whose unreadable entries are discarded and compiled
again rather than raised, and whose machine code loads without its linking bitcode
(:mod:`.lazy_linking`), numba's registries (:mod:`.numba_runtime`) or the modules of its
environments (:mod:`.deferred_envs`). :func:`is_cached` and :func:`job_cached` read
numba's index to tell whether an entry is there without loading it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from numba.core.caching import FunctionCache

from ..kernel_identity import instruction_forms, sources_hash
from . import numba_runtime
from .deferred_envs import deferred_environments
from .kept_code import kept_in
from .lazy_linking import LazyLinkingRebuild

__all__ = ["KernelCache", "install", "is_cached", "job_cached", "make_job", "uses_kernel_cache"]

_log = logging.getLogger("tensorplug_cpu")
_warned: list[bool] = []  # a bad cache is said once per process, not once per kernel


class KernelCache(FunctionCache):  # type: ignore[misc]  # numba has no type hints
    """A function's cache whose entries also depend on :data:`SOURCES_HASH` and the
    instruction forms (:func:`instruction_forms`), whose
    unreadable entries are discarded (then compiled again) rather than raised, and whose
    machine code loads without its linking bitcode (:mod:`.lazy_linking`)."""

    _impl_class = LazyLinkingRebuild

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        return (*super()._index_key(sig, codegen), sources_hash(), instruction_forms())

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """numba's ``load_overload`` without its ``target_context.refresh()``: loading
        machine code needs numba's runtime only (:func:`.numba_runtime.ready`), not the
        registries that a compile reads (and refreshes itself), nor the numba modules
        whose code the kernel inlined (:mod:`.deferred_envs`)."""
        try:
            kept = kept_in()
            if kept is not None:  # where the kept kernels find the runtime library
                numba_runtime.ready(target_context, kept.folder)
            with self._guard_against_spurious_io_errors(), deferred_environments():
                return self._load_overload(sig, target_context)
        except Exception as e:  # any failure to read a cache entry: compile it instead
            self._discard(e)
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:  # numba reads the index again to add an entry to it
            super().save_overload(sig, data)
        except Exception as e:  # the kernel is compiled: it runs, uncached this time
            self._discard(e)

    def _discard(self, error: Exception) -> None:
        """Delete this function's index and data files (what cannot be read cannot be
        trusted either) and say so once."""
        folder = Path(self.cache_path)
        base = self._impl.filename_base
        for path in [folder / f"{base}.nbi", *folder.glob(f"{base}.*.nbc")]:
            path.unlink(missing_ok=True)
        if not _warned:
            _warned.append(True)
            _log.warning(
                "numba's kernel cache in %s had an unreadable entry (%s: %s); discarded, "
                "the kernels it held compile again (seconds, once)",
                folder, type(error).__name__, error,
            )  # fmt: skip


def install(function: Any, py_func: Any) -> None:
    """Make ``function`` (numba's dispatcher or cfunc of ``py_func``, made without a
    cache) cache through a :class:`KernelCache`."""
    function._cache = KernelCache(py_func)


def uses_kernel_cache(function: Any) -> bool:
    """Whether ``function`` caches through a :class:`KernelCache`."""
    return isinstance(getattr(function, "_cache", None), KernelCache)


def is_cached(dispatcher: Any, sig: tuple[Any, ...]) -> bool:
    """Whether numba's disk cache holds ``dispatcher`` compiled for ``sig`` (numba
    types), without loading it: its index has the entry."""
    cache = getattr(dispatcher, "_cache", None)
    if not isinstance(cache, FunctionCache):
        return False
    try:
        key = cache._index_key(sig, dispatcher.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # an unreadable index holds nothing usable
        return False


def make_job(py_func: Any, signature: Any, options: dict[str, Any], cached: bool) -> Any:
    """numba's C function of ``py_func`` for ``signature``, not compiled yet, caching
    through a :class:`KernelCache` where ``cached``."""
    from numba.core.ccallback import CFunc

    function = CFunc(py_func, (signature.args, signature.return_type), locals={},
                     options=options)  # fmt: skip
    if cached:
        install(function, py_func)
    return function


def job_cached(job: Any) -> bool:
    """Whether numba's disk cache holds the job ``job`` (a
    :class:`..job_function.JobFunction`), without loading it."""
    function = job.internal_function()
    cache = getattr(function, "_cache", None)
    if not isinstance(cache, KernelCache):
        return False
    try:
        codegen = function._targetdescr.target_context.codegen()
        return cache._index_key(function._sig, codegen) in cache._cache_file._load_index()
    except Exception:  # an unreadable index holds nothing usable
        return False

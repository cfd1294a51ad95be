"""numba's disk cache for the CPU kernels, keyed on every kernel source file.

numba keys a cached function by its own file's time stamp and bytecode only. Most of
these kernels inline code from other files (the LLVM IR of :mod:`._numba_introw`, the
f16 helpers of :mod:`._numba_ir`, :func:`._numba_rows.expf`, the repacked layouts of
:mod:`..repack`), so after an edit to one of those, or a ``git checkout`` of an older
one, the cached machine code of the kernels that inline it ran on: stale numbers, or a
crash (this happened while bisecting). :func:`kernel` is ``njit(cache=True)`` whose
index key also holds a hash of every ``_numba_*.py`` here, of ``repack.py`` and of
``dispatch.py`` (the weight rows each integer kernel takes at a time), so a change to
any of them recompiles all of them once (seconds). An installed wheel changes
nothing: its files' time stamps already did.

The hook is numba's ``FunctionCache._index_key``, what a cache entry depends on (a
numba without it would fail this import, and the backend would use its numpy kernels,
saying why in ``get_features``).

A cache file that cannot be read (a disk that filled up, a copy cut short, a file of
zeros) made numba raise ``UnpicklingError`` from every later run's first call of that
kernel, and only deleting the cache by hand helped. :class:`KernelCache` discards such
a kernel's entries instead, warns once per process, and numba compiles it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numba import njit
from numba.core.caching import FunctionCache

from . import _numba_ir as _ir
from . import numba_runtime
from .deferred_envs import deferred_environments
from .kernel_identity import FORM_FLAGS, instruction_forms, sources_hash
from .lazy_linking import LazyLinkingRebuild

__all__ = ["SOURCES_HASH", "KernelCache", "is_cached", "job_cached", "job_function", "kernel",
           "use_instruction_forms"]  # fmt: skip

#: sha256 of the kernels' sources (:func:`.kernel_identity.sources_hash`)
SOURCES_HASH = sources_hash()

_log = logging.getLogger("tensorplug_cpu")
_warned: list[bool] = []  # a bad cache is said once per process, not once per kernel


def use_instruction_forms(forms: tuple[bool, ...]) -> None:
    """Set the flags to ``forms`` (another process's :func:`instruction_forms`), before
    anything is compiled here: the compile-ahead process builds its parent's forms."""
    if len(forms) != len(FORM_FLAGS):
        raise ValueError(f"{len(forms)} instruction-form flags given, {FORM_FLAGS} expected")
    for name, value in zip(FORM_FLAGS, forms, strict=True):
        setattr(_ir, name, value)


class KernelCache(FunctionCache):  # type: ignore[misc]  # numba has no type hints
    """A function's cache whose entries also depend on :data:`SOURCES_HASH` and the
    instruction forms (:func:`instruction_forms`), whose
    unreadable entries are discarded (then compiled again) rather than raised, and whose
    machine code loads without its linking bitcode (:mod:`.lazy_linking`)."""

    _impl_class = LazyLinkingRebuild

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        return (*super()._index_key(sig, codegen), SOURCES_HASH, instruction_forms())

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """numba's ``load_overload`` without its ``target_context.refresh()``: loading
        machine code needs numba's runtime only (:func:`.numba_runtime.ready`), not the
        registries that a compile reads (and refreshes itself), nor the numba modules
        whose code the kernel inlined (:mod:`.deferred_envs`)."""
        try:
            numba_runtime.ready(target_context, Path(self.cache_path))
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


def kernel(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)``, cached under :data:`SOURCES_HASH` too.

    ``fastmath`` is ``False`` unless given: numba compiles a callee that sets none with
    its caller's flags (and keeps that version for direct calls as well), and the
    activation quantizer, called from the fast-math mat×vec kernels, rounded its scales
    differently from ggml that way. A kernel's rounding is its own decision.

    ``nogil`` is ``True`` unless given: a kernel touches no Python object, and one that
    held the GIL (numba's parallel kernels do unless told) stalled every other Python
    thread of the process while it ran. A server's threads then waited out each step
    of the model (its HTTP handlers, the streaming of tokens already sampled: a token
    reached its client a step or two late), and the step in turn waited for the GIL
    back each time they had taken it.

    ``error_model`` is ``"numpy"`` unless given: float division as IEEE and ggml's C
    divide, where numba's default (Python's) checks each divisor for zero and raises
    ZeroDivisionError. A model file's values made those zeros (rms_norm's eps 0 over a
    row of zeros, a rope frequency factor of 0, Q8_K's scale of an infinite activation)
    and a request failed where llama.cpp computes NaN; the checks also kept the gated
    activations' loop from vectorizing. Integer divisors here are shapes and constants
    that a graph's ops have checked. A job (:func:`job_function`) cannot raise at all."""
    options.setdefault("fastmath", False)
    options.setdefault("nogil", True)
    options.setdefault("error_model", "numpy")

    def compile_later(fn: Callable[..., Any]) -> Any:
        # cache=True would make numba's own cache for it first (~0.1 ms of the launch a
        # kernel, ~100 of them defined at import), only for this one to replace it
        dispatcher = njit(**options)(fn)
        dispatcher._cache = KernelCache(dispatcher.py_func)
        return dispatcher

    return compile_later


def job_function(fn: Callable[..., None], name: str, fastmath: Any = False) -> Any:
    """``fn(job, lo, hi)`` (three ``int64``) as the C function ``void(int64, int64,
    int64)`` that the spinning helpers call by address (:mod:`.pool`; a numba
    ``cfunc``, whose ``address`` it is once compiled), cached on disk as :func:`kernel`
    caches. Not compiled yet: :func:`.kept_kernels.job_ready` loads it, or its
    ``compile()`` compiles it. ``name``: its cache files' name (closures over different
    constants need different ones). Its own ``fastmath`` and its float division as
    :func:`kernel`'s (a C function cannot raise numba's ``ZeroDivisionError``)."""
    from numba import types
    from numba.core.ccallback import CFunc

    fn.__qualname__ = name
    job = CFunc(fn, ((types.int64, types.int64, types.int64), types.void), locals={},
                options={"nopython": True, "fastmath": fastmath,
                         "error_model": "numpy"})  # fmt: skip
    job._cache = KernelCache(fn)  # type: ignore[attr-defined]  # as kernel() sets numba's
    return job


def job_cached(job: Any) -> bool:
    """Whether numba's disk cache holds the :func:`job_function` ``job``, without
    loading it."""
    try:
        key = job._cache._index_key(job._sig, job._targetdescr.target_context.codegen())
        return key in job._cache._cache_file._load_index()
    except Exception:  # an unreadable index holds nothing usable
        return False

"""How the CPU kernels are made numba functions (:func:`kernel`; the spinning helpers'
jobs: :func:`.job_function.job_function`), cached on disk in the plugin's folder
(:mod:`.cache_folder`).

Through numba's public API (``njit(cache=True)``, ``cfunc(cache=True)``) by default;
where the fast launch is on (:mod:`.numba_internals`), each kernel's cache is its
:func:`~.numba_internals.numba_private.kernel_cache_class`, beside which the launch keeps
machine code, and which can say what it holds without loading it (:mod:`.compiled`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
from numba import njit

from . import _numba_ir as _ir
from . import numba_internals
from .cache_folder import numba_cache_dir
from .kernel_identity import FORM_FLAGS, instruction_forms, sources_hash
from .numba_internals import numba_private
from .numba_internals.runtime_library import ready_beside_kernels

__all__ = ["CACHE_RULES", "SOURCES_HASH", "kernel", "use_instruction_forms"]

#: sha256 of the kernels' sources (:func:`.kernel_identity.sources_hash`)
SOURCES_HASH = sources_hash()
#: the fast launch's rules for numba's cache of every kernel and job: entries keyed by
#: the sources and the instruction forms too, numba's runtime readied from the library
#: kept beside the kernels
CACHE_RULES = numba_private.CacheRules(
    key=lambda: (sources_hash(), instruction_forms()), ready_runtime=ready_beside_kernels
)


def use_instruction_forms(forms: tuple[bool, ...]) -> None:
    """Set the flags to ``forms`` (another process's :func:`instruction_forms`), before
    anything is compiled here: the compile-ahead process builds its parent's forms."""
    if len(forms) != len(FORM_FLAGS):
        raise ValueError(f"{len(forms)} instruction-form flags given, {FORM_FLAGS} expected")
    for name, value in zip(FORM_FLAGS, forms, strict=True):
        setattr(_ir, name, value)


def kernel(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)``, cached in the plugin's folder
    (:mod:`.cache_folder`; numba's cache reached into by the fast launch where it is on,
    :mod:`.numba_internals.numba_private`).

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

    def decorate(fn: Callable[..., Any]) -> Any:
        with numba_cache_dir(numba) as folder:
            if folder is not None and numba_internals.enabled():
                dispatcher = njit(**options)(fn)
                if numba_internals.attempt("caching a kernel", _with_kernel_cache, dispatcher, fn):
                    return dispatcher
            return njit(cache=folder is not None, **options)(fn)

    return decorate


def _with_kernel_cache(function: Any, fn: Callable[..., Any]) -> bool:
    numba_private.install_kernel_cache(function, fn, CACHE_RULES)
    return True

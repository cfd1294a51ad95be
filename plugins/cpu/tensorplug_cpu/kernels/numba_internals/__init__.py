"""The fast launch: the one place the CPU plugin uses numba's and llvmlite's private names.

Everything the kernels need works through numba's public API (``njit(cache=True)``,
``cfunc``, ``numba.config``, ``set_num_threads``, ``prange`` on the threading layer numba
starts). What that leaves slow is a launch: ``import numba``, numba's unpickling and
typing of each cached kernel, its runtime library built from IR in every process, and
LLVM's code left resident. The modules of this package take those out of a launch by
reaching into numba: kernels' machine code kept beside numba's cache and loaded into an
LLVM JIT of the plugin's own (:mod:`.kept_code`, :mod:`.kept_kernels`), numba's runtime
readied without its registries and its library kept (:mod:`.runtime_library`), cached
code loaded without its bitcode or its environments' modules, the threading layer
started without numba (:mod:`.threads`), LLVM's pages given back (:mod:`.llvm_pages`).

None of that is numba's promise, so it runs only where it was tested: numba and
llvmlite at a pair of versions in :data:`ALLOWED_VERSIONS` (the tests check that the
installed pair is listed, or that this gate is shut), on Linux (ELF objects), with
``TENSORPLUG_CPU_NUMBA_INTERNALS`` on and numba's JIT not disabled. Elsewhere
:func:`enabled` is False and the plugin takes the public path, with one warning where
the reason is an untested version. Anything unexpected inside (:func:`attempt`) shuts
the gate for the rest of the process, with one warning, and the public path takes over:
never a crash. Kept files are read only from folders only the user can write
(:mod:`tensorplug.kept`).

Every private numba or llvmlite name these modules need is in one module,
:mod:`.numba_private`, and no other module of the plugin names one (a test reads the
plugin's sources); the modules here are used only once :func:`enabled` said yes.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from tensorplug import installed

from ...settings import NUMBA_INTERNALS

__all__ = ["ALLOWED_VERSIONS", "attempt", "enabled", "give_up", "installed_versions", "why_off"]

_log = logging.getLogger("tensorplug_cpu")

#: The (numba, llvmlite) versions the fast launch was tested with: exactly these, since
#: the private names it uses may change in any release.
ALLOWED_VERSIONS: frozenset[tuple[str, str]] = frozenset({("0.68.1", "0.50.0")})

T = TypeVar("T")

_lock = threading.Lock()
#: why the gate shut during this process (an error inside), once it has
_given_up: list[str] = []
_warned: set[str] = set()


@functools.cache
def installed_versions() -> tuple[str | None, str | None]:
    """numba's and llvmlite's installed versions, read without importing them (once a
    process: the gate is asked at every kernel's decoration)."""
    return installed.version("numba"), installed.version("llvmlite")


def numba_jit_disabled() -> bool:
    """Whether numba's JIT is disabled (``NUMBA_DISABLE_JIT``): its kernels then run as
    Python, and no machine code kept by another run may stand in for them."""
    return os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")


def why_off() -> str | None:
    """Why the fast launch is off in this process, or None where it is on."""
    if not NUMBA_INTERNALS.get():  # a value it cannot read raises SettingError
        return f"{NUMBA_INTERNALS.env}=0"
    if numba_jit_disabled():
        return "NUMBA_DISABLE_JIT is set"
    if not sys.platform.startswith("linux"):
        return f"kept machine code is read on Linux only, not {sys.platform}"
    with _lock:
        if _given_up:
            return _given_up[0]
    versions = installed_versions()
    if versions not in ALLOWED_VERSIONS:
        return (f"numba {versions[0]} with llvmlite {versions[1]} is not a pair it was "
                f"tested with ({_listed()})")  # fmt: skip
    return None


def enabled() -> bool:
    """Whether the fast launch may run: see the module. An untested numba or llvmlite is
    said once a process (the public path runs, with a slower launch)."""
    why = why_off()
    if why is None:
        return True
    if why.startswith("numba "):
        _warn_once(why, f"the CPU kernels load through numba's public API: {why}; a launch "
                   "is slower, results are the same")  # fmt: skip
    return False


def attempt(what: str, action: Callable[..., T], *args: object) -> T | None:
    """``action(*args)`` where the fast launch is :func:`enabled`, else None; an
    exception inside shuts the gate (:func:`give_up`) and is None too, so the caller
    takes the public path."""
    if not enabled():
        return None
    try:
        return action(*args)
    except Exception as e:  # numba's internals are not its promise: any failure is a miss
        give_up(what, e)
        return None


def give_up(what: str, error: BaseException) -> None:
    """Shut the fast launch for the rest of this process after ``error`` while ``what``,
    saying so once; what it loaded already goes on running."""
    why = f"{what} failed ({type(error).__name__}: {error})"
    with _lock:
        if not _given_up:
            _given_up.append(why)
    _warn_once("given up", f"the CPU plugin's fast launch is off for this process: {why}; "
               "the kernels load through numba's public API")  # fmt: skip


def _warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    _log.warning("%s", message)


def _listed() -> str:
    return ", ".join(f"numba {n} with llvmlite {v}" for n, v in sorted(ALLOWED_VERSIONS))

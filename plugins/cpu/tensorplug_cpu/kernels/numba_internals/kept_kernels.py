"""numba's side of kept code (:mod:`.kept_code`): which kernel is which, keeping the
machine code of what numba ran, and handing what was kept to numba's dispatchers.

A kernel (:func:`.._numba_cache.kernel`) or job (:func:`..job_function.job_function`) is
kept under its identity (:func:`.kernel_identity.identity`: where it is defined, the
sources, the instruction forms and the target, all known without numba). Its machine
code is what numba loaded (:func:`.numba_private.code_library_object`) or compiled with object
caching on, as every kernel here is. A kernel loaded from kept
code goes into numba's dispatch table for the types of its arguments, as numba's
``add_overload`` puts a compiled one (numba's ``overloads`` do not list it: numba did
not compile or load it); a job gets its address.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from ..arg_types import arg_key
from ..cache_folder import kept_code_folder
from ..kernel_identity import identity, origin_of, salt
from . import numba_private
from .kept_code import CALLABLE, JOB, Entry, KeptCode
from .runtime_library import runtime_code, stored_code

__all__ = ["compile_job", "job_ready", "keep_overload", "kept_in", "kept_loads", "load_kept",
           "loaded_count", "ready_overload", "runtime_code_of"]  # fmt: skip


def job_ready(job: Any) -> bool:
    """Whether ``job`` (a :class:`..job_function.JobFunction`) can be called: compiled in
    this process, or now loaded (its kept code, :mod:`.kept_code`, else numba's disk
    cache: milliseconds); False, compiling nothing, when neither has it."""
    if job.address is not None:
        return True
    if _load_kept_job(job):
        return True
    if not numba_private.job_cached(job.internal_function()):
        return False
    compile_job(job)  # a load: the cache has it
    return True


def compile_job(job: Any) -> bool:
    """numba's load or compile of ``job``, its code then kept for later processes
    (:mod:`.kept_code`); True."""
    function = job.internal_function()
    function.compile()
    job.use_address(function.address)
    kept = _kept(function)
    if kept is None:
        return True
    symbol, code = numba_private.job_symbol(function)
    name = _identity(job)
    if code is not None and name is not None:
        kept.keep(name, _JOB_KEY, Entry(JOB, symbol, job.py_func.__module__, job.name, code))
    return True


def _load_kept_job(job: Any) -> bool:
    kept = _kept(job.internal_function())
    name = None if kept is None else _identity(job)
    if kept is None or name is None:
        return False
    address = kept.load(name, _JOB_KEY)
    if address is None:
        return False
    job.use_address(address)
    return True


#: a job's :func:`.kept_code.arg_key`: its C signature is always the same
_JOB_KEY = ("job",)
#: where a kernel's identity (:func:`_identity`) is noted on it once computed, and the
#: argument keys whose kept code its dispatch table was given (:func:`load_kept`)
_IDENTITY, _GIVEN = "tensorplug_kept_identity", "tensorplug_kept_keys"


def kept_loads() -> int:
    """How many kernels and jobs this process has loaded from kept code (numba's
    dispatchers do not count them among their overloads)."""
    return loaded_count()


def _kept(function: Any) -> KeptCode | None:
    """The kept kernels beside the cache files of ``function`` (numba's dispatcher or C
    function): None where it does not cache through the fast launch's cache, which
    alone keeps code."""
    if not numba_private.uses_kernel_cache(function):
        return None
    return kept_in()


def _identity(function: Any) -> str | None:
    """What tells ``function`` (a dispatcher or job) apart from every other kernel
    (:func:`.kernel_identity.identity` of its origin), noted on it once computed; None
    where it has no origin (nothing kept)."""
    known = getattr(function, _IDENTITY, None)
    if known is None:
        origin = origin_of(function)
        known = "" if origin is None else identity(origin) or ""
        setattr(function, _IDENTITY, known)
    return str(known) or None


def load_kept(kernel: Any, args: tuple[Any, ...]) -> bool:
    """Make ``kernel(*args)`` (a :func:`kernel` dispatcher) run its kept code
    (:mod:`.kept_code`), loaded now (or already), without numba loading it from its
    cache; False where none is kept for these arguments (numba's call loads or compiles
    it)."""
    kept = _kept(kernel)
    key = arg_key(args) if kept is not None else None
    if kept is None or key is None:
        return False
    given = getattr(kernel, _GIVEN, None)
    if given is not None and key in given:
        return True
    name = _identity(kernel)
    function = None if name is None else kept.load(name, key)
    if function is None:
        return False
    numba_private.add_to_dispatch_table(kernel, args, function)
    setattr(kernel, _GIVEN, (given or frozenset()) | {key})
    return True


def ready_overload(kernel: Any, args: tuple[Any, ...]) -> None:
    """Make ``kernel(*args)`` ready to run without calling it: its kept code loaded, or
    numba's load (or compile) of it, kept then."""
    if not load_kept(kernel, args):
        kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
        keep_overload(kernel, args)


def keep_overload(kernel: Any, args: tuple[Any, ...]) -> None:
    """After numba has run ``kernel(*args)``: keep the code it ran for later processes
    (:mod:`.kept_code`), where it has its machine code and no environment constants."""
    kept = _kept(kernel)
    key = arg_key(args) if kept is not None else None
    name = None if kept is None else _identity(kernel)
    if kept is None or key is None or name is None:
        return
    found = numba_private.cached_overload(kernel, args)
    if found is not None:
        symbol, function_name, code = found
        kept.keep(name, key, Entry(CALLABLE, symbol, kernel.py_func.__module__, function_name,
                                   code))  # fmt: skip


def runtime_code_of(folder: Path) -> bytes | None:
    """The runtime library's machine code for kept kernels of ``folder``: as kept there,
    else numba's, where numba is imported (it compiles or loads it, and keeps it here)."""
    found = stored_code(folder)
    if found is None and sys.modules.get("numba") is not None:
        found = runtime_code(numba_private.cpu_target_context(), folder)
    return found


_folders_lock = threading.Lock()
_by_folder: dict[str, KeptCode] = {}


def kept_in() -> KeptCode | None:
    """The one :class:`KeptCode` of this process (salted with
    :func:`.kernel_identity.salt`, its runtime library :func:`runtime_code_of`),
    in the ``kept`` folder of the kernels' cache (:func:`.cache_folder.kernel_folder`);
    None where there is no safe one. Whoever asks, numba's side or a launch without
    numba, an entry is loaded once, and never where this process kept it."""
    path = kept_code_folder()
    if path is None:
        return None
    name = os.path.realpath(path)  # one folder, however it is spelled
    with _folders_lock:
        if name not in _by_folder:
            _by_folder[name] = KeptCode(path, salt(), lambda: runtime_code_of(path))
        return _by_folder[name]


def loaded_count() -> int:
    """How many kernels and jobs this process has loaded from kept code."""
    with _folders_lock:
        return sum(len(kept.loaded) for kept in _by_folder.values())

"""numba's side of kept code (:mod:`.kept_code`): which kernel is which, keeping the
machine code of what numba ran, and handing what was kept to numba's dispatchers.

A kernel (:func:`.._numba_cache.kernel`) or job (:func:`.._numba_cache.job_function`) is
kept under its identity (:func:`.kernel_identity.identity`: where it is defined, the
sources, the instruction forms and the target, all known without numba). Its machine
code is what numba loaded (:func:`.lazy_linking.object_code`) or compiled with object
caching on, as every kernel here is. A kernel loaded from kept
code goes into numba's dispatch table for the types of its arguments, as numba's
``add_overload`` puts a compiled one (numba's ``overloads`` do not list it: numba did
not compile or load it); a job gets its address.
"""

from __future__ import annotations

from typing import Any

from numba.core.compiler_lock import global_compiler_lock

from ..arg_types import arg_key
from ..kernel_identity import identity, origin_of
from .kept_code import CALLABLE, JOB, Entry, KeptCode, kept_in, loaded_count
from .kernel_cache import KernelCache, job_cached
from .lazy_linking import object_code

__all__ = ["compile_job", "job_ready", "keep_overload", "kept_loads", "load_kept",
           "ready_overload"]  # fmt: skip


def job_ready(job: Any) -> bool:
    """Whether ``job`` (a :class:`..job_function.JobFunction`) can be called: compiled in
    this process, or now loaded (its kept code, :mod:`.kept_code`, else numba's disk
    cache: milliseconds); False, compiling nothing, when neither has it."""
    if job.address is not None:
        return True
    if _load_kept_job(job):
        return True
    if not job_cached(job):
        return False
    compile_job(job)  # a load: the cache has it
    return True


def compile_job(job: Any) -> bool:
    """numba's load or compile of ``job``, its code then kept for later processes
    (:mod:`.kept_code`); True."""
    function = job.internal_function()
    function.compile()
    job.use_address(function.address)
    kept = _kept(getattr(function, "_cache", None))
    code = None if kept is None else object_code(function._library)
    name = _identity(job)
    if kept is not None and code is not None and name is not None:
        entry = Entry(JOB, function._wrapper_name, job.py_func.__module__, job.name, code)
        kept.keep(name, _JOB_KEY, entry)
    return True


def _load_kept_job(job: Any) -> bool:
    kept = _kept(getattr(job.internal_function(), "_cache", None))
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


def _kept(cache: Any) -> KeptCode | None:
    """The kept kernels beside ``cache``'s files (a :class:`KernelCache`; None for any
    other cache, which keeps nothing)."""
    if not isinstance(cache, KernelCache):
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
    kept = _kept(getattr(kernel, "_cache", None))
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
    # numba's dispatch table, as its add_overload fills it (the types' codes), under the
    # lock numba fills it under
    with global_compiler_lock:
        kernel._insert([kernel.typeof_pyval(a)._code for a in args], function, False)
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
    kept = _kept(getattr(kernel, "_cache", None))
    key = arg_key(args) if kept is not None else None
    name = None if kept is None else _identity(kernel)
    if kept is None or key is None or name is None:
        return
    result = kernel.overloads.get(tuple(kernel.typeof_pyval(a) for a in args))
    code = None if result is None else object_code(result.library)
    if code is None or result.environment is None or len(result.environment.consts):
        return
    fndesc = result.fndesc
    entry = Entry(CALLABLE, fndesc.llvm_cpython_wrapper_name, kernel.py_func.__module__,
                  fndesc.qualname.split(".")[-1], code)  # fmt: skip
    kept.keep(name, key, entry)

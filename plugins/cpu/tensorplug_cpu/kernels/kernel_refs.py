"""The compiled kernels and jobs by where they are defined: callable before numba is
imported, from the machine code kept for them (:mod:`.kept_code`).

The kernels are numba dispatchers, made when their module (``_numba_*.py``) is imported,
and that import is numba's: a large share of a small model's launch, where llama.cpp
reaches its first token sooner (docs/performance.md has the figures). A :class:`KernelRef`
names a kernel by its origin (:func:`.kernel_identity.origin_of`) and runs the code
kept for the types of its arguments, loaded with llvmlite and numba's C runtime alone;
asked for anything else (a call with types nothing was kept for, numba's attributes),
it imports numba (:func:`.numba_import.numba_module`) and the kernel's module, and hands
over to numba's dispatcher, to which it gives the code it loaded as it is called again.
A :class:`JobRef` does the same for a job of the spinning helpers, whose address is
what a step needs. There is one ref per origin (:func:`kernel_ref`, :func:`job_ref`), so
a ref is the kernel's identity in sets and dicts, as the dispatcher was.

A call through a ref whose numba dispatcher is not there costs the argument types'
key (:func:`.kept_code.arg_key`, a few microseconds) on top of the kernel; a step bound to fixed
arguments pays it once (:meth:`KernelRef.for_types`, :class:`.jit.KernelCall`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from . import numba_import, numba_internals
from .arg_types import arg_key
from .kernel_identity import identity, origin_of

__all__ = ["JobRef", "KernelRef", "job_ref", "kept_code_ready", "kernel_ref", "made_job",
           "made_kernel", "module_kernel", "resolve"]  # fmt: skip

#: a job's kept code has one key: its C signature is always the same
_JOB_KEY = ("job",)


def resolve(origin: tuple[Any, ...]) -> Any:
    """The numba dispatcher (or job function) that ``origin`` describes, its module
    imported (and numba with it)."""
    numba_import.numba_module()
    kind = origin[0]
    if kind == "module":
        return getattr(importlib.import_module(origin[1]), origin[2])
    if kind in ("made", "made_job"):
        return getattr(importlib.import_module(origin[1]), origin[2])(*origin[3:])
    if kind == "job":
        module = importlib.import_module(origin[1])
        for value in vars(module).values():
            if origin_of(value) == origin:
                return value
    raise ValueError(f"unknown kernel origin {origin!r}")


def kept_code_ready() -> bool:
    """Whether a launch may leave numba unimported until a kernel needs it: the fast
    launch is on and numba has run in this cache folder before with this numba,
    llvmlite, Python, these sources and this target (its runtime library is kept there:
    :mod:`.numba_internals.runtime_library`)."""
    return bool(numba_internals.attempt("finding kept code", _kept_code_ready))


def _kept_code_ready() -> bool:
    from .numba_internals.kept_kernels import kept_in
    from .numba_internals.runtime_library import runtime_file

    kept = kept_in()
    return kept is not None and runtime_file(kept.folder).is_file()


class _Kept:
    """Where one origin's kept code is (the process's kept code and the origin's
    identity), found once; ``kept`` is None where the fast launch is off."""

    def __init__(self, origin: tuple[Any, ...]) -> None:
        self.kept: Any = None
        self.identity: str | None = None
        if numba_internals.enabled():
            from .numba_internals.kept_kernels import kept_in

            self.identity = identity(origin)
            self.kept = numba_internals.attempt("finding kept code", kept_in)

    def load(self, key: tuple[Any, ...]) -> Any:
        if self.kept is None or self.identity is None:
            return None
        return numba_internals.attempt("loading kept code", self.kept.load, self.identity, key)

    def exists(self, key: tuple[Any, ...]) -> bool:
        if self.kept is None or self.identity is None:
            return False
        return bool(self.kept.path(self.identity, key).is_file())


class KernelRef:
    """A kernel by its origin: its kept code for the argument types loaded so far, and
    numba's dispatcher once anything else was asked of it. Every attribute it lacks is
    the dispatcher's (``overloads``, ``py_func``, ``typeof_pyval``...: numba imported)."""

    def __init__(self, origin: tuple[Any, ...]) -> None:
        #: the origin, under the name the compile-ahead process reads it by
        self.tensorplug_origin = tuple(origin)
        self._loaded: dict[tuple[Any, ...], Any] = {}
        self._made: Any = None  # the numba dispatcher, once made
        self._where: _Kept | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"KernelRef{self.tensorplug_origin!r}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dispatcher = self._made
        if dispatcher is not None and not self._loaded:
            return dispatcher(*args, **kwargs)
        if not kwargs:
            function = self._function(args)
            if function is not None:
                return function(*args)
        return self.dispatcher()(*args, **kwargs)

    def _function(self, args: tuple[Any, ...]) -> Any:
        """The kept code for ``args``'s types, loaded now if need be (None: none is
        kept); with numba's dispatcher there, it is given the code as well."""
        key = arg_key(args)
        if key is None:
            return None
        function = self._loaded.get(key)
        if function is None and self._made is None:
            function = self._load(key)
        if function is not None and self._made is not None:
            self._give(args, key)
        return function

    def _load(self, key: tuple[Any, ...]) -> Any:
        with self._lock:
            if key not in self._loaded:
                function = self._kept().load(key)
                if function is None:
                    return None
                self._loaded[key] = function
            return self._loaded[key]

    def _kept(self) -> _Kept:
        if self._where is None:
            self._where = _Kept(self.tensorplug_origin)
        return self._where

    def _give(self, args: tuple[Any, ...], key: tuple[Any, ...]) -> None:
        """Give numba's dispatcher the code loaded here for ``args``'s types (its table
        then calls it, and calls here go straight to numba)."""
        from .compiled import load_kept

        load_kept(self._made, args)  # the same entry: loaded once, by the folder
        with self._lock:
            self._loaded.pop(key, None)

    def load_kept(self, args: tuple[Any, ...]) -> bool:
        """Make a call with ``args``'s types run kept code, loaded now (or already);
        False where none is kept for them."""
        if self._made is not None:
            from .compiled import load_kept

            return load_kept(self._made, args)
        key = arg_key(args)
        return key is not None and self._load(key) is not None

    def kept(self, args: tuple[Any, ...]) -> bool:
        """Whether code is kept for ``args``'s types (loaded or not: nothing is loaded)."""
        key = arg_key(args)
        if key is None:
            return False
        return key in self._loaded or self._kept().exists(key)

    def ready(self, args: tuple[Any, ...]) -> None:
        """Make a call with ``args``'s types ready without making it: its kept code
        loaded, or numba's load (or compile) of it, kept then."""
        if not self.load_kept(args):
            from .compiled import ready_overload

            ready_overload(self.dispatcher(), args)

    @property
    def resolved(self) -> bool:
        """Whether numba's dispatcher is here (numba imported for this kernel)."""
        return self._made is not None

    def dispatcher(self) -> Any:
        """numba's dispatcher of this kernel, numba and its module imported now if need
        be; the code loaded here so far goes to its table as it is called."""
        if self._made is None:
            dispatcher = resolve(self.tensorplug_origin)
            with self._lock:
                if self._made is None:
                    self._made = dispatcher
        return self._made

    def for_types(self, *args: Any) -> Callable[..., Any]:
        """What to call with arguments of the types of ``args``, and only those: the
        kept code for them, looked up (or loaded) now, else this kernel. A caller whose
        arguments' types never change saves the key a call through here computes (a step
        bound to fixed arguments: :class:`.jit.KernelCall`)."""
        if self._made is None:
            function = self._function(args)
            if function is not None:
                return function  # type: ignore[no-any-return]
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("tensorplug_origin", "_made", "_loaded",
                                             "_where", "_lock"):  # fmt: skip
            raise AttributeError(name)
        return getattr(self.dispatcher(), name)


class JobRef:
    """A job function of the spinning helpers by its origin: its address from kept code,
    or numba's job once anything else was asked of it (every attribute it lacks is the
    job's: numba imported)."""

    def __init__(self, origin: tuple[Any, ...]) -> None:
        self.tensorplug_origin = tuple(origin)
        self._address: int | None = None
        self._job: Any = None
        self._where: _Kept | None = None

    def __repr__(self) -> str:
        return f"JobRef{self.tensorplug_origin!r}"

    def load_kept(self) -> bool:
        """Whether the job can be called from its kept code (loaded now, or already)."""
        if self._address is None:
            if self._where is None:
                self._where = _Kept(self.tensorplug_origin)
            address = self._where.load(_JOB_KEY)
            if address is not None:
                self._address = int(address)
        return self._address is not None

    def ready(self) -> bool:
        """Whether the job can be called: its kept code loaded, else numba's
        (:func:`.kept_kernels.job_ready`: compiled here, or in numba's cache)."""
        if self.load_kept():
            return True
        from .compiled import job_ready

        return job_ready(self.job())

    @property
    def address(self) -> int:
        """The job's address (it must be :meth:`ready`)."""
        if self._address is not None or self.load_kept():
            assert self._address is not None
            return self._address
        return int(self.job().address)

    def job(self) -> Any:
        """numba's job function, numba and its module imported now if need be."""
        if self._job is None:
            self._job = resolve(self.tensorplug_origin)
        return self._job

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("tensorplug_origin", "_address", "_job",
                                             "_where"):  # fmt: skip
            raise AttributeError(name)
        return getattr(self.job(), name)


_refs_lock = threading.Lock()
_refs: dict[tuple[Any, ...], Any] = {}
_Ref = TypeVar("_Ref", KernelRef, JobRef)


def _the_one(origin: tuple[Any, ...], make: type[_Ref]) -> _Ref:
    with _refs_lock:
        ref = _refs.get(origin)
        if ref is None:
            ref = _refs[origin] = make(origin)
        if not isinstance(ref, make):
            raise TypeError(f"{origin!r} names a {type(ref).__name__}, not a {make.__name__}")
        return ref


def kernel_ref(origin: tuple[Any, ...]) -> KernelRef:
    """The one :class:`KernelRef` of ``origin`` in this process."""
    return _the_one(origin, KernelRef)


def job_ref(origin: tuple[Any, ...]) -> JobRef:
    """The one :class:`JobRef` of ``origin`` in this process."""
    return _the_one(origin, JobRef)


def module_kernel(module: str, name: str) -> KernelRef:
    """The kernel ``name`` of this package's kernel module ``module`` (``"_numba_rows"``)."""
    return kernel_ref(("module", f"{__package__}.{module}", name))


def made_kernel(module: str, factory: str, *args: Any) -> KernelRef:
    """The kernel that ``factory(*args)`` of this package's kernel module ``module``
    makes (``args``: plain values, part of the kernel's identity)."""
    return kernel_ref(("made", f"{__package__}.{module}", factory, *args))


def made_job(module: str, factory: str, *args: Any) -> JobRef:
    """The job function that ``factory(*args)`` of this package's kernel module
    ``module`` makes."""
    return job_ref(("made_job", f"{__package__}.{module}", factory, *args))

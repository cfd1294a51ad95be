"""Every private name of numba and llvmlite the plugin reaches for, in one module.

The other modules of :mod:`.numba_internals` decide what to keep, where, and when to
load it; whatever they need of numba beyond its public API they ask of this module, by
a name that says what it does. So the coupling to numba's internals is this file: when
a numba release moves something, this is what to read, and the versions it was read
against are the gate's :data:`~.ALLOWED_VERSIONS`.

numba's Python package is imported inside the functions that need it, never when this
module is: a launch whose kernels are all kept runs without it (:mod:`.kept_code`). The
subclasses of numba's classes are made on first use for the same reason
(:func:`kernel_cache_class`, :func:`lazy_linking_classes`).
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import functools
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from .elf_symbols import defined_symbols

__all__ = [
    "ENVIRONMENT_PREFIX", "EXTENSION_MODULES", "LAYER_CHOICES", "TBB_LIBRARY_NAMES",
    "THREADING_MODULES", "CacheRules",
    "add_to_dispatch_table", "cached_overload", "code_library_object", "compile_lock",
    "first_compile_noticed", "listen_for_compiles",
    "compile_runtime_library", "cpu_target_context", "deferred_environments",
    "hand_layer_to_numba", "initialize_runtime", "install_kernel_cache", "is_cached",
    "job_cached", "job_symbol", "kernel_cache_class", "lazy_linking_classes", "make_job",
    "make_kept_function", "new_environment", "register_c_helpers",
    "runtime_initialized", "set_environment", "start_threading_layer",
    "load_serialized_library", "uses_kernel_cache",
]  # fmt: skip

_log = logging.getLogger("tensorplug_cpu")

# ---- numba's C extension modules and the names its compiled code calls ----------------

#: numba's C extension modules the kept kernels need, by numba's names for them: its C
#: helpers, the compiled functions' Python type, its runtime (NRT)
EXTENSION_MODULES = {"helpers": "numba._helperlib", "functions": "numba._dynfunc",
                     "runtime": "numba.core.runtime._nrt_python"}  # fmt: skip
#: the extension module of each threading layer
THREADING_MODULES = {"tbb": "numba.np.ufunc.tbbpool", "omp": "numba.np.ufunc.omppool",
                     "workqueue": "numba.np.ufunc.workqueue"}  # fmt: skip
#: the layers numba tries, in its order, for each value of ``NUMBA_THREADING_LAYER``
#: other than a layer's name (Linux's and Windows' choices)
LAYER_CHOICES = {"safe": ("tbb",), "threadsafe": ("tbb", "omp"),
                 "forksafe": ("tbb", "workqueue")}  # fmt: skip
#: the TBB runtime file numba's TBB layer asks the loader for, per platform
TBB_LIBRARY_NAMES = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}
#: the prefix of the globals that hold a numba function's environment
ENVIRONMENT_PREFIX = "_ZN08NumbaEnv"
#: a threading layer's C functions numba's compiled code calls, by the names it calls them
_LAYER_SYMBOLS = {"numba_parallel_for": "parallel_for", **{n: n for n in (
    "do_scheduling_signed", "do_scheduling_unsigned", "allocate_sched", "deallocate_sched",
    "get_num_threads", "set_num_threads", "get_thread_id", "set_parallel_chunksize",
    "get_parallel_chunksize", "get_sched_size")}}  # fmt: skip


def register_c_helpers(helpers: ModuleType, functions: ModuleType, runtime: ModuleType) -> None:
    """Register with LLVM the symbols numba's compiled code calls its C helpers by, as
    numba's ``_load_global_helpers`` and its runtime's ``initialize`` register them
    (registering them again, as numba will when imported, changes nothing)."""
    import llvmlite.binding as ll

    ll.add_symbol("_Py_NoneStruct", id(None))
    for table in (helpers.c_helpers, functions.c_helpers):
        for name, address in table.items():
            ll.add_symbol("numba_" + name, address)
    for name, address in runtime.c_helpers.items():
        ll.add_symbol(name if name.startswith("_") else "NRT_" + name, address)
    for value in vars(builtins).values():
        if isinstance(value, type) and issubclass(value, BaseException):
            ll.add_symbol(f"PyExc_{value.__name__}", id(value))


def new_environment(functions: ModuleType, module_name: str) -> Any:
    """A compiled function's environment (``_dynfunc.Environment``) whose globals are
    the module's name alone."""
    return functions.Environment({"__name__": module_name})


def set_environment(address: int, environment: Any) -> None:
    """Point the environment global at ``address`` (a symbol starting
    :data:`ENVIRONMENT_PREFIX`) at ``environment``, as numba's loader does."""
    (ctypes.c_void_p * 1).from_address(address)[0] = id(environment)


def make_kept_function(functions: ModuleType, module: ModuleType, name: str, address: int,
                       environment: Any, keep_alive: tuple[Any, ...]) -> Any:  # fmt: skip
    """A Python callable of the CPython wrapper at ``address``, as numba makes one
    (``_dynfunc.make_function``)."""
    return functions.make_function(module, name, f"kept kernel {name}", address, environment,
                                   keep_alive)  # fmt: skip


# ---- the threading layer ---------------------------------------------------------------


def start_threading_layer(
    module: ModuleType, count: int
) -> tuple[Callable[[int], None], Callable[[], int]]:
    """Start the layer of extension ``module`` with ``count`` threads, as numba's
    ``_launch_threads`` does, its functions registered with LLVM under the names
    compiled code calls: the calling thread's thread-count setter and getter."""
    import llvmlite.binding as ll

    for symbol, name in _LAYER_SYMBOLS.items():
        ll.add_symbol(symbol, getattr(module, name))
    ctypes.CFUNCTYPE(None, ctypes.c_int)(module.launch_threads)(count)
    return layer_counts(module)


def layer_counts(module: ModuleType) -> tuple[Callable[[int], None], Callable[[], int]]:
    """The thread-count setter and getter of a started layer's extension ``module``."""
    set_count = ctypes.CFUNCTYPE(None, ctypes.c_int)(module.set_num_threads)
    get_count = ctypes.CFUNCTYPE(ctypes.c_int)(module.get_num_threads)
    return set_count, get_count


def hand_layer_to_numba(layer: str, module: ModuleType) -> None:
    """Make numba, imported since the layer ``layer`` (extension ``module``) was started
    without it, take that layer as the one it started: its ``parallel`` globals set as
    its ``_launch_threads`` sets them, so that it neither starts a second layer nor
    sees none."""
    from numba.np.ufunc import parallel

    with parallel._backend_init_thread_lock:
        if parallel._is_initialized:
            return
        set_count, get_count = layer_counts(module)
        n = int(get_count())
        parallel._load_threading_functions(module)  # its globals, as numba sets them
        set_count(n)  # (numba's loader reset this thread's count)
        parallel._threading_layer = layer  # type: ignore[assignment]
        parallel._is_initialized = True


# ---- locks and targets -----------------------------------------------------------------


def compile_lock() -> Any:
    """numba's compiler lock (reentrant), which its own loads and compiles hold."""
    from numba.core.compiler_lock import global_compiler_lock

    return global_compiler_lock


def cpu_target_context() -> Any:
    """numba's CPU target context."""
    from numba.core.registry import cpu_target

    return cpu_target.target_context


# ---- numba's compile events ------------------------------------------------------------


def listen_for_compiles(numba: ModuleType, note: Callable[[], None]) -> None:
    """Call ``note`` whenever ``numba`` (imported) begins a compile, for the rest of the
    process: a listener of its ``numba:compile`` event (``numba.core.event``)."""
    numba.core.event.register("numba:compile", _compile_listener(numba, note))


@contextlib.contextmanager
def first_compile_noticed(numba: ModuleType, start: Callable[[], None]) -> Iterator[None]:
    """Within the block, call ``start`` once when ``numba`` begins its first compile (a
    load from its disk cache raises no such event; nested compiles of a kernel's
    callees raise it again)."""
    started: list[bool] = []

    def once() -> None:
        if not started:
            started.append(True)
            start()

    with numba.core.event.install_listener("numba:compile", _compile_listener(numba, once)):
        yield


def _compile_listener(numba: ModuleType, note: Callable[[], None]) -> Any:
    """A numba event listener that calls ``note`` whenever a compile begins."""

    class Compile(numba.core.event.Listener):  # type: ignore[misc, name-defined]
        def on_start(self, event: Any) -> None:
            note()

        def on_end(self, event: Any) -> None:
            pass

    return Compile()


# ---- environments of numba modules not imported yet ------------------------------------

_NUMBAS_OWN = "numba."


def rebuild_environment(modname: Any, consts: Any, env_name: Any) -> Any:
    """numba's ``_rebuild_env``, except for a numba module not imported yet: its
    environment gets the module's name as its only global (what numba reads back to
    pickle it again) and its constants as they were. Nopython code reads an
    environment's constants, never its globals."""
    from numba.core import environment

    numbas = _original_rebuild[0] if _original_rebuild else environment._rebuild_env
    if (
        not isinstance(modname, str)
        or not modname.startswith(_NUMBAS_OWN)
        or (modname in sys.modules)
    ):
        return numbas(modname, consts, env_name)
    env = environment.lookup_environment(env_name)
    if env is not None:
        return env
    env = environment.Environment({"__name__": modname})
    env.consts[:] = consts
    env.env_name = env_name
    environment.Environment._memo[env_name] = env
    return env


#: numba's ``_rebuild_env``, once read, and how many loads are inside
#: :func:`deferred_environments` (nested loads swap it once)
_original_rebuild: list[Any] = []
_depth = [0]


@contextlib.contextmanager
def deferred_environments() -> Iterator[None]:
    """Cache entries read inside rebuild environments by :func:`rebuild_environment`
    (pickle finds ``_rebuild_env`` by name when it reads one): loading a kernel then
    imports none of the numba modules whose code it inlined (``numba.np.arrayobj``,
    ``numba.cpython.listobj``...). Held under numba's compiler lock, which numba's own
    loads and compiles take too (reentrant). Where numba has no ``_rebuild_env``,
    entries load numba's way."""
    from numba.core import environment

    with compile_lock():
        if not _original_rebuild:
            numbas = getattr(environment, "_rebuild_env", None)
            if numbas is None:
                yield
                return
            _original_rebuild.append(numbas)
        _depth[0] += 1
        environment._rebuild_env = rebuild_environment  # type: ignore[attr-defined]
        try:
            yield
        finally:
            _depth[0] -= 1
            if not _depth[0]:  # the outermost load puts numba's back
                environment._rebuild_env = _original_rebuild[0]  # type: ignore[attr-defined]


# ---- cached code loaded without its linking bitcode ------------------------------------


@functools.cache
def lazy_linking_classes() -> tuple[Any, Any]:
    """numba's code library and cache-result rebuild, subclassed so that a cached
    kernel's linking bitcode is parsed only when a compile links it: the library class
    and the rebuild class (see :func:`unserialize`)."""
    import llvmlite.binding as ll
    from numba.core.caching import CompileResultCacheImpl
    from numba.core.codegen import JITCodeLibrary

    class LazyLinkingLibrary(JITCodeLibrary):  # type: ignore[misc, valid-type]
        """A cached kernel's code library whose linking bitcode is parsed when first
        asked for (numba's ``_get_module_for_linking``: a compile that calls it)."""

        _lazy_bitcode: bytes | None = None
        #: the machine code loaded (numba's copy is handed to LLVM's loader and dropped)
        object_code: bytes | None = None

        def _get_module_for_linking(self) -> Any:
            if self._shared_module is None and self._lazy_bitcode is not None:
                self._shared_module = ll.parse_bitcode(self._lazy_bitcode)
                self._lazy_bitcode = None
                self._codegen._engine._load_defined_symbols(self._shared_module)
            return super()._get_module_for_linking()

    class LazyLinkingRebuild(CompileResultCacheImpl):  # type: ignore[misc, valid-type]
        """numba's rebuild of a cached compile result, its code library made by
        :func:`unserialize`."""

        def rebuild(self, target_context: Any, payload: Any) -> Any:
            codegen = target_context.codegen()
            # numba loads under this lock (reentrant): no other load sees the swap
            with compile_lock():
                codegen.unserialize_library = lambda state: unserialize(codegen, state)
                try:
                    return super().rebuild(target_context, payload)
                finally:
                    del codegen.unserialize_library

    return LazyLinkingLibrary, LazyLinkingRebuild


def unserialize(codegen: Any, state: Any) -> Any:
    """numba's ``JITCodeLibrary._unserialize`` of a cached ``"object"`` library, but
    with the names from the object's symbol table (they compare equal to what numba
    walks the bitcode for) and the bitcode kept unparsed; any other library numba's
    way."""
    from numba.core.codegen import JITCodeLibrary

    name, kind, data = state
    names = defined_symbols(data[0]) if kind == "object" else None
    if names is None or codegen._library_class is not JITCodeLibrary:
        return JITCodeLibrary._unserialize(codegen, state)
    code, bitcode = data
    library = codegen.create_library(name)
    library.__class__ = lazy_linking_classes()[0]  # adds only the lazy parse to numba's class
    library.enable_object_caching()
    library._set_compiled_object(code)
    library.object_code = code
    library._lazy_bitcode = bitcode
    library._finalize_final_module()  # the JIT takes the machine code (no compile)
    codegen._engine._defined_symbols |= names
    return library


def code_library_object(library: Any) -> bytes | None:
    """The machine code of a numba code library: what :func:`unserialize` loaded, or what
    numba compiled with object caching on (a cached kernel's); None where neither."""
    code = getattr(library, "object_code", None)
    if code is None and getattr(library, "_object_caching_enabled", False):
        code = getattr(library, "_compiled_object", None)
    return code if isinstance(code, bytes) else None


# ---- numba's disk cache of a kernel ----------------------------------------------------

_warned: list[bool] = []  # a bad cache is said once per process, not once per kernel


class CacheRules(NamedTuple):
    """What the plugin adds to numba's cache of a kernel: ``key()``, more of each
    entry's index key (the kernels' sources and the instruction forms at the lookup: a
    process may switch forms to build another host's code), and
    ``ready_runtime(context)``, numba's runtime readied before an entry loads."""

    key: Callable[[], tuple[Any, ...]]
    ready_runtime: Callable[[Any], None]


@functools.cache
def kernel_cache_class() -> Any:
    """numba's ``FunctionCache``, subclassed: its entries also depend on the kernels'
    sources hash and the instruction forms at each lookup (a process may switch forms
    to build another host's code), its unreadable entries are discarded and compiled
    again rather than raised, and its machine code loads without its linking bitcode,
    numba's registries or the modules of its environments (``rules``,
    :class:`CacheRules`): ``ready_runtime(context)``
    readies numba's runtime instead of numba's refresh of the registries, which only a
    compile reads (and refreshes itself)."""
    from numba.core.caching import FunctionCache

    class KernelCache(FunctionCache):  # type: ignore[misc, valid-type]
        _impl_class = lazy_linking_classes()[1]

        def __init__(self, py_func: Any, rules: CacheRules) -> None:
            super().__init__(py_func)
            self.rules = rules

        def _index_key(self, sig: Any, codegen: Any) -> Any:
            return (*super()._index_key(sig, codegen), *self.rules.key())

        def load_overload(self, sig: Any, target_context: Any) -> Any:
            try:
                self.rules.ready_runtime(target_context)
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
            """Delete this function's index and data files (what cannot be read cannot
            be trusted either) and say so once."""
            folder = Path(self.cache_path)
            base = self._impl.filename_base
            for path in [folder / f"{base}.nbi", *folder.glob(f"{base}.*.nbc")]:
                path.unlink(missing_ok=True)
            if not _warned:
                _warned.append(True)
                _log.warning(
                    "numba's kernel cache in %s had an unreadable entry (%s: %s); "
                    "discarded, the kernels it held compile again (seconds, once)",
                    folder, type(error).__name__, error,
                )  # fmt: skip

    return KernelCache


def install_kernel_cache(function: Any, py_func: Any, rules: CacheRules) -> None:
    """Make ``function`` (numba's dispatcher or cfunc of ``py_func``, made without a
    cache) cache through :func:`kernel_cache_class`."""
    function._cache = kernel_cache_class()(py_func, rules)


def uses_kernel_cache(function: Any) -> bool:
    """Whether ``function`` caches through :func:`kernel_cache_class`."""
    return isinstance(getattr(function, "_cache", None), kernel_cache_class())


def is_cached(dispatcher: Any, sig: tuple[Any, ...]) -> bool:
    """Whether numba's disk cache holds ``dispatcher`` compiled for ``sig`` (numba
    types), without loading it: its index has the entry."""
    from numba.core.caching import FunctionCache

    cache = getattr(dispatcher, "_cache", None)
    if not isinstance(cache, FunctionCache):
        return False
    try:
        key = cache._index_key(sig, dispatcher.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # an unreadable index holds nothing usable
        return False


def make_job(py_func: Any, signature: Any, options: dict[str, Any],
             rules: CacheRules | None) -> Any:  # fmt: skip
    """numba's C function of ``py_func`` for ``signature``, not compiled yet (numba's
    public ``cfunc`` compiles as it decorates), caching through
    :func:`kernel_cache_class` where ``rules`` are given."""
    from numba.core.ccallback import CFunc

    function = CFunc(py_func, (signature.args, signature.return_type), locals={},
                     options=options)  # fmt: skip
    if rules is not None:
        install_kernel_cache(function, py_func, rules)
    return function


def job_cached(function: Any) -> bool:
    """Whether numba's disk cache holds the C function ``function`` (:func:`make_job`),
    without loading it."""
    cache = getattr(function, "_cache", None)
    if not isinstance(cache, kernel_cache_class()):
        return False
    try:
        codegen = function._targetdescr.target_context.codegen()
        return cache._index_key(function._sig, codegen) in cache._cache_file._load_index()
    except Exception:  # an unreadable index holds nothing usable
        return False


def job_symbol(function: Any) -> tuple[str, bytes | None]:
    """A compiled C function's entry point and its machine code (None where numba
    kept none)."""
    return function._wrapper_name, code_library_object(function._library)


def cached_overload(kernel: Any, args: tuple[Any, ...]) -> tuple[str, str, bytes] | None:
    """What numba compiled or loaded of dispatcher ``kernel`` for ``args``: its CPython
    wrapper's symbol, the function's name and its machine code; None where it has not,
    has no machine code, or its environment holds constants (a kept copy could not
    rebuild them)."""
    result = kernel.overloads.get(tuple(kernel.typeof_pyval(a) for a in args))
    code = None if result is None else code_library_object(result.library)
    if code is None or result.environment is None or len(result.environment.consts):
        return None
    fndesc = result.fndesc
    return fndesc.llvm_cpython_wrapper_name, fndesc.qualname.split(".")[-1], code


def add_to_dispatch_table(kernel: Any, args: tuple[Any, ...], function: Any) -> None:
    """Put ``function`` in dispatcher ``kernel``'s table for the types of ``args``, as
    numba's ``add_overload`` puts a compiled one (its ``overloads`` do not list it),
    under the lock numba fills it under."""
    with compile_lock():
        kernel._insert([kernel.typeof_pyval(a)._code for a in args], function, False)


# ---- numba's runtime library -----------------------------------------------------------


def runtime_initialized() -> bool:
    """Whether numba's runtime (NRT) is initialized in this process."""
    from numba.core.runtime import rtsys

    return bool(getattr(rtsys, "_init", False))


def initialize_runtime(target_context: Any, build: Callable[[Any], Any]) -> None:
    """Initialize numba's runtime alone (not the registries that a compile reads and
    refreshes itself), its runtime library made by ``build(context)`` instead of
    numba's compile of it from IR."""
    from numba.core.runtime import nrtdynmod, rtsys

    with compile_lock():  # reentrant: rtsys.initialize takes it too
        compile_nrt_functions = nrtdynmod.compile_nrt_functions
        nrtdynmod.compile_nrt_functions = build
        try:
            rtsys.initialize(target_context)
        finally:
            nrtdynmod.compile_nrt_functions = compile_nrt_functions


def load_serialized_library(context: Any, state: Any) -> Any:
    """A code library of ``context``'s code generator from numba's serialized ``state``."""
    return context.codegen().unserialize_library(state)


def compile_runtime_library(context: Any) -> tuple[Any, Any]:
    """numba's runtime library compiled from its IR with object caching on: the library
    and its serialized state (``(name, "object", (code, bitcode))``)."""
    from numba.core.runtime import nrtdynmod

    ir_module, library = nrtdynmod.create_nrt_module(context)
    library.enable_object_caching()
    library.add_ir_module(ir_module)
    library.finalize()
    return library, library.serialize_using_object_code()

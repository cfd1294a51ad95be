"""numba's C runtime for kept kernels, without importing numba's Python package.

A kernel's machine code calls a few of numba's C helpers (raising an exception, the
reference counts and allocations of its runtime, NRT) and, if Python calls it, is
wrapped as numba wraps it. Those live in three of numba's
C extension modules, which load quickly; ``import numba`` runs many times longer in
Python before a kernel can run, most of what a small model's launch takes beyond
llama.cpp's.

:func:`c_runtime` hands out numba's own modules where numba is imported, and otherwise
loads the same files from numba's install, under their own names (a later ``import
numba`` then uses these, so nothing in them is initialized twice), and registers their
helpers with LLVM's symbol table as numba does when it starts its JIT (the names numba's
compiled code calls them by; registering them again, as numba will, changes nothing).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from . import numba_private

__all__ = ["CRuntime", "c_runtime", "extension_module"]


@dataclass(frozen=True)
class CRuntime:
    """numba's C helpers, its runtime and the compiled functions' Python type (their
    module names: :data:`numba_private.EXTENSION_MODULES`)."""

    helpers: ModuleType
    runtime: ModuleType
    functions: ModuleType


_lock = threading.Lock()
_loaded: list[CRuntime] = []


def c_runtime() -> CRuntime:
    """numba's C runtime, loaded and its symbols registered (once a process). Raises
    ``ImportError`` where numba is not installed or its files are not where its package
    says."""
    with _lock:
        if not _loaded:
            names = numba_private.EXTENSION_MODULES
            found = CRuntime(*(extension_module(names[k]) for k in ("helpers", "runtime",
                                                                    "functions")))  # fmt: skip
            numba_private.register_c_helpers(found.helpers, found.functions, found.runtime)
            _loaded.append(found)
        return _loaded[0]


def extension_module(name: str) -> ModuleType:
    """numba's extension module ``name`` (a value of
    :data:`.numba_private.EXTENSION_MODULES`): numba's, or loaded from its file, under
    that name. Raises ``ImportError`` where it is not there."""
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("numba")  # finds it; runs none of it
    if package is None or not package.submodule_search_locations:
        raise ImportError(f"numba is not installed (looking for {name})", name=name)
    folder = Path(next(iter(package.submodule_search_locations)))
    *parents, stem = name.split(".")[1:]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder.joinpath(*parents, stem + suffix)
        if path.is_file():
            loader = importlib.machinery.ExtensionFileLoader(name, str(path))
            spec = importlib.util.spec_from_file_location(name, path, loader=loader)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # numba, imported later, takes this one
            try:
                loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
    raise ImportError(f"numba's {name} is not in {folder}", name=name)

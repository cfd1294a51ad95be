"""numba's cached kernels loaded without parsing the bitcode kept for linking them.

numba caches a compiled function as its machine code (an ELF object on Linux) and the
LLVM bitcode of its module, which a later compile needs only to link the function into
a caller of its own. numba's loading parses that bitcode at once and walks its
functions and globals for their names (its JIT keeps the set of names it defines, to
look entry points up): about half of what a small model's kernel loads take at every
launch, for bitcode that no launch links.

:class:`LazyLinkingRebuild`, the rebuild of :class:`._numba_cache.KernelCache`, loads
the machine code as numba does and takes the names from the object's own symbol table,
which holds the same ones (they compare equal for the kernels of this package); the
bitcode is parsed, and its names added, only if a compile links the kernel
(:meth:`LazyLinkingLibrary._get_module_for_linking`). Machine code of another format,
or a numba whose code libraries are not the ones written for here, loads numba's way.
"""

from __future__ import annotations

from typing import Any

import llvmlite.binding as ll
from numba.core.caching import CompileResultCacheImpl
from numba.core.codegen import JITCodeLibrary
from numba.core.compiler_lock import global_compiler_lock

from .elf_symbols import defined_symbols

__all__ = ["LazyLinkingLibrary", "LazyLinkingRebuild", "object_code", "unserialize"]


class LazyLinkingLibrary(JITCodeLibrary):  # type: ignore[misc]  # numba has no type hints
    """A cached kernel's code library whose linking bitcode is parsed when first asked
    for (numba's ``_get_module_for_linking``: a compile that calls the kernel)."""

    _lazy_bitcode: bytes | None = None
    #: the machine code loaded (numba's copy is handed to LLVM's loader and dropped)
    object_code: bytes | None = None

    def _get_module_for_linking(self) -> Any:
        if self._shared_module is None and self._lazy_bitcode is not None:
            self._shared_module = ll.parse_bitcode(self._lazy_bitcode)
            self._lazy_bitcode = None
            self._codegen._engine._load_defined_symbols(self._shared_module)
        return super()._get_module_for_linking()


def unserialize(codegen: Any, state: Any) -> Any:
    """numba's ``JITCodeLibrary._unserialize`` of a cached ``"object"`` library, but
    with the names from the object's symbol table and the bitcode kept unparsed; any
    other library numba's way."""
    name, kind, data = state
    names = defined_symbols(data[0]) if kind == "object" else None
    if names is None or codegen._library_class is not JITCodeLibrary:
        return JITCodeLibrary._unserialize(codegen, state)
    object_code, bitcode = data
    library = codegen.create_library(name)
    library.__class__ = LazyLinkingLibrary  # adds only the lazy parse to numba's class
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library.object_code = object_code
    library._lazy_bitcode = bitcode
    library._finalize_final_module()  # the JIT takes the machine code (no compile)
    codegen._engine._defined_symbols |= names
    return library


def object_code(library: Any) -> bytes | None:
    """The machine code of a numba code library: what :func:`unserialize` loaded, or what
    numba compiled with object caching on (a cached kernel's); None where neither."""
    code = getattr(library, "object_code", None)
    if code is None and getattr(library, "_object_caching_enabled", False):
        code = getattr(library, "_compiled_object", None)
    return code if isinstance(code, bytes) else None


class LazyLinkingRebuild(CompileResultCacheImpl):  # type: ignore[misc]
    """numba's rebuild of a cached compile result, its code library made by
    :func:`unserialize`."""

    def rebuild(self, target_context: Any, payload: Any) -> Any:
        codegen = target_context.codegen()
        # numba loads under this lock (reentrant): no other load sees the swap
        with global_compiler_lock:
            codegen.unserialize_library = lambda state: unserialize(codegen, state)
            try:
                return super().rebuild(target_context, payload)
            finally:
                del codegen.unserialize_library

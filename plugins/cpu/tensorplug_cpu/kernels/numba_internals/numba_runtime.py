"""numba's runtime (NRT) made ready for cached kernels without compiling anything.

A kernel that numba loads from its disk cache is machine code already, but numba
readies two things first, and both cost more than the kernels themselves:

- its typing and lowering registries (``BaseContext.refresh``: importing numba's
  implementations of numpy, random, typed containers, cffi...), which only a compile
  reads: a large share of a small model's launch time and memory;
- its runtime library, a few reference-counting and atomic helpers that the kernels
  call, which numba builds from LLVM IR in every process
  (``nrtdynmod.compile_nrt_functions``): running LLVM's optimizer and code generator
  makes tens of megabytes of ``libllvmlite``'s code resident.

:func:`ready` initializes the runtime alone (a compile still refreshes the registries
itself: numba's ``compile_extra`` does), and keeps the runtime library's object code
in the kernel cache's folder (:mod:`.runtime_library`: keyed by numba's and llvmlite's
versions and the code generator's target, and read back without numba), so that later
processes load it as they load a kernel, in a fraction of the time and memory. A file
that cannot be read, does not match its digest, or cannot be written only costs the
compile.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from numba.core.compiler_lock import global_compiler_lock
from numba.core.runtime import nrtdynmod, rtsys

from tensorplug import kept

from ..cache_folder import cache_root
from .runtime_library import (
    from_bytes,
    object_code,
    read_payload,
    runtime_file,
    stored_code,
    to_bytes,
)

__all__ = ["ready", "runtime_code"]

_log = logging.getLogger("tensorplug_cpu")


#: the runtime library's machine code, once :func:`ready` has it (:mod:`.kept_code`
#: loads it into its own JIT, before the kernels that call it)
_code: list[bytes] = []


def runtime_code(target_context: Any, folder: Path) -> bytes | None:
    """The runtime library's machine code for kernels of the cache in ``folder``
    (:func:`ready` first): as loaded or compiled here, or, where numba initialized its
    runtime itself (a compile came first), as kept in the folder; None where neither."""
    ready(target_context, folder)
    if not _code:
        code = stored_code(folder)
        if code is not None:
            _code.append(code)
    return _code[0] if _code else None


def ready(target_context: Any, folder: Path) -> None:
    """Initialize numba's runtime for kernels loaded from the cache in ``folder``
    (once a process; later calls return at once)."""
    if getattr(rtsys, "_init", False):
        return
    path = runtime_file(folder)

    def compile_or_load(ctx: Any) -> Any:
        return _load(ctx, path) or _compile_and_keep(ctx, path)

    with global_compiler_lock:  # reentrant: rtsys.initialize takes it too
        compile_nrt_functions = nrtdynmod.compile_nrt_functions
        nrtdynmod.compile_nrt_functions = compile_or_load
        try:
            rtsys.initialize(target_context)
        finally:
            nrtdynmod.compile_nrt_functions = compile_nrt_functions


def _load(ctx: Any, path: Path) -> Any:
    payload = read_payload(path)
    state = None if payload is None else from_bytes(payload)
    if state is None:
        return None
    try:
        library = ctx.codegen().unserialize_library(state)
    except Exception as e:  # another numba's layout: compile it, the new file replaces it
        _log.debug("numba runtime library %s unusable (%s); compiling it", path, e)
        return None
    _keep_code(state)
    return library


def _keep_code(state: Any) -> None:
    """Note the machine code of a serialized runtime library."""
    code = object_code(state)
    if code is not None:
        _code[:] = [code]


def _compile_and_keep(ctx: Any, path: Path) -> Any:
    ir_module, library = nrtdynmod.create_nrt_module(ctx)
    library.enable_object_caching()
    library.add_ir_module(ir_module)
    library.finalize()
    state = library.serialize_using_object_code()
    _keep_code(state)
    data = to_bytes(state)
    if data is not None and not kept.save(cache_root(), path, data):
        _log.debug("could not keep numba's runtime library in %s", path)
    return library

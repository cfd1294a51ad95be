"""What a kernel's kept machine code (:mod:`.kept_code`) is filed under, known without
importing numba.

A launch that loads every kernel from kept code should not need numba's Python package at
all: its import is a large share of a small model's launch. numba's own cache key would
name an entry, but only numba computes it. Here is the same information, computed the
same way by the process that keeps an entry (numba imported) and by one that loads it
(numba perhaps not):

- the kernel's *origin* (:func:`origin_of`: a module's kernel by module and name,
  a factory's by the tag it puts on what it makes), and the sha256 of the source file
  of a module's kernel (what numba's key took as the function's bytecode);
- :func:`sources_hash`, every kernel source of this package (the kernels inline code
  from each other), and the instruction forms (:func:`instruction_forms`);
- the compile target (:func:`compile_target`): LLVM's triple, the CPU and the feature
  list numba's code generator is given (``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``, else
  the host's), and the environment's other settings of numba's code generation;
- :func:`salt`: numba's, llvmlite's and Python's versions, as installed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from tensorplug import installed

from ..system import kernel_features, llvm_cpu_name, numba_target_features

__all__ = [
    "CODEGEN_SETTINGS", "FORM_FLAGS", "SOURCES",
    "compile_target", "identity", "instruction_forms", "origin_of", "salt", "source_hash",
    "sources_hash",
]  # fmt: skip

_HERE = Path(__file__).parent
#: the kernel sources, in name order, the repacked layouts they read, the dispatch
#: table whose limits and row groups they compile in, and the jobs' block layouts
SOURCES = [*sorted(_HERE.glob("_numba_*.py")), _HERE.parent / "repack.py", _HERE / "dispatch.py",
           _HERE / "job_blocks.py", _HERE / "kernel_shapes.py"]  # fmt: skip

#: the names of :mod:`._numba_ir`'s instruction-form flags, in :func:`instruction_forms`'s order
FORM_FLAGS = ("HAS_AVX2", "HAS_F16C", "HAS_VNNI", "HAS_32_REGS", "ON_ZEN")
_IR_MODULE = f"{__package__}._numba_ir"

#: numba's settings (environment variables) that change the machine code it generates
#: beyond the target's CPU and features; numba's own cache key leaves them out, a kept
#: entry does not
CODEGEN_SETTINGS = ("NUMBA_OPT", "NUMBA_ENABLE_AVX", "NUMBA_LOOP_VECTORIZE",
                    "NUMBA_SLP_VECTORIZE", "NUMBA_BOUNDSCHECK", "NUMBA_FASTMATH",
                    "NUMBA_DISABLE_INTEL_SVML", "NUMBA_DEBUGINFO")  # fmt: skip


def origin_of(kernel: Any) -> tuple[Any, ...] | None:
    """Where a process finds ``kernel`` again: ``("module", module, name)`` for a
    module's kernel, the tag a factory put on what it made (``("made", module,
    factory, *args)`` for a dispatcher, ``("made_job", module, factory, *args)`` for a
    job function: ``factory(*args)`` makes it again), ``("job", module, name)`` for
    another job function (:func:`.job_function.job_function`, by the name its cache
    files have), or None
    (not a numba dispatcher, or not one a module holds)."""
    tag = getattr(kernel, "tensorplug_origin", None)
    if tag is not None:
        return tuple(tag)
    if getattr(kernel, "tensorplug_job", False):  # a :class:`.job_function.JobFunction`
        return ("job", kernel.py_func.__module__, kernel.py_func.__qualname__)
    py_func = getattr(kernel, "py_func", None)
    if py_func is not None and hasattr(kernel, "compile"):
        module = sys.modules.get(py_func.__module__)
        if module is None or getattr(module, py_func.__name__, None) is not kernel:
            return None
        return ("module", py_func.__module__, py_func.__name__)
    return None


@functools.cache
def sources_hash() -> str:
    """sha256 of :data:`SOURCES` (read once a process, when a kernel's identity or
    numba's cache first needs it: a process that computes nothing reads none of them)."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()


def instruction_forms() -> tuple[bool, ...]:
    """The IR kernels' instruction-form flags (:mod:`._numba_ir`, :data:`FORM_FLAGS`) as
    they are now: part of every entry's key, because a process may set them to build
    another host's form (the tests do, to check it on this machine), and that machine
    code must never be what a later run on this host loads from the shared cache.
    Where :mod:`._numba_ir` is not imported (it imports numba), the flags are what its
    import would set: the compile target's (:func:`..system.kernel_features`)."""
    ir = sys.modules.get(_IR_MODULE)
    if ir is not None:
        return tuple(bool(getattr(ir, name)) for name in FORM_FLAGS)
    host = kernel_features()
    return (host.avx2, host.f16c, host.vnni, host.regs32, host.zen)


def compile_target() -> tuple[str, ...]:
    """What numba's code generator compiles for, as numba's configuration reads it from
    the environment, else the host's as LLVM sees it (:func:`..system.llvm_cpu_name`,
    :func:`..system.numba_target_features`), and :data:`CODEGEN_SETTINGS`."""
    names = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", *CODEGEN_SETTINGS)
    return _compile_target(tuple(f"{name}={os.environ.get(name)!r}" for name in names))


@functools.cache
def _compile_target(environment: tuple[str, ...]) -> tuple[str, ...]:
    """:func:`compile_target` for these settings (asked of LLVM once for each)."""
    import llvmlite.binding as ll

    triple = str(ll.get_process_triple())
    return (triple, llvm_cpu_name(), numba_target_features(), *environment[2:])


def salt() -> str:
    """What every kept entry must have been written under: numba's, llvmlite's and
    Python's versions (installed: read without importing numba) and the sources."""
    # installed versions, read without importing them (kept: tensorplug.installed)
    numba, llvmlite = (installed.version(d) or "not installed" for d in ("numba", "llvmlite"))
    return repr((numba, llvmlite, sys.version, sources_hash()))


@functools.cache
def source_hash(module: str) -> str | None:
    """sha256 of the source file of ``module`` (found, not imported), or None where it
    has none."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = None if spec is None else spec.origin
    if origin is None or not origin.endswith(".py"):
        return None
    try:
        return hashlib.sha256(Path(origin).read_bytes()).hexdigest()
    except OSError:
        return None


def identity(origin: tuple[Any, ...]) -> str | None:
    """The name of the kernel ``origin`` (:func:`origin_of`) among kept entries,
    for this target and these instruction forms; None where a module's kernel has no
    source file to hash."""
    source = None
    if origin[0] in ("module", "job", "made", "made_job"):
        source = source_hash(str(origin[1]))
        if source is None:
            return None
    text = repr((tuple(origin), source, sources_hash(), instruction_forms(), compile_target()))
    return hashlib.sha256(text.encode()).hexdigest()

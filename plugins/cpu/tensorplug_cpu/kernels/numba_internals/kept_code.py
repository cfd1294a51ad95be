"""Kernels' machine code kept by tensorplug itself, and loaded without numba's cache.

numba loads a cached kernel by reading its index, unpickling the compile result (numba
types, a function descriptor, an environment), rebuilding it and typing the call, for
each of the ~20 kernels a small model's launch loads, and all of it needs numba's Python
package, whose import is the largest part of a launch. The machine code itself loads in
LLVM's JIT in a fraction of that time.

So every kernel numba compiles or loads is also written here, as one file: its ELF object
and the name of its entry point, under a name derived from the kernel's identity (the
key numba's cache files it under, less the signature: its code, closure and sources,
the target and the instruction forms), the numba types of its arguments (:func:`arg_key`)
and :attr:`KeptCode.salt` (numba, llvmlite, Python, the kernels' sources). A later
process loads it into an LLVM JIT of its own (:func:`load`): a Python-callable kernel as
numba makes one (through numba's C function-wrapper type and CPython wrapper, an environment of
its own), a job (a C function the spinning helpers call) as its address.

What is loaded must be what was written, and must be able to run: a file is its sha256
then its contents; an object is loaded only if every symbol it uses resolves (numba's
runtime helpers, which the process has registered, the runtime library kept beside the
kernels, Python's C API): LLVM's loader aborts the process on a symbol it cannot find.
Anything else (a missing or unreadable file, another format, an environment with
constants) leaves the kernel to numba, which compiles or loads it as before.

Nothing here imports numba's Python package: a kept kernel needs LLVM's JIT (llvmlite)
and numba's C runtime (:mod:`.numba_extensions`) only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorplug import kept

from ..cache_folder import cache_root
from . import numba_private
from .elf_symbols import defined_symbols, symbols
from .numba_extensions import c_runtime

__all__ = ["CALLABLE", "JOB", "MAX_BYTES", "Entry", "KeptCode", "entry_file", "load"]

_log = logging.getLogger("tensorplug_cpu")

#: an entry's kinds: numba's CPython wrapper of a kernel, or a C function (a job)
CALLABLE, JOB = "callable", "job"
#: what starts an entry's contents, after its digest
_FORMAT = b"tensorplug kept kernel 1\n"
_DIGEST = hashlib.sha256().digest_size
#: the largest entry read back (a kernel's object is tens to hundreds of KiB)
MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Entry:
    """A kept kernel: its ``kind`` (:data:`CALLABLE` or :data:`JOB`), the ``symbol`` of
    its entry point in ``code`` (an ELF object), and the ``module`` and ``name`` its
    Python function has (what its callable is called)."""

    kind: str
    symbol: str
    module: str
    name: str
    code: bytes

    def to_bytes(self) -> bytes:
        head = json.dumps({"kind": self.kind, "symbol": self.symbol, "module": self.module,
                           "name": self.name}).encode()  # fmt: skip
        payload = _FORMAT + len(head).to_bytes(4, "little") + head + self.code
        return hashlib.sha256(payload).digest() + payload

    @classmethod
    def from_bytes(cls, data: bytes) -> Entry | None:
        """The entry ``data`` holds, or None where it is not one whole."""
        digest, payload = data[:_DIGEST], data[_DIGEST:]
        if len(digest) < _DIGEST or hashlib.sha256(payload).digest() != digest:
            return None
        if not payload.startswith(_FORMAT):
            return None
        at = len(_FORMAT)
        size = int.from_bytes(payload[at : at + 4], "little")
        try:
            head = json.loads(payload[at + 4 : at + 4 + size])
            entry = cls(str(head["kind"]), str(head["symbol"]), str(head["module"]),
                        str(head["name"]), payload[at + 4 + size :])  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None
        return entry if entry.kind in (CALLABLE, JOB) else None


def entry_file(folder: Path, identity: str, key: tuple[Any, ...], salt: str) -> Path:
    """Where the kernel ``identity`` typed as ``key`` (:func:`arg_key`) is kept."""
    name = hashlib.sha256(repr((identity, key, salt)).encode()).hexdigest()[:32]
    return folder / f"kept-{name}.tpk"


class KeptCode:
    """The kept kernels of one process: where they are (``folder``, numba's cache folder
    of the kernels), what they must match (``salt``), and numba's runtime library's
    object code (``runtime``: what the kernels' reference counting calls)."""

    def __init__(self, folder: Path, salt: str, runtime: Callable[[], bytes | None]) -> None:
        self.folder, self.salt, self._runtime = folder, salt, runtime
        #: what each entry loaded as, by its file (an object is never loaded twice:
        #: LLVM's loader would find every symbol it defines defined already)
        self.loaded: dict[Path, Any] = {}
        #: the entries kept by this process: numba has their kernels here already
        self._kept_here: set[Path] = set()

    def path(self, identity: str, key: tuple[Any, ...]) -> Path:
        return entry_file(self.folder, identity, key, self.salt)

    def load(self, identity: str, key: tuple[Any, ...]) -> Any:
        """The kernel kept as ``identity`` for arguments of ``key``: a callable, or a
        job's address; None where none is kept, or it cannot be loaded."""
        path = self.path(identity, key)
        with _engine_lock:
            if path in self.loaded or path in self._kept_here:
                return self.loaded.get(path)
            entry = kept.load(cache_root(), path, MAX_BYTES, Entry.from_bytes)
            if entry is None:
                _log.debug("kept kernel %s is not what was written; numba loads it", path)
                return None
            loaded = load(entry, self._runtime)
            if loaded is not None:
                self.loaded[path] = loaded
            return loaded

    def keep(self, identity: str, key: tuple[Any, ...], entry: Entry) -> None:
        """Write ``entry`` for a later process (nothing where the folder is read-only, nor
        for machine code this loader does not read: not ELF); this one has the kernel
        from numba, and never loads the entry as well."""
        path = self.path(identity, key)
        with _engine_lock:
            if path in self._kept_here:  # written already by this process
                return
            self._kept_here.add(path)
        if defined_symbols(entry.code) is None:
            return
        if not kept.save(cache_root(), path, entry.to_bytes()):
            _log.debug("could not keep kernel %s.%s", entry.module, entry.name)


class _Engine:
    """This process's LLVM JIT for kept kernels (numba's own is numba's), the runtime
    library loaded first, and what the loaded code refers to, kept alive."""

    def __init__(self, runtime: bytes) -> None:
        import llvmlite.binding as ll  # here: the plugin imports without llvmlite (no numba)

        self.ll = ll
        ll.initialize_native_target()
        ll.initialize_native_asmprinter()
        target = ll.Target.from_triple(ll.get_process_triple())
        machine = target.create_target_machine(codemodel="jitdefault", jit=True)
        self.engine = ll.create_mcjit_compiler(ll.parse_assembly(""), machine)
        self.runtime_symbols = defined_symbols(runtime) or set()
        self.engine.add_object_file(ll.ObjectFileRef.from_data(runtime))
        self.engine.finalize_object()
        self.environments: list[Any] = []
        #: symbols LLVM's loader found in this process (asked once each)
        self.found: set[str] = set()

    def resolves(self, used: set[str]) -> bool:
        """Whether every symbol of ``used`` is defined by the runtime library or found
        by LLVM's loader in this process."""
        missing = used - self.runtime_symbols - self.found
        for name in missing:
            if not self.ll.address_of_symbol(name):
                return False
            self.found.add(name)
        return True


_engine_lock = threading.RLock()
_engines: list[_Engine] = []


def load(entry: Entry, runtime: Callable[[], bytes | None]) -> Any:
    """``entry`` loaded into this process's JIT: a callable kernel, or a job's address;
    None where its object is not ELF or uses a symbol nothing here defines."""
    functions = c_runtime().functions  # the wrappers' Python type, numba's C helpers

    with _engine_lock:
        if not _engines:
            code = runtime()
            if code is None:
                return None
            _engines.append(_Engine(code))
        jit = _engines[0]
        table = symbols(entry.code)
        if table is None or entry.symbol not in table[0] or not jit.resolves(table[1]):
            return None
        defined = table[0]
        jit.engine.add_object_file(jit.ll.ObjectFileRef.from_data(entry.code))
        jit.engine.finalize_object()
        environment = numba_private.new_environment(functions, entry.module)
        jit.environments.append(environment)
        for name in defined:
            if name.startswith(numba_private.ENVIRONMENT_PREFIX):
                numba_private.set_environment(jit.engine.get_global_value_address(name),
                                              environment)  # fmt: skip
        address = jit.engine.get_function_address(entry.symbol)
    if entry.kind == JOB:
        return address
    module = sys.modules.get(entry.module) or types.ModuleType(entry.module)
    return numba_private.make_kept_function(functions, module, entry.name, address,
                                            environment, (jit,))  # fmt: skip

"""numba's runtime (NRT) made ready for cached kernels without compiling anything, its
library's machine code kept beside the kernels and read back without importing numba.

A kernel that numba loads from its disk cache is machine code already, but numba
readies two things first, and both cost more than the kernels themselves:

- its typing and lowering registries (``BaseContext.refresh``: importing numba's
  implementations of numpy, random, typed containers, cffi...), which only a compile
  reads: a large share of a small model's launch time and memory;
- its runtime library, a few reference-counting and atomic helpers that the kernels
  call, which numba builds from LLVM IR in every process: running LLVM's optimizer and
  code generator makes tens of megabytes of ``libllvmlite``'s code resident.

:func:`ready` initializes the runtime alone (a compile still refreshes the registries
itself: numba's ``compile_extra`` does), and keeps the runtime library's object code
in the kernel cache's folder, so that later processes load it as they load a kernel,
and :mod:`.kept_code` loads it into its own JIT before any kept kernel. A file that
cannot be read, does not match its digest, or cannot be written only costs the
compile. The file is named by :func:`.kernel_identity.salt` and the
compile target (:func:`.kernel_identity.compile_target`), and holds the sha256 of its
contents, then the contents: the library's name, machine code and bitcode (what numba's
``serialize_using_object_code`` gives, in a layout of the plugin's own: nothing is
unpickled). It is read only as :mod:`tensorplug.kept` reads a kept file (a regular file
of the user's, in folders only the user can write, up to the cache root): the digest
only tells a file cut short from a whole one, not who wrote it.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from tensorplug import kept

from ..cache_folder import cache_root, kept_code_folder
from ..kernel_identity import compile_target, salt
from . import numba_private

__all__ = ["MAX_BYTES", "from_bytes", "object_code", "read_payload", "ready",
           "ready_beside_kernels", "runtime_code", "runtime_file", "stored_code",
           "to_bytes"]  # fmt: skip

_log = logging.getLogger("tensorplug_cpu")

#: bytes of the digest that starts the file
_DIGEST = hashlib.sha256().digest_size
#: what starts the contents, after the digest
_FORMAT = b"tensorplug numba runtime 1\n"
#: the largest file read back (the library is tens of KiB)
MAX_BYTES = 16 << 20


def runtime_file(folder: Path) -> Path:
    """Where the runtime library's object code for this numba, llvmlite and target is
    kept in ``folder``."""
    key = repr((salt(), compile_target()))
    return folder / f"nrt-{hashlib.sha256(key.encode()).hexdigest()[:16]}.nbo"


def read_payload(path: Path) -> bytes | None:
    """The payload of the kept file at ``path``, where it is safe to read (see the
    module) and whole (its digest matches)."""
    data = kept.load(cache_root(), path, MAX_BYTES, bytes)
    if data is None:
        return None
    digest, payload = data[:_DIGEST], data[_DIGEST:]
    if len(digest) < _DIGEST or hashlib.sha256(payload).digest() != digest:
        _log.debug("numba runtime library %s is not what was written; compiling it", path)
        return None
    return payload


def to_bytes(state: Any) -> bytes | None:
    """A serialized runtime library (``(name, "object", (code, bitcode))``) as the file
    holds it, digest first; None for anything else."""
    try:
        name, kind, (code, bitcode) = state
    except (TypeError, ValueError):
        return None
    if kind != "object" or not all(isinstance(b, bytes) for b in (code, bitcode)):
        return None
    raw_name = str(name).encode()
    payload = (_FORMAT + len(raw_name).to_bytes(4, "little") + raw_name
               + len(code).to_bytes(8, "little") + code + bitcode)  # fmt: skip
    return hashlib.sha256(payload).digest() + payload


def from_bytes(payload: bytes) -> tuple[str, str, tuple[bytes, bytes]] | None:
    """The serialized library a file's payload holds; None where it is not one whole."""
    if not payload.startswith(_FORMAT):
        return None
    at = len(_FORMAT)
    size = int.from_bytes(payload[at : at + 4], "little")
    name_end = at + 4 + size
    code_size = int.from_bytes(payload[name_end : name_end + 8], "little")
    code_end = name_end + 8 + code_size
    if name_end + 8 > len(payload) or code_end > len(payload):
        return None
    try:
        name = payload[at + 4 : name_end].decode()
    except UnicodeDecodeError:
        return None
    return name, "object", (payload[name_end + 8 : code_end], payload[code_end:])


def object_code(state: Any) -> bytes | None:
    """The machine code of a serialized runtime library (``(name, "object", (code,
    bitcode))``, numba's ``serialize_using_object_code``); None for anything else."""
    try:
        _, kind, data = state
        code = data[0]
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return code if kind == "object" and isinstance(code, bytes) else None


def stored_code(folder: Path) -> bytes | None:
    """The runtime library's machine code as kept in ``folder``; None where it is not
    there whole."""
    payload = read_payload(runtime_file(folder))
    state = None if payload is None else from_bytes(payload)
    return None if state is None else object_code(state)


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
    if numba_private.runtime_initialized():
        return
    path = runtime_file(folder)

    def load_or_compile(context: Any) -> Any:
        return _load(context, path) or _compile_and_keep(context, path)

    numba_private.initialize_runtime(target_context, load_or_compile)


def ready_beside_kernels(target_context: Any) -> None:
    """:func:`ready`, its library kept in the kept-code folder of the kernels' cache
    (where the kept kernels look for it); nothing where there is no safe cache."""
    folder = kept_code_folder()
    if folder is not None:
        ready(target_context, folder)


def _load(context: Any, path: Path) -> Any:
    payload = read_payload(path)
    state = None if payload is None else from_bytes(payload)
    if state is None:
        return None
    try:
        library = numba_private.load_serialized_library(context, state)
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


def _compile_and_keep(context: Any, path: Path) -> Any:
    library, state = numba_private.compile_runtime_library(context)
    _keep_code(state)
    data = to_bytes(state)
    if data is not None and not kept.save(cache_root(), path, data):
        _log.debug("could not keep numba's runtime library in %s", path)
    return library

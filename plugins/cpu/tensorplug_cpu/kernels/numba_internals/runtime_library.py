"""Where numba's runtime library's machine code is kept beside the kernels, and reading
it back, without importing numba.

numba builds its runtime library (a few reference-counting and atomic helpers that the
kernels call) from LLVM IR in every process; :mod:`.numba_runtime` keeps its object
code in the kernel cache's folder instead, and :mod:`.kept_code` loads it into its own
JIT before any kept kernel. The file is named by :func:`.kernel_identity.salt` and the
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

from ..cache_folder import cache_root
from ..kernel_identity import compile_target, salt

__all__ = ["MAX_BYTES", "from_bytes", "object_code", "read_payload", "runtime_file",
           "stored_code", "to_bytes"]  # fmt: skip

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

"""Where numba's runtime library's machine code is kept beside the kernels, and reading
it back, without importing numba.

numba builds its runtime library (a few reference-counting and atomic helpers that the
kernels call) from LLVM IR in every process; :mod:`.numba_runtime` keeps its object
code in the kernel cache's folder instead, and :mod:`.kept_code` loads it into its own
JIT before any kept kernel. The file is named by :func:`.kernel_identity.salt` and the
compile target (:func:`.kernel_identity.compile_target`), and holds the sha256 of its
contents, then the contents (numba's ``serialize_using_object_code``, pickled): machine
code that is not exactly what was written is never handed to LLVM's loader.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import sys
from pathlib import Path
from typing import Any

from .kernel_identity import compile_target, salt

__all__ = ["object_code", "read_payload", "runtime_code", "runtime_file", "stored_code"]

_log = logging.getLogger("tensorplug_cpu")

#: bytes of the digest that starts the file
_DIGEST = hashlib.sha256().digest_size


def runtime_file(folder: Path) -> Path:
    """Where the runtime library's object code for this numba, llvmlite and target is
    kept in ``folder``."""
    key = repr((salt(), compile_target()))
    return folder / f"nrt-{hashlib.sha256(key.encode()).hexdigest()[:16]}.nbo"


def read_payload(path: Path) -> bytes | None:
    """The payload of the file at ``path``, where it is whole (its digest matches)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        _log.debug("numba runtime library %s unreadable (%s); compiling it", path, e)
        return None
    digest, payload = data[:_DIGEST], data[_DIGEST:]
    if len(digest) < _DIGEST or hashlib.sha256(payload).digest() != digest:
        _log.debug("numba runtime library %s is not what was written; compiling it", path)
        return None
    return payload


def object_code(state: Any) -> bytes | None:
    """The machine code of a serialized runtime library (``(name, "object", (code,
    bitcode))``, numba's ``serialize_using_object_code``); None for anything else."""
    try:
        _, kind, data = state
        code = data[0]
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return code if kind == "object" and isinstance(code, bytes) else None


def runtime_code(folder: Path) -> bytes | None:
    """The runtime library's machine code for kept kernels of ``folder``: as kept there,
    else numba's, where numba is imported (it compiles or loads it, and keeps it here)."""
    found = stored_code(folder)
    if found is None and sys.modules.get("numba") is not None:
        from numba.core.registry import cpu_target

        from . import numba_runtime

        found = numba_runtime.runtime_code(cpu_target.target_context, folder)
    return found


def stored_code(folder: Path) -> bytes | None:
    """The runtime library's machine code as kept in ``folder``; None where it is not
    there whole."""
    payload = read_payload(runtime_file(folder))
    if payload is None:
        return None
    try:
        return object_code(pickle.loads(payload))
    except Exception as e:  # another numba's layout: no code to hand out
        _log.debug("numba runtime library unusable (%s)", e)
        return None

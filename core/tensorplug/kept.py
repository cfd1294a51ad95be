"""Reading and writing the files tensorplug keeps between processes, none of them trusted.

A kept file (installed metadata, a GGUF header, a GPU plugin's device list) only saves
time: whatever it holds, the answer must be the one computed without it. So a kept
file is read only where every folder from the cache folder down to it is a real folder
(no link) that only the user can write, owned by the user (or root), as ssh
requires of ``~/.ssh``; only if it is a regular file (opened without following a link and without
blocking, so a FIFO or a device is refused, not waited on), no larger than its reader's
bound; and only as what the reader's check accepts. Anything else is a miss: the
caller computes the answer as if nothing were kept and may write the file anew. The
first miss of each file in a process logs one warning naming the file and how to clear
it (``tensorplug cache clear``, or deleting it); a file that is simply absent is a
miss without a word.

Folders are made user-only (0700) and files user-only (0600, :func:`~tempfile.mkstemp`'s
mode); a folder that others can write is neither read nor written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .files import replace_file

__all__ = [
    "CLEAR_HINT",
    "MAX_DEPTH",
    "PARSE_ERRORS",
    "folder_problem",
    "load",
    "load_json",
    "parse_json",
    "prepare_folder",
    "read",
    "read_regular",
    "save",
    "warn_once",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: How JSON kept by tensorplug may nest at most (its deepest, a GGUF key's nested array
#: of arrays, is a few levels): deeper is not something tensorplug wrote.
MAX_DEPTH = 32

#: What every warning about a kept file says to do.
CLEAR_HINT = "run `tensorplug cache clear`, or delete the file"

#: Errors a reader's parse or check may raise on a file it did not write.
PARSE_ERRORS = (
    ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
    RecursionError, MemoryError, AssertionError,
)  # fmt: skip

_warned: set[str] = set()
_warned_lock = threading.Lock()

_POSIX = os.name == "posix"
_DIR_FD = _POSIX and os.open in os.supports_dir_fd


class _Unsafe(Exception):
    """Why a kept file or folder is not read (the text of the warning)."""


def warn_once(path: Path, why: str) -> None:
    """One warning per file and process: the file, why it was not used, the fix."""
    with _warned_lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    _log.warning(
        "ignoring the kept file %s: %s; it is computed again instead (to clear it, %s)",
        path, why, CLEAR_HINT,
    )  # fmt: skip


def _check_folder(st: os.stat_result, where: Path) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise _Unsafe(f"{where} is not a folder")
    if not _POSIX:
        return
    if st.st_uid not in (os.getuid(), 0):  # root's, as ssh allows: none but root writes
        raise _Unsafe(f"the folder {where} belongs to another user (uid {st.st_uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _Unsafe(
            f"the folder {where} can be written by others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"make it the user's alone (chmod 700 {where})"
        )


def _parts(root: Path, path: Path) -> list[str]:
    """The names from ``root`` down to ``path`` (``path`` must lie below ``root``)."""
    parts = path.relative_to(root).parts
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{path} is not a file below {root}")
    return list(parts)


def folder_problem(root: Path, folder: Path) -> str | None:
    """Why ``folder`` (``root`` or a folder below it) may not hold kept files, or None:
    it or a folder above it, up to ``root``, is a link below ``root``, not a folder,
    another user's, or writable by others. A folder that does not exist is no problem."""
    try:
        _check_folder(os.stat(root), root)
        where = root
        for name in folder.relative_to(root).parts:
            where = where / name
            _check_folder(os.lstat(where), where)
    except FileNotFoundError:
        return None
    except _Unsafe as e:
        return str(e)
    except OSError as e:
        return f"{e.strerror or e}"
    return None


def _open(root: Path, path: Path) -> int:
    """A descriptor of the regular file at ``path``, every folder above it checked;
    FileNotFoundError where it is not there, :class:`_Unsafe` where it is not safe."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    parts = _parts(root, path)
    if not _DIR_FD:
        problem = folder_problem(root, path.parent)
        if problem:
            raise _Unsafe(problem)
        return os.open(path, flags)
    folder_flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(root, folder_flags)
    try:
        _check_folder(os.fstat(fd), root)
        where = root
        for name in parts[:-1]:
            where = where / name
            try:
                below = os.open(name, folder_flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _Unsafe(f"{where} is a link or not a folder") from None
                raise
            os.close(fd)
            fd = below
            _check_folder(os.fstat(fd), where)
        try:
            return os.open(parts[-1], flags, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _Unsafe("it is a link, not a file") from None
            raise
    finally:
        os.close(fd)


def _read_bounded(fd: int, limit: int) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _Unsafe("it is not a regular file (a FIFO, a device or a folder)")
    if _POSIX and st.st_uid not in (os.getuid(), 0):
        raise _Unsafe(f"it belongs to another user (uid {st.st_uid})")
    if st.st_size > limit:
        raise _Unsafe(f"it holds {st.st_size} bytes, more than the {limit} it may")
    chunks, total = [], 0
    while total <= limit:
        chunk = os.read(fd, limit + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise _Unsafe(f"it grew past the {limit} bytes it may hold while being read")
    return b"".join(chunks)


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (not kept by tensorplug: installed
    metadata), at most ``limit``; OSError where it is absent, not a regular file (read
    without blocking) or larger."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise OSError(f"{path} is not a regular file of at most {limit} bytes")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read(
    root: Path, path: Path, limit: int, parse: Callable[[bytes], T]
) -> tuple[T | None, str | None]:
    """What ``parse`` makes of the kept file ``path`` (below the cache folder ``root``)
    and None, or None and why it is not used: unsafe (see the module), larger than
    ``limit`` bytes, or ``parse`` raised one of :data:`PARSE_ERRORS`. A file that is
    not there is ``(None, None)``. Nothing is logged (:func:`load` warns)."""
    try:
        fd = _open(root, path)
    except FileNotFoundError:
        return None, None
    except _Unsafe as e:
        return None, str(e)
    except (OSError, ValueError) as e:
        return None, f"it cannot be opened ({e})"
    try:
        data = _read_bounded(fd, limit)
    except _Unsafe as e:
        return None, str(e)
    except OSError as e:
        return None, f"it cannot be read ({e})"
    finally:
        os.close(fd)
    try:
        return parse(data), None
    except PARSE_ERRORS as e:
        return None, f"it does not hold what tensorplug writes ({type(e).__name__}: {e})"


def load(root: Path, path: Path, limit: int, parse: Callable[[bytes], T]) -> T | None:
    """:func:`read`'s value; where it is not used, one warning per file and process."""
    value, why = read(root, path, limit, parse)
    if why is not None:
        warn_once(path, why)
    return value


def _depth(value: Any) -> int:
    """How deeply ``value`` (parsed JSON) nests, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                break
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_json(data: bytes) -> Any:
    """``data`` as JSON, nested at most :data:`MAX_DEPTH` deep (ValueError or
    RecursionError otherwise)."""
    value = json.loads(data)
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"it nests deeper than {MAX_DEPTH} levels")
    return value


def load_json(root: Path, path: Path, limit: int, check: Callable[[Any], T]) -> T | None:
    """:func:`load` of a JSON file: ``check`` takes the parsed value and returns what
    the caller uses, raising (one of :data:`PARSE_ERRORS`) on anything else."""
    return load(root, path, limit, lambda data: check(parse_json(data)))


def _make_folders(root: Path, folder: Path) -> None:
    """``root`` and the folders down to ``folder``, each made user-only where it is made."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    where = root
    for name in folder.relative_to(root).parts:
        where = where / name
        with contextlib.suppress(FileExistsError):
            os.mkdir(where, 0o700)


def prepare_folder(root: Path, folder: Path) -> str | None:
    """Make ``folder`` (``root`` or below it) and the folders above it, user-only where
    they are made; None where it is then safe to keep files in, else why not (it could
    not be made, or :func:`folder_problem`)."""
    try:
        if folder != root:
            _parts(root, folder / "x")
        _make_folders(root, folder)
    except (OSError, ValueError) as e:
        return f"it cannot be made ({e})"
    return folder_problem(root, folder)


def save(root: Path, path: Path, data: bytes) -> bool:
    """Keep ``data`` in ``path`` (below ``root``), whole or not at all; False where it
    could not be (a read-only home, or a folder others can write: warned once)."""
    try:
        _parts(root, path)
        _make_folders(root, path.parent)
    except (OSError, ValueError) as e:
        _log.debug("could not make the folder of %s: %s", path, e)
        return False
    if problem := folder_problem(root, path.parent):
        warn_once(path, problem)
        return False
    try:
        replace_file(path, data)
    except OSError as e:
        _log.debug("could not keep %s: %s", path, e)
        return False
    return True

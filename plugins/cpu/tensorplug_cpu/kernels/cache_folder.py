"""Where numba keeps the CPU kernels' disk cache: a folder of the plugin's own, keyed on
every kernel source, that only the user can reach.

numba keys a cached function by its own file's time stamp and bytecode only. Most of
these kernels inline code from other files (the LLVM IR of :mod:`._numba_introw`, the
f16 helpers of :mod:`._numba_ir`, :func:`._numba_rows.expf`, the repacked layouts of
:mod:`..repack`), so after an edit to one of those, or a ``git checkout`` of an older
one, the cached machine code of the kernels that inline it would run on: stale numbers,
or a crash. So the kernels are cached in a folder named by the hash of every kernel
source and the instruction forms (:func:`folder_key`): any change to them is a new,
empty folder, and numba compiles everything once. numba is told the folder through its
public setting (``numba.config.CACHE_DIR``), set only while a kernel of this package is
decorated (:func:`numba_cache_dir`): numba reads it then, and a program's own numba
functions keep theirs.

numba's cache files are pickles, which run code when read. The folder is made user-only
(0700), and used only where it and every folder above it up to the cache root are the
user's and writable by no one else (:func:`tensorplug.kept.folder_problem`); elsewhere
the kernels compile in every process, uncached, with one warning naming the folder.

The root is ``$NUMBA_CACHE_DIR/tensorplug-cpu`` where numba's setting names one (so a
program that moves numba's cache moves this one too), else ``cpu-kernels`` in
tensorplug's cache folder (``~/.cache/tensorplug``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tensorplug import kept
from tensorplug.files import cache_folder

from . import numba_internals
from .kernel_identity import instruction_forms, sources_hash

__all__ = ["cache_root", "folder_key", "guarded", "kept_code_folder", "kernel_folder",
           "numba_cache_dir"]  # fmt: skip

_log = logging.getLogger("tensorplug_cpu")
_lock = threading.RLock()
_warned: set[str] = set()
#: the folders found safe in this process
_checked: set[Path] = set()
#: a damaged cache is said once a process, not once a kernel
_warned_damage: list[bool] = []
T = TypeVar("T")


def cache_root() -> Path:
    """The folder every version of the kernels' cache lives in (see the module)."""
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given:
        return Path(given).expanduser() / "tensorplug-cpu"
    base = cache_folder(True)
    assert base is not None  # True always names the default folder
    return base / "cpu-kernels"


def folder_key() -> str:
    """What the cache folder is named by: the kernels' sources and instruction forms."""
    text = repr((sources_hash(), instruction_forms()))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def kernel_folder() -> Path | None:
    """This process's kernel cache folder, made user-only if it was missing; None (with
    one warning) where it cannot be made or is not safe to read. Checked once a process
    for each root and key: every kernel's decoration asks."""
    root = cache_root()
    folder = root / folder_key()
    with _lock:
        if folder in _checked:
            return folder
    problem = kept.prepare_folder(root, folder)
    if problem is None:
        with _lock:
            _checked.add(folder)
        return folder
    with _lock:
        if str(folder) not in _warned:
            _warned.add(str(folder))
            _log.warning(
                "the CPU kernels' cache %s is not used (%s): the kernels compile in every "
                "process; make the folder the user's alone (chmod 700), or delete it",
                folder, problem,
            )  # fmt: skip
    return None


def kept_code_folder() -> Path | None:
    """Where the fast launch keeps machine code (:mod:`.numba_internals.kept_code`) and
    numba's runtime library: inside :func:`kernel_folder`, so that it is keyed and
    checked as that is; None where there is no safe kernel folder."""
    folder = kernel_folder()
    return None if folder is None else folder / "kept"


@contextlib.contextmanager
def numba_cache_dir(numba: Any) -> Iterator[Path | None]:
    """numba's cache folder set to :func:`kernel_folder` for the length of the block (a
    decoration there makes its cache in it), and put back after; yields the folder, or
    None where there is none (decorate without a cache then)."""
    with _lock:
        folder = kernel_folder()
        if folder is None:
            yield None
            return
        before = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = str(folder)
        try:
            yield folder
        finally:
            numba.config.CACHE_DIR = before


def guarded(action: Callable[..., T], *args: Any) -> T:
    """``action(*args)``, numba's load or compile of a kernel. A cache file that cannot
    be read (a disk that filled up, a copy cut short, a file of zeros) makes numba
    raise from every later run's first call of that kernel; on the public path numba's
    files of the kernels' cache are then deleted (what cannot be read cannot be trusted
    either), that is said once, and the action runs again: numba compiles anew. (The
    fast launch's cache discards such an entry itself.)"""
    try:
        return action(*args)
    except Exception as e:  # numba's unpickling of a damaged file raises anything
        if numba_internals.enabled() or not _discard_numba_files(e):
            raise
    return action(*args)


def _discard_numba_files(error: Exception) -> bool:
    """Delete numba's cache files (``*.nbi`` indexes, ``*.nbc`` data) of the kernels'
    folder; whether there were any."""
    folder = kernel_folder()
    found = [] if folder is None else [*folder.rglob("*.nbi"), *folder.rglob("*.nbc")]
    if not found:
        return False
    for path in found:
        path.unlink(missing_ok=True)
    if not _warned_damage:
        _warned_damage.append(True)
        _log.warning(
            "numba's kernel cache in %s had an unreadable entry (%s: %s); discarded, the "
            "kernels compile again (seconds, once)", folder, type(error).__name__, error,
        )  # fmt: skip
    return True

"""What is installed, as ``importlib.metadata`` says, kept between processes while the
environment stays the same.

Every launch asks which plugins and commands are installed (entry points) and a few
distributions' versions (numba's and llvmlite's, which key the CPU's kept kernels; the
GPU bindings', which key their device lists). ``importlib.metadata`` answers by
importing its e-mail parser, ``zipfile`` and ``csv`` (~17 ms) and reading the folder of
every installed distribution (~5 ms for 270 of them): ~6 % of launching a 100M model on
the 2-core Zen 4 dev machine, for answers that change only when something is installed
or removed.

So the answers asked for are kept in a small JSON file, one per interpreter, under
keys of what ``importlib.metadata`` reads: the interpreter, ``sys.path``, and the
modification time of every folder on it. Installing, upgrading or removing a
distribution adds or removes its ``.dist-info`` folder in one of them, which changes
that folder's time. A question the file does not hold, or a key that no longer
matches, is asked of ``importlib.metadata`` and the file rewritten. A folder changed in
the last seconds is not trusted (a change in the same clock tick as the reading would
leave its time as it was): such answers are given, not kept.

What the key cannot see: a metadata file edited in place, without reinstalling its
distribution (its folder stays, and so does the time of the folder holding it), and
distributions that a finder other than the standard path finder provides (then nothing
is kept). The registry asks again without the file when a kept entry point fails to
import (:func:`forget`); ``TENSORPLUG_CACHE=0`` asks in every process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import cache_folder, replace_file
from .settings import CACHE

__all__ = ["EntryPointInfo", "entry_points", "forget", "locate", "version"]

_log = logging.getLogger(__name__)

#: Bumped when what a file holds changes shape: an older file is then a miss.
FORMAT = 1

#: A folder modified less than this long ago (ns) is not trusted to be unchanged yet.
SETTLE_NS = 2_000_000_000

#: Keys kept at once, the newest: ``sys.path`` starts with the folder of the script run
#: (``tensorplug``'s in a venv's ``bin``, a user's own), so one interpreter has several.
MAX_KEYS = 8


@dataclass(frozen=True)
class EntryPointInfo:
    """An installed entry point: what ``importlib.metadata.EntryPoint`` says of it, and
    the name of the distribution that declares it (None where it has none)."""

    name: str
    value: str
    group: str
    distribution: str | None = None

    def load(self) -> Any:
        """The object the entry point names, as ``EntryPoint.load`` gives it: the module
        imported, then each attribute after the ``:`` (extras in brackets ignored)."""
        module_name, _, attrs = self.value.partition("[")[0].partition(":")
        obj: Any = importlib.import_module(module_name.strip())
        for attr in filter(None, attrs.strip().split(".")):
            obj = getattr(obj, attr)
        return obj


def _file() -> Path | None:
    """This interpreter's file (None: nothing is kept)."""
    folder = cache_folder(CACHE.get())
    if folder is None:
        return None
    who = hashlib.sha256(f"{sys.executable}\0{sys.prefix}".encode()).hexdigest()[:16]
    return folder / f"metadata-{who}.json"


def _only_path_finders() -> bool:
    """Whether every finder that can list distributions is the standard path finder:
    the key below describes only what that one reads."""
    from importlib.machinery import PathFinder

    return all(
        finder is PathFinder or not hasattr(finder, "find_distributions")
        for finder in sys.meta_path
    )


def _key() -> tuple[str, bool] | None:
    """What ``importlib.metadata`` would read, hashed, and whether it has settled (no
    folder changed in the last :data:`SETTLE_NS`); None where no key can describe it."""
    if not _only_path_finders():
        return None
    now = time.time_ns()
    settled = True
    seen: list[Any] = []
    for entry in sys.path:
        # an application may put a Path or bytes there: named by their text
        name = entry if isinstance(entry, str) else repr(entry)
        try:
            st = os.stat(entry or ".")
            where = os.fsdecode(os.path.abspath(entry or "."))
        except (OSError, ValueError, TypeError):  # not a path (a path hook's name), gone
            seen.append([name])
            continue
        seen.append([name, where, st.st_mtime_ns])
        settled = settled and st.st_mtime_ns < now - SETTLE_NS
    parts = [FORMAT, sys.version, sys.executable, seen]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    return digest, settled


_lock = threading.Lock()
#: the file as last read or written by this process: {"path": …, "entries": {key: answers}}
_memo: dict[str, Any] = {}


def _entries(path: Path) -> dict[str, dict[str, Any]]:
    """The file's answers by key (empty where it is missing, unreadable, or not what
    this module writes)."""
    if _memo.get("path") == path:
        memo: dict[str, dict[str, Any]] = _memo["entries"]
        return memo
    try:
        data = json.loads(path.read_bytes())
        entries = data["entries"] if data["format"] == FORMAT else {}
        if not isinstance(entries, dict) or not all(isinstance(a, dict) for a in entries.values()):
            entries = {}
    except (OSError, ValueError, KeyError, TypeError):
        entries = {}
    _memo.update(path=path, entries=entries)
    return entries


def _kept(question: str, ask: Callable[[], Any], valid: Callable[[Any], bool],
          fresh: bool = False) -> Any:  # fmt: skip
    """The answer to ``question`` (JSON values): from the kept file where it holds one
    under the current key that ``valid`` accepts (unless ``fresh``), else ``ask()``'s,
    then kept where the key has settled and the answer is new (a kept answer of another
    shape, written by hand or by another version, is replaced)."""
    path = _file()
    found = None if path is None else _key()
    if path is None or found is None:
        return ask()
    key, settled = found
    with _lock:
        answers = _entries(path).get(key, {})
        if question in answers and not fresh and valid(answers[question]):
            return answers[question]
    answer = ask()
    if settled and (question not in answers or answers[question] != answer):
        with _lock:
            entries = dict(_entries(path))
            answers = {**entries.pop(key, {}), question: answer}  # the newest key last
            entries = dict([*list(entries.items())[-(MAX_KEYS - 1) :], (key, answers)])
            try:
                replace_file(path, json.dumps({"format": FORMAT, "entries": entries}).encode())
            except OSError as e:  # a read-only home: asked again next time, as without it
                _log.debug("could not keep installed metadata in %s: %s", path, e)
            else:
                _memo.update(path=path, entries=entries)
    return answer


def _text_or_none(answer: Any) -> bool:
    return answer is None or isinstance(answer, str)


def _entry_point_rows(answer: Any) -> bool:
    """Whether ``answer`` is what :func:`_ask_entry_points` gives: [name, value, dist] rows."""
    return isinstance(answer, list) and all(
        isinstance(row, list) and len(row) == 3 and isinstance(row[0], str)
        and isinstance(row[1], str) and _text_or_none(row[2])
        for row in answer
    )  # fmt: skip


def _ask_entry_points(group: str) -> list[list[str | None]]:
    from importlib import metadata

    found = metadata.entry_points(group=group)
    return [[ep.name, ep.value, ep.dist.name if ep.dist is not None else None] for ep in found]


def entry_points(group: str, *, fresh: bool = False) -> list[EntryPointInfo]:
    """Every installed entry point of ``group``, in ``importlib.metadata``'s order.
    ``fresh``: asked of ``importlib.metadata`` whatever is kept (a kept entry point
    failed to import: the list may be out of date in a way the key could not see), and
    kept for the next process where it changed."""
    ask = functools.partial(_ask_entry_points, group)
    rows = _kept(f"entry_points:{group}", ask, _entry_point_rows, fresh)
    return [EntryPointInfo(name, value, group, dist) for name, value, dist in rows]


def _ask_version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def version(distribution: str) -> str | None:
    """``distribution``'s installed version (read without importing it), None where it
    is not installed."""
    ask = functools.partial(_ask_version, distribution)
    answer: str | None = _kept(f"version:{distribution}", ask, _text_or_none)
    return answer


def _ask_location(distribution: str, name: str) -> str | None:
    from importlib import metadata

    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return None
    found = (dist.locate_file(f) for f in dist.files or () if f.name == name)
    return next((str(p) for p in found), None)


def locate(distribution: str, name: str) -> str | None:
    """The path of the file called ``name`` (a base name) that ``distribution``
    installed, by its record; None where it is not installed or lists no such file.
    The file itself may have gone since: the caller checks it before use."""
    ask = functools.partial(_ask_location, distribution, name)
    answer: str | None = _kept(f"file:{distribution}:{name}", ask, _text_or_none)
    return answer


def forget() -> None:
    """Drop every kept answer, this process's memory of them and the file."""
    path = _file()
    with _lock:
        _memo.clear()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()

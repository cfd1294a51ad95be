"""What is installed, as ``importlib.metadata`` says, kept between processes while the
environment stays the same.

Every launch asks which plugins and commands are installed (entry points) and a few
distributions' versions (numba's and llvmlite's, which key the CPU's kept kernels; the
GPU bindings', which key their device lists). ``importlib.metadata`` answers by
importing its e-mail parser, ``zipfile`` and ``csv`` and reading the folder of every
installed distribution: a noticeable share of launching a small model, for answers
that change only when something is installed or removed.

So the answers asked for are kept in a small JSON file, one per interpreter, under
keys of what ``importlib.metadata`` reads: the interpreter, ``sys.path``, and the
modification time of every folder on it. Installing, upgrading or removing a
distribution adds or removes its ``.dist-info`` folder in one of them, which changes
that folder's time. A question the file does not hold, or a key that no longer
matches, is asked of ``importlib.metadata`` and the file rewritten. A folder changed in
the last seconds is not trusted (a change in the same clock tick as the reading would
leave its time as it was): such answers are given, not kept.

The file is a cache, not an authority (:mod:`tensorplug.kept` reads it): a kept answer
is used only where what the installed distributions declare confirms it, read without
``importlib.metadata``. A kept entry point must be declared, as kept, by its
distribution's ``entry_points.txt`` (the first of that name on ``sys.path``), so a row
added to the file never makes discovery import a module; a kept library path must be
listed in its distribution's ``RECORD``, so it never names a library to load that the
distribution did not install; a kept version must be the one its ``.dist-info`` folder
is named with. An answer that cannot be confirmed is asked again (and, where even a
fresh answer cannot be confirmed, as for an egg, not kept).

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
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import kept
from .files import cache_folder
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

#: The largest file kept (a few KB in use): larger is not one this module wrote.
MAX_BYTES = 4 << 20


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


def _file() -> tuple[Path, Path] | None:
    """The cache folder and this interpreter's file in it (None: nothing is kept)."""
    folder = cache_folder(CACHE.get())
    if folder is None:
        return None
    who = hashlib.sha256(f"{sys.executable}\0{sys.prefix}".encode()).hexdigest()[:16]
    return folder, folder / f"metadata-{who}.json"


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


def entries_of(data: Any) -> dict[str, dict[str, Any]]:
    """The answers by key a parsed file holds (empty for another format's); raises
    where it is not what this module writes."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError("expected an object with the field 'entries'")
    if data.get("format") != FORMAT:
        return {}
    entries = data["entries"]
    for key, answers in entries.items():
        if not isinstance(answers, dict):
            raise ValueError(f"the answers under key {key[:16]}... are not an object")
    return entries  # type: ignore[no-any-return]


def _entries(root: Path, path: Path) -> dict[str, dict[str, Any]]:
    """The file's answers by key (empty where it is missing, unsafe, unreadable, or not
    what this module writes: see :mod:`tensorplug.kept`)."""
    if _memo.get("path") == path:
        memo: dict[str, dict[str, Any]] = _memo["entries"]
        return memo
    entries = kept.load_json(root, path, MAX_BYTES, entries_of) or {}
    _memo.update(path=path, entries=entries)
    return entries


def _kept(question: str, ask: Callable[[], Any], valid: Callable[[Any], bool],
          fresh: bool = False) -> Any:  # fmt: skip
    """The answer to ``question`` (JSON values): from the kept file where it holds one
    under the current key that ``valid`` accepts (unless ``fresh``), else ``ask()``'s,
    then kept where the key has settled and the answer is new (a kept answer of another
    shape, written by hand or by another version, is replaced)."""
    where = _file()
    found = None if where is None else _key()
    if where is None or found is None:
        return ask()
    root, path = where
    key, settled = found
    with _lock:
        answers = _entries(root, path).get(key, {})
        if question in answers and not fresh:
            if _valid(valid, answers[question]):
                return answers[question]
            kept.warn_once(path, f"its answer to {question!r} is not what is installed")
    answer = ask()
    if settled and (question not in answers or answers[question] != answer):
        if not _valid(valid, answer):  # a layout the check cannot confirm: asked each time
            _log.debug("not keeping the answer to %s: it cannot be checked", question)
            return answer
        with _lock:
            entries = dict(_entries(root, path))
            answers = {**entries.pop(key, {}), question: answer}  # the newest key last
            entries = dict([*list(entries.items())[-(MAX_KEYS - 1) :], (key, answers)])
            data = json.dumps({"format": FORMAT, "entries": entries}).encode()
            if kept.save(root, path, data):  # else (a read-only home) asked again next time
                _memo.update(path=path, entries=entries)
    return answer


def _valid(valid: Callable[[Any], bool], answer: Any) -> bool:
    """Whether ``valid`` accepts ``answer``; an answer it cannot even read is not valid."""
    try:
        return valid(answer)
    except (*kept.PARSE_ERRORS, OSError):
        return False


# -- what the installed distributions declare, read to check a kept answer -----------------


def _normal(name: str) -> str:
    """A distribution's name as its folder spells it (PEP 503, with underscores)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _search_path() -> tuple[str, ...]:
    return tuple(e for e in sys.path if isinstance(e, str))


@functools.lru_cache(maxsize=4)
def _dist_folders(path: tuple[str, ...]) -> dict[str, str]:
    """Each distribution's first metadata folder (``.dist-info`` or ``.egg-info``) on
    ``path``, by normalized name: the one ``importlib.metadata`` reads."""
    found: dict[str, str] = {}
    for entry in path:
        try:
            names = os.listdir(entry or ".")
        except (OSError, ValueError):
            continue
        for name in names:
            stem, _, ext = name.rpartition(".")
            if ext in ("dist-info", "egg-info"):
                found.setdefault(_normal(stem.partition("-")[0]), os.path.join(entry, name))
    return found


def _folder_of(distribution: str) -> str | None:
    return _dist_folders(_search_path()).get(_normal(distribution))


def _declared_entry_points(folder: str, group: str) -> list[tuple[str, str]]:
    """``group``'s ``(name, value)`` pairs in the distribution's ``entry_points.txt``,
    parsed as ``importlib.metadata`` parses it."""
    try:
        text = kept.read_regular(os.path.join(folder, "entry_points.txt"), 1 << 20).decode()
    except FileNotFoundError:
        return []
    pairs, section = [], None
    for line in map(str.strip, text.splitlines()):
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
        elif section == group and "=" in line:
            name, value = map(str.strip, line.split("=", 1))
            pairs.append((name, value))
    return pairs


def _recorded_location(distribution: str, name: str) -> str | None:
    """What :func:`_ask_location` answers, read from the distribution's ``RECORD``
    (ValueError where its metadata folder has none: an egg, which is not checked)."""
    folder = _folder_of(distribution)
    if folder is None:
        return None
    if not folder.endswith(".dist-info"):
        raise ValueError(f"{folder} has no RECORD")
    import csv

    text = kept.read_regular(os.path.join(folder, "RECORD"), 64 << 20).decode()
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as e:
        raise ValueError(f"{folder}/RECORD: {e}") from None
    for row in rows:
        if row and row[0].rpartition("/")[2] == name:
            return str(Path(folder).parent / row[0])
    return None


def _text_or_none(answer: Any) -> bool:
    return answer is None or isinstance(answer, str)


def _entry_points_valid(group: str, answer: Any) -> bool:
    """Whether ``answer`` is what :func:`_ask_entry_points` gives, ``[name, value,
    distribution]`` rows, each distribution's rows exactly what its ``entry_points.txt``
    declares: a kept row that no installed distribution declares is never imported."""
    if not isinstance(answer, list) or not all(
        isinstance(row, list) and len(row) == 3 and all(isinstance(v, str) for v in row)
        for row in answer
    ):
        return False
    by_distribution: dict[str, list[tuple[str, str]]] = {}
    for name, value, distribution in answer:
        by_distribution.setdefault(distribution, []).append((name, value))
    for distribution, rows in by_distribution.items():
        folder = _folder_of(distribution)
        if folder is None or rows != _declared_entry_points(folder, group):
            return False
    return True


def _ask_entry_points(group: str) -> list[list[str | None]]:
    from importlib import metadata

    found = metadata.entry_points(group=group)
    return [[ep.name, ep.value, ep.dist.name if ep.dist is not None else None] for ep in found]


def entry_points(group: str, *, fresh: bool = False) -> list[EntryPointInfo]:
    """Every installed entry point of ``group``, in ``importlib.metadata``'s order.
    ``fresh``: asked of ``importlib.metadata`` whatever is kept (a kept entry point
    failed to import: the list may be out of date in a way the key could not see), and
    kept for the next process where it changed."""
    if fresh:
        _dist_folders.cache_clear()
    ask = functools.partial(_ask_entry_points, group)
    valid = functools.partial(_entry_points_valid, group)
    rows = _kept(f"entry_points:{group}", ask, valid, fresh)
    return [EntryPointInfo(name, value, group, dist) for name, value, dist in rows]


def _ask_version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _version_valid(distribution: str, answer: Any) -> bool:
    """Whether ``answer`` is the version the distribution's ``.dist-info`` folder is
    named with (None: no such folder)."""
    folder = _folder_of(distribution)
    if folder is None or answer is None:
        return folder is None and answer is None
    name = os.path.basename(folder)
    return name.endswith(".dist-info") and name[: -len(".dist-info")].partition("-")[2] == answer


def version(distribution: str) -> str | None:
    """``distribution``'s installed version (read without importing it), None where it
    is not installed."""
    ask = functools.partial(_ask_version, distribution)
    valid = functools.partial(_version_valid, distribution)
    answer: str | None = _kept(f"version:{distribution}", ask, valid)
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
    A kept path is used only where the distribution's ``RECORD`` lists it: nothing kept
    names a library to load that the distribution did not install. The file itself may
    have gone since: the caller checks it before use."""
    ask = functools.partial(_ask_location, distribution, name)

    def valid(answer: Any) -> bool:
        return _text_or_none(answer) and answer == _recorded_location(distribution, name)

    answer: str | None = _kept(f"file:{distribution}:{name}", ask, valid)
    return answer


def forget() -> None:
    """Drop every kept answer, this process's memory of them and the file."""
    where = _file()
    with _lock:
        _memo.clear()
        _dist_folders.cache_clear()
        if where is not None:
            with contextlib.suppress(OSError):
                where[1].unlink()

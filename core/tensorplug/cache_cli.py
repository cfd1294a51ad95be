"""``tensorplug cache``: what tensorplug keeps between processes, shown, verified, cleared.

Everything kept only saves time (:mod:`tensorplug.kept`), so clearing it is always safe:
the next launch computes it again. The folders are ``TENSORPLUG_CACHE``'s (installed
metadata, GGUF headers) and ``TENSORPLUG_DEVICE_CACHE``'s (the GPU plugins' device
lists), by default both ``~/.cache/tensorplug``. Only files of the kinds listed in
:data:`KINDS` are read or removed; a link is removed, never followed, and nothing
outside those folders is touched. The CPU plugin's compiled kernels live in its own
folder of numba's caches (``cpu-kernels/``: ``docs/caches.md``) and are not listed here.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import gguf_index, installed, kept
from .files import cache_folder
from .settings import CACHE, DEVICE_CACHE

__all__ = ["KINDS", "Kept", "Kind", "Stale", "add_arguments", "find", "main"]


class Stale(str):
    """What a kept file is of, where it is of another state of it or another version:
    a miss, harmless, replaced when next needed (not counted as a problem)."""


@dataclass(frozen=True)
class Kind:
    """One kind of kept file: where it lies below its folder, what it is, and how it is
    checked (``verify(root, path)``: None where it is what tensorplug would use, else
    what is wrong, a :class:`Stale` where it is merely out of date)."""

    folder: str  # "" for the cache folder itself
    prefix: str
    what: str
    verify: Callable[[Path, Path], str | None]


def _verify_metadata(root: Path, path: Path) -> str | None:
    _, why = kept.read(root, path, installed.MAX_BYTES, _json(installed.entries_of))
    return why


def _verify_header(root: Path, path: Path) -> str | None:
    data, why = kept.read(root, path, gguf_index.MAX_BYTES, kept.parse_json)
    if why is not None:
        return why
    model = data.get("path") if isinstance(data, dict) else None
    if not isinstance(model, str):
        return "it names no model file"
    try:
        index = gguf_index.index_of(data, os.stat(model))
    except OSError:
        return Stale(f"stale: its model {model} is gone (removed when another is kept)")
    except kept.PARSE_ERRORS as e:
        return f"it does not hold what tensorplug writes ({type(e).__name__}: {e})"
    if index is None:
        return Stale(f"stale: kept for another state of {model}, or by another version")
    import numpy as np

    if not gguf_index.matches(index, np.memmap(model, mode="r")):
        return f"it does not match the header of {model} (a miss)"
    return None


def _verify_devices(root: Path, path: Path) -> str | None:
    """The list's shape (each plugin checks its records, and its key, when it reads it);
    the bounds are ``tensorplug_kernels.runtime.probe``'s, which the core cannot import."""

    def check(data: Any) -> None:
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise ValueError("expected an object with a list of 'devices'")
        if len(data["devices"]) > 256 or not all(isinstance(d, dict) for d in data["devices"]):
            raise ValueError("the devices are not at most 256 objects")

    _, why = kept.read(root, path, 4 << 20, _json(check))
    return why


def _json(check: Callable[[Any], Any]) -> Callable[[bytes], Any]:
    return lambda data: check(kept.parse_json(data))


KINDS = (
    Kind("", "metadata-", "installed metadata (entry points, versions, library paths)",
         _verify_metadata),
    Kind("gguf", "", "a GGUF file's header", _verify_header),
    Kind("devices", "", "a GPU plugin's device list", _verify_devices),
)  # fmt: skip


@dataclass(frozen=True)
class Kept:
    """One kept file found: where, its kind, its size (None: not a regular file)."""

    root: Path
    path: Path
    kind: Kind
    size: int | None


def _roots() -> list[Path]:
    roots = [cache_folder(CACHE.get()), cache_folder(DEVICE_CACHE.get())]
    return list(dict.fromkeys(r for r in roots if r is not None))


def find() -> list[Kept]:
    """Every kept file of a known kind in the cache folders, links and other non-files
    included (they are what a hostile or damaged cache holds)."""
    found: list[Kept] = []
    for root in _roots():
        for kind in KINDS:
            folder = root / kind.folder if kind.folder else root
            try:
                if kind.folder and not stat.S_ISDIR(os.lstat(folder).st_mode):
                    continue
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                if not (name.startswith(kind.prefix) and name.endswith(".json")):
                    continue
                path = folder / name
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                size = st.st_size if stat.S_ISREG(st.st_mode) else None
                found.append(Kept(root, path, kind, size))
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=("show", "verify", "clear"),
        default="show",
        help="show (the default): each kept file, its size and what it is; verify: check "
        "each as a launch would; clear: remove them (each is computed again when needed)",
    )


def _size(item: Kept) -> str:
    from .cli import format_bytes

    return format_bytes(item.size) if item.size is not None else "not a file"


def main(args: argparse.Namespace) -> int:
    from .cli import Output

    out = Output(getattr(args, "plain", True))
    items = find()
    roots = ", ".join(map(str, _roots())) or "none (caches are off)"
    action = getattr(args, "action", "show")
    if action == "clear":
        return _clear(out, items, roots)
    out.heading(f"kept in {roots}")
    if not items:
        out.text("nothing is kept")
        return 0
    rows = [[str(i.path), _size(i), i.kind.what] for i in items]
    if action == "show":
        out.table(["file", "size", "what"], rows)
        return 0
    checked = [i.kind.verify(i.root, i.path) for i in items]
    for row, found in zip(rows, checked, strict=True):
        row.append("ok" if found is None else found)
    out.table(["file", "size", "what", "check"], rows)
    problems = [c for c in checked if c is not None and not isinstance(c, Stale)]
    if problems:
        out.text(f"{len(problems)} kept file(s) would not be used (each is computed again "
                 "instead); `tensorplug cache clear` removes them")  # fmt: skip
        return 1
    return 0


def _clear(out: Any, items: list[Kept], roots: str) -> int:
    failed = 0
    for item in items:
        try:
            item.path.unlink()  # a link itself, never what it points to
        except FileNotFoundError:
            continue
        except OSError as e:
            print(f"tensorplug cache: could not remove {item.path}: {e}", file=sys.stderr)
            failed += 1
    out.text(f"removed {len(items) - failed} kept file(s) from {roots}")
    return 1 if failed else 0

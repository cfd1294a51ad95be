"""The tools on the server's own machine: Python's file system calls, and ``git
ls-files`` (then a walk of the folders) for listings."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from .process import ExecResult, OnChunk, run_command
from .tool_io import (
    JUNK_DIRS,
    LIST_TIMEOUT,
    LISTING_MAX_OUTPUT,
    ListEntry,
    Listing,
    ListKind,
    ToolIO,
    entry_depth,
)

__all__ = ["HostIO"]


class HostIO(ToolIO):
    """``cwd``: the folder relative paths resolve against and commands run in (empty:
    the server's own)."""

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        """``~`` expanded, made absolute and normalized (``.`` and ``..`` never reach
        git or the client)."""
        p = os.path.expanduser(path) if path.startswith("~") else path
        if not os.path.isabs(p):
            p = os.path.join(self.cwd or os.getcwd(), p)
        return Path(os.path.normpath(p)).as_posix()

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def file_size(self, path: str) -> int | None:
        try:
            return os.path.getsize(self.resolve(path))
        except (OSError, ValueError):  # ValueError: a NUL in the path
            return None

    def read(self, path: str) -> bytes | None:
        try:
            return Path(self.resolve(path)).read_bytes()
        except (OSError, ValueError):  # ValueError: a NUL in the path
            return None

    def write(self, path: str, content: bytes) -> bool:
        target = Path(self.resolve(path))
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        except (OSError, ValueError):
            return False
        return True

    def list_entries(self, base: str, max_depth: int, kind: ListKind) -> Listing:
        if not os.path.isdir(base):
            return Listing(error="path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_TIMEOUT
        if kind is ListKind.FILES:  # git cannot list folders: the walk does them
            git = self.run(
                ["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                LISTING_MAX_OUTPUT, LIST_TIMEOUT,
            )  # fmt: skip
            if git.exit_code == 0 and not git.timed_out:
                out = Listing()
                for line in git.output.splitlines():
                    rel = line.rstrip("\r").replace("\\", "/")
                    if not rel or (max_depth > 0 and entry_depth(rel) > max_depth):
                        continue
                    if os.path.isfile(os.path.join(base, rel)):
                        out.entries.append(ListEntry(rel))
                return out
        return _walk(base, max_depth, kind, deadline)

    def run(
        self,
        args: Sequence[str],
        max_output: int,
        timeout: float,
        on_chunk: OnChunk | None = None,
    ) -> ExecResult:
        return run_command(args, max_output, timeout, on_chunk, cwd=self.cwd or None)


def _walk(base: str, max_depth: int, kind: ListKind, deadline: float) -> Listing:
    """Depth-first, links never followed (one can point back to an ancestor)."""
    out = Listing()
    stack: list[tuple[str, str, int]] = [(base, "", 0)]
    while stack:
        folder, rel_folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)  # the same answer every time
        except OSError:
            out.truncated = True  # a subtree the caller never sees
            continue
        for entry in entries:
            if time.monotonic() >= deadline:
                out.truncated = True
                return out
            rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
                link = entry.is_symlink()
            except OSError:
                continue
            if is_dir:
                if kind is not ListKind.FILES:
                    out.entries.append(ListEntry(rel, True))
                name = entry.name.lower() if os.name == "nt" else entry.name
                if name in JUNK_DIRS or link:
                    continue
                if max_depth == 0 or depth + 1 < max_depth:
                    stack.append((entry.path, rel, depth + 1))
            elif is_file and kind is not ListKind.DIRS:
                out.entries.append(ListEntry(rel))
    return out

"""Where a tool's reads, writes and commands happen: the interface every runtime gives
(the host, a container, a host over ssh), so each tool is written once.

Paths a tool is given resolve against the request's working directory (``x-tool-cwd``)
when relative; the listing of a directory reports its junk folders (``node_modules``,
``build``...) but never walks into them: they can hold millions of files."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from .process import ExecResult, OnChunk

__all__ = [
    "JUNK_DIRS",
    "LIST_TIMEOUT",
    "LISTING_MAX_OUTPUT",
    "ListEntry",
    "ListKind",
    "Listing",
    "ToolIO",
    "entry_depth",
]

#: folders listed but never descended into (compared lowercased on Windows)
JUNK_DIRS = frozenset({
    ".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build",
    "target", ".cache", ".idea", ".vscode",
})  # fmt: skip
#: seconds one listing may take, git's and the walk's together
LIST_TIMEOUT = 15
#: the most of ``git ls-files``' output (or ``find``'s) read for one listing
LISTING_MAX_OUTPUT = 8 * 2**20


class ListKind(enum.Enum):
    FILES = "file"
    DIRS = "dir"
    ALL = "all"


@dataclass
class ListEntry:
    rel: str  # '/'-separated, relative to the listed folder
    is_dir: bool = False


@dataclass
class Listing:
    entries: list[ListEntry] = field(default_factory=list)
    error: str = ""  # set when the folder is not one
    truncated: bool = False  # the walk could not see everything (time, permissions)


def entry_depth(rel: str) -> int:
    """How deep a relative path lies: ``a/b/c`` is 3."""
    return 1 + rel.count("/")


class ToolIO(ABC):
    """The file system and process table one tool call works on."""

    @abstractmethod
    def resolve(self, path: str) -> str:
        """``path`` made absolute against the working directory."""

    @abstractmethod
    def is_dir(self, path: str) -> bool: ...

    @abstractmethod
    def is_file(self, path: str) -> bool: ...

    @abstractmethod
    def file_size(self, path: str) -> int | None:
        """The file's size in bytes, None where it cannot be had."""

    @abstractmethod
    def read(self, path: str) -> bytes | None:
        """The file's bytes, None where it cannot be read."""

    @abstractmethod
    def write(self, path: str, content: bytes) -> bool:
        """Write the file, making its folders; whether it worked."""

    @abstractmethod
    def list_entries(self, base: str, max_depth: int, kind: ListKind) -> Listing:
        """The entries under ``base`` (already resolved); ``max_depth`` 0: any depth, 1:
        its children only. Files honour ``.gitignore`` where ``base`` is in a git
        repository (``git ls-files``)."""

    @abstractmethod
    def run(
        self,
        args: Sequence[str],
        max_output: int,
        timeout: float,
        on_chunk: OnChunk | None = None,
    ) -> ExecResult:
        """Run a command in the working directory; stdout and stderr together."""

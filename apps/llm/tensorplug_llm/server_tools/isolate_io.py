"""The tools inside an isolate (a running container, a host over ssh): every read,
write and listing is a POSIX command run there (``sh``, ``cat``, ``wc``, ``find``,
``timeout`` are all it needs, a busybox image has them), wrapped into the host-side
command that reaches it (``docker exec -i ID ...``, ``ssh TARGET '...'``).

The paths travel as arguments of ``sh -c '... "$1"' _ PATH``, never spliced into the
script, and a file's content travels on stdin: nothing a client sends is parsed as shell
by the isolate. ssh re-parses its command line in a remote shell, so there the whole
command goes as one word, each argument single-quoted."""

from __future__ import annotations

import shlex
from abc import abstractmethod
from collections.abc import Sequence

from .process import ExecResult, OnChunk, run_command
from .tool_io import (
    JUNK_DIRS,
    LISTING_MAX_OUTPUT,
    ListEntry,
    Listing,
    ListKind,
    ToolIO,
    entry_depth,
)

__all__ = ["ContainerIO", "IsolateIO", "SshIO"]

#: seconds a helper command (a stat, a read, a write) may take in the isolate
HELPER_TIMEOUT = 15
#: the largest file read from an isolate
READ_MAX = 64 * 2**20


class IsolateIO(ToolIO):
    """``cwd``: the isolate's folder relative paths resolve against (POSIX paths
    whatever the host's system)."""

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    @abstractmethod
    def wrap(self, inner: Sequence[str], needs_stdin: bool) -> list[str]:
        """The host-side command that runs ``inner`` (a POSIX argv) in the isolate."""

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return f"{self.cwd}/{path}"

    def is_dir(self, path: str) -> bool:
        return self._ok(["sh", "-c", '[ -d "$1" ]', "_", self.resolve(path)])

    def is_file(self, path: str) -> bool:
        return self._ok(["sh", "-c", '[ -f "$1" ]', "_", self.resolve(path)])

    def file_size(self, path: str) -> int | None:
        res = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        if res.exit_code != 0 or res.timed_out:
            return None
        try:
            return int(res.output.strip())
        except ValueError:
            return None

    def read(self, path: str) -> bytes | None:
        # stderr apart: it must not be spliced into the file's bytes
        res = self._exec(["cat", "--", self.resolve(path)], READ_MAX, combine_stderr=False)
        if res.exit_code != 0 or res.timed_out:
            return None
        return res.raw

    def write(self, path: str, content: bytes) -> bool:
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        res = run_command(
            self.wrap(["sh", "-c", script, "_", self.resolve(path)], True),
            4096, HELPER_TIMEOUT, stdin=content,
        )  # fmt: skip
        return res.exit_code == 0 and not res.timed_out

    def list_entries(self, base: str, max_depth: int, kind: ListKind) -> Listing:
        where = self.resolve(base)
        if not self.is_dir(base):
            return Listing(error="path does not exist or is not a directory")
        out = Listing()
        if kind is ListKind.FILES:
            git = self._exec(
                ["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard',
                 "_", where],
                LISTING_MAX_OUTPUT,
            )  # fmt: skip
            if git.exit_code == 0 and not git.timed_out:
                for rel in _lines(git.output):
                    if max_depth == 0 or entry_depth(rel) <= max_depth:
                        out.entries.append(ListEntry(rel))
                return out
        if kind is not ListKind.FILES:
            out.entries += [ListEntry(r, True) for r in self._find(where, max_depth, True, out)]
        if kind is not ListKind.DIRS:
            out.entries += [ListEntry(r) for r in self._find(where, max_depth, False, out)]
        return out

    def run(
        self,
        args: Sequence[str],
        max_output: int,
        timeout: float,
        on_chunk: OnChunk | None = None,
    ) -> ExecResult:
        """The command under the isolate's own ``timeout`` (killing the host-side client
        does not kill what runs in the isolate), the host's deadline 5 s later so that
        one has the time to end it cleanly."""
        inner = ["timeout", f"{int(timeout)}s", *args]
        if self.cwd:  # no transport has a -w of its own for every one of them
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return run_command(self.wrap(inner, True), max_output, timeout + 5, on_chunk)

    def _exec(
        self, inner: Sequence[str], max_output: int, combine_stderr: bool = True
    ) -> ExecResult:
        return run_command(
            self.wrap(inner, False), max_output, HELPER_TIMEOUT, combine_stderr=combine_stderr
        )

    def _ok(self, inner: Sequence[str]) -> bool:
        res = self._exec(inner, 4096)
        return res.exit_code == 0 and not res.timed_out

    def _find(self, where: str, max_depth: int, dirs: bool, out: Listing) -> list[str]:
        """One ``find`` pass: junk folders pruned (listed when folders are asked for),
        ``-mindepth``/``-maxdepth`` as busybox's find takes them too."""
        prune = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIRS))
        cmd = 'cd "$1" && find . -mindepth 1'
        if max_depth > 0:
            cmd += f" -maxdepth {max_depth}"
        cmd += f" \\( {prune} \\) -prune"
        cmd += " -print -o -type d -print" if dirs else " -o -type f -print"
        res = self._exec(["sh", "-c", cmd, "_", where], LISTING_MAX_OUTPUT)
        out.truncated = out.truncated or res.timed_out
        return _lines(res.output, strip_dot=True)


class ContainerIO(IsolateIO):
    """A running container, through ``docker exec`` or ``podman exec`` (the same verbs
    and argument order)."""

    def __init__(self, engine: str, container: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.engine, self.container = engine, container

    def wrap(self, inner: Sequence[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container, *inner]


class SshIO(IsolateIO):
    """A host over ssh: remoting, not isolation (the tools can do whatever the target's
    account can). Key-based only and a host key already trusted: there is no terminal
    for a prompt, which would hang the call."""

    OPTIONS = (
        "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
        "-o", "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes",
    )  # fmt: skip

    def __init__(self, target: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.target = target

    def wrap(self, inner: Sequence[str], needs_stdin: bool) -> list[str]:
        quoted = " ".join(shlex.quote(a) for a in inner)
        return ["ssh", *self.OPTIONS, *([] if needs_stdin else ["-n"]), self.target, quoted]


def _lines(text: str, strip_dot: bool = False) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        if not line:
            continue
        if strip_dot and line.startswith("./"):
            line = line[2:]
        out.append(line.replace("\\", "/"))
    return out

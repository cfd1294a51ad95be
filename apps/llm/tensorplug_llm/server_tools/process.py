"""One command run to its end for a tool: its output (stdout and, unless told not to,
stderr) read as raw bytes while it runs, capped at a size but always drained (a child
writing into a full pipe would never exit), handed out chunk by chunk to a streaming
caller, and a deadline after which the command is killed.

The command runs in a session of its own and the deadline kills that whole process
group: killing only ``sh`` would leave ``sleep 100`` behind, holding the pipe open, and
the read would wait for it."""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["ExecResult", "kill_group", "run_command"]

#: a chunk of output for a streaming caller; returning False stops the command
OnChunk = Callable[[str], bool]

_POSIX = sys.platform != "win32"


@dataclass
class ExecResult:
    raw: bytes  # what the command wrote, cut where it was cut
    exit_code: int = -1
    timed_out: bool = False

    @property
    def output(self) -> str:
        return self.raw.decode("utf-8", "replace")


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` and, on POSIX, every process of its session (it leads one)."""
    try:
        if _POSIX:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError, OSError):
        pass


def run_command(
    args: Sequence[str],
    max_output: int,
    timeout: float,
    on_chunk: OnChunk | None = None,
    *,
    combine_stderr: bool = True,
    cwd: str | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """Run ``args`` (searched on PATH) and wait for it. Past ``max_output`` bytes the
    output is cut and ends with ``[output truncated]``; past ``timeout`` seconds the
    command is killed and ``timed_out`` is set. ``stdin`` is written, then closed (a
    client that reads its input to the end would otherwise wait for ever)."""
    try:
        proc = subprocess.Popen(
            list(args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
            cwd=cwd or None,
            start_new_session=_POSIX,
        )
    except (OSError, ValueError):
        return ExecResult(b"failed to spawn process")
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        kill_group(proc)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if stdin:
                proc.stdin.write(stdin)
            proc.stdin.close()
        except OSError:  # a short write is no error by itself: the exit code decides
            pass
        out = _drain(proc, proc.stdout.fileno(), max_output, on_chunk)
        code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            kill_group(proc)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return ExecResult(out, code, timed_out.is_set())


def _drain(
    proc: subprocess.Popen[bytes], fd: int, max_output: int, on_chunk: OnChunk | None
) -> bytes:
    kept = bytearray()
    truncated = False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        try:
            data = os.read(fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        if truncated:
            continue  # drained, not kept: the child must not block on a full pipe
        room = max_output - len(kept)
        piece = data[:room]
        kept += piece
        truncated = len(data) > room
        if on_chunk is not None and piece:
            text = decoder.decode(piece)
            if text and not on_chunk(text):
                kill_group(proc)
                break
    return bytes(kept) + b"\n[output truncated]" if truncated else bytes(kept)

"""One MCP server over stdio: a child process, one JSON-RPC message a line each way
(MCP's stdio transport), the ``initialize`` handshake, ``tools/list`` and
``tools/call``.

This is a client of its own, not the ``mcp`` SDK's: what ``/tools`` must guarantee is
lifecycle the SDK keeps to itself. Its ``stdio_client`` is an async context manager
that must be entered and left in one task of one event loop, while a server's calls
come from many requests' threads, live across them, and must be cancelled from the
signal handler at shutdown within a fraction of a second (llama.cpp's tests stop the
server in under 3 s with a 10 s call in flight; the SDK's teardown is its own, and has
varied between versions); a call that times out must leave the session usable for the
next one (its late reply dropped); a crashed server must be noticed and started again;
a server whose grandchild keeps its pipes open must not hang the reader waiting for
their end; and a server gets this server's whole environment with the configuration's
``env`` over it (as llama-server and Cursor give it; the SDK passes a few variables
only). Each of these is a few lines here, with threads:

- a reader thread polls the child's stdout (every 50 ms it checks whether the session
  is closing, so an end of file that never comes cannot hold it) and hands each reply
  to the call that waits for its id; notifications, replies to calls that gave up and
  lines that are not JSON are dropped;
- another drains stderr (an undrained pipe blocks the child) and keeps its tail for the
  log;
- a call writes its request (non-blocking: a child that stops reading cannot hold it)
  and waits for its reply, its deadline or its cancellation, whichever comes first;
  calls to one server may overlap, each waits for its own id.

The child leads a process group of its own (on POSIX), and :meth:`StdioSession.close`
kills that group: what it started goes with it."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .mcp_config import McpServerConfig

__all__ = ["McpToolDef", "StdioSession", "tool_result"]

log = logging.getLogger("tensorplug.server")

PROTOCOL_VERSION = "2024-11-05"
POLL = 0.05  # seconds between checks of a waiting reader or call
MAX_LINE = 8 * 2**20  # a longer line is dropped, so a child that never ends one is bounded
ERR_TAIL = 4096
_POSIX = sys.platform != "win32"

ShouldStop = Callable[[], bool]


@dataclass(frozen=True)
class McpToolDef:
    server: str
    name: str  # the server's own name for it, without the "<server>_" prefix
    description: str
    input_schema: Any  # JSON Schema of its arguments, or None


def _rpc_error(reply: dict[str, Any]) -> str:
    e = reply.get("error")
    if isinstance(e, dict) and isinstance(e.get("message"), str):
        return str(e["message"])
    return e if isinstance(e, str) else "unknown error"


def tool_result(result: Any) -> dict[str, Any]:
    """A ``tools/call`` result as ``/tools`` answers: the text parts of its content
    joined by newlines in ``plain_text_response``, or ``error`` where it says
    ``isError``."""
    parts = result.get("content") if isinstance(result, dict) else None
    texts = [
        str(p.get("text", ""))
        for p in parts or ()
        if isinstance(p, dict) and p.get("type") == "text"
    ]
    text = "\n".join(texts)
    if isinstance(result, dict) and result.get("isError") is True:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


class _Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: dict[str, Any] | None = None


class StdioSession:
    """One run of one configured server: :meth:`start`, calls, :meth:`close`. A
    session whose process ended stays dead (:meth:`alive` False): the caller starts
    another."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.running = threading.Event()
        self.ids = itertools.count(1)
        self.pending: dict[int, _Waiter] = {}
        self.lock = threading.Lock()  # pending
        self.write_lock = threading.Lock()  # one message at a time on stdin
        self.init_lock = threading.Lock()
        self.initialized = False
        self.tools: list[McpToolDef] | None = None
        self.last_error = ""
        self.err_tail = ""
        self.threads: list[threading.Thread] = []

    def start(self) -> bool:
        cfg = self.config
        env = {**os.environ, **cfg.env} if cfg.env else None
        try:
            self.proc = subprocess.Popen(
                [cfg.command, *cfg.args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, cwd=cfg.cwd or None, start_new_session=_POSIX, bufsize=0,
            )  # fmt: skip
        except (OSError, ValueError) as e:
            self.last_error = f"failed to spawn {cfg.command!r}: {e}"
            return False
        assert self.proc.stdin is not None and self.proc.stdout and self.proc.stderr
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.running.set()
        self.threads = [
            threading.Thread(target=self._read_replies, name=f"mcp-{cfg.name}-out", daemon=True),
            threading.Thread(target=self._read_stderr, name=f"mcp-{cfg.name}-err", daemon=True),
        ]
        for t in self.threads:
            t.start()
        return True

    def alive(self) -> bool:
        return self.running.is_set() and self.proc is not None and self.proc.poll() is None

    def diagnostics(self) -> str:
        tail = self.err_tail.strip()
        return "; ".join(s for s in (self.last_error, tail and f"last stderr: {tail}") if s)

    def close(self) -> None:
        """End the process (stdin closed, a moment to leave, then its group killed)
        and the threads; idempotent, and never waits on a pipe."""
        self.running.clear()
        self._wake_all()
        proc = self.proc
        if proc is None:
            return
        with self.write_lock:  # a writer sees running cleared within one poll
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        try:  # the whole group: a grandchild holding the pipes goes too
            if _POSIX:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except OSError:
            pass
        proc.wait()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    def list_tools(self, should_stop: ShouldStop) -> list[McpToolDef]:
        """The server's tools (asked once a session), [] where it cannot tell."""
        if not self._ensure_init(should_stop):
            return []
        if self.tools is not None:
            return self.tools
        tools: list[McpToolDef] = []
        cursor: str | None = None
        for _ in range(100):  # pages, each naming the next
            reply = self._request("tools/list", {"cursor": cursor} if cursor else None,
                                  should_stop)  # fmt: skip
            result = reply.get("result")
            if not isinstance(result, dict):
                self.last_error = f"tools/list failed: {_rpc_error(reply)}"
                return tools
            for t in result.get("tools") or ():
                if isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"]:
                    desc = t.get("description")
                    tools.append(McpToolDef(self.config.name, t["name"],
                                            desc if isinstance(desc, str) else "",
                                            t.get("inputSchema")))  # fmt: skip
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        self.tools = tools
        return tools

    def call_tool(self, name: str, arguments: dict[str, Any], should_stop: ShouldStop
                  ) -> dict[str, Any]:  # fmt: skip
        if not self._ensure_init(should_stop):
            return {"error": self.last_error}
        reply = self._request("tools/call", {"name": name, "arguments": arguments}, should_stop)
        if "error" in reply:
            return {"error": _rpc_error(reply)}
        if "result" in reply:
            return tool_result(reply["result"])
        return {"error": "invalid response from MCP server"}

    def _ensure_init(self, should_stop: ShouldStop) -> bool:
        with self.init_lock:
            if self.initialized:
                return True
            reply = self._request("initialize", {
                "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                "clientInfo": {"name": "tensorplug", "version": "1.0"},
            }, should_stop)  # fmt: skip
            if "result" not in reply:
                self.last_error = f"initialize failed: {_rpc_error(reply)}"
                return False
            self._write({"jsonrpc": "2.0", "method": "notifications/initialized"},
                        time.monotonic() + self.config.timeout_ms / 1000, should_stop)  # fmt: skip
            self.initialized = True
            return True

    def _request(self, method: str, params: dict[str, Any] | None, should_stop: ShouldStop
                 ) -> dict[str, Any]:  # fmt: skip
        """The reply to one request, or a JSON-RPC error of our own: ``cancelled``,
        ``request timed out`` or ``transport closed``."""
        deadline = time.monotonic() + self.config.timeout_ms / 1000
        waiter = _Waiter()
        with self.lock:
            rid = next(self.ids)
            self.pending[rid] = waiter
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        try:
            if self._write(msg, deadline, should_stop):
                while not waiter.event.wait(POLL):
                    if should_stop() or time.monotonic() >= deadline:
                        break
        finally:
            with self.lock:
                self.pending.pop(rid, None)
        if waiter.reply is not None:
            return waiter.reply
        if should_stop():
            why = "cancelled"
        elif time.monotonic() >= deadline:
            why = "request timed out"
        else:
            why = "transport closed"
        return {"error": {"code": -32603, "message": why}}

    def _write(self, msg: dict[str, Any], deadline: float, should_stop: ShouldStop) -> bool:
        proc = self.proc
        if proc is None or proc.stdin is None or not self.running.is_set():
            return False
        data = (json.dumps(msg, ensure_ascii=False) + "\n").encode("utf-8", "replace")
        fd = proc.stdin.fileno()
        with self.write_lock:
            while data:
                if not self.running.is_set() or should_stop() or time.monotonic() >= deadline:
                    return False
                try:
                    n = os.write(fd, data)
                except BlockingIOError:
                    _wait(fd, writable=True)
                    continue
                except OSError:  # the child closed its stdin or left
                    return False
                data = data[n:]
        return True

    def _read_replies(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            _pump(self.proc.stdout.fileno(), self.running, self._on_line)
        finally:
            self.running.clear()
            self._wake_all()

    def _on_line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return  # not JSON: skipped
        rid = msg.get("id") if isinstance(msg, dict) else None
        if rid is None or isinstance(rid, bool):
            return  # a notification (or a request of the server's: none is answered)
        with self.lock:
            waiter = self.pending.get(rid) if isinstance(rid, int) else None
        if waiter is not None and ("result" in msg or "error" in msg):
            waiter.reply = msg
            waiter.event.set()

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None

        def keep(line: bytes) -> None:
            text = line.decode("utf-8", "replace")
            log.debug("MCP %r stderr: %s", self.config.name, text)
            self.err_tail = (self.err_tail + text + "\n")[-ERR_TAIL:]

        _pump(self.proc.stderr.fileno(), self.running, keep)

    def _wake_all(self) -> None:
        with self.lock:
            waiters = list(self.pending.values())
        for w in waiters:
            w.event.set()


def _wait(fd: int, writable: bool = False) -> bool:
    """Whether ``fd`` is ready within one poll interval (always, where select cannot
    wait on a pipe: Windows then blocks in the read)."""
    if not _POSIX:
        return True
    try:
        r, w, _ = select.select([] if writable else [fd], [fd] if writable else [], [], POLL)
    except (OSError, ValueError):
        return True  # the read or write that follows reports it
    return bool(r or w)


def _pump(fd: int, running: threading.Event, on_line: Callable[[bytes], None]) -> None:
    """``on_line`` for each line read from ``fd`` until its end, an error, or
    ``running`` cleared (checked every :data:`POLL` seconds)."""
    buf = b""
    skipping = False  # inside a line longer than MAX_LINE, until its end
    while running.is_set():
        if not _wait(fd):
            continue
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[:nl].rstrip(b"\r"), buf[nl + 1 :]
            if skipping:
                skipping = False
            elif line:
                on_line(line)
        if len(buf) > MAX_LINE:
            log.warning("MCP: dropping a line longer than %d bytes from a server", MAX_LINE)
            buf, skipping = b"", True

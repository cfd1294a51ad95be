"""The configured MCP servers, as llama-server keeps them: each is started once when
the server starts (the warm-up) to learn its tools, then stopped; the first call to one
of its tools starts it again, and it is kept for the calls after. One that died (a
crash, a kill) is started again at the next call; one that cannot be started is not
tried again for :data:`COOLDOWN` seconds, and its calls answer an ``error`` meanwhile.
A server that fails never stops the others, nor the server: its tools are missing,
and the log says why.

:meth:`McpServers.shutdown` (the server's signal handler) makes every call in flight
return at once, so stopping never waits for a slow tool; :meth:`McpServers.close`
then ends the processes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .mcp_config import McpServerConfig
from .mcp_stdio import McpToolDef, StdioSession
from .tool import StreamSink, Tool

__all__ = ["COOLDOWN", "WARM_UP_TIMEOUT", "McpServers", "McpTool"]

log = logging.getLogger("tensorplug.server")

#: seconds a server that could not be started is left alone
COOLDOWN = 5.0
#: seconds each server has at the start to list its tools
WARM_UP_TIMEOUT = 10.0


class McpServers:
    def __init__(self, configs: Sequence[McpServerConfig]) -> None:
        self.configs = {c.name: c for c in configs}
        self.lock = threading.Lock()  # sessions, dead
        self.sessions: dict[str, StdioSession] = {}
        self.dead: dict[str, float] = {}  # name -> when it may be tried again
        self.registry: list[McpToolDef] = []
        self.stopping = threading.Event()

    def warm_up(self) -> None:
        """Start every server, list its tools, stop it; the servers side by side, each
        within :data:`WARM_UP_TIMEOUT` seconds."""
        if not self.configs:
            return
        with ThreadPoolExecutor(min(8, len(self.configs)), "mcp-warm-up") as pool:
            found = list(pool.map(self._discover, self.configs.values()))
        self.registry = [t for tools in found for t in tools]

    def _discover(self, cfg: McpServerConfig) -> list[McpToolDef]:
        session = StdioSession(cfg)
        if not session.start():
            log.warning("MCP warm-up: failed to start %r: %s", cfg.name, session.diagnostics())
            return []
        deadline = time.monotonic() + WARM_UP_TIMEOUT
        try:
            tools = session.list_tools(
                lambda: self.stopping.is_set() or time.monotonic() >= deadline
            )
        finally:
            session.close()
        if not tools and session.last_error:
            log.warning("MCP warm-up: %r: %s", cfg.name, session.diagnostics())
        log.info("MCP warm-up: %r has %d tools", cfg.name, len(tools))
        return tools

    def tools(self) -> list[McpToolDef]:
        return list(self.registry)

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        should_stop: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """The tool's result as ``/tools`` answers it (``plain_text_response`` or
        ``error``)."""
        session = self._session(server)
        if session is None:
            return {"error": f"MCP server unavailable: {server}"}

        def stop() -> bool:
            return self.stopping.is_set() or (should_stop is not None and should_stop())

        return session.call_tool(tool, arguments, stop)

    def _session(self, name: str) -> StdioSession | None:
        """The server's live session, started (again) where there is none."""
        stale: StdioSession | None = None
        with self.lock:
            if self.stopping.is_set() or name not in self.configs:
                return None
            now = time.monotonic()
            if self.dead.get(name, 0.0) > now:
                return None
            self.dead.pop(name, None)
            session = self.sessions.get(name)
            if session is not None and session.alive():
                return session
            if session is not None:
                log.warning("MCP %r is no longer running: %s", name, session.diagnostics())
                stale = self.sessions.pop(name)
            fresh = StdioSession(self.configs[name])
            started = fresh.start()
            if started:
                self.sessions[name] = fresh
            else:
                log.warning("MCP %r: failed to start: %s", name, fresh.diagnostics())
                self.dead[name] = now + COOLDOWN
        if stale is not None:
            stale.close()
        return fresh if started else None

    def shutdown(self) -> None:
        """Every call in flight returns ("cancelled"), and none starts; idempotent."""
        self.stopping.set()

    def close(self) -> None:
        self.shutdown()
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            s.close()


class McpTool(Tool):
    """One tool of an MCP server, as ``<server>_<tool>`` (how llama-server names them,
    and a name OpenAI's function names allow)."""

    kind = "mcp"

    def __init__(self, tool: McpToolDef, servers: McpServers) -> None:
        self.tool, self.servers = tool, servers
        self.name = self.display_name = f"{tool.server}_{tool.name}"

    def definition(self) -> dict[str, Any]:
        schema = self.tool.input_schema
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.tool.description,
                # a server that gives no schema: a function of no arguments
                "parameters": schema
                if isinstance(schema, dict)
                else {"type": "object", "properties": {}},
            },
        }

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        # the request's cwd, runtime and resp_type are the built-in tools', not arguments
        arguments = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
        return self.servers.call(self.tool.server, self.tool.name, arguments)

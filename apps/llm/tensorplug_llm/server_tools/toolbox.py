"""The tools one server offers at ``/tools``: the built-in ones ``--tools`` names, the
MCP servers' (``--mcp-servers-config``, ``--mcp-servers-json``), and the runtime they
run in (``--tools-runtime``), started and stopped with the server.

What a call carries beside the model's arguments comes from the request's headers,
never from its parameters: ``x-tool-cwd`` (the working directory), ``x-tool-runtime``
(the isolate; else ``--tools-runtime``'s) and ``x-resp-type`` (``read_file`` in
base64). A model's ``cwd`` argument is dropped: the client decides where it works."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .file_tools import EditFile, ReadFile, WriteFile
from .mcp_config import McpServerConfig
from .mcp_servers import McpServers, McpTool
from .runtime import SpawnedContainer, StaticRuntime, tools_runtime
from .search_tools import FileGlobSearch, GrepSearch
from .shell_tools import ExecShellCommand, GetInfo
from .tool import Tool

__all__ = ["BUILTIN_TOOLS", "ToolBox", "UnknownTool", "builtin_tools"]

log = logging.getLogger("tensorplug.server")

#: the built-in tools, in llama-server's order (small, local file and shell tools only:
#: anything higher belongs to an MCP server)
BUILTIN_TOOLS: tuple[type[Tool], ...] = (
    ReadFile, FileGlobSearch, GrepSearch, ExecShellCommand, WriteFile, EditFile, GetInfo,
)  # fmt: skip

#: the parameters a request's headers set (whatever the model put there is dropped)
HEADER_PARAMS = {"cwd": "x-tool-cwd", "runtime": "x-tool-runtime", "resp_type": "x-resp-type"}


class UnknownTool(LookupError):
    """A tool that is not offered, or that cannot stream when asked to (a 404)."""


def builtin_tools(names: Sequence[str]) -> list[Tool]:
    """The built-in tools ``--tools`` names (``all``: every one), in their order; a
    ValueError names one that does not exist."""
    known = [t.name for t in BUILTIN_TOOLS]
    for name in names:
        if name != "all" and name not in known:
            raise ValueError(f'unknown tool "{name}". available tools: {", ".join(known)}')
    wanted = set(names)
    return [t() for t in BUILTIN_TOOLS if "all" in wanted or t.name in wanted]


class ToolBox:
    def __init__(
        self,
        tools: Sequence[Tool] = (),
        mcp: McpServers | None = None,
        runtime: SpawnedContainer | StaticRuntime | None = None,
    ) -> None:
        self.tools: list[Tool] = list(tools)
        self.mcp, self.runtime = mcp, runtime
        if mcp is not None:
            seen = {t.name for t in self.tools}
            for found in mcp.tools():
                tool = McpTool(found, mcp)
                if tool.name in seen:
                    log.warning("MCP tool %r of server %r has the name of another tool, skipped",
                                tool.name, found.server)  # fmt: skip
                    continue
                seen.add(tool.name)
                self.tools.append(tool)

    @classmethod
    def start(
        cls,
        names: Sequence[str] = (),
        mcp_configs: Sequence[McpServerConfig] = (),
        runtime: str = "",
    ) -> ToolBox:
        """The tools of the command line: the runtime started (a container spawned for
        ``docker:IMAGE``), the MCP servers warmed up. ValueError (a tool name),
        :class:`~.runtime.ToolRuntimeError` (the runtime) say what is wrong."""
        tools = builtin_tools(names)
        rt = tools_runtime(runtime) if runtime else None
        mcp = McpServers(mcp_configs) if mcp_configs else None
        try:
            if mcp is not None:
                mcp.warm_up()
            box = cls(tools, mcp, rt)
        except BaseException:
            if mcp is not None:
                mcp.close()
            if rt is not None:
                rt.close()
            raise
        return box

    def listing(self) -> list[dict[str, Any]]:
        return [t.listing() for t in self.tools]

    def find(self, name: str, stream: bool = False) -> Tool:
        for t in self.tools:
            if t.name == name:
                if stream and not t.stream:
                    raise UnknownTool(f'tool "{name}" does not support stream = true')
                return t
        raise UnknownTool(f'unknown tool "{name}"')

    def call_params(
        self, params: Mapping[str, Any], headers: Mapping[str, str], in_runtime: bool = True
    ) -> dict[str, Any]:
        """The model's ``params`` with the request's own (from ``headers``, whose names
        are lowercase) in place of any it gave; ``--tools-runtime``'s runtime where the
        request names none and the tool runs in one (``in_runtime``: a built-in tool,
        not an MCP server's)."""
        out = {k: v for k, v in params.items() if k not in HEADER_PARAMS}
        for key, header in HEADER_PARAMS.items():
            if headers.get(header):
                out[key] = headers[header]
        if in_runtime and "runtime" not in out and self.runtime is not None:
            out["runtime"] = self.runtime.spec()
        return out

    def shutdown(self) -> None:
        """Calls in flight return now (MCP's); from the signal handler, before the HTTP
        server waits for its requests to end."""
        if self.mcp is not None:
            self.mcp.shutdown()

    def close(self) -> None:
        """The MCP servers ended, the spawned container removed."""
        if self.mcp is not None:
            self.mcp.close()
        if self.runtime is not None:
            self.runtime.close()

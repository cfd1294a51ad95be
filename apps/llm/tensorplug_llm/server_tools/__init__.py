"""llama-server's server tools for ``tensorplug serve --tools`` and its MCP servers
(``--mcp-servers-config``, ``--mcp-servers-json``): what ``GET /tools`` lists and
``POST /tools`` runs (:mod:`tensorplug_llm.http.tools_routes`).

They run commands and write files with the server's rights, for any client that can
reach the server: off unless a flag turns them on. :mod:`.toolbox` holds what one
server offers; the built-in tools are :mod:`.file_tools`, :mod:`.search_tools` and
:mod:`.shell_tools`, each working through a runtime (:mod:`.runtime`: the host, a
container, ssh); :mod:`.mcp_servers` keeps the MCP servers, each a
:mod:`.mcp_stdio` session."""

from __future__ import annotations

from .mcp_config import McpConfigError, McpServerConfig, load_configs
from .runtime import ToolRuntimeError
from .tool import ParamError, Tool
from .toolbox import BUILTIN_TOOLS, ToolBox, UnknownTool

__all__ = [
    "BUILTIN_TOOLS",
    "McpConfigError",
    "McpServerConfig",
    "ParamError",
    "Tool",
    "ToolBox",
    "ToolRuntimeError",
    "UnknownTool",
    "load_configs",
]

"""The MCP servers a server is told to run: ``--mcp-servers-config FILE`` and
``--mcp-servers-json JSON``, both in the format Cursor, Claude Desktop and llama-server
read::

    {"mcpServers": {"NAME": {"command": "...", "args": [...], "env": {...},
                             "cwd": "...", "timeout_ms": 30000}}}

Only stdio servers (a command to run) are taken; an entry without a ``command`` is
skipped with a warning, as llama-server's. Text that is not JSON, a file that cannot be
read or a field of the wrong type is a :class:`McpConfigError`: the server does not
start on a configuration it would half follow."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_TIMEOUT_MS", "McpConfigError", "McpServerConfig", "load_configs"]

log = logging.getLogger("tensorplug.server")

#: how long one tool call may take, unless the entry says (``timeout_ms``)
DEFAULT_TIMEOUT_MS = 30000


class McpConfigError(ValueError):
    pass


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # over the server's environment
    cwd: str = ""
    timeout_ms: int = DEFAULT_TIMEOUT_MS


def _entry(name: str, cfg: Any) -> McpServerConfig | None:
    if not isinstance(cfg, dict):
        raise McpConfigError(f"mcpServers.{name} must be an object")

    def text(key: str) -> str:
        value = cfg.get(key, "")
        if not isinstance(value, str):
            raise McpConfigError(f"mcpServers.{name}.{key} must be a string")
        return value

    args = cfg.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"mcpServers.{name}.args must be an array of strings")
    env = cfg.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise McpConfigError(f"mcpServers.{name}.env must be an object of strings")
    timeout = cfg.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise McpConfigError(f"mcpServers.{name}.timeout_ms must be a number of milliseconds > 0")
    command = text("command")
    if not command:
        log.warning("MCP server %r has no command, skipping", name)
        return None
    return McpServerConfig(name, command, tuple(args), dict(env), text("cwd"), int(timeout))


def parse_configs(text: str) -> list[McpServerConfig]:
    """The servers of one configuration's JSON text."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"failed to parse MCP config JSON: {e}") from None
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        log.warning('MCP config: no servers found in JSON (no "mcpServers" object)')
        return []
    out = [c for name, cfg in servers.items() if (c := _entry(name, cfg)) is not None]
    if not out:
        log.warning("MCP config: no servers found in JSON")
    return out


def load_configs(file: str | None, inline: str | None) -> list[McpServerConfig]:
    """``--mcp-servers-config``'s servers then ``--mcp-servers-json``'s; a name given
    twice keeps its first entry (calls find a server by name)."""
    texts: list[str] = []
    if file:
        try:
            texts.append(Path(file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise McpConfigError(f"failed to open MCP config file: {file} ({e})") from None
    if inline:
        texts.append(inline)
    out: list[McpServerConfig] = []
    for text in texts:
        for cfg in parse_configs(text):
            if any(c.name == cfg.name for c in out):
                log.warning("MCP config: duplicate server name %r, skipping", cfg.name)
                continue
            out.append(cfg)
    return out

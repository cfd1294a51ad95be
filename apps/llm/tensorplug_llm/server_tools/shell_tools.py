"""``exec_shell_command`` (any shell command: ``sh -c``, or ``cmd /c`` on a Windows
host) and ``get_info`` (the system and working directory the tools see)."""

from __future__ import annotations

import os
import sys
from typing import Any

from .runtime import io_for
from .tool import StreamSink, Tool, function_definition, opt_int, opt_str, required_str

__all__ = ["ExecShellCommand", "GetInfo"]

#: the most output a command gives back, and the longest it may run (seconds)
EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT = 60
INFO_MAX_OUTPUT = 4096
INFO_TIMEOUT = 5


def _shell(command: str, isolated: bool) -> list[str]:
    """An isolate is always POSIX, whatever the host's system."""
    if sys.platform == "win32" and not isolated:
        return ["cmd", "/c", command]
    return ["sh", "-c", command]


class ExecShellCommand(Tool):
    name, display_name = "exec_shell_command", "Execute shell command"
    uses_cwd, write, stream = True, True, True

    def definition(self) -> dict[str, Any]:
        return function_definition(
            self.name,
            "Execute a shell command and return its output (stdout and stderr combined).",
            {
                "command": {"type": "string", "description": "Shell command to execute"},
                "timeout": {"type": "integer", "description":
                            f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT})"},
                "max_output_size": {"type": "integer", "description":
                                    f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})"},
            },
            ["command"],
        )  # fmt: skip

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        command = required_str(params, "command")
        timeout = min(opt_int(params, "timeout", 10), EXEC_MAX_TIMEOUT)
        max_output = max(0, min(opt_int(params, "max_output_size", EXEC_MAX_OUTPUT),
                                EXEC_MAX_OUTPUT))  # fmt: skip
        io = io_for(params)
        args = _shell(command, bool(opt_str(params, "runtime", "")))
        if sink is None:
            res = io.run(args, max_output, timeout)
            return {"plain_text_response": res.output + _tail(res.exit_code, res.timed_out)}
        gone = False

        def forward(chunk: str) -> bool:
            nonlocal gone
            gone = gone or not sink(chunk)
            return not gone

        res = io.run(args, max_output, timeout, forward)
        if not gone:
            sink(_tail(res.exit_code, res.timed_out))
        return {}


def _tail(code: int, timed_out: bool) -> str:
    return f"\n[exit code: {code}]" + (" [exit due to timed out]" if timed_out else "")


class GetInfo(Tool):
    name, display_name, uses_cwd = "get_info", "Get Runtime Info", True

    def definition(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": "Returns runtime info: the OS name/version and the current "
                "working directory",
                "parameters": {"type": "object", "properties": {}},
            },
        }

    def invoke(self, params: dict[str, Any], sink: StreamSink | None = None) -> dict[str, Any]:
        io = io_for(params)
        isolated = bool(opt_str(params, "runtime", ""))
        host_windows = sys.platform == "win32" and not isolated
        res = io.run(["cmd", "/c", "ver"] if host_windows else ["uname", "-a"],
                     INFO_MAX_OUTPUT, INFO_TIMEOUT)  # fmt: skip
        system = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = opt_str(params, "cwd", "")
        if not cwd and not isolated:
            cwd = os.getcwd()
        elif not cwd:
            pwd = io.run(["pwd"], INFO_MAX_OUTPUT, INFO_TIMEOUT)
            cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": system, "cwd": cwd}

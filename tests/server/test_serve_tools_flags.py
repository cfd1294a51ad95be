"""``tensorplug serve``'s ``--tools``, ``--tools-runtime``, ``--mcp-servers-config`` and
``--mcp-servers-json`` as llama-server's: a bad name or configuration stops the server
in one line before the model loads, and CORS narrows to localhost while tools are on."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorplug.cli import main
from tensorplug.errors import RunError
from tensorplug_llm import run_cli
from tensorplug_llm.serve_cli import add_arguments
from tensorplug_llm.serve_flags import cors_origins, tools_settings


def _no_loading(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the model was loaded")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--tools", "read_file,bogus"], 'unknown tool "bogus". available tools: read_file'),
        (["--mcp-servers-json", "not valid json"], "failed to parse MCP config JSON"),
        (["--mcp-servers-config", "/nonexistent/path.json"], "failed to open MCP config file"),
        (["--tools", "all", "--tools-runtime", "fake:x"], "unknown tool runtime: fake:x"),
    ],
)
def test_a_bad_tools_setting_stops_the_server_in_one_line(
    flags: list[str], error: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(run_cli, "load_model", _no_loading)
    assert main(["serve", "--tiny", "--port", "0", *flags]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("tensorplug serve: error: ")
    assert error in err.splitlines()[-1]


def test_tools_settings_read_both_sources(tmp_path: Path) -> None:
    file = tmp_path / "mcp.json"
    file.write_text(json.dumps({"mcpServers": {"a": {"command": "x"}}}))
    args = _parse(["--tools", " read_file, get_info ", "--mcp-servers-config", str(file),
                   "--mcp-servers-json", '{"mcpServers": {"b": {"command": "y"}}}'])  # fmt: skip
    names, configs = tools_settings(args)
    assert names == ["read_file", "get_info"]
    assert [c.name for c in configs] == ["a", "b"]
    assert tools_settings(_parse([])) == ([], [])
    with pytest.raises(RunError, match="mcpServers.a.args"):
        tools_settings(_parse(["--mcp-servers-json", '{"mcpServers": {"a": {"args": 1}}}']))


def test_cors_narrows_to_localhost_while_tools_are_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert cors_origins(None, False) is None  # every origin, as llama-server's default
    assert cors_origins(None, True) == ["localhost"]
    assert "--cors-origins defaults to localhost" in capsys.readouterr().err
    assert cors_origins("https://a.example, b", True) == ["https://a.example", "b"]


def test_the_tools_flags_are_parsed() -> None:
    argv = ["--tools", "all", "--tools-runtime", "docker:busybox", "--mcp-servers-json",
            '{"mcpServers": {}}', "--mcp-servers-config", "m.json"]  # fmt: skip
    args = _parse(argv)
    assert (args.tools, args.tools_runtime) == ("all", "docker:busybox")
    assert (args.mcp_servers_json, args.mcp_servers_config) == ('{"mcpServers": {}}', "m.json")


def test_the_toolbox_starts_before_and_closes_after_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve`` starts the tools with the listener, registers their shutdown as a stop
    hook (MCP calls in flight return at once) and closes them when it ends."""
    from mcp_fake import write_server

    from tensorplug_llm.serve_cli import _tools
    from tensorplug_llm.server_tools import McpServerConfig

    class Listening:
        def __init__(self) -> None:
            self.on_stop: list[Any] = []

    fake = McpServerConfig("fake", sys.executable, (str(write_server(tmp_path)),))
    listening = Listening()
    with _tools(["read_file"], [fake], "", listening) as box:  # type: ignore[arg-type]
        assert box is not None and box.mcp is not None
        assert [t.name for t in box.tools][:2] == ["read_file", "fake_echo"]
        assert listening.on_stop == [box.shutdown]
        assert box.mcp.call("fake", "add", {"a": 1, "b": 1}) == {"plain_text_response": "2"}
        sessions = list(box.mcp.sessions.values())
    assert box.mcp.stopping.is_set() and not any(s.alive() for s in sessions)
    with _tools([], [], "docker:x", Listening()) as none:  # type: ignore[arg-type]
        assert none is None  # a runtime alone serves nothing, as llama-server's
    assert "--tools-runtime without --tools" in capsys.readouterr().err

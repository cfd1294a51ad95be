"""MCP servers behind ``/tools`` (``tensorplug_llm.server_tools``), against a fake
stdio server run with this Python (``mcp_fake.py``): the configuration as Cursor and
llama-server write it, the warm-up that learns the tools, calls and their results, and
what a server that misbehaves (a crash, a hang, a notification and garbage before its
reply, a grandchild holding its pipes, a bad command) must not do to the others or to
shutdown. Every wait is on a fact the server leaves (a file per request), none on time.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp_fake import write_server

from tensorplug_llm.server_tools import McpConfigError, McpServerConfig, ToolBox, load_configs
from tensorplug_llm.server_tools.mcp_servers import McpServers
from tensorplug_llm.server_tools.mcp_stdio import McpToolDef, StdioSession, tool_result
from tensorplug_llm.server_tools.toolbox import builtin_tools

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")


def _config(
    script: Path,
    name: str = "fake",
    marks: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_ms: int = 30000,
) -> McpServerConfig:
    more = {"MARKS": str(marks)} if marks else {}
    return McpServerConfig(
        name, sys.executable, (str(script),), {**more, **(env or {})}, "", timeout_ms
    )


def _wait_for(path: Path, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return write_server(tmp_path)


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


@pytest.fixture
def servers(script: Path, marks: Path) -> Iterator[McpServers]:
    mcp = McpServers([_config(script, marks=marks)])
    mcp.warm_up()
    yield mcp
    mcp.close()


def test_the_config_is_cursors_format_from_a_file_and_inline(tmp_path: Path) -> None:
    file = tmp_path / "mcp.json"
    file.write_text(json.dumps({"mcpServers": {
        "a": {"command": "a-cmd", "args": ["-x"], "env": {"K": "V"}, "cwd": "/w",
              "timeout_ms": 500},
        "nocommand": {"args": []},
    }}))  # fmt: skip
    inline = json.dumps({"mcpServers": {"a": {"command": "dup"}, "b": {"command": "b-cmd"}}})
    got = load_configs(str(file), inline)
    assert got == [
        McpServerConfig("a", "a-cmd", ("-x",), {"K": "V"}, "/w", 500),
        McpServerConfig("b", "b-cmd"),  # "a" again: the first one kept
    ]
    assert got[1].timeout_ms == 30000
    assert load_configs(None, json.dumps({"servers": {}})) == []


@pytest.mark.parametrize(
    ("file", "inline", "why"),
    [
        (None, "not valid json", "failed to parse MCP config JSON"),
        ("/nonexistent/path.json", None, "failed to open MCP config file: /nonexistent"),
        (None, '{"mcpServers": {"a": {"command": "x", "args": [1]}}}', "a.args must be"),
        (None, '{"mcpServers": {"a": {"command": "x", "timeout_ms": 0}}}', "a.timeout_ms"),
        (None, '{"mcpServers": {"a": {"command": 5}}}', "a.command must be a string"),
        (None, '{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', "a.env must be"),
        (None, '{"mcpServers": {"a": []}}', "mcpServers.a must be an object"),
    ],
)
def test_a_bad_config_is_refused_whole(file: str | None, inline: str | None, why: str) -> None:
    with pytest.raises(McpConfigError, match=why):
        load_configs(file, inline)


def test_warm_up_lists_the_tools_then_stops_the_server(servers: McpServers, marks: Path) -> None:
    names = [t.name for t in servers.tools()]
    assert names == ["echo", "add", "noisy", "crash", "hang", "bad", "fail", "args"]
    echo = servers.tools()[0]
    assert echo.server == "fake" and echo.description == "Echo back the message"
    assert echo.input_schema["required"] == ["message"]
    assert (marks / "initialize-").exists() and (marks / "notifications_initialized-").exists()
    assert servers.sessions == {}  # stopped after the warm-up: a call starts it again


def test_calls_answer_the_text_of_the_result(servers: McpServers) -> None:
    assert servers.call("fake", "echo", {"message": "hello world"}) == {
        "plain_text_response": "echo: hello world"
    }
    assert servers.call("fake", "add", {"a": 3, "b": 5}) == {"plain_text_response": "8"}
    assert len(servers.sessions) == 1  # kept for the next calls
    session = servers.sessions["fake"]
    assert servers.call("fake", "echo", {"message": "again"})["plain_text_response"] == (
        "echo: again"
    )
    assert servers.sessions["fake"] is session


def test_errors_come_back_as_the_results_error(servers: McpServers) -> None:
    assert servers.call("fake", "bad", {}) == {"error": "it went wrong"}
    assert servers.call("fake", "fail", {}) == {"error": "the tool failed"}
    assert servers.call("nosuch", "echo", {}) == {"error": "MCP server unavailable: nosuch"}


def test_notifications_garbage_and_others_replies_are_skipped(servers: McpServers) -> None:
    assert servers.call("fake", "noisy", {}) == {"plain_text_response": "after the noise"}
    assert servers.call("fake", "echo", {"message": "x"}) == {"plain_text_response": "echo: x"}


def test_a_crashed_server_is_started_again_at_the_next_call(servers: McpServers) -> None:
    assert servers.call("fake", "echo", {"message": "1"})["plain_text_response"] == "echo: 1"
    first = servers.sessions["fake"]
    assert servers.call("fake", "crash", {}) == {"error": "transport closed"}
    assert servers.call("fake", "echo", {"message": "2"}) == {"plain_text_response": "echo: 2"}
    assert servers.sessions["fake"] is not first and not first.alive()


def test_a_timed_out_call_leaves_the_session_usable(script: Path, marks: Path) -> None:
    mcp = McpServers([_config(script, marks=marks, timeout_ms=300)])
    try:
        assert mcp.call("fake", "hang", {}) == {"error": "request timed out"}
        assert (marks / "tools_call-hang").exists()  # it was asked, and never answered
        assert mcp.call("fake", "echo", {"message": "ok"}) == {"plain_text_response": "echo: ok"}
    finally:
        mcp.close()


def test_shutdown_cancels_a_call_in_flight(servers: McpServers, marks: Path) -> None:
    got: list[dict[str, object]] = []
    call = threading.Thread(target=lambda: got.append(servers.call("fake", "hang", {})))
    call.start()
    _wait_for(marks / "tools_call-hang")  # the server has it: the call is waiting
    servers.shutdown()
    call.join(60)
    assert got == [{"error": "cancelled"}]
    assert servers.call("fake", "echo", {"message": "x"}) == {
        "error": "MCP server unavailable: fake"
    }


def test_concurrent_calls_each_get_their_own_reply(servers: McpServers) -> None:
    results: dict[int, dict[str, object]] = {}

    def call(i: int) -> None:
        results[i] = servers.call("fake", "echo", {"message": f"m{i}"})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: {"plain_text_response": f"echo: m{i}"} for i in range(10)}


def test_a_bad_command_leaves_the_others_and_is_left_alone_a_while(script: Path) -> None:
    good = _config(script, "good")
    bad = McpServerConfig("bad", "this_executable_does_not_exist_12345")
    mcp = McpServers([bad, good])
    try:
        mcp.warm_up()
        assert {t.server for t in mcp.tools()} == {"good"}
        assert mcp.call("bad", "x", {}) == {"error": "MCP server unavailable: bad"}
        assert "bad" in mcp.dead  # not started again at every call (a cool-down)
        assert mcp.call("bad", "x", {}) == {"error": "MCP server unavailable: bad"}
        assert mcp.call("good", "add", {"a": 1, "b": 2}) == {"plain_text_response": "3"}
    finally:
        mcp.close()


def test_a_grandchild_holding_the_pipes_holds_neither_start_nor_stop(
    script: Path, marks: Path
) -> None:
    """The server's child inherits its stdout and stderr and outlives it: the readers
    poll, so closing never waits for the end of a pipe, and the whole process group is
    killed, the grandchild with it."""
    mcp = McpServers([_config(script, marks=marks, env={"GRANDCHILD": "1"})])
    mcp.warm_up()  # returns: the warm-up's session closed
    assert [t.name for t in mcp.tools()][:1] == ["echo"]
    assert mcp.call("fake", "echo", {"message": "hi"}) == {"plain_text_response": "echo: hi"}
    pid = int((marks / "grandchild").read_text())
    mcp.close()
    deadline = time.monotonic() + 60
    while _running(pid):
        assert time.monotonic() < deadline, "the grandchild outlived the server"
        time.sleep(0.01)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (its parent, the MCP server, is gone: init reaps it) counts as ended
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_tools_listed_over_pages(script: Path) -> None:
    session = StdioSession(_config(script, env={"PAGED": "1"}))
    assert session.start()
    try:
        names = [t.name for t in session.list_tools(lambda: False)]
    finally:
        session.close()
    assert names[:2] == ["echo", "add"] and len(names) == 8


def test_mcp_tools_join_the_toolbox_as_server_tool(servers: McpServers) -> None:
    box = ToolBox([], servers)
    listed = {t["tool"]: t for t in box.listing()}
    assert "fake_echo" in listed and "fake_add" in listed
    echo = listed["fake_echo"]
    assert echo["type"] == "mcp" and echo["permissions"] == {"write": False}
    assert echo["definition"] == {"type": "function", "function": {
        "name": "fake_echo", "description": "Echo back the message",
        "parameters": {"type": "object",
                       "properties": {"message": {"type": "string", "maxLength": 8}},
                       "required": ["message"]},
    }}  # fmt: skip
    # a tool without a schema: a function of no arguments, still an object schema
    assert listed["fake_noisy"]["definition"]["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }
    # the request's cwd and runtime are the built-in tools', not the MCP tool's arguments
    params = box.call_params({"x": 1, "cwd": "/model/says"}, {"x-tool-cwd": "/tmp"})
    assert params == {"x": 1, "cwd": "/tmp"}
    assert box.find("fake_args").invoke(params) == {"plain_text_response": '{"x": 1}'}


def test_an_mcp_tool_named_as_a_built_in_one_is_skipped() -> None:
    mcp = McpServers([])
    mcp.registry = [McpToolDef("read", "file", "", None), McpToolDef("read", "echo", "", None)]
    box = ToolBox(builtin_tools(["read_file"]), mcp)
    assert [t.name for t in box.tools] == ["read_file", "read_echo"]
    assert box.find("read_file").kind == "server"


def test_a_result_is_its_text_parts_joined() -> None:
    two = {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert tool_result(two) == {"plain_text_response": "a\nb"}
    assert tool_result({"content": []}) == {"plain_text_response": ""}
    assert tool_result({"isError": True}) == {"error": "MCP tool returned an error"}
    assert tool_result(None) == {"plain_text_response": ""}

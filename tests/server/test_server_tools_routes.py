"""``GET /tools`` and ``POST /tools`` over HTTP as llama-server answers them: off (403
``feature_disabled``) unless tools are given, behind the API key, the status codes its
test suite pins (400 for a body the tool cannot take, 404 for a tool not offered or
not streaming, 500 for a runtime that cannot be used), the streamed shell command, and
an MCP tool's definition taken by ``/v1/chat/completions`` as one of its ``tools`` (how
a client gives the model the server's tools)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient
from mcp_fake import write_server
from tiny_server import TinyModel, tiny_model

from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.server_tools import McpServerConfig, ToolBox
from tensorplug_llm.server_tools.mcp_servers import McpServers
from tensorplug_llm.server_tools.toolbox import builtin_tools

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell tools")

KEY = "sk-tools"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("tools"), n_ctx=1024)  # room for the tools
    yield m
    m.close()


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolBox]:
    script = write_server(tmp_path_factory.mktemp("mcp"))
    mcp = McpServers([McpServerConfig("echo", sys.executable, (str(script),))])
    mcp.warm_up()
    tools = ToolBox(builtin_tools(["all"]), mcp)
    yield tools
    tools.close()


@pytest.fixture(scope="module")
def http(model: TinyModel, box: ToolBox) -> TestClient:
    return TestClient(create_app(model.llm, ServerConfig(api_key=KEY, tools=box)))


def post(http: TestClient, body: Any, **headers: str) -> Any:
    content = body if isinstance(body, str) else json.dumps(body)
    hdrs = {**AUTH, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return http.post("/tools", content=content, headers=hdrs)


def test_without_tools_the_routes_are_403_feature_disabled(model: TinyModel) -> None:
    off = TestClient(create_app(model.llm, ServerConfig()))
    for r in (off.get("/tools"), off.post("/tools", json={"tool": "read_file"})):
        assert r.status_code == 403
        assert r.json()["error"]["message"] == "this feature is disabled"
        assert r.json()["error"]["type"] == "feature_disabled"


def test_the_key_is_asked_for(http: TestClient) -> None:
    assert http.get("/tools").status_code == 401
    assert http.post("/tools", json={"tool": "get_info", "params": {}}).status_code == 401
    assert http.get("/tools", headers={"x-api-key": KEY}).status_code == 200


def test_get_lists_built_in_then_mcp_tools(http: TestClient) -> None:
    listed = http.get("/tools", headers=AUTH).json()
    names = [t["tool"] for t in listed]
    assert names[:7] == [
        "read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file",
        "edit_file", "get_info",
    ]  # fmt: skip
    assert "echo_echo" in names and "echo_add" in names
    assert {t["type"] for t in listed} == {"server", "mcp"}


def test_post_runs_a_tool_with_the_headers_cwd(http: TestClient, tmp_path: Path) -> None:
    (tmp_path / "rel.txt").write_text("relative-content")
    r = post(http, {"tool": "read_file", "params": {"path": "rel.txt", "cwd": "/nope"}},
             x_tool_cwd=str(tmp_path))  # fmt: skip
    assert r.status_code == 200
    assert r.json() == {"plain_text_response": "relative-content\n"}
    r = post(http, {"tool": "read_file", "params": {"path": "missing.txt"}},
             x_tool_cwd=str(tmp_path))  # fmt: skip
    assert r.status_code == 200 and r.json() == {"error": "cannot stat file: missing.txt"}
    r = post(http, {"tool": "echo_add", "params": {"a": 3, "b": 5}})
    assert r.status_code == 200 and r.json() == {"plain_text_response": "8"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ("{not json", 400, "the request body is not valid JSON"),
        ([1], 400, "the request body must be a JSON object"),
        ({"params": {}}, 400, "tool: the name of a tool (a string) is required"),
        ({"tool": "read_file", "params": []}, 400, "params: must be an object"),
        ({"tool": "read_file", "stream": "yes"}, 400, "stream: must be a boolean"),
        ({"tool": "read_file", "params": {}}, 400, "params.path is required"),
        ({"tool": "edit_file", "params": {"path": "x", "edits": [{"new_text": "a"}]}}, 400,
         "params.edits[0].old_text is required"),
        ({"tool": "nope"}, 404, 'unknown tool "nope"'),
        ({"tool": "read_file", "stream": True}, 404,
         'tool "read_file" does not support stream = true'),
    ],
)  # fmt: skip
def test_bad_requests(http: TestClient, body: Any, status: int, message: str) -> None:
    r = post(http, body)
    assert r.status_code == status
    assert r.json()["error"]["message"].startswith(message)


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand"),
        ("podman-container:--privileged", "invalid container id: --privileged"),
    ],
)
def test_a_runtime_that_cannot_be_used_is_500(http: TestClient, runtime: str, message: str) -> None:
    r = post(http, {"tool": "exec_shell_command", "params": {"command": "echo hi"}},
             x_tool_runtime=runtime)  # fmt: skip
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"
    assert r.json()["error"]["message"].startswith(message)


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_exec_shell_command_streams_then_says_done(http: TestClient) -> None:
    body = {"tool": "exec_shell_command", "params": {"command": "echo hello"}, "stream": True}
    with http.stream("POST", "/tools", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.read().decode())
    assert events[-1] == {"done": True}
    assert "".join(e["chunk"] for e in events[:-1]) == "hello\n\n[exit code: 0]"
    body["params"] = {}  # the error of a streamed call is its last event's
    with http.stream("POST", "/tools", json=body, headers=AUTH) as r:
        assert _events(r.read().decode()) == [{"done": True, "error": "params.command is required"}]


def test_an_mcp_tools_definition_is_a_chat_completions_tool(http: TestClient) -> None:
    """A client gives the model the server's tools by passing their definitions as
    ``tools`` to the chat route (llama-server's web UI does), then runs its calls
    through ``POST /tools``."""
    listed = http.get("/tools", headers=AUTH).json()
    echo = next(t for t in listed if t["tool"] == "echo_echo")["definition"]
    assert echo["type"] == "function"
    assert echo["function"]["parameters"]["type"] == "object"
    chat = {
        "messages": [{"role": "user", "content": "say hi"}], "tools": [echo],
        "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 256,
        "temperature": 0,
    }  # fmt: skip
    r = http.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert r.status_code == 200, r.text
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["echo_echo"]
    args = json.loads(calls[0]["function"]["arguments"])
    assert set(args) == {"message"}
    ran = post(http, {"tool": "echo_echo", "params": args})  # the client runs the call
    assert ran.json() == {"plain_text_response": f"echo: {args['message']}"}

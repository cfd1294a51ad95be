"""A tiny stdio MCP server for the tests, as a script written into a test's folder and
run with this Python: one JSON-RPC message a line, with tools that each misbehave in
one way a real server may (a notification and a line that is not JSON before the
reply, a crash, a reply that never comes, an error result).

``MARKS`` (an environment variable) names a folder where the server leaves a file
per request it received (``<method>-<tool>``) and its grandchild's pid, so a test
waits on facts, never on time."""

from __future__ import annotations

from pathlib import Path

__all__ = ["SERVER", "write_server"]

SERVER = r"""
import json, os, subprocess, sys

MARKS = os.environ.get("MARKS", "")
TOOLS = [
    {"name": "echo", "description": "Echo back the message",
     "inputSchema": {"type": "object",
                     "properties": {"message": {"type": "string", "maxLength": 8}},
                     "required": ["message"]}},
    {"name": "add", "description": "Add two numbers",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"},
                                                      "b": {"type": "number"}}}},
    {"name": "noisy", "description": "A notification and garbage before the reply"},
    {"name": "crash", "description": "Exit without replying"},
    {"name": "hang", "description": "Never reply"},
    {"name": "bad", "description": "An error result"},
    {"name": "fail", "description": "A JSON-RPC error"},
    {"name": "args", "description": "The arguments it got, as JSON"},
]
PAGED = os.environ.get("PAGED") == "1"
if os.environ.get("GRANDCHILD") == "1":  # keeps our stdout and stderr open
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    if MARKS:
        open(os.path.join(MARKS, "grandchild"), "w").write(str(child.pid))

def mark(name):
    if MARKS:
        open(os.path.join(MARKS, name), "w").close()

def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()

for line in sys.stdin:
    if not line.strip():
        continue
    req = json.loads(line)
    rid, method, params = req.get("id"), req.get("method"), req.get("params") or {}
    mark(f"{method}-{params.get('name', '')}".replace("/", "_"))
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
            "serverInfo": {"name": "fake", "version": "1"}}})
    elif method == "tools/list":
        if PAGED and not params.get("cursor"):
            send({"jsonrpc": "2.0", "id": rid,
                  "result": {"tools": TOOLS[:1], "nextCursor": "page2"}})
        else:
            send({"jsonrpc": "2.0", "id": rid,
                  "result": {"tools": TOOLS[1:] if PAGED else TOOLS}})
    elif method == "tools/call":
        name, args = params.get("name"), params.get("arguments") or {}
        text = None
        if name == "echo":
            text = "echo: " + str(args.get("message", ""))
        elif name == "add":
            text = str(args.get("a", 0) + args.get("b", 0))
        elif name == "args":
            text = json.dumps(args, sort_keys=True)
        elif name == "noisy":
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                                         "params": {"progress": 1}}) + "\nTHIS IS NOT JSON\n")
            send({"jsonrpc": "2.0", "id": rid + 1000, "result": {}})  # someone else's id
            text = "after the noise"
        elif name == "crash":
            os._exit(3)
        elif name == "hang":
            continue
        elif name == "bad":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": "it went wrong"}], "isError": True}})
            continue
        else:
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32000, "message": "the tool failed"}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [
            {"type": "text", "text": text}, {"type": "image", "data": "", "mimeType": "x"}]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no method"}})
"""


def write_server(folder: Path) -> Path:
    path = folder / "fake_mcp.py"
    path.write_text(SERVER)
    return path

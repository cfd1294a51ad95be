"""llama-server's ``/cors-proxy`` (``--ui-mcp-proxy``): off, a 403; on, the request goes
to the target with only the headers the caller names for it, and the target's status,
headers and body come back."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from fastapi.testclient import TestClient
from tiny_server import TinyModel, tiny_model

from tensorplug_llm.server import ServerConfig, create_app


class _Target(BaseHTTPRequestHandler):
    """Records each request; GET answers JSON, POST echoes its body (204 when empty)."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        self._record(b"")
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Target", "yes")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._record(body)
        if not body:
            self.send_response(204)
            self.end_headers()
            return
        self.send_response(201)
        self.send_header("Content-Type", self.headers.get("Content-Type", "text/plain"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _record(self, body: bytes) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.seen.append({"method": self.command, "headers": headers, "body": body})

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("cors-proxy"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def http(model: TinyModel) -> TestClient:
    return TestClient(create_app(model.llm, ServerConfig(api_key="k", cors_proxy=True)))


KEY = {"Authorization": "Bearer k"}


def test_off_it_is_llama_servers_403(model: TinyModel, target: str) -> None:
    off = TestClient(create_app(model.llm, ServerConfig()))
    r = off.get("/cors-proxy", params={"url": target})
    assert r.status_code == 403 and r.json()["error"]["type"] == "feature_disabled"


def test_only_the_headers_named_for_the_target_reach_it(http: TestClient, target: str) -> None:
    _Target.seen.clear()
    r = http.get("/cors-proxy", params={"url": target + "/models?x=1"}, headers={
        **KEY, "Cookie": "session=secret", "X-Api-Key": "k", "Proxy-Authorization": "Basic s",
        "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer theirs",
    })  # fmt: skip
    assert r.status_code == 200 and r.json() == {"path": "/models?x=1"}
    assert r.headers["x-target"] == "yes" and r.headers["content-type"] == "application/json"
    (seen,) = _Target.seen
    assert seen["headers"]["accept"] == "application/json"
    assert seen["headers"]["authorization"] == "Bearer theirs"  # not this server's key
    assert not {"cookie", "x-api-key", "proxy-authorization"} & set(seen["headers"])


def test_a_post_sends_its_body_and_gets_the_targets_status(http: TestClient, target: str) -> None:
    _Target.seen.clear()
    r = http.post("/cors-proxy", params={"url": target}, headers=KEY, json={"jsonrpc": "2.0"})
    assert r.status_code == 201 and r.json() == {"jsonrpc": "2.0"}
    assert _Target.seen[0]["headers"]["content-type"] == "application/json"
    r = http.post("/cors-proxy", params={"url": target}, headers=KEY)
    assert r.status_code == 204 and r.content == b""


@pytest.mark.parametrize(
    ("url", "says"),
    [(None, "?url="), ("ftp://example.com/", "scheme"), ("http:///x", "missing host"),
     ("http://u:p@127.0.0.1/", "authentication")],
)  # fmt: skip
def test_a_bad_target_is_400_naming_the_url(http: TestClient, url: str | None, says: str) -> None:
    r = http.get("/cors-proxy", params={} if url is None else {"url": url}, headers=KEY)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "url" and says in error["message"]


def test_an_unreachable_target_is_502(http: TestClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, nobody listens
    r = http.get("/cors-proxy", params={"url": f"http://127.0.0.1:{port}/"}, headers=KEY)
    assert r.status_code == 502 and "failed" in r.json()["error"]["message"]


def test_the_key_is_asked_before_anything_is_proxied(http: TestClient, target: str) -> None:
    _Target.seen.clear()
    assert http.get("/cors-proxy", params={"url": target}).status_code == 401
    assert _Target.seen == []

"""Response header names go out as llama-server writes them (``Content-Type``,
``Access-Control-Allow-Origin``, ``Process-Start-Time-Unix``), over a real socket of
serve's protocol: scripts that read headers into a plain dict (llama.cpp's server
tests) find them."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from tiny_server import TinyModel, tiny_model
from uvicorn_thread import UvicornThread

from tensorplug_llm.http.header_case import canonical
from tensorplug_llm.server import ServerConfig, create_app


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UvicornThread]:
    m: TinyModel = tiny_model(tmp_path_factory.mktemp("header_case"))
    # h11, the protocol serve runs (uvicorn's httptools writes every name in lower case)
    server = UvicornThread(create_app(m.llm, ServerConfig(metrics=True)), http="h11")
    yield server
    server.stop()
    m.close()


def _raw_names(server: UvicornThread, method: str, path: str, **headers: str) -> dict[str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        response.read()
        return dict(response.getheaders())  # the names as they came over the wire
    finally:
        conn.close()


def test_header_names_keep_llama_servers_case(served: UvicornThread) -> None:
    preflight = _raw_names(served, "OPTIONS", "/completions", Origin="web.example",
                           **{"Access-Control-Request-Method": "POST"})  # fmt: skip
    assert preflight["Access-Control-Allow-Origin"] == "web.example"
    assert preflight["Access-Control-Allow-Methods"]
    assert "access-control-allow-origin" not in preflight
    metrics = _raw_names(served, "GET", "/metrics")
    assert metrics["Content-Type"].startswith("text/plain")
    assert 0 < int(metrics["Process-Start-Time-Unix"]) <= time.time()
    refused = _raw_names(served, "GET", "/no-such-route")
    assert "Content-Type" in refused and "content-type" not in refused


def test_canonical_case_capitalizes_each_word() -> None:
    assert canonical(b"access-control-allow-origin") == b"Access-Control-Allow-Origin"
    assert canonical(b"x-request-id") == b"X-Request-Id"
    assert canonical(b"etag") == b"Etag"

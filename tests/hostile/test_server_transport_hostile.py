"""The server's connections under clients that misbehave at the HTTP level, over raw
sockets on 127.0.0.1: a head or a body that never finishes, an idle connection, too
many connections, an unknown HTTP version. The server's limits are set small and
every wait is bounded generously: a test waits for the server to act, it never races
a timer."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="the server needs tensorplug-llm[serve]")

from tensorplug_llm.api import LLM
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.serve_cli import _Listening, bind
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

SHORT = 0.3  # the server's timeouts under test
LONG = 60.0  # a limit no test reaches
BOUND = 30.0  # how long a test waits for the server to act


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    path: Path = write_tiny_llama(tmp_path_factory.mktemp("transport") / "tiny.gguf", "q8_0", 0)
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=64, warmup=False)
    model = LLM(llama, n_parallel=1, model_name="tiny.gguf")
    try:
        yield model
    finally:
        model.close()
        llama.close()


@contextmanager
def serving(llm: LLM, body_timeout: float = LONG, **transport: Any) -> Iterator[int]:
    """A server on a free port of 127.0.0.1 (its port), with ``transport``'s limits."""
    sockets = bind("127.0.0.1", 0)
    with _Listening(sockets, **transport) as listening:
        listening.ready(create_app(llm, ServerConfig(body_timeout=body_timeout)))
        yield sockets[0].getsockname()[1]


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    return sock


def _response(sock: socket.socket) -> tuple[int, dict[str, Any] | None]:
    """The status of the response read from ``sock``, and its JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"the server closed the connection without answering: {data!r}"
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    # names compared without case, as HTTP says (serve writes them capitalized)
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        got = sock.recv(65536)
        assert got, "the server closed the connection within the body"
        body += got
    is_json = "json" in headers.get("content-type", "")
    return status, json.loads(body) if is_json else None


def _closed(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (waiting at most BOUND seconds)."""
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"


def test_a_connection_that_sends_nothing_is_closed(llm: LLM) -> None:
    with serving(llm, header_timeout=SHORT) as port, _connect(port) as sock:
        assert _closed(sock)


def test_a_head_that_never_ends_is_closed(llm: LLM) -> None:
    with serving(llm, header_timeout=SHORT) as port, _connect(port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
        sock.sendall(b"X-Slow: 1\r\n")
        assert _closed(sock)


def test_a_kept_alive_connection_whose_next_head_never_ends_is_closed(llm: LLM) -> None:
    with serving(llm, idle_timeout=SHORT, header_timeout=SHORT) as port, _connect(port) as sock:
        sock.sendall(GET_HEALTH)
        assert _response(sock)[0] == 200
        sock.sendall(b"GET /health HT")  # a byte received stops uvicorn's keep-alive timer
        assert _closed(sock)


def test_a_body_shorter_than_its_length_is_a_408_and_the_connection_is_closed(
    llm: LLM,
) -> None:
    body = b'{"prompt": "a'
    with serving(llm, body_timeout=SHORT) as port, _connect(port) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + body
        )
        status, error = _response(sock)
        assert status == 408 and error is not None
        assert "Content-Length" in error["error"]["message"]
        assert _closed(sock)


def test_connections_past_the_limit_are_answered_503_in_openais_shape(llm: LLM) -> None:
    with serving(llm, max_connections=3, header_timeout=LONG, idle_timeout=LONG) as port:
        held = [_connect(port) for _ in range(3)]
        try:
            for sock in held:  # each answered: the server has counted it
                sock.sendall(GET_HEALTH)
                assert _response(sock)[0] == 200
            with _connect(port) as fourth:
                fourth.sendall(GET_HEALTH)
                status, error = _response(fourth)
                assert status == 503 and error is not None
                assert error["error"]["type"] == "unavailable_error"
                assert error["error"]["code"] == 503
                message = error["error"]["message"]
                assert "connection limit (3 open at once)" in message
                assert "retry after 1 s" in message and "--max-connections" in message
                assert _closed(fourth)  # past the cap, the connection is not kept
            held.pop().close()
            # once the server has seen that close, a new connection is served again
            for _ in range(int(BOUND / 0.05)):
                with _connect(port) as again:
                    again.sendall(GET_HEALTH)
                    if _response(again)[0] == 200:
                        break
            else:
                pytest.fail("a connection closed under the cap did not free its place")
        finally:
            for sock in held:
                sock.close()


def test_the_connection_cap_holds_while_the_model_loads(llm: LLM) -> None:
    sockets = bind("127.0.0.1", 0)
    port = sockets[0].getsockname()[1]
    limits = {"max_connections": 1, "header_timeout": LONG, "idle_timeout": LONG}
    with _Listening(sockets, **limits), _connect(port) as first:
        first.sendall(GET_HEALTH)
        status, error = _response(first)  # answered: the server has counted it
        assert status == 503 and error is not None
        assert error["error"]["message"] == "Loading model"
        with _connect(port) as second:
            second.sendall(GET_HEALTH)
            status, error = _response(second)
            assert status == 503 and error is not None
            assert "connection limit (1 open at once)" in error["error"]["message"]


def test_an_unknown_http_version_is_refused(llm: LLM) -> None:
    with serving(llm) as port, _connect(port) as sock:
        sock.sendall(b"GET /health HTTP/9.9\r\nHost: test\r\n\r\n")
        status, error = _response(sock)
        assert status == 505 and error is not None
        assert "HTTP/9.9 is not supported" in error["error"]["message"]

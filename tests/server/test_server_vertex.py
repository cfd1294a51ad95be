"""Vertex AI's prediction protocol (``AIP_MODE=PREDICTION``), as llama-server serves it:
``POST /predict`` runs each instance on the route its ``@requestFormat`` names and
answers the predictions in order; the variables pick the routes and the port."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient
from tiny_server import PROMPT, TinyModel, tiny_model

from tensorplug.errors import RunError
from tensorplug_llm.http.vertex import VertexRoutes, request_format
from tensorplug_llm.serve_cli import _resolve, add_arguments
from tensorplug_llm.server import ServerConfig, create_app

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("vertex"))
    yield m
    m.close()


def test_a_routes_request_format_is_its_path_in_camel_case() -> None:
    assert request_format("/v1/chat/completions") == "chatCompletions"
    assert request_format("/apply-template") == "applyTemplate"
    assert request_format("/completion") == "completion"


def test_predict_answers_each_instance_as_its_route_in_order(model: TinyModel) -> None:
    app = TestClient(create_app(model.llm, ServerConfig(vertex=VertexRoutes())))
    direct = app.post("/v1/chat/completions", json=CHAT).json()
    instances = [
        {"@requestFormat": "chatCompletions", **CHAT, "stream": True},
        {"@requestFormat": "/tokenize", "content": PROMPT},
        {"@requestFormat": "nosuch"},
        "text",
    ]
    r = app.post("/predict", json={"instances": instances})
    assert r.status_code == 200, r.text
    chat, tokens, unknown, text = r.json()["predictions"]
    assert chat["choices"][0]["message"] == direct["choices"][0]["message"]  # not streamed
    assert tokens == {"tokens": model.llm.tokenize(PROMPT, False)}
    assert unknown["error"]["message"] == "no handler registered for @requestFormat: nosuch"
    assert text["error"]["message"] == "each instance must be a JSON object"
    bad = app.post("/predict", json={"instances": {}})
    assert bad.status_code == 400 and "'instances'" in bad.json()["error"]["message"]


def test_an_instance_needs_the_key_as_any_request(model: TinyModel) -> None:
    config = ServerConfig(api_key="k", vertex=VertexRoutes(health="/ping"))
    app = TestClient(create_app(model.llm, config))
    body = {"instances": [{"@requestFormat": "tokenize", "content": "a"}]}
    assert app.post("/predict", json=body).status_code == 401
    ok = app.post("/predict", json=body, headers={"Authorization": "Bearer k"})
    assert "tokens" in ok.json()["predictions"][0]
    assert app.get("/ping").json() == {"status": "ok"}


def test_without_prediction_mode_there_is_no_predict_route(model: TinyModel) -> None:
    assert VertexRoutes.from_environment({"AIP_PREDICT_ROUTE": "/p"}) is None
    routes = VertexRoutes.from_environment({"AIP_MODE": "PREDICTION"})
    assert routes is not None and (routes.predict, routes.health) == ("/predict", None)
    assert TestClient(create_app(model.llm)).post("/predict", json={}).status_code == 404
    with pytest.raises(RunError, match="AIP_PREDICT_ROUTE=/completion"):
        create_app(model.llm, ServerConfig(vertex=VertexRoutes("/completion")))


def test_vertex_port_wins_over_port(monkeypatch: pytest.MonkeyPatch) -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", "9123")
    args = p.parse_args(["--tiny", "--port", "8000"])
    _resolve(args)
    assert args.port == 9123
    monkeypatch.setenv("AIP_HTTP_PORT", "port")
    with pytest.raises(RunError, match="AIP_HTTP_PORT"):
        _resolve(p.parse_args(["--tiny"]))

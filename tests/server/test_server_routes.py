"""``tensorplug serve``'s OpenAI routes, CORS and keys as llama-server has them: every
OpenAI route with and without ``/v1``, any model name, ``/v1/models``' fields, a
browser's preflight answered before the key is asked for, the key in either header,
and llama-server's ``grammar`` / ``json_schema`` on the OpenAI routes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient
from tiny_server import PROMPT, TinyModel, tiny_model

from tensorplug_llm.server import ServerConfig, create_app

KEY = "sk-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("routes"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def http(model: TinyModel) -> TestClient:
    return TestClient(create_app(model.llm, ServerConfig(api_key=KEY)))


def test_chat_and_models_answer_with_and_without_v1(http: TestClient) -> None:
    with_v1 = http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    without = http.post("/chat/completions", json=CHAT, headers=AUTH)
    assert with_v1.status_code == without.status_code == 200
    text = with_v1.json()["choices"][0]["message"]["content"]
    assert text and without.json()["choices"][0]["message"]["content"] == text
    assert http.get("/models").json()["data"] == http.get("/v1/models").json()["data"]


def test_completions_without_v1_is_llama_servers_own(model: TinyModel, http: TestClient) -> None:
    """llama-server's ``/completions`` is its native ``/completion``; OpenAI's shape is
    at ``/v1/completions``: both give the runner's greedy text."""
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    native = http.post("/completions", json=body, headers=AUTH).json()
    openai = http.post("/v1/completions", json=body, headers=AUTH).json()
    assert native["content"] == openai["choices"][0]["text"] == model.greedy_text


def test_a_streamed_chat_begins_with_the_role_and_null_content(http: TestClient) -> None:
    r = http.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH)
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    whole = http.post("/v1/chat/completions", json=CHAT, headers=AUTH).json()
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == whole["choices"][0]["message"]["content"]


def test_any_model_name_or_none_is_the_served_model(http: TestClient) -> None:
    for extra in ({}, {"model": "gpt-3.5-turbo"}):
        r = http.post("/v1/chat/completions", json={**CHAT, **extra}, headers=AUTH)
        assert r.status_code == 200 and r.json()["model"] == "tiny.gguf"


def test_models_has_llama_servers_fields(model: TinyModel, http: TestClient) -> None:
    [entry] = http.get("/v1/models").json()["data"]
    config = model.llama.config
    assert (entry["id"], entry["object"], entry["owned_by"]) == ("tiny.gguf", "model", "llamacpp")
    meta = entry["meta"]
    assert meta["n_vocab"] == len(model.llm.vocab.tokens)
    assert (meta["n_ctx_train"], meta["n_embd"]) == (config.n_ctx_train, config.n_embd)
    assert meta["vocab_type"] == 1  # SentencePiece, as llama.cpp numbers it
    assert meta["size"] == sum(t.nbytes for t in model.llama.file.tensors.values())


def test_an_alias_names_the_model(model: TinyModel) -> None:
    model.llm.model_name, before = "my-model", model.llm.model_name
    try:
        app = TestClient(create_app(model.llm))
        assert [m["id"] for m in app.get("/models").json()["data"]] == ["my-model"]
        assert app.post("/v1/chat/completions", json=CHAT).json()["model"] == "my-model"
    finally:
        model.llm.model_name = before


def test_models_lists_the_aliases_and_tags(model: TinyModel) -> None:
    config = ServerConfig(aliases=["code", "fim"], tags=["chat", "small"])
    app = TestClient(create_app(model.llm, config))
    [entry] = app.get("/v1/models").json()["data"]
    assert (entry["aliases"], entry["tags"]) == (["code", "fim"], ["chat", "small"])
    [bare] = TestClient(create_app(model.llm)).get("/v1/models").json()["data"]
    assert (bare["aliases"], bare["tags"]) == ([], [])


def test_without_the_web_page_slash_is_404(model: TinyModel) -> None:
    app = TestClient(create_app(model.llm, ServerConfig(web_page=False)))
    assert app.get("/").status_code == 404
    assert app.get("/web/index.html").status_code == 404
    assert app.get("/health").status_code == 200


# -- keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/health", "/v1/health", "/models", "/v1/models", "/api/tags"])
def test_public_routes_need_no_key(http: TestClient, route: str) -> None:
    r = http.get(route)
    assert r.status_code == 200 and "error" not in r.json()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "no"}])
def test_a_missing_or_wrong_key_is_401_authentication_error(
    http: TestClient, headers: dict[str, str]
) -> None:
    r = http.post("/completions", json={"prompt": PROMPT, "n_predict": 1}, headers=headers)
    assert r.status_code == 401
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")


def test_the_key_is_taken_from_x_api_key_too(http: TestClient) -> None:
    r = http.post("/completions", json={"prompt": PROMPT, "n_predict": 2},
                  headers={"X-Api-Key": KEY})  # fmt: skip
    assert r.status_code == 200 and "content" in r.json()


def test_any_of_several_keys_is_accepted(model: TinyModel) -> None:
    app = TestClient(create_app(model.llm, ServerConfig(api_key=["k1", "k2"])))
    for key, status in (("k1", 200), ("k2", 200), ("k3", 401)):
        r = app.post("/tokenize", json={"content": "the"}, headers={"x-api-key": key})
        assert r.status_code == status


# -- CORS -------------------------------------------------------------------------------------


PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "Authorization",
}


def test_a_preflight_is_answered_before_the_key_with_the_origin_reflected(
    http: TestClient,
) -> None:
    r = http.options("/completions", headers={"Origin": "https://web.example", **PREFLIGHT})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "https://web.example"
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["Access-Control-Allow-Headers"] == "*"
    got = http.post("/tokenize", json={"content": "the"},
                    headers={"Origin": "https://web.example", **AUTH})  # fmt: skip
    assert got.headers["Access-Control-Allow-Origin"] == "https://web.example"


def test_cors_origins_narrow_who_may_call(model: TinyModel) -> None:
    app = TestClient(create_app(model.llm, ServerConfig(cors_origins=["https://app.example",
                                                                      "localhost"])))  # fmt: skip
    for origin, allowed in (("https://app.example", True), ("http://localhost:5173", True),
                            ("http://127.0.0.1:3000", True), ("http://[::1]", True),
                            ("https://evil.example", False), ("http://localhost.evil", False),
                            ("http://[::1", False)):  # fmt: skip
        r = app.options("/completion", headers={"Origin": origin, **PREFLIGHT})
        assert r.status_code == 200
        assert ("Access-Control-Allow-Origin" in r.headers) is allowed
        got = app.get("/health", headers={"Origin": origin})
        assert (got.headers.get("Access-Control-Allow-Origin") == origin) is allowed


# -- llama-server's fields on OpenAI's routes ---------------------------------------------------


def test_a_grammar_constrains_an_openai_chat_reply(http: TestClient) -> None:
    pytest.importorskip("llguidance")
    body = {**CHAT, "max_tokens": 4, "temperature": 1.0, "seed": 3,
            "grammar": 'root ::= "yes" | "no"'}  # fmt: skip
    r = http.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")


def test_a_top_level_json_schema_constrains_an_openai_completion(http: TestClient) -> None:
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "json_schema": schema}
    r = http.post("/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["choices"][0]["text"])["ok"], bool)


def test_grammar_with_response_format_is_400_naming_both(http: TestClient) -> None:
    body = {**CHAT, "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}
    r = http.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400
    assert "response_format and grammar" in r.json()["error"]["message"]


def test_a_bad_grammar_is_400_naming_grammar(http: TestClient) -> None:
    pytest.importorskip("llguidance")
    r = http.post("/v1/chat/completions", json={**CHAT, "grammar": "root ::= ("}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"


def test_embeddings_take_token_ids_as_openai_does(model: TinyModel, http: TestClient) -> None:
    def embed(value: Any) -> list[list[float]]:
        r = http.post("/v1/embeddings", json={"input": value}, headers=AUTH)
        assert r.status_code == 200, r.text
        return [d["embedding"] for d in r.json()["data"]]

    ids = model.llm.tokenize("the of")
    assert embed(ids) == embed("the of") == embed([ids])
    assert len(embed([ids, ids])) == 2
    bad = http.post("/v1/embeddings", json={"input": [10**6]}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_embeddings_take_llama_servers_content_objects(http: TestClient) -> None:
    """``{"content": text or text parts}`` in a list of inputs is that text, the parts
    joined as they are; a part that is not text is 400."""

    def post(value: Any) -> Any:
        return http.post("/v1/embeddings", json={"input": value}, headers=AUTH)

    parts = [{"type": "text", "text": "the "}, {"type": "text", "text": "of"}]
    got = post(["the of", {"content": parts}, {"content": "the of"}]).json()["data"]
    assert got[0]["embedding"] == got[1]["embedding"] == got[2]["embedding"]
    bad = post([{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert bad.status_code == 400 and "text only" in bad.json()["error"]["message"]


def test_a_chats_image_or_audio_part_is_llama_servers_500_and_another_part_a_400(
    http: TestClient,
) -> None:
    """An image or audio part is answered as llama-server answers it for a model without
    a multimodal projector (500, "... input is not supported", on every route that reads
    a chat); a part of a kind nobody reads is the request's own error (400)."""
    text = {"type": "text", "text": "what is it?"}
    for part, kind in (
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
    ):
        messages = [{"role": "user", "content": [text, part]}]
        for path in ("/v1/chat/completions", "/apply-template"):
            r = http.post(path, json={"messages": messages, "max_tokens": 2}, headers=AUTH)
            assert r.status_code == 500, r.text
            error = r.json()["error"]
            assert error["message"].startswith(f"{kind} input is not supported")
            assert error["type"] == "server_error"
    odd = [{"role": "user", "content": [text, {"type": "hologram"}]}]
    r = http.post("/v1/chat/completions", json={"messages": odd}, headers=AUTH)
    assert r.status_code == 400 and "type 'hologram'" in r.json()["error"]["message"]

"""``tensorplug serve`` answers a few one-token requests of its own before it listens
(``http/warm.py``): they reach the model through the whole app (routes, streaming,
the engine), and a server whose key they lack fails them by name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from tiny_server import TinyModel, tiny_model

from tensorplug_llm.engine.state import EngineStats
from tensorplug_llm.generation import EngineGenerator
from tensorplug_llm.http.warm import WARM_REQUESTS, warm_up_app
from tensorplug_llm.server import ServerConfig, create_app


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("warm"))
    yield m
    m.close()


def _engine_stats(m: TinyModel) -> EngineStats:
    generator = m.llm.generator
    assert isinstance(generator, EngineGenerator)
    return generator.engine.stats


def test_each_warm_up_request_generates_one_token_through_the_app(model: TinyModel) -> None:
    stats = _engine_stats(model)
    finished, generated = stats.requests_finished, stats.generated_tokens
    assert warm_up_app(create_app(model.llm, ServerConfig())) == []
    assert stats.requests_finished - finished == len(WARM_REQUESTS) == 3
    assert stats.generated_tokens - generated == len(WARM_REQUESTS)


def test_the_warm_up_sends_the_servers_key_and_a_refusal_is_no_failure(
    model: TinyModel,
) -> None:
    """A refused warm-up request (here: no key) is reported, never raised: the server
    serves all the same (a chat template's preamble may outgrow a small context)."""
    app = create_app(model.llm, ServerConfig("sesame"))
    refused = warm_up_app(app)
    assert len(refused) == len(WARM_REQUESTS)
    assert refused[0].startswith("POST /v1/chat/completions was answered 401")
    assert warm_up_app(app, "sesame") == []

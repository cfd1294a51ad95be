"""llama-server's LoRA routes on ``tensorplug serve --lora``: ``GET /lora-adapters`` lists
the adapters, ``POST`` sets their scales for the requests that follow (0 is the plain
model: its greedy text), and a request's own ``lora`` is taken only when it asks for
the server's scales."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from lora_files import write_lora

from tensorplug_llm.api import LLM
from tensorplug_llm.engine import Engine
from tensorplug_llm.generation import EngineGenerator
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

TARGETS = ["blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.1.ffn_down.weight",
           "output.weight"]  # fmt: skip
PROMPT = "the of and to in"


class _Served:
    def __init__(self, model: Path, lora: list[tuple[str, float]]) -> None:
        self.llama = ModelRunner(model, placement=Placement.on(host_cpu(), 2), n_ctx=128,
                                 warmup=False, lora=lora)  # fmt: skip
        self.llm = LLM(self.llama, EngineGenerator(Engine(self.llama, 2)), model_name="tiny")
        self.http = TestClient(create_app(self.llm, ServerConfig()))

    def text(self, **extra: Any) -> str:
        r = self.http.post("/completion", json={"prompt": PROMPT, "n_predict": 8,
                                                "temperature": 0, **extra})  # fmt: skip
        assert r.status_code == 200, r.text
        content: str = r.json()["content"]
        return content

    def close(self) -> None:
        self.llm.close()
        self.llama.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("serve-lora")
    model = write_tiny_llama(folder / "tiny.gguf", "f32", 3)
    return model, write_lora(folder / "adapter.gguf", model, TARGETS, seed=4)


@pytest.fixture
def served(files: tuple[Path, Path]) -> Iterator[_Served]:
    s = _Served(files[0], [(str(files[1]), 1.0)])
    yield s
    s.close()


def test_the_adapters_are_listed_and_their_scales_set_for_what_follows(
    served: _Served, files: tuple[Path, Path]
) -> None:
    listed = served.http.get("/lora-adapters").json()
    assert [(a["id"], Path(a["path"]), a["scale"]) for a in listed] == [(0, files[1], 1.0)]
    adapted = served.text()
    plain = _Served(files[0], [])
    try:
        want = plain.text()
    finally:
        plain.close()
    assert adapted != want
    assert served.http.post("/lora-adapters", json=[{"id": 0, "scale": 0.0}]).json() == {
        "success": True
    }
    assert served.http.get("/lora-adapters").json()[0]["scale"] == 0.0
    assert served.text() == want  # scale 0: the plain model (the cached prompt dropped)
    served.http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert served.text() == adapted
    served.http.post("/lora-adapters", json=[])  # an adapter left out goes to 0
    assert served.text() == want


def test_a_requests_own_lora_is_taken_only_at_the_servers_scales(served: _Served) -> None:
    assert served.text(lora=[{"id": 0, "scale": 1.0}]) == served.text()
    r = served.http.post("/completion", json={"prompt": PROMPT, "lora": [{"id": 0, "scale": 0.5}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora"
    assert "POST /lora-adapters" in r.json()["error"]["message"]
    r = served.http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "lora": [{"id": 0, "scale": 0.2}],
    })  # fmt: skip
    assert r.status_code == 400


@pytest.mark.parametrize(
    ("body", "says"),
    [({"id": 0}, "array"), ([{"id": 3, "scale": 1.0}], "does not exist"),
     ([{"scale": 1.0}], "each LoRA entry")],
)  # fmt: skip
def test_a_bad_scales_body_is_400(served: _Served, body: Any, says: str) -> None:
    r = served.http.post("/lora-adapters", json=body)
    assert r.status_code == 400 and says in r.json()["error"]["message"]

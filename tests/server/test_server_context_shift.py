"""``tensorplug serve --context-shift``: a request whose slot is full drops half of its
tokens after ``n_keep`` and goes on to its ``n_predict``; without it the reply ends
"length" when the slot is full, as llama-server's."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tensorplug_llm.api import LLM
from tensorplug_llm.engine import Engine
from tensorplug_llm.generation import EngineGenerator
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama


@pytest.mark.parametrize("shift", [False, True])
def test_a_full_slot_ends_or_shifts(tmp_path: Path, shift: bool) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf", "q8_0", 0)
    llama = ModelRunner(model, placement=Placement.on(host_cpu(), 2), n_ctx=64, warmup=False)
    llm = LLM(llama, EngineGenerator(Engine(llama, 1, context_shift=shift)), model_name="t")
    try:
        http = TestClient(create_app(llm, ServerConfig()))
        r = http.post("/completion", json={"prompt": "the of and to in", "n_predict": 150,
                                           "n_keep": 3, "ignore_eos": True,
                                           "temperature": 0})  # fmt: skip
        body = r.json()
        assert r.status_code == 200, body
        if shift:
            assert body["tokens_predicted"] == 150 and body["stop_type"] == "limit"
        else:  # the 64 cells hold the prompt and the reply
            assert body["tokens_predicted"] < 64 and body["stop_type"] == "limit"
    finally:
        llm.close()
        llama.close()

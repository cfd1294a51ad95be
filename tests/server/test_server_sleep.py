"""``--sleep-idle-seconds``: an idle server gives its model's memory back, answers what
needs no model while asleep, and the next request for the model is served as if it
had never slept (llama-server's sleeping state)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tensorplug_llm.api import LLM
from tensorplug_llm.engine import Engine
from tensorplug_llm.generation import EngineGenerator
from tensorplug_llm.http.sleep import IdleSleep
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama

PROMPT = "the of and to in"


class _Served:
    def __init__(self, folder: Path, idle_seconds: float) -> None:
        template = {"tokenizer.chat_template": TINY_CHAT_TEMPLATE}
        path = write_tiny_llama(folder / "tiny.gguf", "q8_0", 0, metadata=template)
        self.llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=256,
                                 warmup=False)  # fmt: skip
        self.engine = Engine(self.llama, 2, prompt_cache=None)
        self.llm = LLM(self.llama, EngineGenerator(self.engine), model_name="tiny.gguf")
        self.sleep = IdleSleep(idle_seconds, self.engine.unload, self.engine.reload,
                               self.llm.stats)  # fmt: skip
        self.http = TestClient(create_app(self.llm, ServerConfig(metrics=True), self.sleep))

    def complete(self) -> str:
        r = self.http.post("/completion", json={"prompt": PROMPT, "n_predict": 8,
                                                "temperature": 0})  # fmt: skip
        assert r.status_code == 200
        text: str = r.json()["content"]
        return text

    def asleep(self) -> bool:
        sleeping: bool = self.http.get("/props").json()["is_sleeping"]
        assert sleeping == self.llama.released  # what /props says is what the runner did
        return sleeping

    def metrics(self) -> dict[str, float]:
        text = self.http.get("/metrics").text
        return {line.split()[0]: float(line.split()[1])
                for line in text.splitlines() if line.startswith("llamacpp:")}  # fmt: skip

    def close(self) -> None:
        self.sleep.stop()
        self.llm.close()
        self.llama.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[_Served]:
    s = _Served(tmp_path, 3600.0)  # put to sleep by the tests, not by the clock
    yield s
    s.close()


def test_an_idle_server_gives_the_memory_back_and_wakes_for_the_next_request(
    served: _Served,
) -> None:
    awake = served.complete()
    assert not served.asleep()
    assert served.sleep.sleep()
    assert served.llama.released and served.llama.memory == {}
    # what needs no model answers without waking it
    assert served.http.get("/health").json() == {"status": "ok"}
    assert [m["id"] for m in served.http.get("/v1/models").json()["data"]] == ["tiny.gguf"]
    assert served.http.get("/metrics").status_code == 200
    assert served.http.options("/completion").status_code == 200
    assert served.asleep()
    # the next request for the model loads it again and is served the same
    assert served.complete() == awake
    assert not served.asleep()


def test_tokenizing_wakes_the_model_as_llama_servers_does(served: _Served) -> None:
    assert served.sleep.sleep()
    r = served.http.post("/tokenize", json={"content": PROMPT})
    assert r.status_code == 200 and r.json()["tokens"]
    assert not served.asleep()


def test_metrics_while_asleep_are_the_figures_at_the_sleep(served: _Served) -> None:
    served.complete()
    before = served.metrics()
    assert before["llamacpp:kv_cache_tokens"] > 0  # the idle slot keeps its prompt
    assert served.sleep.sleep()
    asleep = served.metrics()
    assert asleep["llamacpp:kv_cache_tokens"] == before["llamacpp:kv_cache_tokens"]
    assert asleep["llamacpp:tokens_predicted_total"] == before["llamacpp:tokens_predicted_total"]
    served.complete()  # awake: the counters go on from where they were
    assert served.metrics()["llamacpp:tokens_predicted_total"] == 2 * 8


def test_an_asleep_servers_scrapes_are_the_text_it_gave_before_whatever_polls_it(
    served: _Served,
) -> None:
    """llama-server's suite compares an asleep server's whole ``/metrics`` text with the
    last scrape before the sleep: the health checks and props a monitor polls, and the
    scrapes themselves, count in no metric; the API's requests do."""
    served.complete()
    served.http.get("/metrics")  # the first scrape empties the per-scrape buckets
    awake = served.http.get("/metrics").text
    for route in ("/health", "/props", "/slots", "/metrics"):
        assert served.http.get(route).status_code == 200
    assert served.sleep.sleep()
    assert served.http.get("/metrics").text == awake
    assert served.asleep()
    served.http.get("/v1/models")
    assert 'tensorplug_http_requests_total{route="/v1/models",status="200"}' in (
        served.http.get("/metrics").text
    )


def test_a_request_in_flight_keeps_the_model_awake(served: _Served) -> None:
    served.sleep.begin()
    try:
        assert not served.sleep.sleep()
        assert not served.llama.released
    finally:
        served.sleep.end()
    assert served.sleep.sleep()


def test_the_watcher_puts_an_idle_server_to_sleep(tmp_path: Path) -> None:
    served = _Served(tmp_path, 0.2)
    try:
        served.complete()
        served.sleep.start()
        deadline = time.monotonic() + 60  # a loaded machine may be slow; no race: we poll
        while not served.llama.released and time.monotonic() < deadline:
            time.sleep(0.05)
        assert served.asleep()
    finally:
        served.close()

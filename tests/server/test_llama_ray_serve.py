"""``tensorplug serve --ray``: two replicas of the server behind one route on a local Ray
cluster (127.0.0.1), driven by the openai client. Each replica loads the model itself,
so both must answer exactly what the model does greedily."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.sampling import Sampler, SamplerParams
from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE, add_arguments
from tensorplug_llm.tiny import write_tiny_llama
from tensorplug_llm.tokenizer import StreamDecoder

serve = pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "ray[serve]"')
ray = pytest.importorskip("ray")

#: a Ray cluster and two replicas, started for its one test
pytestmark = pytest.mark.slow

PROMPT = "the of and to in"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(
        tmp_path_factory.mktemp("ray-serve") / "tiny.gguf", "q8_0", 0,
        metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE},
    )  # fmt: skip


#: Ray Serve's own start waits a fixed 60 s for its HTTP proxy actor, which a 2-core
#: machine with other work on it can take longer to start: it is started again
SERVE_STARTS = 3
#: Ray Serve's health and readiness checks of its proxy and replicas (its documented
#: environment settings), seconds: at its defaults (5 to 10 s) a starved machine had its
#: controller kill a proxy that was still starting, and every start failed alike
SERVE_CHECKS_S = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120",
    "RAY_SERVE_DEPLOYMENT_ACTOR_HEALTH_CHECK_TIMEOUT_S": "120",
}


def _start_serve(port: int) -> None:
    """``serve.start`` on ``port``, started again where Ray gave up on its proxy (a
    timer of Ray's, not the test's: on a busy machine the second start, its imports
    done, comes up sooner)."""
    for attempt in range(1, SERVE_STARTS + 1):
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            return
        except (ray.exceptions.ActorDiedError, ray.exceptions.GetTimeoutError, TimeoutError):
            if attempt == SERVE_STARTS:
                raise
            serve.shutdown()


@pytest.fixture(scope="module")
def route(model: Path) -> Iterator[str]:
    from tensorplug_llm.ray_serve import deployment, replica_options

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([str(model), "-c", "256", "-np", "2", "-t", "1", "--device", "CPU"])
    port = _free_port()
    with pytest.MonkeyPatch.context() as env:
        for name, value in SERVE_CHECKS_S.items():  # read by Ray's processes as they start
            env.setenv(name, value)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            _start_serve(port)
            serve.run(deployment(replica_options(args), replicas=2), name="tensorplug",
                      route_prefix="/")  # fmt: skip
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            serve.shutdown()
            ray.shutdown()


def test_two_replicas_behind_one_route_answer_as_the_model(model: Path, route: str) -> None:
    llama = ModelRunner(model, placement=Placement.on(host_cpu(), 2), n_ctx=256, warmup=False)
    assert llama.vocab is not None
    ids = llama.vocab.encode(PROMPT)
    greedy = llama.generate(ids, 8, Sampler(SamplerParams(0.0)), stop_at_eos=False).tokens
    dec = StreamDecoder(llama.vocab)
    want = "".join(dec.feed(t) for t in greedy) + dec.flush()
    llama.close()

    status = serve.status().applications["tensorplug"].deployments["tensorplug"]
    assert status.replica_states.get("RUNNING") == 2

    client = openai.OpenAI(base_url=route, api_key="none", max_retries=0, timeout=120)

    def ask(_: int) -> str:
        got = client.completions.create(model="tiny.gguf", prompt=PROMPT, max_tokens=8,
                                        temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
        return got.choices[0].text

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, range(16)))
    assert texts == [want] * 16
    streamed = client.chat.completions.create(
        model="tiny.gguf", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        temperature=0, stream=True,
    )  # fmt: skip
    assert [c.choices[0].finish_reason for c in streamed][-1] in ("length", "stop")
    # any model name is the served model, as llama-server answers it
    assert client.completions.create(model="other", prompt="x", max_tokens=1).model == "tiny.gguf"

"""``tensorplug serve``'s HTTP API driven by the real ``openai`` client (and httpx for
what the client will not send: malformed JSON, disconnects), against 127.0.0.1 only.

Expected texts and logprobs come from the runner itself (greedy ``ModelRunner.generate``,
``ModelRunner.eval`` logits and an independent log-softmax), computed before the server
starts; the server must give exactly those.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai
import pytest
import uvicorn
from openai.types.chat import ChatCompletionMessageParam
from terminal_signals import sigint_as_a_terminal_sends_it
from uvicorn_thread import UvicornThread

from tensorplug_llm.api import LLM, Stream
from tensorplug_llm.engine import Engine
from tensorplug_llm.generation import EngineGenerator, GenerationJob
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.sampling import Sampler, SamplerParams
from tensorplug_llm.serve_cli import TINY_CHAT_TEMPLATE
from tensorplug_llm.server import ServerConfig, create_app
from tensorplug_llm.tiny import write_tiny_llama
from tensorplug_llm.tokenizer import StreamDecoder

KEY = "test-key"
PROMPT = "the of and to in"
MODEL = "tiny-llama.gguf"


@dataclass
class Served:
    llm: LLM
    url: str
    greedy: list[int]  # PROMPT's greedy continuation, 24 tokens
    greedy_text: str
    first_logp: np.ndarray  # log-softmax of the logits after PROMPT


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = write_tiny_llama(
        tmp_path_factory.mktemp("serve") / MODEL, "q8_0", 0,
        metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE},
    )  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=256, warmup=False)
    assert llama.vocab is not None
    ids = llama.vocab.encode(PROMPT)
    logits = llama.eval(ids)
    z = logits.astype(np.float64) - logits.max()
    first_logp = z - np.log(np.exp(z).sum())
    llama.reset()
    greedy = llama.generate(ids, 24, Sampler(SamplerParams(0.0)), stop_at_eos=False).tokens
    assert not set(greedy) & llama.vocab.eog, "pick another seed: greedy hits EOS"
    llama.reset()
    dec = StreamDecoder(llama.vocab)
    text = "".join(dec.feed(t) for t in greedy) + dec.flush()
    llm = LLM(llama, n_parallel=4, model_name=MODEL)
    server = UvicornThread(create_app(llm, ServerConfig(api_key=KEY, metrics=True)))
    try:
        yield Served(llm, server.url, greedy, text, first_logp)
    finally:
        server.stop()
        llm.close()
        llama.close()


@pytest.fixture
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _idle(llm: LLM, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while (s := llm.stats()).running or s.waiting:
        assert time.monotonic() < deadline, f"the generator is still busy: {s}"
        time.sleep(0.02)


# -- completions and chat -----------------------------------------------------------------------


def test_completion_is_the_runners_greedy_continuation(
    served: Served, client: openai.OpenAI
) -> None:
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    assert got.choices[0].text == served.greedy_text
    assert got.choices[0].finish_reason == "length"
    assert got.usage is not None
    n_prompt = len(served.llm.tokenize(PROMPT))
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (n_prompt, 24)


def test_streamed_completion_joins_to_the_same_text(served: Served, client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                            temperature=0, stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == served.greedy_text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_streamed_and_not_agree(served: Served, client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                           temperature=0)  # fmt: skip
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                                 temperature=0, stream=True))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert whole.choices[0].message.content == streamed
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage is not None
    plain = [dict(m) for m in messages]
    assert whole.usage.prompt_tokens == len(served.llm.chat_prompt(plain))
    # the template's markup is text for the tiny vocabulary: the prompt is its encoding
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in plain)
    assert served.llm.chat_prompt(plain) == served.llm.tokenize(
        rendered + "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_split_across_tokens_ends_the_text_before_it(
    served: Served, client: openai.OpenAI, stream: bool
) -> None:
    dec = StreamDecoder(served.llm.vocab)
    pieces = [dec.feed(t) for t in served.greedy]
    # a stop string made of the end of one token's text and the start of the next's
    k = next(i for i in range(3, len(pieces) - 1) if pieces[i] and pieces[i + 1])
    stop = pieces[k][-1] + pieces[k + 1][0]
    want = served.greedy_text[: served.greedy_text.find(stop)]
    kw = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": [stop]}
    if stream:
        chunks = list(client.completions.create(**kw, stream=True))  # type: ignore[call-overload]
        text = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        got = client.completions.create(**kw)  # type: ignore[call-overload]
        text, finish = got.choices[0].text, got.choices[0].finish_reason
    assert (text, finish) == (want, "stop")
    _idle(served.llm)  # the stop cancelled the request: it no longer runs


def test_logprobs_are_the_models_log_softmax(served: Served, client: openai.OpenAI) -> None:
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                    logprobs=3)  # fmt: skip
    lp = got.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    first = served.greedy[0]
    np.testing.assert_allclose(lp.token_logprobs[0], served.first_logp[first], atol=1e-5)
    top3 = np.argsort(-served.first_logp)[:3]
    assert list(lp.top_logprobs[0].values()) == pytest.approx(served.first_logp[top3], abs=1e-5)
    assert len(lp.token_logprobs) == 4
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                          max_tokens=3, temperature=0, logprobs=True,
                                          top_logprobs=2)  # fmt: skip
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy: the top


def test_logprobs_without_top_ones_still_carry_each_tokens_own(
    served: Served, client: openai.OpenAI
) -> None:
    """A request that reports no logprobs is spared their softmax; one that asks for them
    with no top ones (completions' ``logprobs: 0``, chat's ``top_logprobs`` left out)
    still gets each token's own, and the text is the same either way."""
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                    logprobs=0)  # fmt: skip
    assert got.choices[0].text == plain.choices[0].text and plain.choices[0].logprobs is None
    lp = got.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and len(lp.token_logprobs) == 3
    first = served.greedy[0]
    np.testing.assert_allclose(lp.token_logprobs[0], served.first_logp[first], atol=1e-5)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                          max_tokens=3, temperature=0, logprobs=True)  # fmt: skip
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    assert all(e.logprob is not None and e.logprob <= 0.0 for e in content)


def test_eight_concurrent_greedy_requests_equal_the_same_run_alone(
    served: Served, client: openai.OpenAI
) -> None:
    prompts = ["the of", "hello tensor plug", "one two", PROMPT, "graph device", "and to in",
               "the the the", "we were"]  # fmt: skip

    def ask(prompt: str) -> str:
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                        temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
        return got.choices[0].text

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone
    assert alone[prompts.index(PROMPT)] == served.greedy_text[: len(alone[3])]


def test_a_second_chat_turn_reuses_the_first_turns_cells(
    served: Served, client: openai.OpenAI
) -> None:
    turn: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello tensor"}]
    first = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=6,
                                           temperature=0)  # fmt: skip
    reply = first.choices[0].message.content or ""
    turn += [{"role": "assistant", "content": reply}, {"role": "user", "content": "and you"}]
    _idle(served.llm)
    before = served.llm.stats()
    second = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=6,
                                            temperature=0)  # fmt: skip
    after = served.llm.stats()
    assert second.usage is not None and first.usage is not None
    reused = after.prompt_tokens_reused - before.prompt_tokens_reused
    evaluated = after.prompt_tokens_total - before.prompt_tokens_total
    assert reused >= first.usage.prompt_tokens  # the first turn's prompt was not recomputed
    assert reused + evaluated == second.usage.prompt_tokens


def test_requests_outgrowing_the_cache_are_preempted_and_complete_as_run_alone(
    served: Served, client: openai.OpenAI
) -> None:
    """Three greedy completions of 110 tokens need ~340 cells of the 256: the newest are
    preempted and resumed, nothing fails, and each text equals the same request run
    alone (Q8_0: bit-exact batching, see test_llama_engine)."""
    prompts = ["one two three", "graph device the", "hello tensor of"]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 110, "temperature": 0,
                            "extra_body": {"ignore_eos": True}}  # fmt: skip
    alone = [client.completions.create(prompt=p, **body).choices[0].text for p in prompts]
    before = served.llm.stats().preemptions
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: client.completions.create(prompt=p, **body), prompts))
    assert [a.choices[0].text for a in answers] == alone
    assert all(a.choices[0].finish_reason == "length" for a in answers)
    assert served.llm.stats().preemptions > before


# -- n choices ------------------------------------------------------------------------------------


def test_n_greedy_choices_all_equal_the_single_answer_and_the_prompt_is_evaluated_once(
    served: Served, client: openai.OpenAI
) -> None:
    prompt = "graph device tensor and of"  # not cached by another test
    n_prompt = len(served.llm.tokenize(prompt))
    _idle(served.llm)
    before = served.llm.stats()
    got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0,
                                    n=3)  # fmt: skip
    after = served.llm.stats()
    evaluated = after.prompt_tokens_total - before.prompt_tokens_total
    reused = after.prompt_tokens_reused - before.prompt_tokens_reused
    # the first choice evaluates what no slot held (a short prefix may be cached); the
    # other two share all of its cells: nothing of the prompt is computed twice
    assert evaluated + reused == 3 * n_prompt and 1 <= evaluated <= n_prompt
    assert [c.index for c in got.choices] == [0, 1, 2]
    one = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert [c.text for c in got.choices] == [one.choices[0].text] * 3
    assert got.usage is not None and got.usage.prompt_tokens == n_prompt  # counted once
    assert got.usage.completion_tokens == 30


def test_n_seeded_choices_are_reproducible_streamed_or_not(
    served: Served, client: openai.OpenAI
) -> None:
    """Choice i samples with seed + i: the same request gives the same choices, streamed
    (chunks carry their choice's index) or not, and choice 0 is the n=1 answer, all on
    the one server the other tests share. Its cache holds other sequences, so a
    request's cells lie out of position order (a reused prefix, cells freed by others);
    attention sums a row's cells by position, not by cell, so the draws do not part.
    (When it summed in cell order, a temperature-1.5 draw parted after a few tokens and
    this test needed a fresh server per request.)"""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "one two three"}]
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 12,
        "temperature": 1.5,
        "extra_body": {"top_k": 0, "min_p": 0.0},
    }
    first = client.chat.completions.create(**args, n=3, seed=42)
    again = client.chat.completions.create(**args, n=3, seed=42)
    texts = [c.message.content for c in first.choices]
    assert len(texts) == 3 and [c.message.content for c in again.choices] == texts
    assert len(set(texts)) > 1  # independent draws
    single = client.chat.completions.create(**args, seed=42)
    assert single.choices[0].message.content == texts[0]
    chunks = list(client.chat.completions.create(**args, n=3, seed=42, stream=True))
    streamed = ["", "", ""]
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == texts
    finished = [ch.index for c in chunks for ch in c.choices if ch.finish_reason]
    assert sorted(finished) == [0, 1, 2]


def test_the_python_api_streams_n_choices_and_cancels_them_together(served: Served) -> None:
    llm = served.llm
    whole = llm.create_completion(PROMPT, max_tokens=24, temperature=0, n=2)
    assert isinstance(whole, dict)
    assert [c["text"] for c in whole["choices"]] == [served.greedy_text] * 2
    stream = llm.create_completion(PROMPT, max_tokens=200, temperature=0, n=2, stream=True,
                                   ignore_eos=True)  # fmt: skip
    assert isinstance(stream, Stream)
    first = [next(stream) for _ in range(4)]
    assert sorted(c["choices"][0]["index"] for c in first) == [0, 0, 1, 1]
    stream.cancel()  # both choices end: their slots are free again
    _idle(llm)
    assert llm.stats().running == 0


def test_n_beyond_the_slots_is_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, n=5)  # -np 4
    assert e.value.param == "n" and "1 to 4" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, n=0)
    assert e.value.param == "n"


# -- errors ---------------------------------------------------------------------------------------


def test_any_model_name_is_answered_by_the_served_model(
    served: Served, client: openai.OpenAI
) -> None:
    """llama-server holds one model and answers every name with it (clients send
    "gpt-3.5-turbo", or nothing at all)."""
    got = client.completions.create(model="gpt-17", prompt=PROMPT, max_tokens=24, temperature=0)
    assert (got.choices[0].text, got.model) == (served.greedy_text, MODEL)
    r = httpx.post(served.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0})  # fmt: skip
    assert r.json()["choices"][0]["text"] == served.greedy_text


def test_max_tokens_minus_one_is_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}])  # type: ignore[misc, list-item]
    assert e.value.param == "messages.0.role"


def test_logit_bias_reaches_the_sampler(served: Served, client: openai.OpenAI) -> None:
    token = served.llm.tokenize("hello", add_bos=False)[-1]
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                    logit_bias={str(token): 100})  # fmt: skip
    assert got.choices[0].text == served.llm.vocab.piece(token).decode() * 3


def test_a_sampling_option_the_sampler_refuses_is_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                  extra_body={"repeat_penalty": 0})  # fmt: skip
    assert e.value.param == "repeat_penalty"


def test_malformed_json_is_400_with_an_openai_error_body(served: Served) -> None:
    r = httpx.post(served.url + "/v1/completions", content=b'{"model": ',
                   headers={"Authorization": f"Bearer {KEY}",
                            "Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "not valid JSON" in error["message"]


def test_the_api_key_guards_every_route_but_health_and_models(served: Served) -> None:
    wrong = openai.OpenAI(base_url=served.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert e.value.code == "invalid_api_key"
    assert httpx.get(served.url + "/metrics").status_code == 401
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}
    assert [m.id for m in wrong.models.list()] == [MODEL]  # public, as llama-server's


def test_models_and_metrics(served: Served, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    text = httpx.get(served.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    s = served.llm.stats()
    assert values["tensorplug_generated_tokens_total"] == s.generated_tokens_total > 0
    assert values["tensorplug_kv_cells_total"] == 256
    assert "tensorplug_requests_waiting" in values
    assert values["tensorplug_preemptions_total"] == s.preemptions
    assert values['tensorplug_http_requests_total{route="/v1/models",status="200"}'] >= 1


# -- queue, disconnects, timeouts -----------------------------------------------------------------


class _Gate:
    """A constraint that holds its sequence until the test opens it: the slots are
    then busy for as long as the test needs, whatever the machine's speed."""

    def __init__(self, n_vocab: int) -> None:
        self.open = threading.Event()
        self.n_vocab = n_vocab

    def allowed(self) -> np.ndarray:
        assert self.open.wait(30)
        return np.ones(self.n_vocab, dtype=bool)

    def accept(self, token: int) -> None:
        pass

    def done(self) -> bool:
        return False


@pytest.mark.slow
def test_a_full_queue_is_503_with_retry_after_and_a_waiting_client_that_leaves_is_dropped(
    served: Served,
) -> None:
    llm = served.llm
    gate = _Gate(llm.llama.config.n_vocab)
    slots = llm.stats().n_parallel
    ids = llm.tokenize(PROMPT)
    held = [llm.generator.submit(GenerationJob(ids, 2, {"temperature": 0.0}, constraint=gate))
            for _ in range(slots)]  # fmt: skip
    before = llm.stats().generated_tokens_total
    server = UvicornThread(create_app(llm, ServerConfig(max_queue=0, retry_after=2)))
    try:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "stream": True}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            with contextlib.ExitStack() as streams:
                # the server admits n_parallel + max_queue requests: these wait for a slot
                for _ in range(slots):
                    waiting = streams.enter_context(
                        http.stream("POST", "/v1/completions", json=body)
                    )
                    assert waiting.status_code == 200
                busy = http.post("/v1/completions", json={**body, "stream": False})
                assert busy.status_code == 503
                assert busy.headers["retry-after"] == "2"
                assert busy.json()["error"]["type"] == "server_overloaded"
            # the waiting clients went away: their requests are cancelled before they run
            deadline = time.monotonic() + 10
            while llm.stats().waiting > 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            gate.open.set()
            assert all(len(list(h)) == 2 for h in held)
            _idle(llm)
            assert llm.stats().generated_tokens_total == before + 2 * slots
            ok = http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2})
            assert ok.status_code == 200
            assert ok.json()["usage"]["completion_tokens"] == 2
    finally:
        gate.open.set()
        server.stop()


def test_a_request_past_the_timeout_is_cancelled_with_504(served: Served) -> None:
    server = UvicornThread(create_app(served.llm, ServerConfig(request_timeout=0.05)))
    try:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 240, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 504
        assert r.json()["error"]["type"] == "timeout"
        _idle(served.llm)
    finally:
        server.stop()


class _HeldGate(_Gate):
    """:class:`_Gate` that also says when the engine's step reached it: from then on
    every step waits, and nothing queued can run until the test opens it."""

    def __init__(self, n_vocab: int) -> None:
        super().__init__(n_vocab)
        self.entered = threading.Event()

    def allowed(self) -> np.ndarray:
        self.entered.set()
        return super().allowed()


@contextlib.contextmanager
def _engine_held(llm: LLM) -> Iterator[_HeldGate]:
    """The engine stopped inside a step (a generation held by a gate) until the block
    ends: requests submitted meanwhile wait in the queue."""
    gate = _HeldGate(llm.llama.config.n_vocab)
    held = llm.generator.submit(GenerationJob(llm.tokenize(PROMPT), 2, {"temperature": 0.0},
                                              constraint=gate))  # fmt: skip
    try:
        assert gate.entered.wait(30)
        yield gate
    finally:
        gate.open.set()
        list(held)


def _engine(llm: LLM) -> Engine:
    """The batching engine behind ``llm`` (the server's generator)."""
    assert isinstance(llm.generator, EngineGenerator)
    return llm.generator.engine


def _until(condition: Any, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("route", ["/v1/embeddings", "/embeddings"])
def test_embeddings_past_the_timeout_are_504_and_leave_the_queue(
    served: Served, route: str
) -> None:
    """Embeddings are computed by the engine, so they wait for it as a generation does;
    past the server's ``--timeout`` the answer is a 504 and the texts are cancelled
    before they run (here the engine is held: they could never run in time)."""
    llm = served.llm
    engine = _engine(llm)
    server = UvicornThread(create_app(llm, ServerConfig(request_timeout=0.5)))
    try:
        with _engine_held(llm):
            cancelled = engine.stats.requests_cancelled
            texts = ["the", "of and", "the of"]
            body = {"model": MODEL, "input": texts} if route == "/v1/embeddings" else {
                "content": texts}  # fmt: skip
            r = httpx.post(server.url + route, json=body, timeout=30)
            assert r.status_code == 504
            assert r.json()["error"]["type"] == "timeout"
            assert engine.n_waiting == 3  # cancelled, and gone at the next step
        _until(lambda: engine.n_waiting == 0, "the cancelled texts leave the queue")
        assert engine.stats.requests_cancelled == cancelled + 3
    finally:
        server.stop()


def test_an_embeddings_client_that_leaves_frees_its_place(served: Served) -> None:
    """A client that hangs up while its embeddings wait releases its place in the
    server's queue and cancels its texts: they never run."""
    import socket

    llm = served.llm
    engine = _engine(llm)
    app = create_app(llm, ServerConfig())
    server = UvicornThread(app)
    try:
        with _engine_held(llm):
            cancelled = engine.stats.requests_cancelled
            body = json.dumps({"model": MODEL, "input": ["the", "of and"]}).encode()
            host, port = server.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: test\r\n"
                             b"Content-Type: application/json\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                             + body)  # fmt: skip
                _until(lambda: engine.n_waiting == 2, "the texts are queued")
            _until(lambda: app.state.service.in_flight == 0, "the request is released")
            assert engine.n_waiting == 2  # cancelled, and gone at the next step
        _until(lambda: engine.n_waiting == 0, "the cancelled texts leave the queue")
        assert engine.stats.requests_cancelled == cancelled + 2
    finally:
        server.stop()


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024


async def _clients(url: str, seconds: float, seed: int) -> tuple[int, int]:
    """64 streaming clients for ``seconds``; about a third hang up midway. Returns
    (finished, disconnected); every finished stream must be whole."""
    rng = random.Random(seed)
    finished = disconnected = 0
    stop_at = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {KEY}"}

    async def one(http: httpx.AsyncClient) -> None:
        nonlocal finished, disconnected
        while time.monotonic() < stop_at:
            quit_after = rng.randint(1, 4) if rng.random() < 0.35 else None
            chat = rng.random() < 0.5
            body = {"model": MODEL, "max_tokens": 6, "temperature": 0.7, "stream": True}
            if chat:
                body["messages"] = [{"role": "user", "content": rng.choice(["hi", "the of"])}]
            else:
                body["prompt"] = rng.choice(["the", "of and", PROMPT])
            route = "/v1/chat/completions" if chat else "/v1/completions"
            async with http.stream("POST", route, json=body, headers=headers) as r:
                if r.status_code == 503:  # a hung-up request not yet released: back off
                    assert r.headers["retry-after"] == "1"
                    await asyncio.sleep(0.1)
                    continue
                assert r.status_code == 200, await r.aread()
                events, done = [], False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    events.append(json.loads(line[6:]))
                    if quit_after is not None and len(events) >= quit_after:
                        break
            if done:
                finish = events[-1]["choices"][0]["finish_reason"]
                assert finish in ("stop", "length"), events[-1]
                assert events[-1]["usage"]["completion_tokens"] >= 1
                finished += 1
            else:
                assert quit_after is not None, "a stream ended without [DONE]"
                disconnected += 1

    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        await asyncio.gather(*(one(http) for _ in range(64)))
    return finished, disconnected


@pytest.mark.slow
def test_64_streaming_clients_with_random_disconnects(served: Served) -> None:
    # warm as long as the measured run: the step shapes a run meets (kept, bounded, in the
    # graph and plan caches) depend on how many requests the machine finishes in that
    # time; a 1 s warm-up on a loaded machine left shapes for the measured run to build
    asyncio.run(_clients(served.url, 4.0, seed=1))
    _idle(served.llm)
    gc.collect()
    before = _rss()
    done_before = served.llm.stats().requests_total
    finished, disconnected = asyncio.run(_clients(served.url, 4.0, seed=2))
    assert finished > 0 and disconnected > 0
    _idle(served.llm)
    s = served.llm.stats()
    assert (s.running, s.waiting) == (0, 0)
    # no sequence left behind: the cells in use are those idle slots keep for reuse
    assert s.kv_cells_used <= s.kv_cells_cached
    assert s.requests_total - done_before >= finished + disconnected
    assert httpx.get(served.url + "/health").status_code == 200  # still up
    gc.collect()
    assert _rss() <= before * 1.05, (before, _rss())


def test_embeddings_come_from_the_served_model_while_a_completion_runs(
    served: Served, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v1/embeddings is computed by the engine's own model (no second copy), as
    sequences beside a completion that keeps running. Each equals ``ModelRunner.embed`` on a
    separate model of the file, normalized: the engine's raw vectors are bit-identical
    (Q8_0, ``test_llama_engine``), so the only difference is the wire's float32
    (base64): 1e-6 is 10x the rounding of a unit vector's entries.

    The completion's generation steps wait for the embeddings' request and then go at
    most 300 tokens/s: unpaced, the tiny model's 240 tokens (a few ms each, a
    fraction of that with the CPU's programs) could all be generated before the
    embeddings' round trip on a busy CI machine, and the test then failed though
    nothing was wrong."""
    texts = ["the of", "and to", "hello tensor graph device"]
    long: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 240,
                            "temperature": 0, "extra_body": {"ignore_eos": True}}  # fmt: skip
    requested = threading.Event()
    decode = served.llm.llama.decode

    def paced(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("prompt") is False:  # a generation step
            requested.wait(30)
            time.sleep(0.003)
        return decode(*args, **kwargs)

    monkeypatch.setattr(served.llm.llama, "decode", paced)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: client.completions.create(**long))
        deadline = time.monotonic() + 30
        while served.llm.stats().running == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        requested.set()
        got = client.embeddings.create(model=MODEL, input=texts)  # base64 float32 on the wire
        still_running = served.llm.stats().running
        completion = running.result()
    assert still_running >= 1  # the completion went on beside the embeddings
    assert completion.choices[0].text.startswith(served.greedy_text)  # and is unchanged
    vectors = [np.asarray(d.embedding) for d in got.data]
    assert got.usage.prompt_tokens == sum(len(served.llm.tokenize(t)) for t in texts)
    with ModelRunner(served.llm.llama.file.path, placement=Placement.on(host_cpu(), 2), n_ctx=256,
               warmup=False) as other:  # fmt: skip
        for text, v in zip(texts, vectors, strict=True):
            raw = other.embed(served.llm.tokenize(text)).astype(np.float64)
            np.testing.assert_allclose(v, raw / np.linalg.norm(raw), rtol=0, atol=1e-6)
    _idle(served.llm)
    assert served.llm.llama.kv.n_used == served.llm.stats().kv_cells_cached  # cells removed


def test_an_embedding_input_longer_than_the_context_is_400_naming_it(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input=["short", "the of " * 200])
    assert e.value.param == "input" and "the context holds 256 (n_ctx)" in e.value.message


def test_serve_loads_the_model_once_for_completions_and_embeddings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tensorplug serve --embeddings`` (the flag is accepted, and not needed) loads one
    model: embeddings and completions are both answered by it."""
    from starlette.testclient import TestClient

    from tensorplug.cli import main
    from tensorplug_llm import runner

    loads: list[object] = []
    load = runner.ModelRunner.__init__

    def counted(self: ModelRunner, *args: Any, **kwargs: Any) -> None:
        loads.append(args[0])
        load(self, *args, **kwargs)

    answers: dict[str, Any] = {}

    def run(app: Any, **_: Any) -> None:
        with TestClient(app) as http:
            deadline = time.monotonic() + 120
            while http.get("/health").status_code == 503:  # the model is loading
                assert time.monotonic() < deadline
                time.sleep(0.02)
            requests: list[tuple[str, dict[str, Any]]] = [
                ("/v1/embeddings", {"input": ["a b c", "d"]}),
                ("/v1/completions", {"prompt": "a b", "max_tokens": 3}),
            ]
            for route, body in requests:
                answers[route] = http.post(route, json={"model": "tiny-llama.gguf", **body})

    monkeypatch.setattr(runner.ModelRunner, "__init__", counted)
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets: run(server.config.app))
    for flags in (["--embeddings"], []):
        loads.clear()
        assert main(["serve", "--tiny", "-c", "128", "-np", "2", "--port", "0", *flags]) == 0
        assert len(loads) == 1
        assert answers["/v1/embeddings"].status_code == 200
        assert len(answers["/v1/embeddings"].json()["data"]) == 2
        assert answers["/v1/completions"].status_code == 200


def test_an_encoder_serves_embeddings_and_completions_are_400(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from tensorplug_llm.tiny_bert import write_tiny_bert

    path = write_tiny_bert(tmp_path / "bert.gguf", 2)
    with ModelRunner(path, placement=Placement.on(host_cpu(), 2), warmup=False) as bert:
        assert bert.vocab is not None
        ids = bert.vocab.encode("hello world")
        want = bert.embed(ids, normalize=True)
        llm = LLM(bert, n_parallel=2, model_name="bert")
        try:
            with TestClient(create_app(llm)) as http:
                got = http.post("/v1/embeddings", json={"model": "bert", "input": "hello world"})
                assert got.status_code == 200
                vector = np.asarray(got.json()["data"][0]["embedding"])
                np.testing.assert_allclose(vector, want, rtol=0, atol=1e-4)  # BERT: see engine
                refused = http.post("/v1/completions", json={"model": "bert", "prompt": "hi"})
                assert refused.status_code == 400
                error = refused.json()["error"]
                assert "is an embedding model" in error["message"] and error["param"] == "prompt"
                chat = http.post(
                    "/v1/chat/completions",
                    json={"model": "bert", "messages": [{"role": "user", "content": "hi"}]},
                )
                assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
                assert "serves /v1/embeddings only" in chat.json()["error"]["message"]
        finally:
            llm.close()


SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "n", "color"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("prompt", ["the of", "hello tensor", "one two three", "graph device"])
def test_json_schema_output_parses_and_validates(client: openai.OpenAI, prompt: str) -> None:
    got = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=96,
        temperature=0.7,
        seed=3,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
        },
    )
    assert got.choices[0].finish_reason == "stop"
    content = got.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), SCHEMA)


def test_a_bad_response_format_is_400_naming_it(client: openai.OpenAI) -> None:
    bad: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": 7}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], response_format=bad
        )
    assert e.value.param is not None and e.value.param.startswith("response_format")


def test_serve_usage_mistakes_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorplug.cli import main

    assert main(["serve", "--tiny", "--timeout", "0"]) == 1
    err = capsys.readouterr().err
    assert "tensorplug serve: error: --max-queue must be >= 0 and --timeout > 0" in err
    assert "Traceback" not in err
    assert main(["serve", "--ray", "--tiny"]) == 1
    assert "--ray needs MODEL.gguf" in capsys.readouterr().err


def test_ctrl_c_twice_stops_the_server_without_a_traceback() -> None:
    """``tensorplug serve`` stopped by Ctrl-C pressed twice (a second press while it
    shuts down): uvicorn re-raised the signal, which cancelled the idle lifespan task,
    and starlette logged that as two tracebacks on the user's terminal. The app has no
    lifespan hooks; uvicorn now runs without the lifespan protocol, and the server
    leaves quietly: status 0, or 130 with one line where the second press lands after
    uvicorn has stopped (the CLI's own Ctrl-C handling)."""
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    child = subprocess.Popen(
        [sys.executable, "-m", "tensorplug", "serve", "--tiny", "-c", "64", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_as_a_terminal_sends_it,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert child.poll() is None, child.communicate()[1]
            assert time.monotonic() < deadline, "the server did not answer"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200:
                    break
            time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        # the second press once the server is shutting down (it no longer answers), not
        # after a guessed pause that a loaded machine can outrun
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            except httpx.HTTPError:
                break
            time.sleep(0.01)
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode in (0, 130), err
    assert "Traceback" not in err and "serving tiny-llama.gguf" in err

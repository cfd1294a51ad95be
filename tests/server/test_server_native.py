"""llama-server's own routes with its request and response shapes: ``/completion``
(text, token ids, stop words, probabilities, streaming), ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/props``, ``/slots``, ``/metrics``,
``/embedding``. Expected values come from the runner itself (:mod:`tiny_server`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

from fastapi.testclient import TestClient
from tiny_server import PROMPT, TINY_CHAT_TEMPLATE, TinyModel, tiny_model

from tensorplug_llm.generation import GenerationJob
from tensorplug_llm.server import ServerConfig, create_app


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("native"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def http(model: TinyModel) -> TestClient:
    return TestClient(create_app(model.llm, ServerConfig(metrics=True)))


def _complete(http: TestClient, **body: Any) -> dict[str, Any]:
    r = http.post("/completion", json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def _events(text: str) -> list[dict[str, Any]]:
    assert "[DONE]" not in text  # llama-server's own stream ends with its last chunk
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


# -- /completion --------------------------------------------------------------------------------


def test_completion_is_the_runners_greedy_continuation(model: TinyModel, http: TestClient) -> None:
    got = _complete(http, prompt=PROMPT, n_predict=24, return_tokens=True)
    assert got["content"] == model.greedy_text
    assert got["tokens"] == model.greedy
    assert (got["stop"], got["stop_type"], got["stopping_word"]) == (True, "limit", "")
    assert (got["tokens_predicted"], got["tokens_evaluated"]) == (24, len(model.ids))
    assert got["model"] == "tiny.gguf" and got["generation_settings"]["n_predict"] == 24
    timings = got["timings"]
    assert timings["predicted_n"] == 24
    assert timings["prompt_n"] + timings["cache_n"] == len(model.ids)


def test_generation_settings_echo_the_logit_bias_and_ignore_eos_end_tokens(
    model: TinyModel, http: TestClient
) -> None:
    eog = sorted(model.llm.vocab.eog)
    assert eog  # the tiny model has an end token
    got = _complete(http, prompt=PROMPT, n_predict=2, ignore_eos=True, logit_bias=[[5, -2.5]])
    biases = got["generation_settings"]["logit_bias"]
    assert biases == [{"bias": -2.5, "token": 5}] + [{"bias": None, "token": t} for t in eog]
    plain = _complete(http, prompt=PROMPT, n_predict=2)
    assert plain["generation_settings"]["logit_bias"] == []


def test_token_ids_and_mixed_prompts_read_as_the_text(model: TinyModel, http: TestClient) -> None:
    ids = model.ids
    assert _complete(http, prompt=ids, n_predict=24)["content"] == model.greedy_text
    # BOS, then "the of": the prompt begins with text
    assert model.llm.vocab.encode("the of") == ids[:3]
    mixed = _complete(http, prompt=["the of", *ids[3:]], n_predict=24)
    assert mixed["content"] == model.greedy_text and mixed["tokens_evaluated"] == len(ids)


def test_several_prompts_are_answered_as_a_list_in_their_order(
    model: TinyModel, http: TestClient
) -> None:
    got = http.post("/completion", json={"prompt": [model.ids, PROMPT, "the"], "n_predict": 24,
                                         "temperature": 0}).json()  # fmt: skip
    assert [r["index"] for r in got] == [0, 1, 2]
    assert got[0]["content"] == got[1]["content"] == model.greedy_text
    assert got[2]["tokens_evaluated"] == len(model.llm.tokenize("the"))
    r = http.post("/completion", json={"prompt": [PROMPT, PROMPT], "n_predict": 24,
                                       "temperature": 0, "stream": True})  # fmt: skip
    events = _events(r.text)
    for i in (0, 1):
        mine = [e for e in events if e["index"] == i]
        assert "".join(e["content"] for e in mine) == model.greedy_text
        assert [e["stop"] for e in mine][-1] is True


def test_a_stop_word_ends_the_text_before_it(model: TinyModel, http: TestClient) -> None:
    text = model.greedy_text
    word = text[len(text) // 2 : len(text) // 2 + 2]
    got = _complete(http, prompt=PROMPT, n_predict=24, stop=[word])
    assert got["content"] == text[: text.index(word)]
    assert (got["stop_type"], got["stopping_word"]) == ("word", word)


def test_n_probs_are_the_models_log_softmax(model: TinyModel, http: TestClient) -> None:
    got = _complete(http, prompt=PROMPT, n_predict=3, n_probs=5)
    probs = got["completion_probabilities"]
    assert [p["id"] for p in probs] == model.greedy[:3]
    first = probs[0]
    assert first["logprob"] == pytest.approx(model.first_logp[model.greedy[0]], abs=1e-4)
    top = np.argsort(model.first_logp)[::-1][:5]
    assert [t["id"] for t in first["top_logprobs"]] == top.tolist()
    piece = model.llm.vocab.piece(model.greedy[0]).decode()
    assert (first["token"], first["bytes"]) == (piece, list(piece.encode()))


def test_post_sampling_probs_are_the_draws_distribution(model: TinyModel, http: TestClient) -> None:
    """``post_sampling_probs``: each token's ``prob`` and ``top_probs`` are of what the
    chain left (here top-k 3 at temperature 1: three tokens summing to 1), not the
    model's softmax; at temperature 0 the one token at probability 1."""
    got = _complete(http, prompt=PROMPT, n_predict=4, n_probs=5, top_k=3, min_p=0.0,
                    top_p=1.0, temperature=1.0, seed=5, post_sampling_probs=True)  # fmt: skip
    for token in got["completion_probabilities"]:
        top = token["top_probs"]
        assert len(top) == 3 and sum(t["prob"] for t in top) == pytest.approx(1.0, abs=1e-6)
        assert token["prob"] == pytest.approx({t["id"]: t["prob"] for t in top}[token["id"]])
    first = got["completion_probabilities"][0]
    best3 = np.argsort(model.first_logp)[::-1][:3]
    assert [t["id"] for t in first["top_probs"]] == best3.tolist()
    greedy = _complete(http, prompt=PROMPT, n_predict=1, n_probs=5, post_sampling_probs=True)
    [only] = greedy["completion_probabilities"]
    assert only["prob"] == 1.0 and [t["id"] for t in only["top_probs"]] == [model.greedy[0]]


def test_a_stream_is_llama_servers_chunks_then_the_totals(
    model: TinyModel, http: TestClient
) -> None:
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 24, "temperature": 0,
                                       "stream": True})  # fmt: skip
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    *pieces, last = events
    assert "".join(e["content"] for e in pieces) == model.greedy_text
    assert [t for e in pieces for t in e["tokens"]] == model.greedy
    assert all(e["stop"] is False for e in pieces)
    assert (last["stop"], last["content"], last["stop_type"]) == (True, "", "limit")
    assert last["timings"]["predicted_n"] == 24


def test_n_predict_defaults_to_the_servers_n(model: TinyModel) -> None:
    app = TestClient(create_app(model.llm, ServerConfig(defaults={"n_predict": 5})))
    assert _complete(app, prompt=PROMPT)["tokens_predicted"] == 5
    assert _complete(app, prompt=PROMPT, n_predict=7)["tokens_predicted"] == 7


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": [1, 10**6]}, "prompt[1]"),
        ({"prompt": [PROMPT, [1, 10**6]]}, "prompt[1][1]"),
        ({"prompt": [{"prompt_string": "x", "multimodal_data": "AAAA"}]}, "prompt"),
        ({"prompt": PROMPT, "mirostat": 2}, "mirostat"),
        ({"prompt": PROMPT, "samplers": ["top_k", "banana"]}, "samplers"),
        ({"prompt": PROMPT, "id_slot": 7}, "id_slot"),
        ({"prompt": PROMPT, "logit_bias": [[1, 2, 3]]}, "logit_bias"),
    ],
)
def test_a_bad_field_is_400_naming_it(http: TestClient, body: dict[str, Any], param: str) -> None:
    r = http.post("/completion", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_grammar_constrains_a_native_completion(http: TestClient) -> None:
    pytest.importorskip("llguidance")
    got = _complete(http, prompt=PROMPT, n_predict=8, temperature=1.0, seed=1,
                    grammar='root ::= "yes" | "no"')  # fmt: skip
    assert got["content"] in ("yes", "no") and got["stop_type"] == "eos"


# -- tokens and templates -----------------------------------------------------------------------


def test_tokenize_and_detokenize_round_trip(model: TinyModel, http: TestClient) -> None:
    tokens = http.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    assert tokens == model.llm.tokenize(PROMPT, add_bos=False)
    with_bos = http.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()
    assert with_bos["tokens"] == model.ids and model.ids[0] == model.llm.vocab.bos
    assert http.post("/detokenize", json={"tokens": tokens}).json()["content"].strip() == PROMPT
    pieces = http.post("/tokenize", json={"content": PROMPT, "with_pieces": True}).json()
    assert [p["id"] for p in pieces["tokens"]] == tokens
    assert "".join(p["piece"] for p in pieces["tokens"]).strip() == PROMPT
    bad = http.post("/detokenize", json={"tokens": [3, -1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[1]"


def test_apply_template_is_the_chat_prompt(http: TestClient) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert prompt.endswith(rendered + "<|im_start|>assistant\n")


# -- props, slots, metrics ----------------------------------------------------------------------


def test_props_describe_the_server(model: TinyModel, http: TestClient) -> None:
    props = http.get("/props").json()
    assert props["total_slots"] == 2
    assert props["model_path"] == str(model.llama.file.path)
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 256 and settings["params"]["seed"] == 4294967295
    assert props["chat_template"] == model.llm.chat_template
    refused = http.post("/props", json={})
    assert refused.status_code == 501
    assert refused.json()["error"]["type"] == "not_supported_error"
    writable = TestClient(create_app(model.llm, ServerConfig(props_writable=True)))
    assert writable.post("/props", json={}).json() == {"success": True}


def test_slots_are_listed_unless_turned_off(model: TinyModel, http: TestClient) -> None:
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 256 and "params" not in s for s in slots)
    assert http.get("/slots?fail_on_no_slot=1").status_code == 200  # both idle
    off = TestClient(create_app(model.llm, ServerConfig(slots=False)))
    assert off.get("/slots").status_code == 501
    # an idle slot's next token, as llama-server lists it: no budget left over
    assert slots[0]["next_token"] == [{"has_next_token": True, "has_new_line": False,
                                       "n_remain": -1, "n_decoded": 0}]  # fmt: skip
    saved = http.post("/slots/0?action=save", json={"filename": "x.bin"})
    # without --slot-save-path, llama-server's 501
    assert saved.status_code == 501 and "--slot-save-path" in saved.json()["error"]["message"]


class _Gate:
    """A constraint that holds its sequence until the test opens it."""

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


def test_busy_slots_are_shown_and_fail_on_no_slot_is_503(
    model: TinyModel, http: TestClient
) -> None:
    gate = _Gate(model.llama.config.n_vocab)
    # choices of one prompt are admitted together, one slot each
    job = GenerationJob(model.ids, 2, {"temperature": 0.0}, constraint=gate)
    handles = list(model.llm.generator.submit_choices([job, job]))
    try:
        deadline = time.monotonic() + 30
        while model.llm.stats().running < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert [s["is_processing"] for s in http.get("/slots").json()] == [True, True]
        r = http.get("/slots?fail_on_no_slot=1")
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
    finally:
        gate.open.set()
        for h in handles:
            list(h)


def test_metrics_only_with_metrics_under_llama_servers_names(
    model: TinyModel, http: TestClient
) -> None:
    _complete(http, prompt=PROMPT, n_predict=4)
    text = http.get("/metrics").text
    values = {line.split()[0]: float(line.split()[1])
              for line in text.splitlines() if line and not line.startswith("#")}  # fmt: skip
    stats = model.llm.stats()
    assert values["llamacpp:prompt_tokens_total"] == stats.prompt_tokens_total
    assert values["llamacpp:tokens_predicted_total"] == stats.generated_tokens_total > 0
    assert values["llamacpp:tokens_predicted_seconds_total"] > 0
    assert values["llamacpp:n_tokens_max"] >= len(model.ids) + 4
    assert values["llamacpp:prompt_tokens_cached_total"] == stats.prompt_tokens_reused
    assert values["llamacpp:n_decode_total"] == stats.decode_steps >= 4  # the prompt's, 3 more
    assert values["llamacpp:spec_decode_num_drafts_total"] == 0  # nothing is drafted
    assert 1 <= values["llamacpp:n_busy_slots_per_decode"] <= 2
    # llama-server's types: the watermark is a counter under its own name (no _total)
    assert "# TYPE llamacpp:n_tokens_max counter" in text.splitlines()
    # the throughput gauges cover the time since the previous scrape: the request's
    # rates once, then an idle server's zeros
    assert values["llamacpp:predicted_tokens_seconds"] > 0
    assert values["llamacpp:prompt_tokens_seconds"] > 0
    again = {line.split()[0]: float(line.split()[1])
             for line in http.get("/metrics").text.splitlines()
             if line and not line.startswith("#")}  # fmt: skip
    assert again["llamacpp:predicted_tokens_seconds"] == 0.0
    assert again["llamacpp:prompt_tokens_seconds"] == 0.0
    assert again["llamacpp:tokens_predicted_total"] == values["llamacpp:tokens_predicted_total"]
    off = TestClient(create_app(model.llm))
    assert off.get("/metrics").status_code == 501


# -- embeddings ---------------------------------------------------------------------------------


def test_embedding_is_the_pooled_vector_normalized(model: TinyModel, http: TestClient) -> None:
    r = http.post("/embedding", json={"content": "the of"}).json()
    [item] = r
    [row] = item["embedding"]
    expected = model.llm.embed_tokens([model.llm.tokenize("the of")])[0]
    expected = expected / np.linalg.norm(expected)
    assert np.allclose(row, expected, atol=1e-6)
    raw = http.post("/embeddings", json={"input": "the of", "embd_normalize": -1}).json()
    assert np.linalg.norm(raw[0]["embedding"][0]) != pytest.approx(1.0)


def test_pooling_none_gives_a_row_per_token(model: TinyModel, http: TestClient) -> None:
    model.llm.pooling = "none"
    try:
        ids = model.llm.tokenize("the of and")
        [item] = http.post("/embeddings", json={"content": ids}).json()
        assert np.asarray(item["embedding"]).shape == (len(ids), model.llama.config.n_embd)
        refused = http.post("/v1/embeddings", json={"input": "the"})
        assert refused.status_code == 400 and "--pooling" in refused.json()["error"]["message"]
    finally:
        model.llm.pooling = None


def test_llama_servers_prompt_objects_and_text_biases(model: TinyModel, http: TestClient) -> None:
    """``{"prompt_string": TEXT}`` is that text (one with multimodal data is 400); a
    ``logit_bias`` keyed by text biases each of its tokens, as llama-server's does."""
    want = _complete(http, prompt=PROMPT, n_predict=4)["content"]
    assert _complete(http, prompt={"prompt_string": PROMPT}, n_predict=4)["content"] == want
    both = http.post("/completion", json={"prompt": [model.ids, {"prompt_string": PROMPT}],
                                          "n_predict": 4, "temperature": 0}).json()  # fmt: skip
    assert [r["content"] for r in both] == [want, want]
    bad = http.post("/completion", json={"prompt": {"prompt_string": "x", "multimodal_data": "A"}})
    assert bad.status_code == 400 and "multimodal" in bad.json()["error"]["message"]
    first = model.greedy[0]
    text = model.llm.detokenize([first])
    ids = model.llm.tokenize(text, add_bos=False)
    assert first in ids
    for bias in ([[text, -100]], {text: -100}):
        got = _complete(http, prompt=PROMPT, n_predict=1, logit_bias=bias, return_tokens=True)
        assert got["tokens"][0] not in ids


def test_return_progress_reports_each_prompt_chunk_before_the_text(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """llama-server's ``return_progress``: a stream reports its prompt's evaluation
    (``total``, ``cache``, ``processed``, ``time_ms``) when admitted and after each chunk
    of ``n_batch`` tokens, before any text; the same prompt again finds all but its last
    token cached. On the chat route too, as role deltas with ``prompt_progress``."""
    from tensorplug_llm.api import LLM
    from tensorplug_llm.engine import Engine
    from tensorplug_llm.generation import EngineGenerator
    from tensorplug_llm.placement import Placement, host_cpu
    from tensorplug_llm.runner import ModelRunner
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("progress") / "t.gguf", "q8_0", 0,
                            metadata={"tokenizer.chat_template": TINY_CHAT_TEMPLATE})  # fmt: skip
    llama = ModelRunner(path, placement=Placement.on(host_cpu(), 2), n_ctx=128, warmup=False)
    llm = LLM(llama, generator=EngineGenerator(Engine(llama, 1, n_batch=8)))
    http = TestClient(create_app(llm, ServerConfig()))
    try:
        prompt = list(range(1, 21))  # 20 tokens: chunks of 8, 8 and 4

        def progress(route: str, body: dict[str, Any]) -> list[dict[str, int]]:
            r = http.post(route, json={"stream": True, "return_progress": True, **body})
            events = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip
            reports = [e["prompt_progress"] for e in events if "prompt_progress" in e]

            def text(e: dict[str, Any]) -> Any:
                return e.get("content") or (e.get("choices") or [{}])[0].get("delta", {}).get(
                    "content"
                )

            first_text = next(i for i, e in enumerate(events) if text(e))
            assert all("prompt_progress" not in e for e in events[first_text:])
            return reports

        cold = progress("/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0})
        assert [(p["total"], p["cache"], p["processed"]) for p in cold] == [
            (20, 0, 0), (20, 0, 8), (20, 0, 16), (20, 0, 20)]  # fmt: skip
        assert all(p["time_ms"] >= 0 for p in cold)
        warm = progress("/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0})
        assert [(p["cache"], p["processed"]) for p in warm] == [(19, 19), (19, 20)]
        timed = http.post("/completion", json={"prompt": prompt[::-1], "n_predict": 1,
                                               "stream": True, "return_progress": True,
                                               "timings_per_token": True})  # fmt: skip
        reports = [json.loads(line[6:]) for line in timed.text.splitlines()
                   if line.startswith("data: ") and "prompt_progress" in line]  # fmt: skip
        first = reports[0]["timings"]
        assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"]) == (0, 0.0, 0)
        assert [r["timings"]["prompt_n"] for r in reports] == [0, 8, 16, 20]
        chat = progress("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2, "temperature": 0})  # fmt: skip
        assert chat and chat[-1]["processed"] == chat[-1]["total"]
        plain = http.post("/completion", json={"prompt": prompt, "n_predict": 2,
                                               "return_progress": True})  # fmt: skip
        assert "prompt_progress" not in plain.json()  # reported on streams only
    finally:
        llm.close()
        llama.close()


def test_n_cache_reuse_takes_the_cached_run_after_a_cut(http: TestClient) -> None:
    """llama-server's ``n_cache_reuse`` (the server's ``--cache-reuse`` per request):
    after a cut in a prompt the slot held, the run that follows comes from the cache,
    moved to its new positions, rather than being evaluated again."""
    old = [1, *range(40, 80)]
    cut = [1, *range(40, 50), *range(60, 80)]
    for reuse, cached in ((0, 11), (8, len(cut) - 1)):
        _complete(http, prompt=old, n_predict=1, id_slot=0)
        got = _complete(http, prompt=cut, n_predict=1, id_slot=0, n_cache_reuse=reuse)
        timings = got["timings"]
        assert (timings["cache_n"], timings["prompt_n"]) == (cached, len(cut) - cached)
    r = http.post("/completion", json={"prompt": cut, "n_cache_reuse": -1})
    assert r.status_code == 400 and "n_cache_reuse" in r.text

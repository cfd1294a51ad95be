"""flash_attn_ext with ``online`` set: ggml's own flash attention kernel's arithmetic
(``kernels/_numba_flash.py``) against a float64 formula, by the way ggml takes for the
step (a row at a time, or in tiles for 64 query rows or more). The bits are held to
llama.cpp's in ``tests/llm/test_flash_attn.py``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from test_cpu_helpers import compute, nmse

import tensorplug as tp
from tensorplug import ops

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the online arithmetic is numba's"
)

RNG = np.random.default_rng(7)


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
               scale: float, softcap: float) -> np.ndarray:  # fmt: skip
    """softmax(q·kᵀ·scale (soft-capped) + mask)·v in float64, (B, n_q, H, Dv); a row
    that sees nothing gives zeros."""
    B, H, n_q, _ = q.shape
    g = H // k.shape[1]
    out = np.zeros((B, n_q, H, v.shape[-1]))
    for b in range(B):
        for h in range(H):
            s = q[b, h] @ k[b, h // g].T * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            s = s + mask[0, 0, :n_q]
            for r in range(n_q):
                if np.isneginf(s[r]).all():
                    continue
                e = np.exp(s[r] - s[r].max())
                out[b, r, h] = (e / e.sum()) @ v[b, h // g]
    return out


def _run(kv_type: tp.Type, n_q: int, softcap: float) -> tuple[np.ndarray, np.ndarray]:
    """The online op's output over a causal cache of ``n_q + 11`` cells (GQA, two
    batches, the last query row masked everywhere) and the float64 reference on the
    cache's own values (and, for F16, the query rounded as ggml's one-row way does)."""
    B, H, Hkv, D, Dv = 2, 4, 2, 64, 32
    n_kv = n_q + 11
    q = tp.new_tensor("f32", (B, H, n_q, D), "q")
    k = tp.new_tensor(kv_type, (B, Hkv, n_kv, D), "k")
    v = tp.new_tensor(kv_type, (B, Hkv, n_kv, Dv), "v")
    mask = tp.new_tensor(tp.Type.F16, (1, 1, n_q, n_kv), "mask")
    qv = RNG.standard_normal(q.shape).astype(np.float32)
    kv_ = RNG.standard_normal(k.shape).astype(kv_type.numpy_dtype)
    vv = RNG.standard_normal(v.shape).astype(kv_type.numpy_dtype)
    mv = np.triu(np.full((n_q, n_kv), -np.inf, np.float16), 12)[None, None]
    mv[..., -1, :] = -np.inf
    out = ops.flash_attn_ext(q, k, v, mask, scale=D**-0.5, logit_softcap=softcap, online=True)
    compute(out, {q: qv, k: kv_, v: vv, mask: mv})
    q64 = qv.astype(np.float64)
    if n_q < 64:  # one row at a time: the query rounded to F16, K's vec_dot type
        q64 = qv.astype(np.float16).astype(np.float64)
    # an F32 cache is rounded to F16 first, as llama.cpp casts it for flash attention
    k64 = kv_.astype(np.float16).astype(np.float64)
    v64 = vv.astype(np.float16).astype(np.float64)
    ref = _reference(q64, k64, v64, mv.astype(np.float64), D**-0.5, softcap)
    return tp.get_array(out), ref


@pytest.mark.parametrize("kv_type", [tp.Type.F16, tp.Type.F32])
@pytest.mark.parametrize("softcap", [0.0, 20.0])
def test_one_row_at_a_time_accumulates_v_in_f16(kv_type: tp.Type, softcap: float) -> None:
    """A few query rows: each row's output summed in f16 as ggml's ``ggml_vec_mad_f16``
    does: near the float64 value, and only as near as f16 lets it be."""
    got, ref = _run(kv_type, 5, softcap)
    assert nmse(got, ref) < 1e-5
    assert nmse(got, ref) > 1e-9  # f16 sums, not float32 ones
    np.testing.assert_array_equal(got[:, -1], 0)


@pytest.mark.parametrize("kv_type", [tp.Type.F16, tp.Type.F32])
def test_a_prompt_of_64_rows_is_tiled_in_float32(kv_type: tp.Type) -> None:
    """64 query rows or more: ggml's tiles, float32 query and sums (tiles of 64 cells
    rescaled at each new maximum): float32-close to the float64 value."""
    got, ref = _run(kv_type, 70, 0.0)
    assert nmse(got, ref) < 1e-10
    np.testing.assert_array_equal(got[:, -1], 0)


def test_the_op_records_online_and_defaults_to_off() -> None:
    q = tp.new_tensor("f32", (1, 2, 3, 8), "q")
    k = tp.new_tensor("f16", (1, 1, 4, 8), "k")
    v = tp.new_tensor("f16", (1, 1, 4, 8), "v")
    assert ops.flash_attn_ext(q, k, v).op_params["online"] is False
    assert ops.flash_attn_ext(q, k, v, online=True).op_params["online"] is True


def _f16_and_f32_outputs(n_q: int, softcap: float, heads: int, kv_heads: int,
                        dv: int) -> list[np.ndarray]:  # fmt: skip
    """The online op's output over an F16 cache and over an F32 one of the same values
    (two batches, each row seeing cells of its own, in a cell order that is not the
    cache's, and cells no row sees at the end)."""
    B, D, n_kv = 2, 64, n_q + 40
    qv = RNG.standard_normal((B, heads, n_q, D)).astype(np.float32)
    kv16 = RNG.standard_normal((B, kv_heads, n_kv, D)).astype(np.float16)
    vv16 = RNG.standard_normal((B, kv_heads, n_kv, dv)).astype(np.float16)
    seen = RNG.random((n_q, n_kv)) < 0.6
    seen[:, 0] = True
    mv = np.where(seen, 0, -np.inf).astype(np.float16)[None, None]
    mv[..., n_kv - 7 :] = -np.inf  # cells no row sees: the padding of a runner's step
    order = RNG.permutation(n_kv).astype(np.int32)
    outs = []
    for kv_type in (tp.Type.F16, tp.Type.F32):
        q = tp.new_tensor("f32", qv.shape, "q")
        k = tp.new_tensor(kv_type, kv16.shape, "k")
        v = tp.new_tensor(kv_type, vv16.shape, "v")
        mask = tp.new_tensor(tp.Type.F16, mv.shape, "mask")
        cells = tp.new_tensor(tp.Type.I32, order.shape, "order")
        out = ops.flash_attn_ext(q, k, v, mask, scale=D**-0.5, logit_softcap=softcap,
                                 order=cells, online=True)  # fmt: skip
        dtype = kv_type.numpy_dtype
        compute(out, {q: qv, k: kv16.astype(dtype), v: vv16.astype(dtype), mask: mv,
                      cells: order})  # fmt: skip
        outs.append(tp.get_array(out).copy())
    assert np.isfinite(outs[0]).all() and np.abs(outs[0]).max() > 0.1
    return outs


@pytest.mark.parametrize(("n_q", "softcap"), [(1, 0.0), (5, 0.0), (5, 30.0), (70, 0.0)])
def test_an_f16_cache_gives_the_bits_of_the_same_values_in_an_f32_one(
    n_q: int, softcap: float
) -> None:
    """An F16 cache is read in place by the compiled program's job (a KV head's query
    heads together where one mask serves them all), an F32 one is cast to F16 and read
    by the parallel kernel, a query head at a time: the same values, so the same bits,
    however the rows and cells lie (GQA 3:1)."""
    f16, f32 = _f16_and_f32_outputs(n_q, softcap, 6, 2, 64)
    np.testing.assert_array_equal(f16, f32)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dv"), [(2, 2, 64), (4, 2, 80), (8, 2, 64), (10, 2, 40)]
)
def test_every_group_and_value_size_gives_the_bits_of_a_head_at_a_time(
    heads: int, kv_heads: int, dv: int
) -> None:
    """The job carries query heads' outputs in registers over a KV head's cells, 64
    values at a time (up to four heads a walk on a CPU of 32 vector registers, one of
    16), the values past the last run in memory: groups of 1, 2, 4 and 5 (four, then
    one) query heads, value sizes of one run, one and a tail, and a tail alone, give
    the parallel kernel's bits, which takes one query head's values one cell at a time."""
    f16, f32 = _f16_and_f32_outputs(3, 0.0, heads, kv_heads, dv)
    np.testing.assert_array_equal(f16, f32)


_JOB_WITHOUT_F16C = """
import ctypes
import numpy as np
from tensorplug_cpu.kernels import _numba_ir as ir

ir.HAS_F16C = False  # then compiled afresh (the disk cache does not know it)
from numba import njit
from tensorplug_cpu.kernels import _numba_flash as flash
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table
from tensorplug_cpu.kernels.job_blocks import flash_job_block

rng = np.random.default_rng(5)
rows, hkv, group, d, n_kv = 3, 2, 3, 64, 48
q = rng.standard_normal((1, hkv * group, rows, d)).astype(np.float32)
k16 = rng.standard_normal((1, hkv, n_kv, d)).astype(np.float16)
v16 = rng.standard_normal((1, hkv, n_kv, d)).astype(np.float16)
seen = rng.random((rows, n_kv)) < 0.7
seen[:, 0] = True
mask = np.where(seen, 0, -np.inf).astype(np.float16)[None, None]
order = np.zeros(0, np.int32)
job = np.full((1, rows, hkv * group, d), np.nan, np.float32)
raw = mask.view(np.uint16)
block, chunks = flash_job_block(q, k16.view(np.uint16), v16.view(np.uint16), raw, raw, order,
                                d**-0.5, 0.0, False, job, table, 1)
run = njit(flash._flash_job)
run(block.ctypes.data, -1, 0)
run(block.ctypes.data, 0, chunks)
each = np.empty_like(job)
attend = njit(parallel=True)(flash.flash_attend.py_func)
attend(q, k16.view(np.uint16), v16.view(np.uint16), raw, order, n_kv, d**-0.5, 0.0, True,
       False, each, table)
assert np.isfinite(job).all() and np.abs(job).max() > 0.1
assert np.array_equal(job, each), np.abs(job - each).max()
print("ok")
"""


@pytest.mark.slow
def test_without_f16c_the_job_keeps_the_outputs_in_memory_with_the_same_bits() -> None:
    """Without F16C (no conversion in registers) the job's outputs take the cells one
    at a time in memory, rounded through the f16 table: compiled so in a fresh process,
    the job gives the parallel kernel's bits there too."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _JOB_WITHOUT_F16C], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_a_chunk_of_every_kv_head_gives_the_bits_of_a_chunk_a_kv_head() -> None:
    """The flash job's chunks take one query row of one KV head's query heads, or, from
    ``WHOLE_ROW_CHUNKS`` rows a thread, of every KV head's (the row's visible cells then
    found once for all its heads): the same bits either way. Sixteen decoding rows, each
    of its own sequence, their cells interleaved in the cache as a server's slots lie."""
    import ctypes

    from tensorplug_cpu.kernels._numba_flash import flash_job
    from tensorplug_cpu.kernels.jit import F16_TO_F32
    from tensorplug_cpu.kernels.job_blocks import (
        FLASH_KV_SPAN,
        WHOLE_ROW_CHUNKS,
        flash_job_block,
    )

    rows, hkv, group, d, held = 16, 3, 3, 64, 9
    n_kv = 256
    seq = np.full(n_kv, -1)
    seq[: rows * held] = np.tile(np.arange(rows), held)  # cell c: sequence c % 16
    pos = np.full(n_kv, n_kv)
    pos[: rows * held] = np.repeat(np.arange(held), rows)
    k = RNG.standard_normal((1, hkv, n_kv, d)).astype(np.float16).view(np.uint16)
    v = RNG.standard_normal((1, hkv, n_kv, d)).astype(np.float16).view(np.uint16)
    q = RNG.standard_normal((1, hkv * group, rows, d)).astype(np.float32)
    seen = seq[None, :] == np.arange(rows)[:, None]
    mask = np.where(seen, 0, -np.inf).astype(np.float16)[None, None].view(np.uint16)
    order = np.argsort(pos, kind="stable").astype(np.int32)
    job = flash_job()
    job.compile()
    call = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(job.address)
    outs, spans = [], []
    for threads in (rows // WHOLE_ROW_CHUNKS, rows // WHOLE_ROW_CHUNKS + 1):
        out = np.full((1, rows, hkv * group, d), np.nan, np.float32)
        block, chunks = flash_job_block(q, k, v, mask, mask, order, d**-0.5, 0.0, False, out,
                                        F16_TO_F32, threads)  # fmt: skip
        call(block.ctypes.data, -1, 0)
        call(block.ctypes.data, 0, chunks)
        spans.append((int(block[FLASH_KV_SPAN]), chunks))
        outs.append(out)
    assert spans == [(hkv, rows), (1, rows * hkv)]
    assert np.isfinite(outs[0]).all() and np.abs(outs[0]).max() > 0.1
    np.testing.assert_array_equal(outs[0], outs[1])

"""A quantized KV cache on the CPU: its rows written as ggml's ``from_float`` writes them
(``kernels/_numba_encode.py``), the rotation llama.cpp applies before (``hadamard``, as
ggml's fast transform), and flash attention reading the blocks (``_numba_flash_blocks``)
against a float64 formula on the decoded rows. The whole path is held to llama.cpp's
logits, to the bit, in ``tests/llm/test_flash_attn.py``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute, nmse, q8_0_blocks

import tensorplug as tp
from tensorplug import ops
from tensorplug.errors import OutOfBoundsError
from tensorplug.quants import dequantize_blocks, quantize, row_size
from tensorplug.types import Type

numba_only = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the encoders are numba's"
)
RNG = np.random.default_rng(11)
#: ggml's IQ4_NL levels
IQ4_NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                  np.float32)  # fmt: skip


def _written(t: Type, values: np.ndarray, rows: np.ndarray, n_rows: int = 6) -> np.ndarray:
    """The raw table after set_rows of ``values`` at ``rows`` on the CPU backend."""
    table = tp.new_tensor(t, (n_rows, values.shape[1]), "cache")
    x = tp.new_tensor(Type.F32, values.shape, "rows")
    idx = tp.new_tensor(Type.I64, (rows.size,), "idx")
    out = ops.set_rows(table, x, idx)
    start = np.zeros((n_rows, row_size(t, values.shape[1])), np.uint8)
    compute(out, {table: start, x: values, idx: rows.astype(np.int64)})
    return tp.get_array(table)


def _q8_0_x86(x: np.ndarray) -> np.ndarray:
    """x86's ``quantize_row_q8_0``: ``d = f16(amax/127)``, codes ``x·(127/amax)`` rounded
    half to even."""
    codes, d, _ = q8_0_blocks(x)
    blocks = np.empty((*codes.shape[:-1], 34), np.uint8)
    blocks[..., :2] = d.astype(np.float16).view(np.uint8)
    blocks[..., 2:] = codes.astype(np.int8).view(np.uint8)
    return blocks.reshape(x.shape[0], -1)


def _nearest_level(x: np.float32) -> int:
    """ggml's ``best_index_int8``."""
    if x <= IQ4_NL[0]:
        return 0
    if x >= IQ4_NL[15]:
        return 15
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if x < IQ4_NL[mid] else (mid, hi)
    return hi - 1 if x - IQ4_NL[hi - 1] < IQ4_NL[hi] - x else hi


def _iq4_nl_ref(x: np.ndarray) -> np.ndarray:
    """``quantize_row_iq4_nl_ref`` (``ntry = −1``), value by value in float32."""
    out = np.zeros((x.shape[0], x.shape[1] // 32, 18), np.uint8)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            xb = x[r, 32 * b : 32 * b + 32].astype(np.float32)
            big = xb[int(np.argmax(np.abs(xb)))]
            d = np.float32(big / np.float32(-127))
            inv = np.float32(np.float32(1) / d)
            sum_qx = sum_q2 = np.float32(0)
            levels = []
            for v in xb:
                level = _nearest_level(np.float32(inv * v))
                q = IQ4_NL[level]
                wq = np.float32(np.float32(v * v) * q)
                sum_qx = np.float32(sum_qx + np.float32(wq * v))
                sum_q2 = np.float32(sum_q2 + np.float32(wq * q))
                levels.append(level)
            scale = np.float32(sum_qx / sum_q2) if sum_q2 > 0 else np.float32(0)
            out[r, b, :2] = np.array([scale], np.float16).view(np.uint8)
            out[r, b, 2:] = [levels[j] | (levels[16 + j] << 4) for j in range(16)]
    return out.reshape(x.shape[0], -1)


@numba_only
@pytest.mark.parametrize("t", [Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1])
def test_rows_are_written_as_ggmls_reference_quantizers(t: Type) -> None:
    values = (RNG.standard_normal((4, 192)) * 2).astype(np.float32)
    rows = np.array([5, 0, 3, 2])
    table = _written(t, values, rows)
    np.testing.assert_array_equal(table[rows], quantize(values, t))  # ggml's *_ref


@numba_only
def test_q8_0_rows_are_x86s_with_ties_to_even() -> None:
    values = (RNG.standard_normal((3, 64)) * 3).astype(np.float32)
    values[0, :4] = [127, 2.5, -3.5, 0.5]  # amax 127: codes x·1, ties to even (2, -4, 0)
    table = _written(Type.Q8_0, values, np.arange(3))
    np.testing.assert_array_equal(table[:3], _q8_0_x86(values))
    assert list(table[0, 2:6].view(np.int8)) == [127, 2, -4, 0]


@numba_only
def test_iq4_nl_rows_are_ggmls_one_pass_quantizer() -> None:
    values = (RNG.standard_normal((3, 64)) * 0.7).astype(np.float32)
    table = _written(Type.IQ4_NL, values, np.array([1, 4, 2]))
    np.testing.assert_array_equal(table[[1, 4, 2]], _iq4_nl_ref(values))


@numba_only
def test_a_bad_row_index_writes_nothing() -> None:
    values = np.ones((2, 32), np.float32)
    table = tp.new_tensor(Type.Q8_0, (4, 32), "cache")
    x = tp.new_tensor(Type.F32, (2, 32), "rows")
    idx = tp.new_tensor(Type.I64, (2,), "idx")
    start = quantize(np.full((4, 32), 0.5, np.float32), Type.Q8_0)
    with pytest.raises(OutOfBoundsError, match="index 4 with 4 rows"):
        compute(ops.set_rows(table, x, idx), {table: start, x: values,
                                              idx: np.array([1, 4], np.int64)})  # fmt: skip
    np.testing.assert_array_equal(tp.get_array(table), start)


def _fwht(x: np.ndarray, n: int) -> np.ndarray:
    """ggml's ``ggml_compute_forward_fwht``, one run at a time in float32."""
    out = (x.astype(np.float32) * np.float32(1 / np.sqrt(np.float32(n)))).astype(np.float32)
    runs = out.reshape(-1, n)
    for run in runs:
        span = 1
        while span < n:
            for i in range(0, n, 2 * span):
                for j in range(i, i + span):
                    u, v = run[j], run[j + span]
                    run[j], run[j + span] = u + v, u - v
            span *= 2
    return out


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("n", [64, 128])
def test_hadamard_is_ggmls_fast_transform_bit_for_bit(jit: bool, n: int) -> None:
    if jit and importlib.util.find_spec("numba") is None:
        pytest.skip("no numba")
    values = RNG.standard_normal((5, 2 * n)).astype(np.float32)
    x = tp.new_tensor(Type.F32, values.shape, "x")
    once = ops.hadamard(x, n)
    twice = ops.hadamard(once, n)
    compute([once, twice], {x: values}, backend_for(jit))
    np.testing.assert_array_equal(tp.get_array(once), _fwht(values, n))
    np.testing.assert_allclose(tp.get_array(twice), values, atol=1e-5)  # its own inverse


def test_hadamard_refuses_what_is_not_a_rotation() -> None:
    x = tp.new_tensor(Type.F32, (2, 96), "x")
    with pytest.raises(tp.OpParamError, match="power of two"):
        ops.hadamard(x, 48)
    with pytest.raises(tp.ShapeError, match="must divide"):
        ops.hadamard(x, 64)
    with pytest.raises(tp.TypeMismatchError, match="F32"):
        ops.hadamard(tp.new_tensor(Type.F16, (2, 64), "h"), 64)


def _stored(rows: np.ndarray, t: Type) -> np.ndarray:
    """Rows as a tensor of type ``t`` holds them (set_array's array)."""
    return rows.astype(np.float16) if t == Type.F16 else quantize(rows, t)


def _decoded(stored: np.ndarray, t: Type) -> np.ndarray:
    if t == Type.F16:
        return stored.astype(np.float64)
    return dequantize_blocks(stored.reshape(stored.shape[0], -1, t.type_size), t)


@numba_only
@pytest.mark.parametrize(
    ("k_type", "v_type"),
    [(Type.Q8_0, Type.Q8_0), (Type.Q4_0, Type.F16), (Type.Q5_1, Type.Q4_1),
     (Type.IQ4_NL, Type.Q5_0), (Type.F16, Type.Q8_0)],
)  # fmt: skip
def test_flash_attention_reads_a_cache_of_rows(k_type: Type, v_type: Type) -> None:
    """The runner's layout: one row per cell, every KV head's blocks side by side, seen
    per head through a permuted view; queries of three heads per KV head, a causal
    mask, a generation step's one row and a prompt's several."""
    n_cells, h_kv, dim, group = 40, 2, 64, 3
    for n_q in (1, 5):
        k_rows = RNG.standard_normal((n_cells, h_kv * dim)).astype(np.float32)
        v_rows = RNG.standard_normal((n_cells, h_kv * dim)).astype(np.float32)
        q_vals = RNG.standard_normal((n_q, h_kv * group, dim)).astype(np.float32)
        n_kv = 32
        mask = np.zeros((n_q, n_kv), np.float16)
        for r in range(n_q):
            mask[r, n_kv - n_q + r + 1 :] = -np.inf
        kc, vc = tp.new_tensor(k_type, k_rows.shape, "k"), tp.new_tensor(v_type, v_rows.shape, "v")
        q = tp.new_tensor(Type.F32, q_vals.shape, "q")
        m = tp.new_tensor(Type.F16, mask.shape, "mask")
        view = (n_kv, h_kv, dim)
        K = ops.permute(ops.view(kc, view), (1, 0, 2))
        V = ops.permute(ops.view(vc, view), (1, 0, 2))
        out = ops.flash_attn_ext(ops.permute(q, (1, 0, 2)), K, V, m, scale=0.125, online=True)
        stored = {kc: _stored(k_rows, k_type), vc: _stored(v_rows, v_type)}
        compute(out, {**stored, q: q_vals, m: mask})
        decoded = {t: _decoded(stored[t], t.type).reshape(n_cells, h_kv, dim) for t in (kc, vc)}
        want = np.zeros((n_q, h_kv * group, dim))
        for h in range(h_kv * group):
            keys, values = decoded[kc][:n_kv, h // group], decoded[vc][:n_kv, h // group]
            s = q_vals[:, h].astype(np.float64) @ keys.T * 0.125 + mask
            e = np.exp(s - s.max(axis=1, keepdims=True))
            want[:, h] = (e / e.sum(axis=1, keepdims=True)) @ values
        # the query rounded to Q8 codes for quantized keys (ggml's vec_dot_type): ~3e-5
        assert nmse(tp.get_array(out), want) < 1e-4

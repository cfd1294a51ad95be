"""Repacked K-quant products in ggml's order of float operations (a CPU backend's
default; ``set_batch_invariant(True)`` and ``TENSORPLUG_CPU_GGML_PRODUCT_ORDER``
choose the other), held to the bit against an independent
reimplementation of that order in numpy: integers for what ggml sums in integers, and
each float32 step (``fmaf`` exactly, then float32 adds) where ggml takes it.

* Q6_K: llama-cpp-python 0.3.36's ggml repacks Q6_K only for ARM. On x86 a product of
  fewer than 8 activation rows runs ``ggml_vec_dot_q6_K_q8_K`` (arch/x86/quants.c,
  AVX2) row by row: eight float sums a row, lane ``c`` taking once per super-block
  ``d_x·d_w`` times one exact integer (the codes ``4c..4c+3`` of each 32-value run
  times the Q8_K codes, each run's scaled by its 16 values' scale, less
  ``32·(sc·bsum)`` over 16-value groups ``2c, 2c + 1``), then ``hsum_float_8``. From 8
  rows its tiled K-quant product (tiled/tiled-kernel.cpp) takes over: one sum a row,
  ``fmaf(f32(I)·d_w, d_x, sum)`` per super-block, ``I`` its exact integer.
* Q8_0 and Q5_0: ``ggml_vec_dot_q8_0_q8_0`` and ``ggml_vec_dot_q5_0_q8_0`` (x86) keep
  eight float sums a row, lane ``k`` taking ``fmaf(d_w·d_x, I, sum)`` once per block,
  ``I`` the exact integer of the block's values ``4k..4k+3`` times the Q8_0 codes, then
  ``hsum_float_8`` (llamafile's tinyBLAS, which takes llama.cpp's prompts, keeps that
  order). Checked on this host's instructions and, in a second process, an AVX2
  host's (16 vector registers: its tiles carry one sum a row through each pass over
  the blocks).
* Q4_K: ggml's repacked ``ggml_gemm_q4_K_8x8_q8_K`` takes a product's activation rows
  in groups of four from the first (one multiply-add per pair of sub-blocks) and its
  ``ggml_gemv_q4_K_8x8_q8_K`` the last ``n % 4`` (one per super-block): a row's bits
  depend on where it falls, which is why a batch-invariant backend does not follow it
  (there a row's bits never depend on the rows beside it, ``test_cpu_repack``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from test_cpu_helpers import q8_0_blocks, q8_k_blocks, throwaway_cache_env

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import quantize
from tensorplug_cpu.system import AVX2_FEATURES

RNG = np.random.default_rng(38)
N_IN = 512  # two super-blocks


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``fmaf(a, b, c)`` elementwise for float32 arrays, rounded once: ``a·b`` is exact
    in float64 (24 + 24 bits), its sum with ``c`` is rounded to odd (TwoSum's error
    tells which way the nearest sum went), and a float64 rounded to odd rounds to the
    float32 nearest the exact value."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    back = s - p
    err = (p - (s - back)) + (c64 - back)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def hsum_float_8(lanes: np.ndarray) -> np.ndarray:
    """ggml's ``hsum_float_8`` over the last axis (8 float32 lanes)."""
    a = [lanes[..., k] for k in range(8)]
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))


def q6_k_fields(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K rows of blocks (``ql[128] qh[64] scales[16] d``): the unsigned 6-bit codes
    (int64 ``(rows, n_sb, 256)``), the signed scales ``(rows, n_sb, 16)`` and ``d``
    (float32 ``(rows, n_sb)``), as ``dequantize_row_q6_K`` reads them."""
    blocks = raw.reshape(raw.shape[0], -1, 210)
    ql, qh = blocks[..., :128].astype(np.int64), blocks[..., 128:192].astype(np.int64)
    scales = blocks[..., 192:208].view(np.int8).astype(np.int64)
    d = blocks[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = np.empty((*blocks.shape[:2], 256), np.int64)
    for n in range(2):
        base, top = 128 * n, qh[..., 32 * n : 32 * n + 32]
        lo, hi = ql[..., 64 * n : 64 * n + 32], ql[..., 64 * n + 32 : 64 * n + 64]
        codes[..., base : base + 32] = (lo & 15) | ((top & 3) << 4)
        codes[..., base + 32 : base + 64] = (hi & 15) | (((top >> 2) & 3) << 4)
        codes[..., base + 64 : base + 96] = (lo >> 4) | (((top >> 4) & 3) << 4)
        codes[..., base + 96 : base + 128] = (hi >> 4) | (((top >> 6) & 3) << 4)
    return codes, scales, d


Fields = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def q4_k_fields(raw: np.ndarray) -> Fields:
    """Q4_K rows of blocks (``d dmin scales[12] qs[128]``): the 4-bit codes (int64
    ``(rows, n_sb, 256)``), the sub-blocks' 6-bit scales and minimums ``(rows, n_sb,
    8)`` (``get_scale_min_k4``), ``d`` and ``dmin`` (float32 ``(rows, n_sb)``)."""
    blocks = raw.reshape(raw.shape[0], -1, 144)
    d, dmin = (blocks[..., k : k + 2].copy().view(np.float16)[..., 0].astype(np.float32)
               for k in (0, 2))  # fmt: skip
    q = blocks[..., 4:16].astype(np.int64)
    sc, mn = np.empty((*blocks.shape[:2], 8), np.int64), np.empty((*blocks.shape[:2], 8), np.int64)
    for j in range(8):
        if j < 4:
            sc[..., j], mn[..., j] = q[..., j] & 63, q[..., j + 4] & 63
        else:
            sc[..., j] = (q[..., j + 4] & 15) | ((q[..., j - 4] >> 6) << 4)
            mn[..., j] = (q[..., j + 4] >> 4) | ((q[..., j] >> 6) << 4)
    qs = blocks[..., 16:].astype(np.int64)
    codes = np.empty((*blocks.shape[:2], 256), np.int64)
    for j in range(4):
        codes[..., 64 * j : 64 * j + 32] = qs[..., 32 * j : 32 * j + 32] & 15
        codes[..., 64 * j + 32 : 64 * j + 64] = qs[..., 32 * j : 32 * j + 32] >> 4
    return codes, sc, mn, d, dmin


def ggml_q6_k_product(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """``out[t, o]`` as x86 ggml computes it for a product of ``x``'s rows: its tiled
    product from 8 rows, ``vec_dot_q6_K_q8_K`` below (module docstring)."""
    q, sc, d_w = q6_k_fields(raw)  # (O, S, 256), (O, S, 16), (O, S)
    xq, d_x = q8_k_blocks(x)  # (T, S, 256), (T, S, 1)
    n_out, n_sb = d_w.shape
    if x.shape[0] >= 8:  # ggml_tiled_min_batch
        sums = np.einsum("osgv,tsgv->tosg", q.reshape(n_out, n_sb, 16, 16),
                         xq.reshape(-1, n_sb, 16, 16))  # fmt: skip
        bsums = xq.reshape(-1, n_sb, 16, 16).sum(-1)[:, None]  # (T, 1, S, 16)
        whole = ((sums - 32 * bsums) * sc[None]).sum(-1).astype(np.float32)  # (T, O, S)
        out = np.zeros((x.shape[0], n_out), np.float32)
        for s in range(n_sb):
            scaled = (whole[:, :, s] * d_w[None, :, s]).astype(np.float32)
            out = fma32(scaled, np.broadcast_to(d_x[:, s], scaled.shape), out)
        return out
    # value 128n + 32k + 4c + j: half n, run k, lane c, place j
    prods = np.einsum("osnkcj,tsnkcj->tosnkc", q.reshape(n_out, n_sb, 2, 4, 8, 4),
                      xq.reshape(-1, n_sb, 2, 4, 8, 4))  # fmt: skip
    run_scale = sc.reshape(n_out, n_sb, 2, 4, 2)[..., np.arange(8) // 4]  # (O, S, n, k, c)
    positive = (prods * run_scale).sum(axis=(3, 4))  # (T, O, S, c)
    bsums = xq.reshape(-1, n_sb, 8, 2, 16).sum(-1)  # (T, S, c, 2): groups 2c, 2c + 1
    offset = 32 * np.einsum("osch,tsch->tosc", sc.reshape(n_out, n_sb, 8, 2), bsums)
    lanes = (positive - offset).astype(np.float32)  # (T, O, S, 8), cvtepi32_ps
    acc = np.zeros((x.shape[0], n_out, 8), np.float32)
    for s in range(n_sb):
        dd = (d_x[:, s] * d_w[None, :, s]).astype(np.float32)  # (T, O): y.d·x.d
        acc = fma32(np.broadcast_to(dd[..., None], acc.shape), lanes[:, :, s], acc)
    return hsum_float_8(acc)


def ggml_lane_product(x: np.ndarray, raw: np.ndarray, t: tp.Type) -> np.ndarray:
    """``out[t, o]`` as x86 ggml's ``vec_dot_q8_0_q8_0`` (or ``q5_0``) computes it: per
    block, lane ``k``'s exact integer over values ``4k..4k+3``, converted and multiplied
    into the lane by ``f32(d_w·d_x)`` (both scales f16) with one rounding, block after
    block; then ``hsum_float_8``."""
    n_out = raw.shape[0]
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(n_out, -1, 32)
    blocks = raw.reshape(n_out, w.shape[1], -1)
    d_w = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # (O, B)
    with np.errstate(invalid="ignore", divide="ignore"):  # d·q is exact: q = (d·q) / d
        q = np.where(d_w[..., None] != 0, w / d_w[..., None], 0).astype(np.int64)
    xq, d_x, _ = q8_0_blocks(x)
    d_x16 = d_x[..., 0].astype(np.float16).astype(np.float32)  # (T, B): as block_q8_0 keeps it
    lanes = np.einsum("obkj,tbkj->tobk", q.reshape(n_out, -1, 8, 4),
                      xq.astype(np.int64).reshape(x.shape[0], -1, 8, 4))  # fmt: skip
    acc = np.zeros((x.shape[0], n_out, 8), np.float32)
    for b in range(w.shape[1]):
        dd = (d_x16[:, None, b] * d_w[None, :, b]).astype(np.float32)  # (T, O)
        acc = fma32(np.broadcast_to(dd[..., None], acc.shape), lanes[:, :, b].astype(np.float32),
                    acc)  # fmt: skip
    return hsum_float_8(acc)


def ggml_q4_k_product(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """``out[t, o]`` as x86 ggml's repacked Q4_K computes it for a product of ``x``'s rows:
    its gemm's order for rows in groups of four from the first, its gemv's for the
    last ``n % 4`` (module docstring)."""
    q, sc, mn, d, dmin = q4_k_fields(raw)
    xq, d_x = q8_k_blocks(x)
    n_out, n_sb = d.shape
    sums = np.einsum("osbv,tsbv->tosb", q.reshape(n_out, n_sb, 8, 32),
                     xq.reshape(-1, n_sb, 8, 32))  # fmt: skip  # (T, O, S, sub-block)
    bsums = xq.reshape(-1, n_sb, 8, 32).sum(-1)  # (T, S, sub-block)
    scaled = sums * sc[None]
    mins = bsums[:, None] * mn[None]
    n_gemm = x.shape[0] - x.shape[0] % 4
    acc = np.zeros((x.shape[0], n_out), np.float32)
    acc_min = np.zeros_like(acc)
    for s in range(n_sb):
        scale = (d[None, :, s] * d_x[:, s]).astype(np.float32)  # (T, O)
        scale_min = (dmin[None, :, s] * d_x[:, s]).astype(np.float32)
        for t in range(x.shape[0]):
            parts = [slice(2 * p, 2 * p + 2) for p in range(4)] if t < n_gemm else [slice(0, 8)]
            for part in parts:  # gemm: a pair of sub-blocks at a time; gemv: all eight
                i_sum = scaled[t, :, s, part].sum(-1).astype(np.float32)
                i_min = mins[t, :, s, part].sum(-1).astype(np.float32)
                acc[t] = fma32(i_sum, scale[t], acc[t])
                acc_min[t] = fma32(i_min, scale_min[t], acc_min[t])
    return acc - acc_min


def _product_graph(dev: Any, t: tp.Type, raw: np.ndarray, x: np.ndarray) -> tp.Graph:
    """``raw`` (repacked on ``dev``) times ``x``, allocated and filled."""
    w = tp.new_tensor(t, (raw.shape[0], N_IN), "w")
    assert tp.alloc_tensors([w], dev.repack_buffer_type(), tp.BufferUsage.WEIGHTS) is not None
    tp.set_array(w, raw)
    xt = tp.new_tensor("f32", x.shape, "x")
    y = ops.mul_mat(w, xt)
    tp.alloc_tensors([xt, y], tp.host_buffer_type())
    tp.set_array(xt, x)
    return tp.Graph(y)


def _cpu_product(
    t: tp.Type, raw: np.ndarray, x: np.ndarray, batch_invariant: bool = False
) -> np.ndarray:
    from tensorplug_cpu.device import create_reg

    reg = create_reg()
    dev = reg.device(0)
    backend = dev.init_backend()
    set_batch_invariant = reg.get_proc("set_batch_invariant")
    assert set_batch_invariant is not None
    set_batch_invariant(backend, batch_invariant)
    graph = _product_graph(dev, t, raw, x)
    backend.graph_compute(graph)
    return tp.get_array(graph.nodes[-1])


def _weights(t: tp.Type, n_out: int) -> np.ndarray:
    w = RNG.standard_normal((n_out, N_IN)).astype(np.float32)
    return np.ascontiguousarray(quantize(w, t))


@pytest.fixture
def ggml_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend's own choice, ggml's order unless it is asked for batch invariance."""
    pytest.importorskip("numba", reason="the repacked products are numba's")
    monkeypatch.delenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", raising=False)


@pytest.mark.parametrize("t", [tp.Type.Q6_K, tp.Type.Q4_K], ids=lambda t: t.name)
def test_the_reference_reads_the_blocks_as_gguf_decodes_them(t: tp.Type) -> None:
    raw = _weights(t, 8)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(8, -1)
    if t == tp.Type.Q6_K:
        q, sc, d = q6_k_fields(raw)
        got = d[..., None] * np.repeat(sc, 16, axis=-1) * (q - 32)
    else:
        q, sc, mn, d, dmin = q4_k_fields(raw)
        got = (d[..., None] * np.repeat(sc, 32, axis=-1)) * q - dmin[..., None] * np.repeat(
            mn, 32, axis=-1
        )
    np.testing.assert_allclose(got.reshape(8, -1), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n_tok", [1, 3, 4, 5, 7, 8, 11])
def test_q6_k_products_are_ggml_vec_dot_and_tiled_bits(ggml_order: None, n_tok: int) -> None:
    raw = _weights(tp.Type.Q6_K, 24)
    x = RNG.standard_normal((n_tok, N_IN)).astype(np.float32)
    np.testing.assert_array_equal(_cpu_product(tp.Type.Q6_K, raw, x), ggml_q6_k_product(x, raw))


@pytest.mark.parametrize("n_tok", [1, 3, 4, 6, 11])
def test_q4_k_products_are_ggml_gemm_and_gemv_bits(ggml_order: None, n_tok: int) -> None:
    raw = _weights(tp.Type.Q4_K, 24)
    x = RNG.standard_normal((n_tok, N_IN)).astype(np.float32)
    np.testing.assert_array_equal(_cpu_product(tp.Type.Q4_K, raw, x), ggml_q4_k_product(x, raw))


LANE_TYPES = [tp.Type.Q8_0, tp.Type.Q5_0]


@pytest.mark.parametrize("t", LANE_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 4, 8, 11])
def test_q8_0_and_q5_0_products_are_ggml_vec_dot_bits(
    ggml_order: None, t: tp.Type, n_tok: int
) -> None:
    raw = _weights(t, 24)
    x = RNG.standard_normal((n_tok, N_IN)).astype(np.float32)
    np.testing.assert_array_equal(_cpu_product(t, raw, x), ggml_lane_product(x, raw, t))


#: the types an AVX2 host's kernels are checked for, and their references
AVX2_CHECKED = {
    tp.Type.Q8_0: lambda x, raw: ggml_lane_product(x, raw, tp.Type.Q8_0),
    tp.Type.Q5_0: lambda x, raw: ggml_lane_product(x, raw, tp.Type.Q5_0),
    tp.Type.Q6_K: ggml_q6_k_product,
    tp.Type.Q4_K: ggml_q4_k_product,
}
AVX2_ROWS = (1, 3, 11)

_ON_AN_AVX2_HOST = """
import sys
import numpy as np
import test_cpu_ggml_order as t
from tensorplug_cpu.kernels import _numba_ir as ir
assert (ir.HAS_AVX2, ir.HAS_VNNI, ir.HAS_32_REGS) == (True, False, False)
data = np.load(sys.argv[1])
for kind in t.AVX2_CHECKED:
    for n in t.AVX2_ROWS:
        got = t._cpu_product(kind, data[kind.name], data["x"][:n])
        np.save(f"{sys.argv[1]}.{kind.name}.{n}.npy", got)
"""


@pytest.mark.slow
def test_an_avx2_hosts_products_are_ggml_bits(ggml_order: None, tmp_path: Path) -> None:
    """The tiles an AVX2 host compiles (``NUMBA_CPU_FEATURES``: its instruction forms
    here) for one row (a generated token's), three (a tile of their own) and 11 (tiles
    of four, Q6_K's tiled product's order, then the rest): Q8_0 and Q5_0 in passes,
    Q6_K's and Q4_K's 16-bit sums scaled as they are widened."""
    x = RNG.standard_normal((max(AVX2_ROWS), N_IN)).astype(np.float32)
    raws = {t.name: _weights(t, 24) for t in AVX2_CHECKED}
    data = tmp_path / "data.npz"
    np.savez(data, x=x, Q8_0=raws["Q8_0"], Q5_0=raws["Q5_0"], Q6_K=raws["Q6_K"],
             Q4_K=raws["Q4_K"])  # fmt: skip
    path = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    env = throwaway_cache_env(tmp_path, NUMBA_CPU_FEATURES=AVX2_FEATURES, PYTHONPATH=path)
    done = subprocess.run([sys.executable, "-c", _ON_AN_AVX2_HOST, str(data)], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for t, reference in AVX2_CHECKED.items():
        for n in AVX2_ROWS:
            got = np.load(f"{data}.{t.name}.{n}.npy")
            want = reference(x[:n], raws[t.name])
            np.testing.assert_array_equal(got, want, err_msg=f"{t.name}, {n} rows")


@pytest.mark.parametrize("t", [tp.Type.Q6_K, tp.Type.Q4_K], ids=lambda t: t.name)
def test_a_batch_invariant_backend_gives_each_row_its_bits_alone(
    ggml_order: None, t: tp.Type
) -> None:
    """``set_batch_invariant(True)``: each row of an 11-row product is the row computed
    alone, where ggml's order (the default) gives the first eight rows the gemm's or
    tiled product's bits (checked: that the test can tell the two apart)."""
    raw = _weights(t, 24)
    x = RNG.standard_normal((11, N_IN)).astype(np.float32)
    together = _cpu_product(t, raw, x, batch_invariant=True)
    alone = np.concatenate([_cpu_product(t, raw, x[r : r + 1], True) for r in range(11)])
    np.testing.assert_array_equal(together, alone)
    assert not np.array_equal(_cpu_product(t, raw, x), alone)


@pytest.mark.parametrize("forced", ["0", "1"])
def test_the_setting_overrides_what_the_application_asks(
    ggml_order: None, monkeypatch: pytest.MonkeyPatch, forced: str
) -> None:
    """``TENSORPLUG_CPU_GGML_PRODUCT_ORDER=0`` makes every backend batch-invariant,
    ``=1`` none, whatever ``set_batch_invariant`` asked."""
    raw = _weights(tp.Type.Q4_K, 24)
    x = RNG.standard_normal((5, N_IN)).astype(np.float32)
    invariant = _cpu_product(tp.Type.Q4_K, raw, x, batch_invariant=True)
    ggml = _cpu_product(tp.Type.Q4_K, raw, x)
    monkeypatch.setenv("TENSORPLUG_CPU_GGML_PRODUCT_ORDER", forced)
    want = ggml if forced == "1" else invariant
    for asked in (False, True):
        np.testing.assert_array_equal(_cpu_product(tp.Type.Q4_K, raw, x, asked), want)


def test_set_batch_invariant_refuses_a_non_bool_and_rebuilds_the_graphs_it_ran(
    ggml_order: None,
) -> None:
    """A graph computed before the switch is computed in the new order after it (its
    cached plan was bound to the old one)."""
    from tensorplug.errors import TypeMismatchError
    from tensorplug_cpu.device import create_reg

    raw = _weights(tp.Type.Q4_K, 24)
    x = RNG.standard_normal((5, N_IN)).astype(np.float32)
    dev = create_reg().device(0)
    backend = dev.init_backend()
    with pytest.raises(TypeMismatchError, match="set_batch_invariant: expected True or False"):
        backend.set_batch_invariant(1)  # type: ignore[attr-defined]
    graph = _product_graph(dev, tp.Type.Q4_K, raw, x)
    got = []
    for invariant in (False, True, False):
        backend.set_batch_invariant(invariant)  # type: ignore[attr-defined]
        backend.graph_compute(graph)
        got.append(tp.get_array(graph.nodes[-1]).copy())
    np.testing.assert_array_equal(got[0], ggml_q4_k_product(x, raw))
    np.testing.assert_array_equal(got[1], _cpu_product(tp.Type.Q4_K, raw, x, True))
    np.testing.assert_array_equal(got[2], got[0])
    assert not np.array_equal(got[0], got[1])


def test_fma32_rounds_once() -> None:
    """The reference's ``fmaf``: ``(1 + 2^-13)(1 - 2^-13)`` and ``-1`` cancel to
    ``-2^-26`` only if the product is not rounded first; a tie above ``2^24`` rounds to
    even."""
    eps = np.float32(2.0**-13)
    one = np.float32(1)
    got = fma32(np.array([one + eps]), np.array([one - eps]), np.array([-one]))
    assert got[0] == np.float32(-(2.0**-26))
    big = fma32(np.array([np.float32(2.0**24)]), np.array([one]), np.array([one]))
    assert big[0] == np.float32(2.0**24)

"""CPU soft_max, rope and flash_attn_ext against float64 formulas from the op contracts."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute, nmse, throwaway_cache_env

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import quantize
from tensorplug_llm.block import BlockConfig, build_block, reference_block

RNG = np.random.default_rng(2024)


def _f32(shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi slopes as the soft_max docstring defines them."""
    if max_bias <= 0:
        return np.ones(n_head)
    m = 2 ** math.floor(math.log2(n_head))
    h = np.arange(n_head)
    return np.where(
        h < m,
        (2 ** (-max_bias / m)) ** (h + 1),
        (2 ** (-max_bias / (2 * m))) ** (2 * (h - m) + 1),
    )


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- soft_max ----------------------------------------------------------------------------


def test_soft_max_plain_and_scaled() -> None:
    a = tp.new_tensor("f32", (2, 3, 17), "a")
    av = _f32(a.shape, 4)
    outs = [ops.soft_max(a), ops.soft_max(a, scale=0.3)]
    compute(outs, {a: av})
    assert nmse(tp.get_array(outs[0]), _softmax(av.astype(np.float64))) < 1e-12
    assert nmse(tp.get_array(outs[1]), _softmax(0.3 * av.astype(np.float64))) < 1e-12


@pytest.mark.parametrize("mask_type", [tp.Type.F32, tp.Type.F16])
@pytest.mark.parametrize("max_bias", [0.0, 8.0])
@pytest.mark.parametrize("mask_shape", [(6, 10), (1, 5, 8, 10), (2, 1, 6, 10)])
def test_soft_max_mask_alibi(
    mask_type: tp.Type, max_bias: float, mask_shape: tuple[int, ...]
) -> None:
    a = tp.new_tensor("f32", (2, 5, 6, 10), "a")  # 5 heads: ALiBi's m0 and m1 both used
    mask = tp.new_tensor(mask_type, mask_shape, "mask")  # may have more rows than a
    av = _f32(a.shape, 2)
    mv = _f32(mask_shape).astype(mask_type.numpy_dtype)
    mv[..., 1, 3:] = -np.inf  # causal-looking holes
    out = ops.soft_max(a, mask, scale=0.5, max_bias=max_bias)
    compute(out, {a: av, mask: mv})
    m64 = mv.astype(np.float64)
    m64 = m64.reshape((1,) * (4 - m64.ndim) + m64.shape)[:, :, :6]
    slope = _slopes(5, max_bias).reshape(1, 5, 1, 1)
    expected = _softmax(0.5 * av.astype(np.float64) + slope * m64)
    assert nmse(tp.get_array(out), expected) < 1e-6


# -- rope ---------------------------------------------------------------------------------


def _corr_dims(n_dims: int, n_ctx: float, base: float, fast: float, slow: float) -> tuple:
    def dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(fast))), min(n_dims - 1.0, math.ceil(dim(slow)))


def _rope_ref(
    x: np.ndarray, pos: np.ndarray, n_dims: int, neox: bool, ff: np.ndarray | None = None,
    **p: float,
) -> np.ndarray:  # fmt: skip
    """x (…, T, H, D) float64; the rope docstring's formulas."""
    half = n_dims // 2
    i = np.arange(half)
    factors = np.ones(half) if ff is None else ff
    theta = pos[:, None] * p["freq_base"] ** (-2 * i / n_dims) / factors
    fs, ext = p["freq_scale"], p["ext_factor"]
    mscale = p["attn_factor"]
    if ext != 0:
        low, high = _corr_dims(n_dims, p["n_ctx_orig"], p["freq_base"], 32.0, 1.0)
        ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
        mix = ramp * ext
        theta = fs * theta * (1 - mix) + theta * mix
        mscale *= 1 + 0.1 * math.log(1 / fs)
    else:
        theta = fs * theta
    cos, sin = np.cos(theta)[:, None] * mscale, np.sin(theta)[:, None] * mscale
    out = x.copy()
    if neox:
        x0, x1 = x[..., :half], x[..., half:n_dims]
        out[..., :half], out[..., half:n_dims] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2], out[..., 1:n_dims:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


@pytest.mark.parametrize("tokens", [7, 300])  # a step's few rows, a prompt's chunks
def test_a_zero_frequency_factor_gives_ggmls_nan_not_an_error(tokens: int) -> None:
    """``θ / 0`` is inf (0/0 NaN at position 0), and its pair's rotation NaN, as ggml's
    float division gives; numba's Python error model raised ZeroDivisionError from the
    kernel instead (a model file's ``rope_freqs`` is untrusted). The other pairs are
    the formula's."""
    a = tp.new_tensor("f32", (1, tokens, 2, 8), "a")
    pos = tp.new_tensor(tp.Type.I32, (tokens,), "pos")
    ff = tp.new_tensor("f32", (4,), "ff")
    params = {"freq_base": 10000.0, "freq_scale": 1.0, "ext_factor": 0.0, "attn_factor": 1.0}
    out = ops.rope(a, pos, 8, tp.RopeMode.NEOX, freq_factors=ff, **params)  # type: ignore[arg-type]
    # its own generator: the shared one's draws are the other tests' data
    av = np.random.default_rng(7).standard_normal(a.shape).astype(np.float32)
    pv = np.arange(tokens, dtype=np.int32)
    ffv = np.array([1.0, 0.0, 2.0, 1.5], np.float32)
    compute(out, {a: av, pos: pv, ff: ffv})
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = _rope_ref(av.astype(np.float64), pv.astype(np.float64), 8, True,
                             ff=ffv.astype(np.float64), **params)  # fmt: skip
    got = tp.get_array(out).astype(np.float64)
    assert np.isnan(got[..., [1, 5]]).all()  # the pair of factor 0: dims 1 and 1 + half
    kept = [0, 2, 3, 4, 6, 7]
    assert nmse(got[..., kept], expected[..., kept]) < 1e-9


@pytest.mark.parametrize("mode", [tp.RopeMode.NORMAL, tp.RopeMode.NEOX])
@pytest.mark.parametrize("n_dims", [16, 12])
@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize("t", [tp.Type.F32, tp.Type.F16])
def test_rope(mode: tp.RopeMode, n_dims: int, yarn: bool, t: tp.Type) -> None:
    a = tp.new_tensor(t, (2, 7, 3, 16), "a")  # (batch, tokens, heads, head_dim)
    pos = tp.new_tensor(tp.Type.I32, (7,), "pos")
    ff = tp.new_tensor("f32", (n_dims // 2,), "ff")
    params = {
        "freq_base": 10000.0,
        "freq_scale": 0.25 if yarn else 1.0,
        "ext_factor": 1.0 if yarn else 0.0,
        "attn_factor": 0.9,
        "n_ctx_orig": 512,
    }
    out = ops.rope(a, pos, n_dims, mode, freq_factors=ff, **params)  # type: ignore[arg-type]
    av = _f32(a.shape).astype(t.numpy_dtype)
    pv = np.array([0, 1, 5, 17, 100, 3, 250], np.int32)
    ffv = (1 + RNG.random(n_dims // 2)).astype(np.float32)
    compute(out, {a: av, pos: pv, ff: ffv})
    expected = _rope_ref(
        av.astype(np.float64), pv.astype(np.float64), n_dims, mode == tp.RopeMode.NEOX,
        ff=ffv.astype(np.float64), **params,
    )  # fmt: skip
    got = tp.get_array(out).astype(np.float64)
    assert nmse(got, expected) < (1e-9 if t == tp.Type.F32 else 1e-6)
    np.testing.assert_array_equal(got[..., n_dims:], av[..., n_dims:])  # passed through


@pytest.mark.parametrize("mode", [tp.RopeMode.NORMAL, tp.RopeMode.NEOX])
@pytest.mark.parametrize("n_dims", [16, 12])
@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize("with_ff", [False, True])
def test_rope_of_a_generation_step(
    mode: tp.RopeMode, n_dims: int, yarn: bool, with_ff: bool
) -> None:
    """A few tokens (numba's kernel where numba is there) and numpy's path: both within
    float32 rounding of the float64 formula, and close to each other: within an ulp or
    two without YaRN; with it, the kernel fuses YaRN's mix of θ as ggml's GCC build does
    and numpy cannot, so a θ may round an ulp apart, which position 4095 turns into
    ~50 ulps of a rotated value (60 seeds: at most 1.7e-7 and 6.5e-6 of the largest
    input apart). The data is this test's own (a shared generator's draws shifted as
    other tests were added, and a bound tuned to one draw failed on another)."""
    a = tp.new_tensor("f32", (1, 3, 4, 16), "a")
    pos = tp.new_tensor(tp.Type.I32, (3,), "pos")
    ff = tp.new_tensor("f32", (n_dims // 2,), "ff") if with_ff else None
    params = {
        "freq_base": 500000.0,
        "freq_scale": 0.125 if yarn else 1.0,
        "ext_factor": 1.0 if yarn else 0.0,
        "attn_factor": 1.1,
        "n_ctx_orig": 8192,
    }
    rng = np.random.default_rng(11)
    av = rng.standard_normal(a.shape).astype(np.float32)
    pv = np.array([0, 37, 4095], np.int32)
    ffv = (1 + rng.random(n_dims // 2)).astype(np.float32)
    inputs = {a: av, pos: pv} | ({ff: ffv} if ff is not None else {})
    expected = _rope_ref(av.astype(np.float64), pv.astype(np.float64), n_dims,
                         mode == tp.RopeMode.NEOX, ffv.astype(np.float64) if with_ff else None,
                         **params)  # fmt: skip
    results = []
    for jit in (True, False):
        out = ops.rope(a, pos, n_dims, mode, freq_factors=ff, **params)  # type: ignore[arg-type]
        compute(out, inputs, backend_for(jit=jit))
        got = tp.get_array(out).astype(np.float64)
        assert nmse(got, expected) < 1e-9
        np.testing.assert_array_equal(got[..., n_dims:], av[..., n_dims:])
        results.append(got)
    apart = 1.5e-5 if yarn else 5e-7
    np.testing.assert_allclose(results[0], results[1], rtol=0, atol=apart * np.abs(av).max())


def test_rope_on_a_permuted_view() -> None:
    base = tp.new_tensor("f32", (4, 5, 8), "base")  # (heads, tokens, dim) in memory
    a = ops.permute(base, (1, 0, 2))  # (tokens, heads, dim), strided
    pos = tp.new_tensor(tp.Type.I32, (5,), "pos")
    out = ops.rope(a, pos, 8, tp.RopeMode.NEOX)
    bv = _f32(base.shape)
    pv = np.arange(5, dtype=np.int32) * 3
    compute(out, {base: bv, pos: pv})
    expected = _rope_ref(
        bv.astype(np.float64).transpose(1, 0, 2), pv.astype(np.float64), 8, True,
        freq_base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
    )  # fmt: skip
    assert nmse(tp.get_array(out), expected) < 1e-10


# -- flash attention --------------------------------------------------------------------------


def _attn_ref(q, k, v, mask, scale, max_bias=0.0, softcap=0.0, half=False):  # type: ignore[no-untyped-def]
    """q (B,H,n_q,D), k/v (B,Hkv,n_kv,·), mask broadcastable to (B,H,n_q,n_kv); ``half``:
    q and the softmax's weights rounded to f16 before their products (an F16 cache's
    arithmetic in ggml, whose ``mul_mat`` converts its float32 operand to F16)."""
    B, H, n_q, _ = q.shape
    if half:
        q = q.astype(np.float16).astype(np.float64)
    g = H // k.shape[1]
    out = np.zeros((B, n_q, H, v.shape[-1]))
    slopes = _slopes(H, max_bias)
    for b in range(B):
        for h in range(H):
            s = q[b, h] @ k[b, h // g].T * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if mask is not None:
                m = np.broadcast_to(mask, (B, H, *mask.shape[-2:]))[b, h, :n_q]
                s = s + slopes[h] * m
            for r in range(n_q):
                if np.isneginf(s[r]).all():
                    continue  # a fully masked row gives zeros, as in ggml
                p = _softmax(s[r])
                if half:
                    p = p.astype(np.float32).astype(np.float16).astype(np.float64)
                out[b, r, h] = p @ v[b, h // g]
    return out


@pytest.mark.parametrize("kv_type", [tp.Type.F32, tp.Type.F16, tp.Type.BF16])
@pytest.mark.parametrize("variant", ["plain", "softcap", "alibi"])
def test_flash_attn_ext_gqa_with_mask(kv_type: tp.Type, variant: str) -> None:
    B, H, Hkv, n_q, n_kv, D, Dv = 2, 4, 2, 5, 9, 16, 8
    q = tp.new_tensor("f32", (B, H, n_q, D), "q")
    k = tp.new_tensor(kv_type, (B, Hkv, n_kv, D), "k")
    v = tp.new_tensor(kv_type, (B, Hkv, n_kv, Dv), "v")
    mask = tp.new_tensor(tp.Type.F16, (1, 1, 8, n_kv), "mask")
    qv = _f32(q.shape)
    from tensorplug.quants import bf16_to_f32, f32_to_bf16

    def store(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if kv_type == tp.Type.BF16:
            s = f32_to_bf16(x)
            return s, bf16_to_f32(s).astype(np.float64)
        s = x.astype(kv_type.numpy_dtype)
        return s, s.astype(np.float64)

    kv_, k64 = store(_f32(k.shape))
    vv, v64 = store(_f32(v.shape))
    mv = np.zeros(mask.shape, np.float16)
    mv[..., 2, 6:] = -np.inf
    mv[..., 4, :] = -np.inf  # query row 4 sees nothing: zeros
    softcap = 20.0 if variant == "softcap" else 0.0
    max_bias = 4.0 if variant == "alibi" else 0.0
    out = ops.flash_attn_ext(q, k, v, mask, scale=D**-0.5, max_bias=max_bias,
                             logit_softcap=softcap)  # fmt: skip
    compute(out, {q: qv, k: kv_, v: vv, mask: mv})
    assert out.shape == (B, n_q, H, Dv)
    expected = _attn_ref(qv.astype(np.float64), k64, v64, mv.astype(np.float64), D**-0.5,
                         max_bias, softcap, kv_type == tp.Type.F16)  # fmt: skip
    got = tp.get_array(out)
    assert nmse(got, expected) < 5e-4
    # float32 all the way (beside an F16 cache's roundings): far better than required
    assert nmse(got, expected) < 1e-10
    np.testing.assert_array_equal(got[:, 4], 0)


def test_flash_attn_ext_of_a_token_is_the_same_on_one_thread_and_two() -> None:
    """One thread runs the serial kernel, more the parallel one (KV heads shared out):
    the same loop per KV head, so the same bits."""
    B, H, Hkv, n_kv, D = 1, 12, 4, 40, 64
    q = tp.new_tensor("f32", (B, H, 1, D), "q")
    k = tp.new_tensor(tp.Type.F16, (B, Hkv, n_kv, D), "k")
    v = tp.new_tensor(tp.Type.F16, (B, Hkv, n_kv, D), "v")
    mask = tp.new_tensor(tp.Type.F16, (1, 1, 1, n_kv), "mask")
    qv, kv_, vv = _f32(q.shape), _f32(k.shape).astype(np.float16), _f32(v.shape).astype(np.float16)
    mv = np.zeros(mask.shape, np.float16)
    mv[..., 31:] = -np.inf  # the cache's padding
    outs = []
    for threads in (1, 2):
        backend = backend_for()
        tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
        out = ops.flash_attn_ext(q, k, v, mask, scale=D**-0.5)
        compute(out, {q: qv, k: kv_, v: vv, mask: mv}, backend)
        outs.append(tp.get_array(out))
    np.testing.assert_array_equal(outs[0], outs[1])
    expected = _attn_ref(qv.astype(np.float64), kv_.astype(np.float64), vv.astype(np.float64),
                         mv.astype(np.float64), D**-0.5, 0.0, 0.0, half=True)  # fmt: skip
    assert nmse(outs[0], expected) < 1e-10


def test_flash_attn_ext_3d_without_mask() -> None:
    q = tp.new_tensor("f32", (2, 3, 8), "q")
    k = tp.new_tensor("f32", (1, 6, 8), "k")
    v = tp.new_tensor("f32", (1, 6, 8), "v")
    qv, kv_, vv = _f32(q.shape), _f32(k.shape), _f32(v.shape)
    out = ops.flash_attn_ext(q, k, v, scale=0.3)
    compute(out, {q: qv, k: kv_, v: vv})
    expected = _attn_ref(qv[None].astype(np.float64), kv_[None].astype(np.float64),
                         vv[None].astype(np.float64), None, 0.3)[0]  # fmt: skip
    assert out.shape == (3, 2, 8)
    assert nmse(tp.get_array(out), expected) < 1e-10


def test_flash_attn_ext_long_queries_are_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorplug_cpu.kernels import attention

    monkeypatch.setattr(attention, "SCORE_ELEMS", 2 * 2 * 11)  # 2 query rows per chunk
    q = tp.new_tensor("f32", (1, 2, 7, 4), "q")
    k = tp.new_tensor("f32", (1, 1, 11, 4), "k")
    v = tp.new_tensor("f32", (1, 1, 11, 4), "v")
    mask = tp.new_tensor("f32", (7, 11), "mask")
    qv, kv_, vv = _f32(q.shape), _f32(k.shape), _f32(v.shape)
    mv = np.triu(np.full((7, 11), -np.inf, np.float32), 5)
    out = ops.flash_attn_ext(q, k, v, mask, scale=0.5)
    compute(out, {q: qv, k: kv_, v: vv, mask: mv})
    expected = _attn_ref(qv.astype(np.float64), kv_.astype(np.float64), vv.astype(np.float64),
                         mv.astype(np.float64), 0.5)  # fmt: skip
    assert nmse(tp.get_array(out), expected) < 1e-10


@pytest.mark.parametrize("jit", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("kv_type", [tp.Type.F32, tp.Type.F16])
def test_flash_attn_ext_reads_only_the_cache_rows_a_query_can_see(
    kv_type: tp.Type, jit: bool
) -> None:
    """A runner pads the cache view and masks the padding: those rows hold garbage
    (here NaN) that must not reach the result, as ggml skips -inf columns."""
    n_q, n_kv, used, D = 3, 32, 11, 8
    q = tp.new_tensor("f32", (1, 2, n_q, D), "q")
    k = tp.new_tensor(kv_type, (1, 1, n_kv, D), "k")
    v = tp.new_tensor(kv_type, (1, 1, n_kv, D), "v")
    mask = tp.new_tensor(tp.Type.F16, (n_q, n_kv), "mask")
    qv, kv_, vv = _f32(q.shape), _f32(k.shape), _f32(v.shape)
    kv_[:, :, used:], vv[:, :, used:] = np.nan, np.nan
    mv = np.zeros((n_q, n_kv), np.float16)
    mv[:, used:] = -np.inf
    mv[0, used - 3 :] = -np.inf  # a causal row sees fewer
    out = ops.flash_attn_ext(q, k, v, mask, scale=0.4)
    compute(out, {q: qv, k: kv_.astype(kv_type.numpy_dtype), v: vv.astype(kv_type.numpy_dtype),
                  mask: mv}, backend_for(jit=jit))  # fmt: skip
    k64 = kv_.astype(kv_type.numpy_dtype)[:, :, :used].astype(np.float64)
    v64 = vv.astype(kv_type.numpy_dtype)[:, :, :used].astype(np.float64)
    expected = _attn_ref(qv.astype(np.float64), k64, v64, mv[:, :used].astype(np.float64), 0.4,
                         half=kv_type == tp.Type.F16)  # fmt: skip
    assert nmse(tp.get_array(out), expected) < 1e-10


@pytest.mark.parametrize("jit", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("max_bias", [0.0, 8.0])
def test_flash_attn_ext_of_a_prompt(
    monkeypatch: pytest.MonkeyPatch, jit: bool, chunked: bool, max_bias: float
) -> None:
    """More query rows than a generation step (numba's one-pass softmax, or numpy's):
    a causal mask over a padded cache whose unseen rows hold NaN, a row that sees
    nothing (zeros), grouped query heads, ALiBi, and query chunks that leave gaps in
    the score scratch."""
    from tensorplug_cpu.kernels import attention

    if chunked:
        monkeypatch.setattr(attention, "SCORE_ELEMS", 4 * 32 * 7)  # 7 query rows a chunk
    n_q, n_kv, D = 20, 32, 16
    q = tp.new_tensor("f32", (1, 4, n_q, D), "q")
    k = tp.new_tensor(tp.Type.F16, (1, 2, n_kv, D), "k")
    v = tp.new_tensor(tp.Type.F16, (1, 2, n_kv, D), "v")
    mask = tp.new_tensor(tp.Type.F16, (1, 1, n_q, n_kv), "mask")
    qv, kv_, vv = _f32(q.shape), _f32(k.shape), _f32(v.shape)
    kv_[:, :, 24:], vv[:, :, 24:] = np.nan, np.nan  # never visible
    mv = np.triu(np.full((n_q, n_kv), -np.inf, np.float16), 5)[None, None]
    mv[..., 3, :] = -np.inf
    out = ops.flash_attn_ext(q, k, v, mask, scale=D**-0.5, max_bias=max_bias)
    compute(out, {q: qv, k: kv_.astype(np.float16), v: vv.astype(np.float16), mask: mv},
            backend_for(jit=jit))  # fmt: skip
    k64 = kv_.astype(np.float16)[:, :, :24].astype(np.float64)
    v64 = vv.astype(np.float16)[:, :, :24].astype(np.float64)
    expected = _attn_ref(qv.astype(np.float64), k64, v64, mv[..., :24].astype(np.float64),
                         D**-0.5, max_bias, half=True)  # fmt: skip
    got = tp.get_array(out)
    np.testing.assert_array_equal(got[:, 3], 0)
    # float32 all the way but the f16 weights: one that float32 and float64 round to
    # either side of an f16 boundary moves its row by an f16 step (2.6e-10 here)
    assert nmse(got, expected) < 1e-9


@pytest.mark.parametrize("strided", [False, True], ids=["rows", "strided-rows"])
def test_f16_rows_widen_exactly_up_to_used(strided: bool) -> None:
    """The prompt's widening of an F16 cache (and mask) into float32 scratch: every
    value of rows ``j < used`` exactly as numpy widens it (inf, -inf, subnormals
    included), rows past ``used`` untouched; a cache whose halves are not contiguous
    takes the table path."""
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    if jit is None:
        pytest.skip("numba is not installed")
    raw = (RNG.standard_normal((2, 3, 9, 40)) * 300).astype(np.float16)
    raw[0, 1, 2, :4] = [np.inf, -np.inf, 6e-8, -0.0]
    if strided:
        raw = np.repeat(raw, 2, axis=-1)[..., ::2]
    out = np.full(raw.shape, 7.0, np.float32)
    jit.bind_widen_f16_rows(raw, out)(5)
    np.testing.assert_array_equal(out[:, :, :5], raw[:, :, :5].astype(np.float32))
    assert (out[:, :, 5:] == 7).all()
    with pytest.raises(ValueError, match="unit-stride"):
        jit.bind_widen_f16_rows(raw, out[..., ::2])


# -- a whole transformer block --------------------------------------------------------------------


@pytest.mark.parametrize("weight_type", [tp.Type.F32, tp.Type.Q8_0])
def test_llama_block_matches_float64_twin(weight_type: tp.Type) -> None:
    """rms_norm, rope, set_rows into an F16 KV cache, GQA flash attention, SwiGLU."""
    cfg = BlockConfig(weight_type=weight_type)
    blk = build_block(cfg)
    weights, dequantized = {}, {}
    for name, t in blk.weights.items():
        w = _f32(t.shape, 0.1 if t.ndim == 2 else 1.0) + (1.0 if t.ndim == 1 else 0.0)
        weights[t] = quantize(w, t.type) if t.type.is_quantized else w
        # expected values from gguf's own dequantizer, not the code under test
        dequantized[name] = (
            gguf.quants.dequantize(weights[t], gguf.GGMLQuantizationType[t.type.name])
            if t.type.is_quantized
            else w
        )
    x = _f32((cfg.n_tokens, cfg.n_embd))
    pos = np.arange(cfg.n_past, cfg.n_kv, dtype=np.int32)
    kv_idx = pos.astype(np.int64)
    mask = np.zeros((cfg.n_tokens, cfg.n_kv), np.float16)
    mask[np.arange(cfg.n_tokens)[:, None] < np.arange(cfg.n_kv)[None] - cfg.n_past] = -np.inf
    caches = {t: _f32(t.shape).astype(np.float16) for t in blk.caches.values()}
    inputs = {**weights, **caches, blk.inputs["x"]: x, blk.inputs["pos"]: pos,
              blk.inputs["kv_idx"]: kv_idx, blk.inputs["mask"]: mask}  # fmt: skip
    compute(blk.out, inputs)
    expected = reference_block(cfg, dequantized, x, caches[blk.caches["k_cache"]],
                               caches[blk.caches["v_cache"]], pos, kv_idx,
                               mask.astype(np.float64))  # fmt: skip
    assert nmse(tp.get_array(blk.out), expected) < 5e-4


_F16_CACHE_ROWS = """
import numba
import numpy as np
from tensorplug_cpu.kernels import _numba_attention as attention, _numba_ir as ir
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

ir.HAS_F16C = {f16c}  # then compiled afresh (the disk cache does not know it)
attend = numba.njit(parallel=True)(attention.attend.py_func)
rng = np.random.default_rng(3)
q = rng.standard_normal((1, 6, 2, 24)).astype(np.float32)
k16 = rng.standard_normal((1, 2, 40, 24)).astype(np.float16)
v16 = rng.standard_normal((1, 2, 40, 24)).astype(np.float16)
k = k16.view(np.uint16)
if {strided}:  # a cache whose rows are not contiguous halves
    k = np.ascontiguousarray(np.repeat(k[..., None], 2, axis=-1))[..., 0]
mask = np.zeros((1, 1, 2, 40), np.float32)
mask[0, 0, 0, 30:] = -np.inf
out = np.empty((1, 2, 6, 24), np.float32)
attend(q, k, v16.view(np.uint16), mask, np.zeros(0, np.int32), 40, 0.2, 0.0, 64, out, table, 2)
kf, vf = k16.astype(np.float64), v16.astype(np.float64)
for h in range(6):
    for r in range(2):
        s = kf[0, h // 3] @ q[0, h, r].astype(np.float64) * 0.2 + mask[0, 0, r]
        p = np.exp(s - s.max())
        ref = (p / p.sum()) @ vf[0, h // 3]
        assert np.abs(out[0, r, h] - ref).max() < 1e-5, (h, r)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize(("f16c", "strided"), [(True, False), (True, True), (False, False)])
def test_f16_cache_rows_are_read_right_on_every_path(f16c: bool, strided: bool) -> None:
    """The exact kernel reads F16 cache rows in place, widened in registers, where the
    CPU has F16C and the rows are contiguous; strided rows are packed first, and
    without F16C widened through the f16 table. Each path, compiled in a fresh process
    (two threads' split of the KV heads), against float64 attention."""
    import subprocess
    import sys

    from tensorplug_cpu.kernels import _numba_ir

    if f16c and not _numba_ir.HAS_F16C:
        pytest.skip("this CPU has no F16C")
    code = _F16_CACHE_ROWS.format(f16c=f16c, strided=strided)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


_FORM_CASES = """
import sys
import numpy as np
from tensorplug_cpu.kernels import _numba_attention as attention, _numba_ir as ir
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

if sys.argv[1] == "16-registers":  # an AVX2 CPU's form, before anything is compiled here
    ir.HAS_32_REGS = False
rng = np.random.default_rng(11)
outs = {}


def cache(n_kv, kv, d):  # ggml's layout: each cell's heads side by side
    cells = rng.standard_normal((n_kv, kv, d)).astype(np.float16).view(np.uint16)
    return cells.transpose(1, 0, 2)[None]


# (cells seen, query heads, KV heads, head size, value size, query rows, lanes)
cases = [(150, 12, 4, 64, 64, 1, 64), (70, 8, 2, 80, 48, 3, 64), (40, 10, 2, 128, 128, 2, 16),
         (33, 4, 1, 256, 256, 1, 64)]
for used, heads, kv, d, dv, rows, lanes in cases:
    n_kv = used + 5
    q = rng.standard_normal((1, heads, rows, d)).astype(np.float32)
    k, v = cache(n_kv, kv, d), cache(n_kv, kv, dv)
    mask = np.zeros((1, 1, rows, n_kv), np.float16)
    mask[..., used:] = -np.inf
    mask[..., 3:6] = -np.inf
    for threads in (1, 2):
        out = np.full((1, rows, heads, dv), np.nan, np.float32)
        attention.attend(q, k, v, mask.view(np.uint16), np.zeros(0, np.int32), used, 0.125, 0.0,
                         lanes, out, table, threads)
        outs[f"{used}-{threads}"] = out
np.savez(sys.argv[2], **outs)
"""


@pytest.mark.slow
def test_both_cpu_forms_of_the_attention_kernel_give_the_same_bits(tmp_path: Path) -> None:
    """The weights·V chains carry 64 values a head where the CPU has 32 vector registers
    (AVX-512) and 32 where it has 16 (AVX2): both forms, each compiled in a fresh
    process with an empty cache, on ggml's interleaved cache layout, head sizes with
    values past the last chain (80, 48), up to five query heads a KV head, one or two
    threads' split of the KV heads, 64 and 16 lanes: the same bits."""
    import os
    import subprocess
    import sys

    from tensorplug_cpu.kernels import _numba_ir

    pytest.importorskip("numba", reason="the exact attention kernel is numba's")
    if not (_numba_ir.HAS_F16C and _numba_ir.HAS_32_REGS):
        pytest.skip("compares the AVX-512 form with the AVX2 one: needs a CPU with both")
    results = []
    for form in ("32-registers", "16-registers"):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / form)}
        path = tmp_path / f"{form}.npz"
        done = subprocess.run([sys.executable, "-c", _FORM_CASES, form, str(path)], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(np.load(path))
    wide, narrow = results
    assert sorted(wide.files) == sorted(narrow.files) and len(wide.files) == 8
    for name in wide.files:
        assert not np.isnan(wide[name]).any(), name
        assert np.array_equal(wide[name].view(np.uint32), narrow[name].view(np.uint32)), name


_ONE_BODY = """
import numpy as np
from tensorplug_cpu.kernels import _numba_attention as attention
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

rng = np.random.default_rng(5)
q = rng.standard_normal((1, 6, 3, 32)).astype(np.float32)
k = rng.standard_normal((1, 2, 48, 32)).astype(np.float16).view(np.uint16)
v = rng.standard_normal((1, 2, 48, 32)).astype(np.float16).view(np.uint16)
mask = np.zeros((1, 1, 3, 48), np.float32)
mask[0, 0, :, 40:] = -np.inf
outs = [np.full((1, 3, 6, 32), np.nan, np.float32) for _ in range(2)]
args = (q, k, v, mask, np.zeros(0, np.int32), 40, 0.2, 0.0, 64)
attention.attend(*args, outs[0], table, 2)
attention.attend_serial(*args, outs[1], table)
assert np.array_equal(outs[0], outs[1])
print(len(attention.attend_rows.signatures))
"""


@pytest.mark.slow
def test_both_attention_kernels_share_one_compiled_body(tmp_path: Path) -> None:
    """The parallel and the one-thread attention kernels call one compiled body
    (``attend_rows``, most of a first run's compile): both must call it with the same
    argument types, or numba compiles it twice. A fresh process with an empty numba
    cache, so that the body is compiled here and its signatures counted; the two
    kernels' outputs are the same bits."""
    import subprocess
    import sys

    pytest.importorskip("numba", reason="the exact attention kernel is numba's")
    env = throwaway_cache_env(tmp_path)
    done = subprocess.run([sys.executable, "-c", _ONE_BODY], capture_output=True, text=True,
                          timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "1"


_ONE_LAYOUT = """
import sys
from tensorplug_cpu.kernels import _numba_attention as attention
from tensorplug_cpu.kernels import _numba_pool as pool
from tensorplug_llm.placement import Placement, host_cpu
from tensorplug_llm.runner import ModelRunner

with ModelRunner(sys.argv[1], placement=Placement.on(host_cpu(), 2), warmup=False,
           cache_type=sys.argv[2], n_threads=1) as m:
    m.eval(list(range(1, 12)))  # a prompt: its q is a permuted, strided view
    for t in (5, 6, 7):  # generated tokens: their q is contiguous
        m.eval([t])
for name, kernel in (("attend", attention.attend), ("attend_serial", attention.attend_serial),
                     ("run_alone", pool.run_alone), ("run_region", pool.run_region)):
    for sig in kernel.signatures:
        print(name, [getattr(a, "layout", "-") for a in sig])
"""


@pytest.mark.parametrize("cache", ["f16", "f32"])
def test_a_prompt_and_its_tokens_share_one_compiled_attention_kernel(
    tmp_path: Path, cache: str
) -> None:
    """numba compiles a kernel once per argument layout, and the exact attention kernel
    is most of a first run's compile (~30 s of CPU each): a prompt step and a generation
    step must call it with the same layouts (a fresh process, so that only this model's
    calls are counted; one thread; numba loading every kernel, kept code or not). An
    F16 cache (the runner's) runs the one job function, whatever the step, through its
    runner, and no attention kernel compiles at all; an F32 cache takes the one-thread
    kernel."""
    import os
    import subprocess
    import sys

    from tensorplug_llm.tiny import write_tiny_llama

    pytest.importorskip("numba", reason="the exact attention kernel is numba's")
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    # numba's dispatchers then hold every kernel that ran, not only those it loaded
    env = {**os.environ, "TENSORPLUG_CPU_NUMBA_INTERNALS": "0"}
    done = subprocess.run([sys.executable, "-c", _ONE_LAYOUT, str(model), cache],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    names = [line.split(" ")[0] for line in done.stdout.split("\n") if line]
    assert len(names) == len(set(names)), done.stdout  # one layout each
    if cache == "f16":
        assert names == ["run_alone"], done.stdout  # one thread: the job alone
    else:
        assert names == ["attend_serial"], done.stdout

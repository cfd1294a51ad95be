"""OpenCL kernels, op by op, against float64 numpy written from the op contracts.

Runs on any OpenCL device (CI uses PoCL's CPU device from ``pocl-binary-distribution``)
and skips with the reason when pyopencl or an OpenCL device is missing. Shapes are
small and ragged on purpose: tile edges, K tails and broadcasts are where kernels
go wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Graph, RopeMode, Tensor, Type, ops
from tensorplug.quants import bf16_to_f32, f32_to_bf16

cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")
gq = pytest.importorskip("gguf.quants", reason="gguf provides the quantization references")

from tensorplug_kernels import encode_math  # noqa: E402
from tensorplug_opencl import score  # noqa: E402

if score()[0] == 0:
    pytest.skip(f"no OpenCL device: {score()[1]}", allow_module_level=True)

QTYPES = (Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1)
GQ = {t: getattr(gq.GGMLQuantizationType, t.name) for t in QTYPES}


@pytest.fixture(scope="module")
def backend() -> Iterator[tp.Backend]:
    from tensorplug_opencl.reg import create_reg

    be = create_reg().devices()[0].init_backend()
    yield be
    be.free()


def run(
    backend: tp.Backend, outputs: Tensor | Sequence[Tensor], inputs: dict[Tensor, np.ndarray]
) -> list[np.ndarray]:
    """Place every tensor of the graph in one device buffer, upload, compute, download."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    graph = Graph(outs)
    buf = tp.alloc_tensors([*graph.leafs, *graph.nodes], backend.buffer_type())
    assert buf is not None
    buf.clear(0xA5)  # garbage where nothing was written: catches missed elements
    for t, values in inputs.items():
        tp.set_array(t, values)
    assert backend.graph_compute(graph) is tp.Status.SUCCESS
    return [tp.get_array(t) for t in outs]


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape
    assert not np.isnan(out).any()
    return float(((out - ref) ** 2).sum() / max((ref**2).sum(), 1e-30))


def rnd(rng: np.random.Generator, shape: Sequence[int], t: Type = Type.F32) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    if t == Type.BF16:
        return f32_to_bf16(x)
    return x.astype(t.numpy_dtype)


def as_f64(x: np.ndarray, t: Type) -> np.ndarray:
    if t == Type.BF16:
        return bf16_to_f32(x).astype(np.float64)
    if t.is_quantized:
        return gq.dequantize(x, GQ[t]).astype(np.float64)
    return x.astype(np.float64)


def like(ref: np.ndarray, t: Type) -> np.ndarray:
    """The float64 reference rounded to the output type, as the kernel must round it."""
    if t == Type.BF16:
        return f32_to_bf16(ref.astype(np.float32))
    return ref.astype(t.numpy_dtype)


def T(t: Type, *shape: int) -> Tensor:
    return tp.new_tensor(t, shape)


# -- elementwise -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ta", "tb"),
    [(Type.F32, Type.F32), (Type.F16, Type.F32), (Type.F32, Type.F16), (Type.BF16, Type.BF16)],
)
@pytest.mark.parametrize("bshape", [(2, 3, 5, 70), (3, 1, 70), (1, 1), (5, 1)])
def test_binary_ops_broadcast(backend, ta: Type, tb: Type, bshape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    a, b = T(ta, 2, 3, 5, 70), T(tb, *bshape)
    va, vb = rnd(rng, a.shape, ta), rnd(rng, bshape, tb)
    vb_f = as_f64(vb, tb)
    vb_f[np.abs(vb_f) < 0.1] = 0.5  # keep division well away from 0
    vb = (
        vb_f.astype(np.float32).astype(tb.numpy_dtype)
        if tb != Type.BF16
        else f32_to_bf16(vb_f.astype(np.float32))
    )
    vb_f = as_f64(vb, tb)
    outs = run(
        backend, [ops.add(a, b), ops.sub(a, b), ops.mul(a, b), ops.div(a, b)], {a: va, b: vb}
    )
    # the contract: compute in f32, round once to a's type; so the bits must match
    x, y = as_f64(va, ta).astype(np.float32), vb_f.astype(np.float32)
    for out, ref in zip(outs, (x + y, x - y, x * y, x / y), strict=True):
        assert out.dtype == ta.numpy_dtype
        assert (out == like(ref, ta)).all()


def test_binary_on_permuted_and_strided_views(backend) -> None:
    rng = np.random.default_rng(2)
    base, b = T(Type.F32, 6, 4, 10), T(Type.F32, 10, 1, 6)
    a = ops.permute(base, (2, 1, 0))  # (10, 4, 6), nothing contiguous
    sliced = ops.view(base, (3, 4, 5), base.strides, offset=base.strides[0] + 4)  # gaps
    va, vb = rnd(rng, base.shape), rnd(rng, b.shape)
    out, out2 = run(backend, [ops.mul(a, b), ops.scale(sliced, 2.0, 1.0)], {base: va, b: vb})
    ref = va.transpose(2, 1, 0).astype(np.float64) * vb
    assert nmse(out, ref) < 1e-13
    assert nmse(out2, va[1:4, :, 1:6] * 2.0 + 1.0) < 1e-13


def test_graph_allocator_reuse_never_overwrites_a_base_read_twice(backend) -> None:
    """``add(a, transpose(a))`` with the graph allocator's block reuse, on the device.

    Writing the sum over ``a`` while its transpose is still being read corrupts the
    result on OpenCL (CPU numpy hides it by copying overlapping operands).
    """
    rng = np.random.default_rng(19)
    x = T(Type.F32, 64, 64).set_input()
    a = ops.silu(x)
    y = ops.add(a, ops.transpose(a)).set_output()
    graph = Graph(y)
    tp.GraphAllocator(backend.buffer_type()).alloc_graph(graph)
    xv = rnd(rng, x.shape)
    tp.set_array(x, xv)
    assert backend.graph_compute(graph) is tp.Status.SUCCESS
    av = xv.astype(np.float64) / (1 + np.exp(-xv.astype(np.float64)))
    assert nmse(tp.get_array(y), av + av.T) < 1e-12


def test_more_rows_than_work_groups(backend) -> None:
    from tensorplug_kernels.launch import MAX_ROW_GROUPS

    rng = np.random.default_rng(22)
    a, b = T(Type.F32, MAX_ROW_GROUPS + 808, 3), T(Type.F32, 3)  # kernels loop over rows
    va, vb = rnd(rng, a.shape), rnd(rng, b.shape)
    add, norm = run(backend, [ops.add(a, b), ops.rms_norm(a, 1e-6)], {a: va, b: vb})
    assert (add == va + vb).all()
    ref = va / np.sqrt((va.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    assert nmse(norm, ref) < 1e-12


def _unary_ref(fn: str, x: np.ndarray) -> np.ndarray:
    sig = 1.0 / (1.0 + np.exp(-x))
    return {
        "abs": np.abs(x),
        "neg": -x,
        "relu": np.maximum(x, 0),
        "exp": np.exp(x),
        "gelu": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        "silu": x * sig,
        "tanh": np.tanh(x),
        "sigmoid": sig,
        "gelu_quick": x / (1.0 + np.exp(-1.702 * x)),
        "gelu_erf": 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    }[fn]


@pytest.mark.parametrize("t", [Type.F32, Type.F16])
def test_unary_functions_and_scale(backend, t: Type) -> None:
    rng = np.random.default_rng(3)
    a = T(t, 3, 7, 33)
    va = (rnd(rng, a.shape) * 3).astype(t.numpy_dtype)
    # the functions the kernels have; newer ones (gelu_erf, gelu_quick) run on the CPU
    fns = [u.value for u in tp.UnaryOp if backend.device.supports_op(ops.unary(a, u))]
    assert {"abs", "neg", "relu", "gelu", "silu", "exp", "tanh", "sigmoid"} <= set(fns)
    outs = run(backend, [ops.unary(a, f) for f in fns] + [ops.scale(a, -1.5, 0.25)], {a: va})
    x = va.astype(np.float64)
    for f, out in zip(fns, outs, strict=False):
        assert out.dtype == t.numpy_dtype
        assert nmse(out, like(_unary_ref(f, x), t)) < (1e-12 if t == Type.F32 else 1e-6), f
    assert nmse(outs[-1], like(x * -1.5 + 0.25, t)) < 1e-12


@pytest.mark.parametrize("swapped", [False, True])
def test_swiglu_split_and_two_operand(backend, swapped: bool) -> None:
    rng = np.random.default_rng(4)
    a, b = T(Type.F32, 5, 2 * 24), T(Type.F32, 5, 48)
    va, vb = rnd(rng, a.shape), rnd(rng, b.shape)
    split, both = run(backend, [ops.swiglu(a, swapped=swapped), ops.swiglu(a, b)], {a: va, b: vb})
    x, g = va[:, :24].astype(np.float64), va[:, 24:].astype(np.float64)
    if swapped:
        x, g = g, x
    assert nmse(split, x / (1 + np.exp(-x)) * g) < 1e-12
    y = va.astype(np.float64)
    assert nmse(both, y / (1 + np.exp(-y)) * vb) < 1e-12


# -- rows ------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [Type.F32, Type.F16])
def test_norm_and_rms_norm_on_strided_rows(backend, t: Type) -> None:
    rng = np.random.default_rng(5)
    base = T(t, 4, 3, 200)
    a = ops.permute(base, (1, 0, 2))  # rows dense, outer axes swapped
    va = (rnd(rng, base.shape) * 2 + 0.5).astype(t.numpy_dtype)
    n, r = run(backend, [ops.norm(a, 1e-5), ops.rms_norm(a, 1e-6)], {base: va})
    x = va.transpose(1, 0, 2).astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    ref_n = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    ref_r = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    tol = 1e-12 if t == Type.F32 else 1e-6
    assert nmse(n, like(ref_n, t)) < tol and nmse(r, like(ref_r, t)) < tol


def _alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    m = 2 ** math.floor(math.log2(n_head))
    m0, m1 = 2 ** (-max_bias / m), 2 ** (-max_bias / 2 / m)
    return np.array([m0 ** (h + 1) if h < m else m1 ** (2 * (h - m) + 1) for h in range(n_head)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    ("mask_t", "max_bias"),
    [(None, 0.0), (Type.F32, 0.0), (Type.F16, 0.0), (Type.F32, 8.0), (Type.F16, 8.0)],
)
def test_soft_max_with_mask_scale_and_alibi(backend, mask_t: Type | None, max_bias: float) -> None:
    rng = np.random.default_rng(6)
    a = T(Type.F32, 2, 6, 5, 37)  # 6 heads: not a power of two, both ALiBi branches
    va = rnd(rng, a.shape)
    inputs: dict[Tensor, np.ndarray] = {a: va}
    mask = None
    ref_in = va.astype(np.float64) * 0.7
    if mask_t is not None:
        mask = T(mask_t, 7, 37)  # more rows than a has: rows beyond 5 are unused
        vm = rnd(rng, mask.shape).astype(mask_t.numpy_dtype)
        vm[:, 30:] = -np.inf
        inputs[mask] = vm
        slopes = _alibi_slopes(6, max_bias) if max_bias else np.ones(6)
        ref_in = ref_in + slopes[None, :, None, None] * vm[:5].astype(np.float64)
    (out,) = run(backend, ops.soft_max(a, mask, scale=0.7, max_bias=max_bias), inputs)
    assert nmse(out, _softmax(ref_in)) < 1e-12
    if mask_t is not None:
        assert (out[..., 30:] == 0).all()


def _rope_ref(
    x: np.ndarray,
    pos: np.ndarray,
    n_dims: int,
    neox: bool,
    base: float = 10000.0,
    freq_scale: float = 1.0,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    ff: np.ndarray | None = None,
    corr: tuple[float, float] = (0.0, 0.0),
) -> np.ndarray:
    out = x.astype(np.float64).copy()
    i = np.arange(n_dims // 2)
    theta_extrap = pos[:, None].astype(np.float64) * base ** (-2.0 * i / n_dims)  # (tok, i)
    if ff is not None:
        theta_extrap = theta_extrap / ff
    theta = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor:
        y = (i - corr[0]) / max(0.001, corr[1] - corr[0])
        mix = (1 - np.clip(y, 0, 1)) * ext_factor
        theta = theta * (1 - mix) + theta_extrap * mix
        mscale *= 1 + 0.1 * math.log(1 / freq_scale)
    c, s = (np.cos(theta) * mscale)[:, None, :], (np.sin(theta) * mscale)[:, None, :]
    ix = i if neox else 2 * i
    iy = i + n_dims // 2 if neox else 2 * i + 1
    x0, x1 = out[..., ix].copy(), out[..., iy].copy()
    out[..., ix] = x0 * c - x1 * s
    out[..., iy] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX])
@pytest.mark.parametrize("t", [Type.F32, Type.F16])
def test_rope_modes_partial_dims_and_strided_input(backend, mode: RopeMode, t: Type) -> None:
    rng = np.random.default_rng(7)
    fused = T(t, 5, 3, 2 * 20)  # two heads' worth per row: rope the second one
    a = ops.view(fused, (5, 3, 20), fused.strides, offset=20 * t.type_size)
    pos = T(Type.I32, 5)
    vx = rnd(rng, fused.shape).astype(t.numpy_dtype)
    vp = np.array([0, 3, 17, 250, 1000], np.int32)
    (out,) = run(backend, ops.rope(a, pos, 16, mode), {fused: vx, pos: vp})
    ref = _rope_ref(vx[..., 20:], vp, 16, mode == RopeMode.NEOX)
    assert nmse(out, like(ref, t)) < (1e-11 if t == Type.F32 else 1e-6)
    assert (out[..., 16:] == vx[..., 36:]).all()  # dims past n_dims are copied


def test_rope_yarn_and_freq_factors(backend) -> None:
    from tensorplug.opmath import rope_yarn_corr_dims

    rng = np.random.default_rng(8)
    a, pos, ff = T(Type.F32, 6, 4, 32), T(Type.I32, 6), T(Type.F32, 16)
    va, vp = rnd(rng, a.shape), np.arange(6, dtype=np.int32) * 37
    vf = (1 + rng.random(16)).astype(np.float32)
    (out,) = run(
        backend,
        ops.rope(
            a,
            pos,
            32,
            RopeMode.NEOX,
            freq_factors=ff,
            freq_base=5000.0,
            freq_scale=0.25,
            ext_factor=0.5,
            attn_factor=0.9,
            beta_fast=32.0,
            beta_slow=1.0,
            n_ctx_orig=512,
        ),
        {a: va, pos: vp, ff: vf},
    )
    corr = rope_yarn_corr_dims(32, 512, 5000.0, 32.0, 1.0)
    # the ggml formula, evaluated independently of the kernel
    lo = 32 * math.log(512 / (32 * 2 * math.pi)) / (2 * math.log(5000))
    hi = 32 * math.log(512 / (1 * 2 * math.pi)) / (2 * math.log(5000))
    assert corr == (max(0.0, math.floor(lo)), min(31.0, math.ceil(hi)))
    ref = _rope_ref(va, vp, 32, True, 5000.0, 0.25, 0.5, 0.9, vf, corr)
    assert nmse(out, ref) < 1e-11


def test_sum_rows_argmax_argsort(backend) -> None:
    rng = np.random.default_rng(9)
    a, v = T(Type.F32, 3, 4, 100), T(Type.F32, 50)
    va = np.round(rnd(rng, a.shape) * 3).astype(np.float32)  # many ties
    vv = rnd(rng, v.shape)
    s, am, asc, desc, am1 = run(
        backend,
        [ops.sum_rows(a), ops.argmax(a), ops.argsort(a), ops.argsort(a, "desc"), ops.argmax(v)],
        {a: va, v: vv},
    )
    assert nmse(s, va.astype(np.float64).sum(-1, keepdims=True)) < 1e-12
    last = va.shape[-1] - 1 - va[..., ::-1].argmax(-1)  # ggml: the last of tied maxima
    assert (am == last).all() and am.dtype == np.int32
    assert (asc == np.argsort(va, -1, kind="stable")).all()
    assert (desc == np.argsort(-va, -1, kind="stable")).all()
    assert am1.shape == (1,) and am1[0] == vv.argmax()


def test_argsort_long_rows_use_launch_per_stage(backend, monkeypatch) -> None:
    from dataclasses import replace

    dev = backend.device
    monkeypatch.setattr(dev, "limits", replace(dev.limits, local_mem=1024))  # no room locally
    rng = np.random.default_rng(10)
    a = T(Type.F32, 2, 300)
    va = np.round(rnd(rng, a.shape) * 4).astype(np.float32)
    asc, desc = run(backend, [ops.argsort(a), ops.argsort(a, "desc")], {a: va})
    assert (asc == np.argsort(va, -1, kind="stable")).all()
    assert (desc == np.argsort(-va, -1, kind="stable")).all()


# -- mul_mat -------------------------------------------------------------------------------------


def _mm_ref(wa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """b · aᵀ per batch with ggml's broadcast: b batch j uses a batch j // ratio."""
    wa = wa.astype(np.float64)
    xb = xb.astype(np.float64)
    nd = max(wa.ndim, xb.ndim)
    wa = wa.reshape((1,) * (nd - wa.ndim) + wa.shape)
    xb = xb.reshape((1,) * (nd - xb.ndim) + xb.shape)
    for ax in range(nd - 2):
        wa = np.repeat(wa, xb.shape[ax] // wa.shape[ax], axis=ax)
    return xb @ np.swapaxes(wa, -1, -2)


@pytest.fixture(params=["tiled", "local", "vector", "generic"])
def mm_path(request, monkeypatch) -> str:
    """Every mul_mat kernel, whatever this device would pick: the register tiles (CPUs),
    local-memory tiles and one work-group per output (GPUs), and the generic one."""
    variant = request.param

    def forced(node, lim) -> str:
        return variant if encode_math.tileable(node) else "generic"

    monkeypatch.setattr(encode_math, "mm_variant", forced)
    return variant


@pytest.mark.parametrize("ta", [Type.F32, Type.F16, Type.BF16])
@pytest.mark.parametrize(("n_out", "n_tok", "k"), [(37, 5, 72), (8, 1, 70), (3, 9, 5)])
def test_mul_mat_float_weights(backend, mm_path, ta: Type, n_out: int, n_tok: int, k: int) -> None:
    rng = np.random.default_rng(11)
    a, b = T(ta, n_out, k), T(Type.F32, 2, n_tok, k)
    va, vb = rnd(rng, a.shape, ta), rnd(rng, b.shape)
    (out,) = run(backend, ops.mul_mat(a, b), {a: va, b: vb})
    assert out.shape == (2, n_tok, n_out)
    assert nmse(out, _mm_ref(as_f64(va, ta), vb)) < 1e-10


def test_mul_mat_gqa_broadcast_and_non_contiguous_operands(backend, mm_path) -> None:
    rng = np.random.default_rng(12)
    k_cache = T(Type.F16, 2, 11, 16)  # (heads_kv, n_kv, d)
    q_store = T(Type.F32, 6, 4, 16)  # (tokens, heads, d): permute to (heads, tokens, d)
    q = ops.permute(q_store, (1, 0, 2))
    vk, vq = rnd(rng, k_cache.shape, Type.F16), rnd(rng, q_store.shape)
    wt_store = T(Type.F32, 24, 10)
    wt = ops.transpose(wt_store)  # a with strided rows: only the generic kernel takes it
    x = T(Type.F16, 3, 24)  # f16 activations
    vw, vx = rnd(rng, wt_store.shape), rnd(rng, x.shape, Type.F16)
    kq, y = run(
        backend,
        [ops.mul_mat(k_cache, q), ops.mul_mat(wt, x)],
        {k_cache: vk, q_store: vq, wt_store: vw, x: vx},
    )
    assert nmse(kq, _mm_ref(vk, vq.transpose(1, 0, 2))) < 1e-10
    assert nmse(y, _mm_ref(vw.T, vx)) < 1e-10


@pytest.mark.parametrize("qt", QTYPES)
@pytest.mark.parametrize("n_tok", [1, 6])
def test_mul_mat_quantized_weights(backend, mm_path, qt: Type, n_tok: int) -> None:
    rng = np.random.default_rng(13)
    n_out, k = 19, 96
    a, b = T(qt, n_out, k), T(Type.F32, n_tok, k)
    raw = gq.quantize(rnd(rng, a.shape), GQ[qt])
    vb = rnd(rng, b.shape)
    (out,) = run(backend, ops.mul_mat(a, b), {a: raw, b: vb})
    assert nmse(out, _mm_ref(as_f64(raw, qt), vb)) < 1e-10


# -- attention ---------------------------------------------------------------------------------


def _attn_ref(q, k, v, mask, scale, max_bias=0.0, softcap=0.0) -> np.ndarray:
    """softmax(q·kᵀ·scale (+softcap) + slope·mask)·v, result (B, n_q, H, Dv)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        slopes = _alibi_slopes(q.shape[1], max_bias) if max_bias else np.ones(q.shape[1])
        s = s + slopes[None, :, None, None] * mask[..., : q.shape[2], :].astype(np.float64)
    return np.swapaxes(_softmax(s) @ v, 1, 2)


@pytest.mark.parametrize("kv_t", [Type.F32, Type.F16])
@pytest.mark.parametrize(("max_bias", "softcap"), [(0.0, 0.0), (4.0, 0.0), (0.0, 20.0)])
def test_flash_attn_ext(backend, kv_t: Type, max_bias: float, softcap: float) -> None:
    rng = np.random.default_rng(14)
    B, H, Hkv, nq, nkv, D, Dv = 2, 6, 2, 3, 150, 16, 24  # nkv spans several key chunks
    q, k, v = T(Type.F32, B, H, nq, D), T(kv_t, B, Hkv, nkv, D), T(kv_t, B, Hkv, nkv, Dv)
    mask = T(Type.F16, 1, 1, 4, nkv)
    vq, vk, vv = rnd(rng, q.shape), rnd(rng, k.shape, kv_t), rnd(rng, v.shape, kv_t)
    vm = np.zeros(mask.shape, np.float16)
    vm[..., 140:] = -np.inf
    vm[..., 0, :] = -np.inf  # a fully masked row gives zeros
    vm[..., 0, 5] = 0
    out_node = ops.flash_attn_ext(
        q, k, v, mask, scale=0.25, max_bias=max_bias, logit_softcap=softcap
    )
    (out,) = run(backend, out_node, {q: vq, k: vk, v: vv, mask: vm})
    assert out.shape == (B, nq, H, Dv)
    ref = _attn_ref(vq, vk, vv, vm, 0.25, max_bias, softcap)
    assert nmse(out, ref) < 1e-10


def test_flash_attn_ext_3d_without_mask(backend) -> None:
    rng = np.random.default_rng(15)
    q, k, v = T(Type.F32, 4, 5, 8), T(Type.F32, 2, 7, 8), T(Type.F32, 2, 7, 8)
    vq, vk, vv = rnd(rng, q.shape), rnd(rng, k.shape), rnd(rng, v.shape)
    (out,) = run(backend, ops.flash_attn_ext(q, k, v, scale=0.5), {q: vq, k: vk, v: vv})
    assert out.shape == (5, 4, 8)
    assert nmse(out, _attn_ref(vq[None], vk[None], vv[None], None, 0.5)[0]) < 1e-10


# -- copies, conversions, gathers and scatters ----------------------------------------------------


def test_cpy_float_conversions_are_exact(backend) -> None:
    rng = np.random.default_rng(16)
    a = T(Type.F32, 4, 50)
    va = rnd(rng, a.shape) * np.float32(1e3)
    va[0, :6] = [65519.0, 65520.0, 1e-6, -3e-8, np.inf, 70000.0]  # rounding edges, subnormals
    h, bf = T(Type.F16, 4, 50), T(Type.BF16, 200)
    back = T(Type.F32, 4, 50)
    f16, b16 = ops.cpy(a, h), ops.cpy(a, bf)
    out_h, out_b, out_back = run(backend, [f16, b16, ops.cpy(f16, back)], {a: va})
    with np.errstate(over="ignore"):  # 65520 and 70000 overflow to inf, as they must
        ref_h = va.astype(np.float16)
    assert (out_h.view(np.uint16) == ref_h.view(np.uint16)).all()
    assert (out_b == f32_to_bf16(va).reshape(-1)).all()
    assert (out_back == ref_h.astype(np.float32)).all()


@pytest.mark.parametrize("qt", QTYPES)
def test_cpy_quantizes_bit_exactly_and_dequantizes(backend, qt: Type) -> None:
    rng = np.random.default_rng(17)
    a = T(Type.F32, 3, 5, 64)
    va = rnd(rng, a.shape)
    va[0, 0, :32] = 0.0  # all-zero block: d = 0
    va[0, 1, :32] = -va[0, 1, :32].max()  # sign ties of the absmax
    va[0, 1, 7] = va[0, 1, :32].max() * -1
    dq = T(qt, 15, 64)  # reshaping copy: rows in C order
    q = ops.cpy(a, dq)
    back = ops.cpy(q, T(Type.F32, 15, 64))
    out_q, out_back = run(backend, [q, back], {a: va})
    assert (out_q == gq.quantize(va.reshape(15, 64), GQ[qt])).all()
    assert (out_back == gq.dequantize(out_q, GQ[qt])).all()


def test_cont_and_dup_of_permuted_views_and_raw_copies(backend) -> None:
    rng = np.random.default_rng(18)
    a, i = T(Type.F32, 3, 4, 5), T(Type.I32, 6, 7)
    qa = T(Type.Q8_0, 4, 64)
    va = rnd(rng, a.shape)
    vi = rng.integers(-(2**31), 2**31 - 1, i.shape, dtype=np.int32)  # beyond f32 precision
    vq = gq.quantize(rnd(rng, qa.shape), GQ[Type.Q8_0])
    p = ops.permute(a, (2, 0, 1))
    outs = run(
        backend,
        [ops.cont(p), ops.cont(p, (5, 12)), ops.dup(ops.transpose(i)), ops.cont(qa, (2, 128))],
        {a: va, i: vi, qa: vq},
    )
    assert (outs[0] == va.transpose(2, 0, 1)).all()
    assert (outs[1] == va.transpose(2, 0, 1).reshape(5, 12)).all()
    assert (outs[2] == vi.T).all()
    assert (outs[3] == vq.reshape(2, -1)).all()


@pytest.mark.parametrize("ta", [Type.F32, Type.F16, Type.BF16, Type.Q8_0, Type.Q4_0, Type.I32])
def test_get_rows(backend, ta: Type) -> None:
    rng = np.random.default_rng(19)
    a, rows = T(ta, 2, 10, 64), T(Type.I32, 2, 4)
    if ta.is_quantized:
        va = gq.quantize(rnd(rng, a.shape), GQ[ta])
    elif ta == Type.I32:
        va = rng.integers(-(2**31), 2**31 - 1, a.shape, dtype=np.int32)
    else:
        va = rnd(rng, a.shape, ta)
    vr = np.array([[9, 0, 3, 3], [1, 1, 8, 2]], np.int32)
    (out,) = run(backend, ops.get_rows(a, rows), {a: va, rows: vr})
    full = va if ta == Type.I32 else as_f64(va, ta)
    ref = np.stack([full[0][vr[0]], full[1][vr[1]]])
    assert out.dtype == (np.int32 if ta == Type.I32 else np.float32)
    assert (out == ref).all()


@pytest.mark.parametrize("dst_t", [Type.F32, Type.F16, Type.Q8_0, Type.Q4_0, Type.Q5_1])
@pytest.mark.parametrize("idx_t", [Type.I32, Type.I64])
def test_set_rows_writes_a_kv_cache(backend, dst_t: Type, idx_t: Type) -> None:
    rng = np.random.default_rng(20)
    cache, b, rows = T(dst_t, 2, 8, 64), T(Type.F32, 2, 3, 64), T(idx_t, 3)
    if dst_t.is_quantized:
        v0 = gq.quantize(rnd(rng, cache.shape), GQ[dst_t])
    else:
        v0 = rnd(rng, cache.shape, dst_t)
    vb = rnd(rng, b.shape)
    vr = np.array([6, 0, 3], idx_t.numpy_dtype)  # rows broadcast over both outer slices
    (out,) = run(backend, ops.set_rows(cache, b, rows), {cache: v0, b: vb, rows: vr})
    ref = v0.copy()
    for h in range(2):
        for j, r in enumerate(vr):
            ref[h, r] = gq.quantize(vb[h, j], GQ[dst_t]) if dst_t.is_quantized else vb[h, j]
    assert (out == ref).all()


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat(backend, axis: int) -> None:
    rng = np.random.default_rng(21)
    sa, sb = [2, 3, 4], [2, 3, 4]
    sb[axis] = 5
    a, b = T(Type.F32, *sa), T(Type.F32, *sb)
    ia, ib = T(Type.I32, *sa), T(Type.I32, *sb)
    va, vb = rnd(rng, sa), rnd(rng, sb)
    via = rng.integers(0, 99, sa, dtype=np.int32)
    vib = rng.integers(0, 99, sb, dtype=np.int32)
    out, iout = run(
        backend,
        [ops.concat(a, b, axis), ops.concat(ia, ib, axis)],
        {a: va, b: vb, ia: via, ib: vib},
    )
    assert (out == np.concatenate([va, vb], axis)).all()
    assert (iout == np.concatenate([via, vib], axis)).all()

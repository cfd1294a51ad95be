"""An independent float64 numpy llama, for checking the runner (tensorplug_llm).

It shares no code with the runner: the file is read with the ``gguf`` package's own
reader and dequantized with ``gguf.quants``, and the forward pass is written from the
llama architecture (RMSNorm, NORMAL rope on adjacent pairs, grouped-query causal
attention, SwiGLU) in plain float64 numpy over the whole sequence at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize


@dataclass
class RefModel:
    n_layer: int
    n_head: int
    n_head_kv: int
    n_rot: int
    eps: float
    base: float
    w: dict[str, np.ndarray]  # float64, numpy order (GGUF dims reversed)
    scaling: str = "none"  # llama.rope.scaling.type: none, linear or yarn
    factor: float = 1.0  # llama.rope.scaling.factor: how much longer the context is
    n_ctx_orig: int = 0  # the context length the model was trained at (YaRN's ramp)
    beta_fast: float = 32.0  # YaRN's ramp: pairs turning more often than this are kept
    beta_slow: float = 1.0  # ... and pairs turning less often are interpolated
    yarn_log_mul: float = 0.0  # YaRN's mscale_all_dim (rope.scaling.yarn_log_multiplier)
    n_expert_used: int = 0  # llama.expert_used_count: experts per token (Mixtral)
    quantized: frozenset[str] = frozenset()  # the tensors stored in a block-quantized type
    types: dict[str, str] = field(default_factory=dict)  # each tensor's ggml type name


def load(path: str | Path) -> RefModel:
    r = GGUFReader(path)
    meta = {name: f.contents() for name, f in r.fields.items()}
    a = meta["general.architecture"]  # llama's block under another name (Mistral 3)
    meta = {k.replace(f"{a}.", "llama.", 1) if k.startswith(f"{a}.") else k: v
            for k, v in meta.items()}  # fmt: skip
    w, quantized, types = {}, set(), {}
    for t in r.tensors:
        types[t.name] = t.tensor_type.name
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
        if t.tensor_type.name not in ("F32", "F16", "BF16"):
            quantized.add(t.name)
    n_embd, n_head = meta["llama.embedding_length"], meta["llama.attention.head_count"]
    return RefModel(
        n_layer=meta["llama.block_count"],
        n_head=n_head,
        n_head_kv=meta.get("llama.attention.head_count_kv", n_head),
        n_rot=meta.get("llama.rope.dimension_count", n_embd // n_head),
        eps=meta["llama.attention.layer_norm_rms_epsilon"],
        base=meta.get("llama.rope.freq_base", 10000.0),
        w=w,
        scaling=meta.get("llama.rope.scaling.type", "none"),
        factor=meta.get("llama.rope.scaling.factor", 1.0),
        n_ctx_orig=meta.get(
            "llama.rope.scaling.original_context_length", meta["llama.context_length"]
        ),
        beta_fast=meta.get("llama.rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=meta.get("llama.rope.scaling.yarn_beta_slow", 1.0),
        yarn_log_mul=meta.get("llama.rope.scaling.yarn_log_multiplier", 0.0),
        n_expert_used=meta.get("llama.expert_used_count", 0),
        quantized=frozenset(quantized),
        types=types,
    )


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def _scaled_freqs(
    freqs: np.ndarray, n_rot: int, base: float, scaling: str, factor: float, n_ctx_orig: int,
    beta_fast: float = 32.0, beta_slow: float = 1.0, log_mul: float = 0.0,
) -> tuple[np.ndarray, float]:  # fmt: skip
    """Per-pair frequencies after context-extension scaling, and the attention scale.

    linear (position interpolation): every frequency divided by ``factor``. YaRN
    (Peng et al. 2023, "NTK-by-parts" + temperature): pairs that turn fewer than
    ``beta_slow`` (1) times over the original context are interpolated, pairs turning
    more than ``beta_fast`` (32) times are kept, a linear ramp in between; cos and sin
    are scaled by transformers' ``attention_factor``: ``mscale(factor)`` =
    ``1 + 0.1·ln(factor)`` (1 for a factor <= 1), divided by
    ``mscale(factor, log_mul)`` = ``1 + 0.1·log_mul·ln(factor)`` when the file gives
    ``log_mul`` (DeepSeek's and Mistral 3's ``mscale_all_dim``).
    """

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 1.0 + 0.1 * m * float(np.log(scale))

    if scaling == "linear":
        return freqs / factor, 1.0
    if scaling != "yarn":
        return freqs, 1.0

    def pair_turning(turns: float) -> float:  # the pair index doing `turns` rotations
        return n_rot * np.log(n_ctx_orig / (turns * 2 * np.pi)) / (2 * np.log(base))

    low = max(np.floor(pair_turning(beta_fast)), 0.0)
    high = min(np.ceil(pair_turning(beta_slow)), n_rot - 1.0)
    i = np.arange(len(freqs), dtype=np.float64)
    keep = 1.0 - np.clip((i - low) / max(high - low, 0.001), 0.0, 1.0)
    attention = mscale(factor) / mscale(factor, log_mul) if log_mul else mscale(factor)
    return freqs / factor * (1.0 - keep) + freqs * keep, attention


def _rope(
    x: np.ndarray, n_rot: int, base: float, factors: np.ndarray | None = None,
    scaling: str = "none", factor: float = 1.0, n_ctx_orig: int = 0,
    yarn: tuple[float, float, float] = (32.0, 1.0, 0.0),
) -> np.ndarray:  # fmt: skip
    """x (T, H, D): rotate pairs (2i, 2i+1), i < n_rot/2, of token t by
    t·base^(-2i/n_rot) / factors[i] (Llama 3.1's rope_freqs; 1 without), the
    frequencies scaled for a longer context as ``scaling`` says."""
    t = np.arange(x.shape[0], dtype=np.float64)[:, None, None]
    freqs = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if factors is not None:
        freqs = freqs / factors
    freqs, mscale = _scaled_freqs(freqs, n_rot, base, scaling, factor, n_ctx_orig, *yarn)
    angle = t * freqs
    c, s = mscale * np.cos(angle), mscale * np.sin(angle)
    out = x.copy()
    a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = a * c - b * s
    out[..., 1:n_rot:2] = a * s + b * c
    return out


def _q8(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` as ggml's CPU rounds them for an integer product with 32-value
    blocks (Q8_0, and Q8_1's codes): in float32, codes ``rint(x·(127/amax))`` and scale
    ``f16(amax/127)``."""
    blocks = np.ascontiguousarray(x, np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
    return (np.rint(blocks * inv).astype(np.float64) * d).reshape(x.shape)


def _q8_k(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` as ggml rounds them for the K-quants (Q8_K): 256-value blocks,
    ``iscale = −127/max`` in float32 (``max`` the value of largest magnitude, signed),
    codes ``min(127, rint(iscale·x))``, ``d = 1/iscale``."""
    blocks = np.ascontiguousarray(x, np.float32).reshape(*x.shape[:-1], -1, 256)
    big = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(big != 0, np.float32(-127) / big, 0).astype(np.float32)
        d = np.where(big != 0, np.float32(1) / iscale, 0).astype(np.float32)
    codes = np.minimum(np.rint(blocks * iscale), 127).astype(np.float64)
    return (codes * d.astype(np.float64)).reshape(x.shape)


def ggml_rounded(x: np.ndarray, type_name: str) -> np.ndarray:
    """``x`` as ggml's CPU rounds activations before multiplying them by weights of
    ``type_name`` (its ``vec_dot_type``): F16 or BF16 values, Q8_K for the K-quants and
    IQ4_XS, 32-value Q8 blocks for the other quantized types, nothing for F32."""
    if type_name == "F32":
        return x
    if type_name == "F16":
        return x.astype(np.float32).astype(np.float16).astype(np.float64)
    if type_name == "BF16":
        from tensorplug.quants import bf16_to_f32, f32_to_bf16

        return bf16_to_f32(f32_to_bf16(x.astype(np.float32))).astype(np.float64)
    return _q8_k(x) if type_name.endswith("_K") or type_name == "IQ4_XS" else _q8(x)


def logits(
    m: RefModel,
    tokens: list[int],
    kv_dtype: type | None = None,
    q8: bool = False,
    kv_cache: list[tuple[np.ndarray, np.ndarray]] | None = None,
    kv_seen: list[tuple[np.ndarray, np.ndarray]] | None = None,
) -> np.ndarray:
    """Logits of every position, (len(tokens), n_vocab). ``kv_dtype`` rounds K and V to
    the cache's element type, as storing them in an F16 cache does. ``q8`` rounds the
    activations of every product as ggml's CPU does for the matrix's type first
    (:func:`ggml_rounded`), as llama.cpp's CPU does, and tensorplug's: with an F16
    cache, the query before K·Q and the attention weights before weights·V too.

    ``kv_cache`` gives each block's K and V rows as a runner stored them (position ``p``
    in row ``p``), and attention reads those instead of the reference's own: a value that
    float32 and float64 round to neighbouring halves then stays in its own position's
    logits, as :func:`rounded_err` expects, rather than reaching every later position
    through the cache. ``kv_seen`` collects the reference's own K and V rows (float64,
    before rounding), to hold the cache that was read to them."""
    w = m.w

    def product(x: np.ndarray, name: str) -> np.ndarray:
        return (ggml_rounded(x, m.types[name]) if q8 else x) @ w[name].T

    T = len(tokens)
    x = w["token_embd.weight"][tokens]
    hd = x.shape[1] // m.n_head
    group = m.n_head // m.n_head_kv
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    ff = w.get("rope_freqs.weight")
    half = q8 and kv_dtype is np.float16  # the cache's products round their operand

    def cached(x: np.ndarray) -> np.ndarray:
        return ggml_rounded(x, "F16") if half else x

    for i in range(m.n_layer):
        p = f"blk.{i}."
        h = _rms(x, m.eps) * w[p + "attn_norm.weight"]
        q = product(h, p + "attn_q.weight").reshape(T, m.n_head, hd)
        k = product(h, p + "attn_k.weight").reshape(T, m.n_head_kv, hd)
        yarn = (m.beta_fast, m.beta_slow, m.yarn_log_mul)
        q, k = (_rope(t, m.n_rot, m.base, ff, m.scaling, m.factor, m.n_ctx_orig, yarn)
                for t in (q, k))  # fmt: skip
        v = product(h, p + "attn_v.weight").reshape(T, m.n_head_kv, hd)
        if kv_seen is not None:
            kv_seen.append((k.reshape(T, -1), v.reshape(T, -1)))
        if kv_cache is not None:
            k, v = (np.asarray(c[:T], np.float64).reshape(T, m.n_head_kv, hd)
                    for c in kv_cache[i])  # fmt: skip
        elif kv_dtype is not None:
            k = k.astype(kv_dtype).astype(np.float64)
            v = v.astype(kv_dtype).astype(np.float64)
        out = np.empty((T, m.n_head, hd))
        for head in range(m.n_head):
            kv = head // group
            s = cached(q[:, head]) @ k[:, kv].T / np.sqrt(hd) + causal
            e = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head] = cached(e / e.sum(axis=1, keepdims=True)) @ v[:, kv]
        x = x + product(out.reshape(T, -1), p + "attn_output.weight")
        h = _rms(x, m.eps) * w[p + "ffn_norm.weight"]
        if p + "ffn_gate_inp.weight" in w:
            x = x + _moe(m, p, h, product(h, p + "ffn_gate_inp.weight"), q8)
            continue
        gate, up = product(h, p + "ffn_gate.weight"), product(h, p + "ffn_up.weight")
        x = x + product(gate / (1.0 + np.exp(-gate)) * up, p + "ffn_down.weight")
    x = _rms(x, m.eps) * w["output_norm.weight"]
    return product(x, "output.weight" if "output.weight" in w else "token_embd.weight")


def _moe(m: RefModel, p: str, h: np.ndarray, logits: np.ndarray, q8: bool = False) -> np.ndarray:
    """Mixtral's FFN, token by token: softmax over the router's logits, the k most
    probable experts, their probabilities renormalised, the weighted sum of their SwiGLU
    outputs (``logits``: the router's; ``q8``: activations rounded as :func:`logits`)."""
    w = m.w

    def rounded(x: np.ndarray, name: str) -> np.ndarray:
        return ggml_rounded(x[None], m.types[p + name])[0] if q8 else x

    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-probs[t], kind="stable")[: m.n_expert_used]
        weights = probs[t, chosen] / probs[t, chosen].sum()
        for e, we in zip(chosen, weights, strict=True):
            gate = w[p + "ffn_gate_exps.weight"][e] @ rounded(h[t], "ffn_gate_exps.weight")
            up = w[p + "ffn_up_exps.weight"][e] @ rounded(h[t], "ffn_up_exps.weight")
            act = rounded(gate / (1 + np.exp(-gate)) * up, "ffn_down_exps.weight")
            out[t] += we * (w[p + "ffn_down_exps.weight"][e] @ act)
    return out


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """Largest absolute difference relative to the largest logit."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def rounded_err(got: np.ndarray, want: np.ndarray, flipped_rows: int = 2) -> float:
    """:func:`rel_err` over the positions but the ``flipped_rows`` worst, for logits whose
    activations were rounded (``logits(q8=True)``): where float32 and float64 land on
    either side of a rounding boundary, one activation takes the neighbouring code (1/127
    of its block's largest value, or one f16 step), and that position's logits move by
    up to ~2e-3 (measured: one position of 18, a Q4_0 model). Such flips are rare; a
    wrong rounding moves every position. The worst rows must still stay within 5e-3."""
    rows = np.sort(np.abs(got - want).max(axis=-1) / np.abs(want).max())
    assert rows[-1] <= 5e-3, f"a position's logits are {rows[-1]:.2g} away"
    return float(rows[-1 - flipped_rows]) if rows.size > flipped_rows else 0.0


# -- the reference's own checks: closed-form facts, so that a broken reference cannot hide a
# -- broken runner


def test_rope_rotates_pairs_by_position_angle() -> None:
    x = np.zeros((3, 1, 4))
    x[:, 0, 0] = 1.0  # pair 0 = (1, 0), pair 1 = (0, 0)
    x[:, 0, 3] = 2.0  # pair 1 = (0, 2)
    out = _rope(x, n_rot=4, base=100.0)
    for t in range(3):
        a0, a1 = t * 1.0, t * 100.0 ** (-2 / 4)
        np.testing.assert_allclose(out[t, 0, :2], [np.cos(a0), np.sin(a0)], atol=1e-15)
        np.testing.assert_allclose(out[t, 0, 2:], [-2 * np.sin(a1), 2 * np.cos(a1)], atol=1e-15)


def test_rope_leaves_dimensions_past_n_rot() -> None:
    x = np.random.default_rng(0).standard_normal((5, 2, 8))
    out = _rope(x, n_rot=4, base=10000.0)
    np.testing.assert_array_equal(out[..., 4:], x[..., 4:])
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))


def test_single_token_attention_passes_v_through() -> None:
    """With one token, attention returns V itself: the logits equal a hand-built MLP path."""
    rng = np.random.default_rng(1)
    d, f, v = 8, 16, 5
    w = {"token_embd.weight": rng.standard_normal((v, d)), "output_norm.weight": np.ones(d)}
    p = "blk.0."
    w |= {p + n: rng.standard_normal(s) for n, s in [
        ("attn_q.weight", (d, d)), ("attn_k.weight", (4, d)), ("attn_v.weight", (4, d)),
        ("attn_output.weight", (d, d)), ("ffn_gate.weight", (f, d)), ("ffn_up.weight", (f, d)),
        ("ffn_down.weight", (d, f)),
    ]}  # fmt: skip
    w |= {p + "attn_norm.weight": np.ones(d), p + "ffn_norm.weight": np.ones(d)}
    m = RefModel(1, 2, 1, 4, 1e-6, 10000.0, w)
    x = w["token_embd.weight"][3]
    h = x / np.sqrt(np.mean(x * x) + 1e-6)
    vv = w[p + "attn_v.weight"] @ h  # one KV head shared by both query heads
    x1 = x + w[p + "attn_output.weight"] @ np.concatenate([vv, vv])
    h2 = x1 / np.sqrt(np.mean(x1 * x1) + 1e-6)
    g, u = w[p + "ffn_gate.weight"] @ h2, w[p + "ffn_up.weight"] @ h2
    x2 = x1 + w[p + "ffn_down.weight"] @ (g / (1 + np.exp(-g)) * u)
    want = w["token_embd.weight"] @ (x2 / np.sqrt(np.mean(x2 * x2) + 1e-6))
    np.testing.assert_allclose(logits(m, [3])[0], want, rtol=1e-12)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between() -> None:
    # n_rot 64, base 10000, original context 4096: pair i turns 4096·base^(-2i/64)/(2π) times
    freqs = 10000.0 ** (-np.arange(0, 64, 2, dtype=np.float64) / 64)
    scaled, mscale = _scaled_freqs(freqs, 64, 10000.0, "yarn", 4.0, 4096)
    turns = 4096 * freqs / (2 * np.pi)
    fast, slow = turns > 32, turns < 1
    assert fast.any() and slow.any()
    np.testing.assert_allclose(scaled[fast], freqs[fast])  # extrapolated: unchanged
    np.testing.assert_allclose(scaled[slow], freqs[slow] / 4)  # interpolated
    assert mscale == pytest.approx(1 + 0.1 * np.log(4))
    ratio = scaled / freqs  # from 1 down to 1/4, never outside
    assert np.all(np.diff(ratio) <= 1e-12) and ratio.min() == pytest.approx(0.25)
    linear, one = _scaled_freqs(freqs, 64, 10000.0, "linear", 4.0, 64)
    np.testing.assert_allclose(linear, freqs / 4)
    assert one == 1.0

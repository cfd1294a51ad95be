"""One llama decoder block on its own, with a KV cache, and its float64 numpy twin.

The demo and the scheduler tests use it as a realistic graph: rms_norm, rope, grouped
query attention reading a KV cache written with set_rows, a SwiGLU MLP and residuals.
The graph is the runner's own block (:func:`~tensorplug_llm.model.decoder_block`),
so what the demo checks is what every model runs. The numpy version is written from
the op contracts, not from any backend's kernels, so agreement between the two is
evidence rather than a tautology.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tensorplug.tensor import Tensor, new_tensor
from tensorplug.types import Type

from .model import LayerWeights, LlamaConfig, decoder_block

__all__ = ["BlockConfig", "BlockGraph", "build_block", "reference_block"]


@dataclass(frozen=True)
class BlockConfig:
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 256
    n_ctx: int = 64
    n_past: int = 16
    n_tokens: int = 8
    eps: float = 1e-5
    rope_base: float = 10000.0
    weight_type: Type = Type.F32
    cache_type: Type = Type.F16

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def n_kv(self) -> int:
        return self.n_past + self.n_tokens

    def llama_config(self) -> LlamaConfig:
        """The block as one layer of a llama model (the runner's hyper-parameters)."""
        return LlamaConfig(
            n_vocab=0, n_ctx_train=self.n_ctx, n_embd=self.n_embd, n_layer=1,
            n_head=self.n_head, n_head_kv=self.n_head_kv, n_ff=self.n_ff,
            head_dim=self.head_dim, n_rot=self.head_dim, eps=self.eps,
            rope_base=self.rope_base,
        )  # fmt: skip


@dataclass
class BlockGraph:
    """The block's tensors: ``inputs`` and ``weights`` to fill, ``out`` to read."""

    cfg: BlockConfig
    out: Tensor
    inputs: dict[str, Tensor] = field(default_factory=dict)
    weights: dict[str, Tensor] = field(default_factory=dict)
    caches: dict[str, Tensor] = field(default_factory=dict)


def build_block(cfg: BlockConfig) -> BlockGraph:
    """One decoder block over ``n_tokens`` new tokens after ``n_past`` cached ones, built
    by the runner's own :func:`~tensorplug_llm.model.decoder_block`."""
    d, kv, T = cfg.n_embd, cfg.n_embd_kv, cfg.n_tokens
    w = {
        "attn_norm": new_tensor(Type.F32, (d,), "attn_norm"),
        "wq": new_tensor(cfg.weight_type, (d, d), "wq"),
        "wk": new_tensor(cfg.weight_type, (kv, d), "wk"),
        "wv": new_tensor(cfg.weight_type, (kv, d), "wv"),
        "wo": new_tensor(cfg.weight_type, (d, d), "wo"),
        "ffn_norm": new_tensor(Type.F32, (d,), "ffn_norm"),
        "w_gate": new_tensor(cfg.weight_type, (cfg.n_ff, d), "w_gate"),
        "w_up": new_tensor(cfg.weight_type, (cfg.n_ff, d), "w_up"),
        "w_down": new_tensor(cfg.weight_type, (d, cfg.n_ff), "w_down"),
    }
    caches = {
        "k_cache": new_tensor(cfg.cache_type, (cfg.n_ctx, kv), "k_cache"),
        "v_cache": new_tensor(cfg.cache_type, (cfg.n_ctx, kv), "v_cache"),
    }
    inputs = {
        "x": new_tensor(Type.F32, (T, d), "x").set_input(),
        "pos": new_tensor(Type.I32, (T,), "pos").set_input(),
        "kv_idx": new_tensor(Type.I64, (T,), "kv_idx").set_input(),
        "mask": new_tensor(Type.F16, (T, cfg.n_kv), "kq_mask").set_input(),
    }
    out = decoder_block(
        cfg.llama_config(), LayerWeights(**w), inputs["x"], inputs["pos"], inputs["kv_idx"],
        inputs["mask"], caches["k_cache"], caches["v_cache"], cfg.n_kv,
    )  # fmt: skip
    return BlockGraph(cfg, out.set_name("block_out").set_output(), inputs, w, caches)


def _rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _rope_normal(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by pos·base^(-2i/d): x is (T, H, d)."""
    d = x.shape[-1]
    theta = pos[:, None].astype(np.float64) * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def reference_block(
    cfg: BlockConfig,
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    pos: np.ndarray,
    kv_idx: np.ndarray,
    mask: np.ndarray,
) -> np.ndarray:
    """The same block in float64 numpy; weights are given as dequantized floats."""
    f = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    x = x.astype(np.float64)
    T, hd, g = cfg.n_tokens, cfg.head_dim, cfg.n_head // cfg.n_head_kv
    h = _rms_norm(x, cfg.eps) * f["attn_norm"]
    q = _rope_normal((h @ f["wq"].T).reshape(T, cfg.n_head, hd), pos, cfg.rope_base)
    k = _rope_normal((h @ f["wk"].T).reshape(T, cfg.n_head_kv, hd), pos, cfg.rope_base)
    v = h @ f["wv"].T
    kc, vc = k_cache.astype(np.float64), v_cache.astype(np.float64)
    # the cache stores values rounded to its type, exactly as set_rows writes them
    kc[kv_idx] = k.reshape(T, -1).astype(k_cache.dtype)
    vc[kv_idx] = v.astype(v_cache.dtype)
    K = kc[: cfg.n_kv].reshape(cfg.n_kv, cfg.n_head_kv, hd)
    V = vc[: cfg.n_kv].reshape(cfg.n_kv, cfg.n_head_kv, hd)
    attn = np.empty((T, cfg.n_head, hd))
    for head in range(cfg.n_head):
        logits = q[:, head, :] @ K[:, head // g, :].T * hd**-0.5 + mask[:, : cfg.n_kv]
        logits -= logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)
        attn[:, head, :] = p @ V[:, head // g, :]
    x1 = x + attn.reshape(T, -1) @ f["wo"].T
    h2 = _rms_norm(x1, cfg.eps) * f["ffn_norm"]
    a, b = h2 @ f["w_gate"].T, h2 @ f["w_up"].T
    return x1 + (a / (1 + np.exp(-a)) * b) @ f["w_down"].T

"""Shared by the allocator and scheduler tests and benchmarks/bench_sched.py.

Loads the TESTACCEL plugin from this folder (no install needed) and builds the graphs
the tests run: a llama-style decoder with attention, rope and a SwiGLU MLP.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.testing.reference import rope

PLUGIN_ROOT = Path(__file__).resolve().parent / "tp-testaccel"
PLUGIN_PACKAGE = PLUGIN_ROOT / "tensorplug_testaccel"

if str(PLUGIN_ROOT) not in sys.path:
    sys.path.insert(0, str(PLUGIN_ROOT))

from tensorplug_testaccel.device import TestAccelReg  # noqa: E402

__all__ = ["PLUGIN_PACKAGE", "ModelRunner", "TestAccelReg", "build_llama", "llama_reference"]


@dataclass
class ModelRunner:
    """A built llama-style graph, its weights (name -> tensor) and its input tensors."""

    graph: tp.Graph
    weights: dict[str, tp.Tensor]
    tokens: tp.Tensor
    pos: tp.Tensor
    mask: tp.Tensor
    logits: tp.Tensor
    config: dict[str, int] = field(default_factory=dict)

    def weight_values(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Fixed random weights (float32, before any quantization), by name."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, w in sorted(self.weights.items()):
            scale = 1.0 if "norm" in name else 0.2
            base = 1.0 if "norm" in name else 0.0
            out[name] = (base + scale * rng.standard_normal(w.shape)).astype(np.float32)
        return out

    def input_values(self, seed: int = 1) -> dict[str, np.ndarray]:
        t, v = self.config["n_tokens"], self.config["n_vocab"]
        rng = np.random.default_rng(seed)
        return {
            "tokens": rng.integers(0, v, size=t).astype(np.int32),
            "pos": np.arange(t, dtype=np.int32),
            "mask": np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1),
        }

    def set_inputs(self, values: dict[str, np.ndarray]) -> None:
        tp.set_array(self.tokens, values["tokens"])
        tp.set_array(self.pos, values["pos"])
        tp.set_array(self.mask, values["mask"])


def build_llama(
    n_layer: int = 2,
    n_tokens: int = 8,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_vocab: int = 96,
    wtype: Type = Type.F32,
    weights: dict[str, tp.Tensor] | None = None,
) -> ModelRunner:
    """A llama-style decoder graph: 33 nodes per layer, matrix weights of ``wtype``.

    Pass the ``weights`` of an earlier model of the same shape to share them (a new
    graph per batch over the same loaded weights, as an inference loop builds them).
    """
    d = n_embd // n_head
    shared = weights
    weights = {}

    def w(shape: tuple[int, ...], name: str, t: Type = wtype) -> tp.Tensor:
        weights[name] = shared[name] if shared is not None else tp.new_tensor(t, shape, name)
        return weights[name]

    tokens = tp.new_tensor(Type.I32, (n_tokens,), "tokens").set_input()
    pos = tp.new_tensor(Type.I32, (n_tokens,), "pos").set_input()
    mask = tp.new_tensor(Type.F32, (n_tokens, n_tokens), "mask").set_input()
    x = ops.get_rows(w((n_vocab, n_embd), "tok_embd", Type.F32), tokens).set_name("embd")
    for il in range(n_layer):
        cur = ops.rms_norm(x, 1e-5) * w((n_embd,), f"attn_norm.{il}", Type.F32)
        q = ops.reshape(ops.mul_mat(w((n_embd, n_embd), f"wq.{il}"), cur), (n_tokens, n_head, d))
        k = ops.reshape(
            ops.mul_mat(w((n_head_kv * d, n_embd), f"wk.{il}"), cur), (n_tokens, n_head_kv, d)
        )
        v = ops.reshape(
            ops.mul_mat(w((n_head_kv * d, n_embd), f"wv.{il}"), cur), (n_tokens, n_head_kv, d)
        )
        q = ops.rope(q, pos, d).set_name(f"q.{il}")
        k = ops.rope(k, pos, d).set_name(f"k.{il}")
        kq = ops.mul_mat(ops.cont(ops.permute(k, (1, 0, 2))), ops.permute(q, (1, 0, 2)))
        kq = ops.soft_max(kq, mask, 1.0 / d**0.5).set_name(f"kq_soft_max.{il}")
        kqv = ops.mul_mat(ops.cont(ops.permute(v, (1, 2, 0))), kq)  # (head, token, d)
        attn = ops.cont(ops.permute(kqv, (1, 0, 2)), (n_tokens, n_embd))
        x = (x + ops.mul_mat(w((n_embd, n_embd), f"wo.{il}"), attn)).set_name(f"attn_out.{il}")
        cur = ops.rms_norm(x, 1e-5) * w((n_embd,), f"ffn_norm.{il}", Type.F32)
        gate = ops.mul_mat(w((n_ff, n_embd), f"ffn_gate.{il}"), cur)
        up = ops.mul_mat(w((n_ff, n_embd), f"ffn_up.{il}"), cur)
        x = (x + ops.mul_mat(w((n_embd, n_ff), f"ffn_down.{il}"), ops.swiglu(gate, up))).set_name(
            f"l_out.{il}"
        )
    x = ops.rms_norm(x, 1e-5) * w((n_embd,), "output_norm", Type.F32)
    logits = ops.mul_mat(w((n_vocab, n_embd), "output"), x).set_name("logits").set_output()
    config = {
        "n_tokens": n_tokens, "n_vocab": n_vocab, "n_embd": n_embd, "n_layer": n_layer,
        "n_head": n_head, "n_head_kv": n_head_kv,
    }  # fmt: skip
    return ModelRunner(tp.Graph(logits), weights, tokens, pos, mask, logits, config)


def llama_reference(
    model: ModelRunner, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
) -> np.ndarray:
    """The logits of :func:`build_llama`'s graph computed with plain numpy (float64)."""
    cfg = model.config
    n_layer, t, n_embd = cfg["n_layer"], cfg["n_tokens"], cfg["n_embd"]
    h, hk = cfg["n_head"], cfg["n_head_kv"]
    d = n_embd // h

    def rms(x: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)

    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1 + np.exp(-x))

    w = {k: v.astype(np.float64) for k, v in weights.items()}
    x = w["tok_embd"][inputs["tokens"]]
    for il in range(n_layer):
        cur = rms(x) * w[f"attn_norm.{il}"]
        q = rope((cur @ w[f"wq.{il}"].T).reshape(t, h, d), inputs["pos"], d)  # NORMAL
        k = rope((cur @ w[f"wk.{il}"].T).reshape(t, hk, d), inputs["pos"], d)
        v = (cur @ w[f"wv.{il}"].T).reshape(t, hk, d)
        k = np.repeat(k, h // hk, axis=1)
        v = np.repeat(v, h // hk, axis=1)
        kq = np.einsum("qhd,khd->hqk", q, k) / d**0.5 + inputs["mask"]
        kq = np.exp(kq - kq.max(-1, keepdims=True))
        kq /= kq.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", kq, v).reshape(t, n_embd)
        x = x + attn @ w[f"wo.{il}"].T
        cur = rms(x) * w[f"ffn_norm.{il}"]
        g, u = cur @ w[f"ffn_gate.{il}"].T, cur @ w[f"ffn_up.{il}"].T
        x = x + (silu(g) * u) @ w[f"ffn_down.{il}"].T
    x = rms(x) * w["output_norm"]
    return x @ w["output"].T

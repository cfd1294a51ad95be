"""The BERT family's encoder: weights and step graph, as llama.cpp's ``build_bert``.

A bidirectional encoder turns tokens into hidden states, which embeddings pool:

    x = LayerNorm(token_embd[tokens] + token_types[0] + position_embd[pos])
    for each block:
        q, k, v = x·Wqᵀ + bq, x·Wkᵀ + bk, x·Wvᵀ + bv     (no rope: positions are embedded)
        x = LayerNorm(x + attention(q, k, v)·Woᵀ + bo)   (every token sees every token)
        x = LayerNorm(x + gelu(x·Wupᵀ + bup)·Wdownᵀ + bdown)
    hidden = x

Everything a decoder has and an encoder lacks — rope, the causal mask, the output
layer — is left out; what they share is the attention itself
(:func:`~tensorplug_llm.model.attend`, through the same KV cache so the runner steps
both alike) and the graph's inputs (:class:`~tensorplug_llm.model.StepGraph`). The
runner gives an encoder's steps a mask that hides only cells past the input, and
reads the hidden states where a decoder's logits would be.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorplug import ops
from tensorplug.errors import RunError
from tensorplug.gguf import GGUFFile
from tensorplug.graph import Graph
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.types import Type

from .model import KVCache, LlamaConfig, StepGraph, attend

__all__ = ["EncoderLayer", "EncoderWeights", "build_encoder_step"]


@dataclass
class EncoderLayer:
    """One post-LayerNorm block: projections with biases, two LayerNorms with biases."""

    wq: Tensor
    bq: Tensor
    wk: Tensor
    bk: Tensor
    wv: Tensor
    bv: Tensor
    wo: Tensor
    bo: Tensor
    attn_out_norm: Tensor
    attn_out_norm_b: Tensor
    w_up: Tensor
    b_up: Tensor
    w_down: Tensor
    b_down: Tensor
    out_norm: Tensor
    out_norm_b: Tensor

    def matrices(self) -> list[Tensor]:
        return [self.wq, self.wk, self.wv, self.wo, self.w_up, self.w_down]

    def vectors(self) -> list[Tensor]:
        """Biases and norm weights (kept in F32)."""
        return [self.bq, self.bk, self.bv, self.bo, self.attn_out_norm, self.attn_out_norm_b,
                self.b_up, self.b_down, self.out_norm, self.out_norm_b]  # fmt: skip


@dataclass
class EncoderWeights:
    """An encoder's tensors, unallocated until the runner places them; the same
    interface as :class:`~tensorplug_llm.model.LlamaWeights` for placing them (the input
    device holds the embeddings and their norm; there is no output layer)."""

    tok_embd: Tensor
    pos_embd: Tensor
    type_embd: Tensor | None
    tok_norm: Tensor
    tok_norm_b: Tensor
    layers: list[EncoderLayer]
    by_name: dict[Tensor, str]

    @classmethod
    def from_gguf(cls, f: GGUFFile, cfg: LlamaConfig) -> EncoderWeights:
        by_name: dict[Tensor, str] = {}
        d, ff = cfg.n_embd, cfg.n_ff
        from_meta = (
            f"from {cfg.arch.name}.embedding_length={d}, head_count={cfg.n_head}, "
            f"feed_forward_length={ff}, context_length={cfg.n_ctx_train}, vocab {cfg.n_vocab}"
        )

        def get(name: str, shape: tuple[int, ...]) -> Tensor:
            t = f.new_tensor(name, shape, from_meta)
            t.name = name
            by_name[t] = name
            return t

        type_embd = None
        if "token_types.weight" in f.tensors:
            n_types = f.tensor_info("token_types.weight").shape[0]
            type_embd = get("token_types.weight", (n_types, d))
        layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            q, kv = cfg.n_embd_q, cfg.n_embd_kv
            layer = EncoderLayer(
                wq=get(p + "attn_q.weight", (q, d)), bq=get(p + "attn_q.bias", (q,)),
                wk=get(p + "attn_k.weight", (kv, d)), bk=get(p + "attn_k.bias", (kv,)),
                wv=get(p + "attn_v.weight", (kv, d)), bv=get(p + "attn_v.bias", (kv,)),
                wo=get(p + "attn_output.weight", (d, q)), bo=get(p + "attn_output.bias", (d,)),
                attn_out_norm=get(p + "attn_output_norm.weight", (d,)),
                attn_out_norm_b=get(p + "attn_output_norm.bias", (d,)),
                w_up=get(p + "ffn_up.weight", (ff, d)), b_up=get(p + "ffn_up.bias", (ff,)),
                w_down=get(p + "ffn_down.weight", (d, ff)), b_down=get(p + "ffn_down.bias", (d,)),
                out_norm=get(p + "layer_output_norm.weight", (d,)),
                out_norm_b=get(p + "layer_output_norm.bias", (d,)),
            )  # fmt: skip
            layers.append(layer)
        return cls(
            tok_embd=get("token_embd.weight", (cfg.n_vocab, d)),
            pos_embd=get("position_embd.weight", (cfg.n_ctx_train, d)),
            type_embd=type_embd,
            tok_norm=get("token_embd_norm.weight", (d,)),
            tok_norm_b=get("token_embd_norm.bias", (d,)),
            layers=layers,
            by_name=by_name,
        )

    def input_tensors(self) -> list[Tensor]:
        extra = [self.type_embd] if self.type_embd is not None else []
        return [self.tok_embd, self.pos_embd, *extra, self.tok_norm, self.tok_norm_b]

    def output_tensors(self) -> list[Tensor]:
        return []

    def product_weights(self) -> list[Tensor]:
        return [t for layer in self.layers for t in layer.matrices()]

    def layer_tensors(self, i: int) -> list[Tensor]:
        return [*self.layers[i].vectors(), *self.layers[i].matrices()]


def build_encoder_step(
    cfg: LlamaConfig,
    w: EncoderWeights,
    cache: KVCache,
    n_tokens: int,
    n_kv: int,
    n_outputs: int,
) -> StepGraph:
    """The encoder over ``n_tokens`` tokens; ``logits`` holds the hidden states of the
    last ``n_outputs`` tokens, F32 ``(n_outputs, n_embd)``."""
    if not 0 < n_outputs <= n_tokens <= n_kv <= min(cache.n_ctx, cfg.n_ctx_train):
        raise RunError(
            f"an encoder step needs 0 < n_outputs ({n_outputs}) <= n_tokens ({n_tokens}) <= "
            f"n_kv ({n_kv}) <= the context ({min(cache.n_ctx, cfg.n_ctx_train)}: positions "
            "past the trained length have no embedding)"
        )
    T, hd = n_tokens, cfg.head_dim
    tokens = new_tensor(Type.I32, (T,), "inp_tokens").set_input()
    pos = new_tensor(Type.I32, (T,), "inp_pos").set_input()
    kv_idx = new_tensor(Type.I64, (T,), "inp_kv_idx").set_input()
    mask = new_tensor(Type.F16, (T, n_kv), "kq_mask").set_input()

    x = ops.add(ops.get_rows(w.tok_embd, tokens), ops.get_rows(w.pos_embd, pos))
    if w.type_embd is not None:  # every token is of type 0 ("sentence A"), as in llama.cpp
        x = ops.add(x, ops.view(w.type_embd, (cfg.n_embd,)))
    x = ops.layer_norm(x, w.tok_norm, w.tok_norm_b, cfg.eps).set_name("inp_norm")
    for i, L in enumerate(w.layers):
        q = ops.reshape(ops.add(ops.mul_mat(L.wq, x), L.bq), (T, cfg.n_head, hd))
        k = ops.reshape(ops.add(ops.mul_mat(L.wk, x), L.bk), (T, cfg.n_head_kv, hd))
        v = ops.add(ops.mul_mat(L.wv, x), L.bv)
        attn = attend(cfg, q, k, v, kv_idx, mask, cache.k[i], cache.v[i], n_kv, i)
        attn = ops.add(ops.mul_mat(L.wo, attn), L.bo).set_name(f"attn_out-{i}")
        x = ops.layer_norm(ops.add(attn, x), L.attn_out_norm, L.attn_out_norm_b, cfg.eps)
        up = ops.gelu(ops.add(ops.mul_mat(L.w_up, x), L.b_up))
        ffn = ops.add(ops.mul_mat(L.w_down, up), L.b_down).set_name(f"ffn_out-{i}")
        x = ops.layer_norm(ops.add(ffn, x), L.out_norm, L.out_norm_b, cfg.eps)
        x = x.set_name(f"l_out-{i}")

    out_ids = None
    if n_outputs < n_tokens:
        out_ids = new_tensor(Type.I32, (n_outputs,), "inp_out_ids").set_input()
        x = ops.get_rows(x, out_ids)
    hidden = x.set_name("result_embd").set_output()
    return StepGraph(Graph(hidden), T, n_kv, n_outputs, tokens, pos, kv_idx, mask, out_ids, hidden)

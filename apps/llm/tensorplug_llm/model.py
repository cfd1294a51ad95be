"""The llama architecture as GGUF describes it: hyper-parameters, weights, KV cache, graphs.

Everything here is description — tensors and graphs, no memory and no compute — so the
runner decides where each part lives and the scheduler runs it. The graph is
llama.cpp's ``build_llama`` in tensorplug ops:

    x = token_embd[tokens]
    for each block:
        h = rms_norm(x) * attn_norm
        q, k = rope(h @ Wqᵀ), rope(h @ Wkᵀ)         (NORMAL rope: adjacent pairs, which
        v = h @ Wvᵀ                                   is right for llama.cpp's converter)
        k, v are written into the KV cache at their positions (set_rows)
        x += attention(q, cache[:n_kv]) @ Woᵀ         (grouped-query flash attention)
        h = rms_norm(x) * ffn_norm
        x += (silu(h @ Wgateᵀ) * (h @ Wupᵀ)) @ Wdownᵀ
    logits = (rms_norm(x[out_ids]) * output_norm) @ Woutᵀ

A step graph has a fixed shape — ``n_tokens`` new tokens attending to the first
``n_kv`` cache rows through a mask — so it is built once and replayed with new inputs
(token ids, positions, cache rows, mask) for every step of that shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tensorplug import ops
from tensorplug.errors import RunError
from tensorplug.gguf import GGUFError, GGUFFile
from tensorplug.graph import Graph
from tensorplug.tensor import Tensor, new_tensor
from tensorplug.types import Type

from .arch import ARCHITECTURES, Architecture, architecture
from .kv_types import CACHE_TYPES
from .lora import ADAPTED, LoraAdapter, LoraPair
from .rope import RopeOverrides, RopeTrain, resolve, yarn_mscale

__all__ = [
    "POOLING_TYPES",
    "KVCache",
    "attend",
    "LayerWeights",
    "LlamaConfig",
    "LlamaWeights",
    "ShiftGraph",
    "StepGraph",
    "build_k_shift",
    "build_step",
    "decoder_block",
]


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters from the ``{arch}.*`` metadata keys (``llama.*``, ``gemma3.*``)."""

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int
    n_rot: int
    eps: float
    #: rope as the op receives it (``ggml_rope_ext``'s parameters), the file's settings
    #: with a context's overrides applied as llama.cpp applies them (``rope.resolve``)
    rope_base: float = 10000.0
    rope_scale: float = 1.0  # ggml's freq_scale: 1 / the scaling factor
    rope_ext_factor: float = 0.0  # 1 for YaRN: mix extrapolated and interpolated pairs
    rope_n_ctx_orig: int = 0  # YaRN's original training context (0: n_ctx_train)
    rope_beta_fast: float = 32.0  # YaRN's ramp: the correction dims' betas
    rope_beta_slow: float = 1.0
    #: the sliding-window layers' base and scale: the file's or the architecture's, never
    #: a context's overrides (llama.cpp's ``rope_freq_base_train_swa``)
    rope_base_swa: float = 10000.0
    rope_scale_swa: float = 1.0
    n_expert: int = 0  # mixture of experts (Mixtral): experts per layer, 0 for a dense FFN
    n_expert_used: int = 0  # experts each token goes through
    expert_weights_norm: bool = True  # the chosen experts' probabilities renormalised to 1
    arch: Architecture = ARCHITECTURES["llama"]
    n_swa: int = 0  # sliding window (positions a token sees, itself included); 0: none
    #: rope's magnitude (ggml's attn_factor): the file's ``rope.scaling.attn_factor``
    #: (Phi-3's LongRoPE) times llama.cpp's YaRN correction, or a context's override
    rope_attn_factor: float = 1.0
    attn_softcap: float = 0.0  # attention logits -> c·tanh(logits/c) (Gemma 2); 0: none
    final_softcap: float = 0.0  # the same on the output logits
    attn_scale: float = 0.0  # the attention logits' scale; 0: 1/sqrt(head_dim)
    #: how embeddings pool the hidden states (``{arch}.pooling_type``: llama.cpp's
    #: ``none``, ``mean``, ``cls``, ``last``); "none" when the file does not say
    pooling: str = "none"
    causal: bool = True  # tokens see only earlier positions (``{arch}.attention.causal``)
    rope: bool = True  # False: no layer ropes (Granite's ``rope.scaling.finetuned`` false)
    embd_multiplier: float = 0.0  # token embeddings times this (Granite); 0: none
    residual_scale: float = 0.0  # each block's branches times this before the add; 0: none
    logit_scale: float = 0.0  # output logits divided by this (Granite); 0: none
    #: attention in the arithmetic of ggml's flash attention kernel (llama.cpp's
    #: ``flash_attn``), not of its graph without it: a context's choice, not the file's
    flash_attn: bool = False

    def uses_rope(self, layer: int) -> bool:
        """Whether ``layer`` ropes Q and K (not SmolLM3's every fourth, llama.cpp's NoPE)."""
        period = self.arch.nope_period
        return self.rope and not (period and (layer + 1) % period == 0)

    @property
    def kq_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def is_swa(self, layer: int) -> bool:
        """Whether ``layer`` attends through the sliding window (ggml's swa pattern)."""
        period = self.arch.swa_period
        return bool(self.n_swa and period and (layer + 1) % period)

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    @classmethod
    def from_gguf(cls, f: GGUFFile, rope: RopeOverrides | None = None) -> LlamaConfig:
        """Read and check the hyper-parameters; a missing or inconsistent key is a
        :class:`~tensorplug.gguf.GGUFError` naming it. ``rope``: a context's overrides
        of the file's rope (llama-cpp-python's ``rope_*``/``yarn_*`` keywords)."""
        arch = architecture(f.architecture, str(f.path))
        a = arch.name  # the metadata keys' prefix
        n_embd = f.value(f"{a}.embedding_length", int)
        _check_counts(f, n_embd, a)
        n_head = _per_layer_constant(f, f"{a}.attention.head_count")
        n_head_kv = _per_layer_constant(f, f"{a}.attention.head_count_kv", n_head)
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise GGUFError(
                f"{f.path}: {a}.attention.head_count ({n_head}) must be a positive multiple "
                f"of {a}.attention.head_count_kv ({n_head_kv})"
            )
        head_dim = f.value(f"{a}.attention.key_length", int, n_embd // n_head)
        _check(f, f"{a}.attention.key_length", head_dim, 1 <= head_dim <= MAX_HEAD_DIM, HEAD_DIMS)
        v_dim = f.value(f"{a}.attention.value_length", int, head_dim)
        _check(f, f"{a}.attention.value_length", v_dim, 1 <= v_dim <= MAX_HEAD_DIM, HEAD_DIMS)
        if v_dim != head_dim:
            raise GGUFError(
                f"{f.path}: {a}.attention.value_length ({v_dim}) differs from key_length "
                f"({head_dim}); this runner needs them equal"
            )
        n_ff_key = f"{a}.feed_forward_length"
        if f"{a}.expert_feed_forward_length" in f and f.value(f"{a}.expert_count", int, 0):
            n_ff_key = f"{a}.expert_feed_forward_length"  # Qwen 3 MoE: the experts' size
        n_ff = _per_layer_constant(f, n_ff_key)
        _check(f, n_ff_key, n_ff, n_ff >= 1, "at least 1")
        n_rot = f.value(f"{a}.rope.dimension_count", int, head_dim)
        if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
            raise GGUFError(
                f"{f.path}: {a}.rope.dimension_count ({n_rot}) must be even and at most the "
                f"head size {head_dim}"
            )
        rope_base = f.value(f"{a}.rope.freq_base", float, 10000.0)
        _check(f, f"{a}.rope.freq_base", rope_base, _finite(rope_base) and rope_base > 0,
               "a finite number > 0 (rope's base frequency, e.g. 10000)")  # fmt: skip
        eps_key = f"{a}.attention.layer_norm_{'' if arch.encoder else 'rms_'}epsilon"
        eps = f.value(eps_key, float)
        _check(f, eps_key, eps, _finite(eps) and eps >= 0,
               "a finite number >= 0 (e.g. 1e-5)")  # fmt: skip
        pooling_id = f.value(f"{a}.pooling_type", int, 0)
        if not 0 <= pooling_id < len(POOLING_TYPES) - 1:  # rank (4): rerankers, not here
            raise GGUFError(
                f"{f.path}: {a}.pooling_type = {pooling_id}; this runner pools by 0-3 "
                f"({', '.join(POOLING_TYPES[:4])})"
            )
        scaling = f.value(f"{a}.rope.scaling.type", str, "linear")  # llama.cpp's default
        if scaling not in ("none", "linear", "yarn"):
            raise GGUFError(
                f"{f.path}: {a}.rope.scaling.type {scaling!r} is not supported (none, linear, yarn)"
            )
        factor_key = f"{a}.rope.scaling.factor"
        if factor_key not in f:
            factor_key = f"{a}.rope.scale_linear"  # the older key, as llama.cpp reads it
        factor = f.value(factor_key, float, 0.0)
        _check(f, factor_key, factor, _finite(factor) and factor >= 0,
               "a finite number >= 0 (the context's stretch, e.g. 4; 0: no scaling)")  # fmt: skip
        n_expert = f.value(f"{a}.expert_count", int, 0)
        n_expert_used = f.value(f"{a}.expert_used_count", int, 0)
        if n_expert < 0 or (n_expert and not 1 <= n_expert_used <= n_expert):
            raise GGUFError(
                f"{f.path}: {a}.expert_used_count ({n_expert_used}) must be between 1 and "
                f"{a}.expert_count ({n_expert})"
            )
        if f.value(f"{a}.expert_gating_func", int, 1) != 1:  # llama.cpp's SOFTMAX
            raise GGUFError(
                f"{f.path}: {a}.expert_gating_func is {f.get(f'{a}.expert_gating_func')}; this "
                "runner routes experts by softmax only (1)"
            )
        if a == "olmo2" and f"{a}.attention.sliding_window" in f:
            # OLMo 3 files say olmo2 and add a window this row does not apply (Phi-3 files
            # have a window too, which llama.cpp ignores, as here)
            raise GGUFError(
                f"{f.path}: {a}.attention.sliding_window is set, but this runner's '{a}' has "
                "no sliding-window layers (OLMo 3 is not supported yet)"
            )
        n_swa = 0
        if arch.swa_period:
            n_swa = f.value(f"{a}.attention.sliding_window", int, 0)
            if f"{a}.attention.sliding_window" in f:
                _check(f, f"{a}.attention.sliding_window", n_swa, n_swa >= 1,
                       "at least 1 (the positions a token sees, itself included)")  # fmt: skip
        if f.value(f"{a}.attention.temperature_scale", float, 0.0):
            raise GGUFError(
                f"{f.path}: {a}.attention.temperature_scale is set; this runner does not scale "
                "attention by position (Llama 4's temperature tuning) yet"
            )
        attn_factor = f.value(f"{a}.rope.scaling.attn_factor", float, 1.0)
        _check(f, f"{a}.rope.scaling.attn_factor", attn_factor,
               _finite(attn_factor) and attn_factor > 0, "a finite number > 0")  # fmt: skip
        caps = {"attn_logit_softcapping": 0.0, "final_logit_softcapping": 0.0}
        if arch.softcap:  # llama.cpp's defaults when the file has no key: Gemma 2's own
            for name, default in (("attn_logit_softcapping", 50.0),
                                  ("final_logit_softcapping", 30.0)):  # fmt: skip
                caps[name] = cap = f.value(f"{a}.{name}", float, default)
                _check(f, f"{a}.{name}", cap, _finite(cap) and cap > 0, "a finite number > 0")
        n_layer = f.value(f"{a}.block_count", int)
        scales = {"embedding_scale": 0.0, "residual_scale": 0.0, "logit_scale": 0.0,
                  "attention.scale": 0.0}  # fmt: skip
        if arch.scales:
            for name in scales:
                scales[name] = value = f.value(f"{a}.{name}", float, 0.0)
                _check(f, f"{a}.{name}", value, _finite(value) and value >= 0,
                       "a finite number >= 0 (0: none)")  # fmt: skip
        attn_scale = scales["attention.scale"]
        if arch.name == "gemma2" and n_layer == 46:
            # Gemma 2 27B scales by its query_pre_attn_scalar, n_embd / n_head, not the head
            # size (llama.cpp recognises the model by its 46 blocks, as here)
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        n_ctx_train = f.value(f"{a}.context_length", int)
        n_ctx_orig = f.value(f"{a}.rope.scaling.original_context_length", int, n_ctx_train)
        _check(f, f"{a}.rope.scaling.original_context_length", n_ctx_orig, n_ctx_orig >= 1,
               "at least 1")  # fmt: skip
        train = RopeTrain(
            scaling=scaling,
            freq_base=rope_base,
            freq_scale=1.0 / factor if factor else 1.0,
            attn_factor=attn_factor,
            n_ctx_orig=n_ctx_orig,
            **_yarn_keys(f, a),
        )
        params = resolve(train, rope)
        swa_base = arch.swa_rope_base
        n_tokens = f.length("tokenizer.ggml.tokens")  # not decoded: a count is all it takes
        n_vocab = f.value(
            f"{a}.vocab_size", int, n_tokens or f.tensor_info("token_embd.weight").shape[0]
        )
        return cls(
            n_vocab=n_vocab,
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_ff=n_ff,
            head_dim=head_dim,
            n_rot=n_rot,
            eps=eps,
            rope_base=params.freq_base,
            rope_scale=params.freq_scale,
            rope_ext_factor=params.ext_factor,
            rope_n_ctx_orig=params.n_ctx_orig,
            rope_beta_fast=params.beta_fast,
            rope_beta_slow=params.beta_slow,
            rope_base_swa=rope_base if swa_base is None else swa_base,
            rope_scale_swa=train.freq_scale if swa_base is None else 1.0,
            n_expert=n_expert,
            n_expert_used=n_expert_used if n_expert else 0,
            expert_weights_norm=f.value(f"{a}.expert_weights_norm", bool, True),
            arch=arch,
            n_swa=n_swa,
            rope_attn_factor=params.attn_factor,
            attn_softcap=caps["attn_logit_softcapping"],
            final_softcap=caps["final_logit_softcapping"],
            attn_scale=attn_scale,
            pooling=POOLING_TYPES[pooling_id],
            causal=f.value(f"{a}.attention.causal", bool, not arch.encoder),
            rope=f.value(f"{a}.rope.scaling.finetuned", bool, True) if arch.scales else True,
            embd_multiplier=scales["embedding_scale"],
            residual_scale=scales["residual_scale"],
            logit_scale=scales["logit_scale"],
        )


#: llama.cpp's ``llama_pooling_type`` values by number (``{arch}.pooling_type``)
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")

#: The largest head size (``attention.key_length``) accepted: real models use 64-256
#: (576 with multi-head latent attention); a size of 2^31 is a damaged file, and would
#: otherwise surface as a tensor-shape error that names no key.
MAX_HEAD_DIM = 65536
HEAD_DIMS = f"between 1 and {MAX_HEAD_DIM} (a head size; 64-256 in real models)"


def _finite(x: float) -> bool:
    return math.isfinite(x)


def _yarn_keys(f: GGUFFile, a: str) -> dict[str, float]:
    """The YaRN keys llama.cpp reads for an architecture (only Mistral 3's, of ours):
    the ramp's betas and ``yarn_log_multiplier`` (DeepSeek's ``mscale_all_dim``)."""
    if a != "mistral3":
        return {}
    keys = {"beta_fast": ("yarn_beta_fast", 32.0), "beta_slow": ("yarn_beta_slow", 1.0),
            "yarn_log_mul": ("yarn_log_multiplier", 0.0)}  # fmt: skip
    out = {}
    for setting, (name, default) in keys.items():
        key = f"{a}.rope.scaling.{name}"
        out[setting] = value = f.value(key, float, default)
        _check(f, key, value, _finite(value), "a finite number")
    return out


def _check(f: GGUFFile, key: str, value: object, ok: bool, valid: str) -> None:
    """Refuse a metadata value outside its range, naming the key, the value and the range:
    a bad value caught here is one message, where later it is a NaN in the logits or an
    op's error that does not say which key of the file caused it."""
    if not ok:
        raise GGUFError(
            f"{f.path}: {key} = {value!r}; it must be {valid}. The file is damaged or was "
            "written wrongly: convert the model again"
        )


def _check_counts(f: GGUFFile, n_embd: int, a: str) -> None:
    """Sizes that everything else is built from, checked before anything is: a block
    count of 2^31 would otherwise allocate a 2^31-entry placement before any error."""
    n_layer = f.value(f"{a}.block_count", int)
    blocks = {name.split(".")[1] for name in f.tensors if name.startswith("blk.")}
    if not 1 <= n_layer == len(blocks):
        # fewer blocks than the file holds would silently run a truncated model
        raise GGUFError(
            f"{f.path}: {a}.block_count = {n_layer}, but the file holds tensors for "
            f"{len(blocks)} blocks (blk.0 ...); it must be {len(blocks)}: the file is damaged "
            "or mislabelled"
        )
    for key, value in ((f"{a}.embedding_length", n_embd),
                       (f"{a}.context_length", f.value(f"{a}.context_length", int))):  # fmt: skip
        if value < 1:
            raise GGUFError(f"{f.path}: {key} = {value}; it must be at least 1")


def _per_layer_constant(f: GGUFFile, key: str, default: int | None = None) -> int:
    """A key that newer files may store per layer; this runner needs one value."""
    value = f.get(key, default)
    if value is None:
        return int(f.value(key, int))  # raises: missing
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise GGUFError(f"{f.path}: {key} varies per layer ({value[:8]}...); not supported")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise GGUFError(f"{f.path}: metadata key {key!r} should be int, got {value!r}")
    return value


# -- weights ---------------------------------------------------------------------------------


@dataclass
class LayerWeights:
    """One block's tensors. Q, K and V are three matrices or one fused ``wqkv``
    ``(n_embd_q + 2·n_embd_kv, n_embd)`` (Phi-3); the FFN's gate is its own matrix, or
    the first half of a fused ``w_up`` ``(2·n_ff, n_embd)`` when ``w_gate`` is None."""

    wo: Tensor
    w_up: Tensor  # (n_ff, n_embd) or fused with the gate (2·n_ff, n_embd); experts stacked
    w_down: Tensor
    attn_norm: Tensor | None = None  # pre-norms (n_embd,); OLMo 2 has none
    ffn_norm: Tensor | None = None
    wq: Tensor | None = None
    wk: Tensor | None = None
    wv: Tensor | None = None
    wqkv: Tensor | None = None
    w_gate: Tensor | None = None  # (n_ff, n_embd); with experts (n_expert, n_ff, n_embd)
    rope_freqs: Tensor | None = None
    ffn_gate_inp: Tensor | None = None  # the router, (n_expert, n_embd), for a MoE layer
    q_norm: Tensor | None = None  # RMS norm weights (head_dim,): Gemma 3, Qwen 3; OLMo 2's
    # over the whole projection, (n_embd_q,) and (n_embd_kv,)
    k_norm: Tensor | None = None
    bq: Tensor | None = None  # projection biases (n_embd_q,), (n_embd_kv,) x 2: Qwen 2
    bk: Tensor | None = None
    bv: Tensor | None = None
    post_attn_norm: Tensor | None = None  # sandwich norms (n_embd,): Gemma 3
    post_ffn_norm: Tensor | None = None
    #: LoRA adapters' pairs by the field they adapt ("wq", "w_up", ...: :mod:`.lora`)
    lora: dict[str, list[LoraPair]] = field(default_factory=dict, init=False)

    def norms(self) -> list[Tensor]:
        """The vectors of the layer: norm weights and biases (kept in F32)."""
        every = (self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm, self.post_attn_norm,
                 self.post_ffn_norm, self.bq, self.bk, self.bv)  # fmt: skip
        return [t for t in every if t is not None]


@dataclass
class LlamaWeights:
    """The model's tensors, unallocated until the runner places them.

    ``by_name`` maps each tensor to its GGUF name (a tied output reads
    ``token_embd.weight``), which is how the runner finds its bytes.
    """

    tok_embd: Tensor
    layers: list[LayerWeights]
    output_norm: Tensor
    output: Tensor
    by_name: dict[Tensor, str]
    #: LoRA adapters' pairs for the output layer (:mod:`.lora`)
    output_lora: list[LoraPair] = field(default_factory=list)

    def adaptable(self) -> set[Tensor]:
        """The weights a LoRA adapter may adapt: the blocks' attention and dense FFN
        matrices and the output layer (not a mixture of experts' stacked ones)."""
        out = {self.output}
        for L in self.layers:
            if L.ffn_gate_inp is not None:  # experts: their matrices are stacked
                names: tuple[str, ...] = ("wq", "wk", "wv", "wqkv", "wo")
                out |= {t for n in names if (t := getattr(L, n)) is not None}
            else:
                out |= {t for n in ADAPTED if (t := getattr(L, n)) is not None}
        return out

    def attach(self, adapter: LoraAdapter) -> None:
        """Apply ``adapter``'s pairs to the products of the weights they adapt."""
        by_gguf = {name: t for t, name in self.by_name.items()}
        for name, pair in adapter.pairs.items():
            w = by_gguf[name]
            if w is self.output:
                self.output_lora.append(pair)
                continue
            for L in self.layers:
                field_name = next((n for n in ADAPTED if getattr(L, n) is w), None)
                if field_name is not None:
                    L.lora.setdefault(field_name, []).append(pair)
                    break

    @classmethod
    def from_gguf(
        cls, f: GGUFFile, cfg: LlamaConfig, share_output: bool = True, n_ctx: int | None = None
    ) -> LlamaWeights:
        """Tensors with the shapes ``cfg`` implies, checked against the file.

        Without ``output.weight`` the output layer is tied to the token embeddings:
        the same tensor when ``share_output``, else a second tensor over the same bytes
        (so that input and output layers can live on different devices). A file with
        LongRoPE's two sets of rope factors (Phi-3 128k) gets the long ones when the
        context ``n_ctx`` exceeds the original one, the short ones otherwise, as llama.cpp
        chooses them.
        """
        by_name: dict[Tensor, str] = {}
        d, q, kv, ff = cfg.n_embd, cfg.n_embd_q, cfg.n_embd_kv, cfg.n_ff
        from_meta = (
            f"from {cfg.arch.name}.embedding_length={d}, head_count={cfg.n_head}, "
            f"head_count_kv={cfg.n_head_kv}, feed_forward_length={ff}, vocab {cfg.n_vocab}"
        )

        def get(name: str, shape: tuple[int, ...], label: str | None = None) -> Tensor:
            t = f.new_tensor(name, shape, from_meta)
            t.name = label or name
            by_name[t] = name
            return t

        freqs = _rope_factors_name(f, cfg, n_ctx)
        if freqs is not None:
            _check_rope_freqs(f, freqs)
        E = cfg.n_expert
        layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            ffn: dict[str, Tensor] = (
                {
                    "w_gate": get(p + "ffn_gate_exps.weight", (E, ff, d)),
                    "w_up": get(p + "ffn_up_exps.weight", (E, ff, d)),
                    "w_down": get(p + "ffn_down_exps.weight", (E, d, ff)),
                    "ffn_gate_inp": get(p + "ffn_gate_inp.weight", (E, d)),
                }
                if E
                else {
                    "w_up": get(p + "ffn_up.weight", (2 * ff, d)),
                    "w_down": get(p + "ffn_down.weight", (d, ff)),
                }
                if cfg.arch.fused
                else {
                    "w_gate": get(p + "ffn_gate.weight", (ff, d)),
                    "w_up": get(p + "ffn_up.weight", (ff, d)),
                    "w_down": get(p + "ffn_down.weight", (d, ff)),
                }
            )
            arch = cfg.arch
            qkv: dict[str, Tensor] = (
                {"wqkv": get(p + "attn_qkv.weight", (q + 2 * kv, d))}
                if arch.fused
                else {
                    "wq": get(p + "attn_q.weight", (q, d)),
                    "wk": get(p + "attn_k.weight", (kv, d)),
                    "wv": get(p + "attn_v.weight", (kv, d)),
                }
            )
            norms: dict[str, Tensor] = {}
            if arch.pre_norms:
                norms["attn_norm"] = get(p + "attn_norm.weight", (d,))
                norms["ffn_norm"] = get(p + "ffn_norm.weight", (d,))
            if arch.qk_norm:
                full = arch.qk_norm_full
                norms["q_norm"] = get(p + "attn_q_norm.weight", (q if full else cfg.head_dim,))
                norms["k_norm"] = get(p + "attn_k_norm.weight", (kv if full else cfg.head_dim,))
            if arch.qkv_bias:
                norms["bq"] = get(p + "attn_q.bias", (q,))
                norms["bk"] = get(p + "attn_k.bias", (kv,))
                norms["bv"] = get(p + "attn_v.bias", (kv,))
            if arch.post_norms:
                norms["post_attn_norm"] = get(p + "post_attention_norm.weight", (d,))
                norms["post_ffn_norm"] = get(p + "post_ffw_norm.weight", (d,))
            layers.append(
                LayerWeights(
                    **norms,
                    **qkv,
                    wo=get(p + "attn_output.weight", (d, q)),
                    **ffn,
                    rope_freqs=(
                        get(freqs, (cfg.n_rot // 2,), f"{p}rope_freqs")
                        if freqs is not None
                        else None
                    ),
                )
            )
        tok_embd = get("token_embd.weight", (cfg.n_vocab, d))
        if "output.weight" in f.tensors:
            output = get("output.weight", (cfg.n_vocab, d))
        elif share_output:
            output = tok_embd
        else:
            output = get("token_embd.weight", (cfg.n_vocab, d), "output.weight (tied)")
        for t in (tok_embd, output, *[w for layer in layers for w in _matrices(layer)]):
            _check_weight_type(f, by_name[t], t)
        return cls(tok_embd, layers, get("output_norm.weight", (d,)), output, by_name)

    def input_tensors(self) -> list[Tensor]:
        """The tensors of the input layer's device: the token embeddings."""
        return [self.tok_embd]

    def output_tensors(self) -> list[Tensor]:
        """The tensors of the output layer's device: its norm and matrix."""
        return [self.output_norm, self.output]

    def product_weights(self) -> list[Tensor]:
        """The tensors that only matrix products read, as their weights: every layer's
        matrices and router, and the output layer unless it is the token embeddings
        (which ``get_rows`` reads). A device's extra buffer types may hold these."""
        routers = [layer.ffn_gate_inp for layer in self.layers if layer.ffn_gate_inp is not None]
        matrices = [t for layer in self.layers for t in _matrices(layer)]
        output = [] if self.output is self.tok_embd else [self.output]
        return [*matrices, *routers, *output]

    def layer_tensors(self, i: int) -> list[Tensor]:
        layer = self.layers[i]
        extra = [t for t in (layer.rope_freqs, layer.ffn_gate_inp) if t is not None]
        return [*layer.norms(), *_matrices(layer), *extra]


def _rope_factors_name(f: GGUFFile, cfg: LlamaConfig, n_ctx: int | None) -> str | None:
    """The tensor of rope's per-pair frequency divisors, if the file has one: Llama 3.1's
    ``rope_freqs``, else LongRoPE's long factors beyond the original context and its
    short ones within it (llama.cpp's ``get_rope_factors``)."""
    if "rope_freqs.weight" in f.tensors:
        return "rope_freqs.weight"
    n_ctx_orig = cfg.rope_n_ctx_orig or cfg.n_ctx_train
    name = "rope_factors_long.weight" if (n_ctx or 0) > n_ctx_orig else "rope_factors_short.weight"
    return name if name in f.tensors else None


def _check_rope_freqs(f: GGUFFile, name: str) -> None:
    """Rope divides each pair's frequency by its factor: a zero gave a ZeroDivisionError
    deep in a kernel, a NaN or a negative factor silently wrong positions."""
    info = f.tensor_info(name)
    if info.type is not Type.F32:
        return  # rope refuses other types itself, naming them
    values = f.read_tensor(info.name).view(np.float32)
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise GGUFError(
            f"{f.path}: tensor {name!r} holds {float(values[i])!r} at index {i}; "
            "it must hold finite numbers > 0 (each pair's rope frequency divisor). The file is "
            "damaged: convert the model again"
        )


def _matrices(layer: LayerWeights) -> list[Tensor]:
    every = (layer.wq, layer.wk, layer.wv, layer.wqkv, layer.wo, layer.w_gate, layer.w_up,
             layer.w_down)  # fmt: skip
    return [t for t in every if t is not None]


def _check_weight_type(f: GGUFFile, name: str, t: Tensor) -> None:
    if t.type.is_integer:
        raise GGUFError(
            f"{f.path}: weight {name!r} is {t.type.name}; expected a float or quantized type"
        )


# -- KV cache ---------------------------------------------------------------------------------


@dataclass
class KVCache:
    """Per block, K and V rows ``(n_ctx, n_embd_kv)``; row ``p`` holds position ``p``.

    K and V each have their type (llama.cpp's ``type_k`` and ``type_v``): a float, or a
    quantized type whose blocks a row stores head after head, written as each step's
    rows are quantized and read by flash attention decoded (ggml's way)."""

    n_ctx: int
    type_k: Type
    type_v: Type
    k: list[Tensor]
    v: list[Tensor]

    @classmethod
    def describe(
        cls, cfg: LlamaConfig, n_ctx: int, type_k: Type = Type.F16, type_v: Type | None = None
    ) -> KVCache:
        type_v = type_k if type_v is None else type_v
        for name, t in (("K", type_k), ("V", type_v)):
            if t not in CACHE_TYPES:
                raise RunError(
                    f"the KV cache's {name} type cannot be {t.name}: it is one of "
                    f"{', '.join(c.name.lower() for c in CACHE_TYPES)}"
                )
            if t.is_quantized and cfg.head_dim % t.block_size:
                raise RunError(
                    f"a {t.name} KV cache needs heads of a multiple of {t.block_size} "
                    f"values; this model's have {cfg.head_dim}: use f16"
                )
        shape = (n_ctx, cfg.n_embd_kv)
        k = [new_tensor(type_k, shape, f"cache_k_l{i}") for i in range(cfg.n_layer)]
        v = [new_tensor(type_v, shape, f"cache_v_l{i}") for i in range(cfg.n_layer)]
        return cls(n_ctx, type_k, type_v, k, v)

    def layer_tensors(self, i: int) -> list[Tensor]:
        return [self.k[i], self.v[i]]

    @property
    def type_names(self) -> str:
        """``f16``, or ``q8_0/f16`` when K and V are kept apart (K's first)."""
        k, v = self.type_k.name.lower(), self.type_v.name.lower()
        return k if k == v else f"{k}/{v}"

    @property
    def bytes_per_cell(self) -> int:
        """What one cell (a position's K and V rows in every block) takes."""
        return sum(t.nbytes for t in (*self.k, *self.v)) // self.n_ctx


def kv_rotation(t: Type, head_dim: int, widest: bool) -> int:
    """The size of llama.cpp's Walsh–Hadamard rotation of a cache's rows kept in ``t``
    (0: none): a quantized cache of heads of a multiple of 64 values is rotated, which
    spreads a head's outliers over its blocks before they are quantized. K's rotation is
    the widest power of two dividing the head, V's is 64 (llama.cpp measured smaller
    ones better for V)."""
    if not t.is_quantized or head_dim % 64:
        return 0
    n = 64
    while widest and head_dim % (2 * n) == 0:
        n *= 2
    return n


# -- step graphs --------------------------------------------------------------------------------


@dataclass
class StepGraph:
    """One step's graph and the inputs to set before each compute.

    ``tokens`` I32 ``(n_tokens,)``, ``pos`` I32 ``(n_tokens,)``, ``kv_idx`` I64
    ``(n_tokens,)`` (the cache rows written), ``mask`` F16 ``(n_tokens, n_kv)`` (0 where
    a token may attend, -inf elsewhere), ``out_ids`` I32 ``(n_outputs,)`` (which tokens
    get logits; None when all do). ``logits`` is F32 ``(n_outputs, n_vocab)``.
    """

    graph: Graph
    n_tokens: int
    n_kv: int
    n_outputs: int
    tokens: Tensor
    pos: Tensor
    kv_idx: Tensor
    mask: Tensor
    out_ids: Tensor | None
    logits: Tensor
    #: the sliding-window layers' mask (as ``mask``, and -inf ``n_swa`` or more
    #: positions back) when some layers have a window and some do not; None otherwise
    mask_swa: Tensor | None = None
    #: the window ``mask`` itself applies (every layer has one); 0: plain causal
    mask_window: int = 0
    #: I32 ``(n_kv,)``: the cache rows sorted by position, the order attention sums a
    #: row's cells in (so a sequence's bits do not depend on where its cells lie)
    kv_order: Tensor | None = None


def _rope(
    cfg: LlamaConfig, x: Tensor, pos: Tensor, layer: LayerWeights, swa: bool, shift: bool = False
) -> Tensor:
    """The architecture's rope (llama: NORMAL, as llama.cpp's converter permutes Q/K rows
    so adjacent pairs rotate) with the config's parameters; sliding-window layers take
    their own base and scale (Gemma 3's fixed base, Gemma 2's file's) and the rest as the
    other layers, as llama.cpp's graphs do.

    ``shift``: rotate already-roped rows by ``pos`` more (a K-shift). The rows already
    carry the magnitude the rope gave them, so a shift divides out the magnitude ggml's
    rope applies on its own (YaRN's ``1 + 0.1 ln(1/freq_scale)``) and only rotates."""
    base, scale = cfg.rope_base, cfg.rope_scale
    if swa:
        base, scale = cfg.rope_base_swa, cfg.rope_scale_swa
    attn_factor = cfg.rope_attn_factor
    if shift:
        attn_factor = 1.0 / yarn_mscale(scale, cfg.rope_ext_factor)
    return ops.rope(
        x, pos, cfg.n_rot, cfg.arch.rope_mode, freq_base=base, freq_scale=scale,
        ext_factor=cfg.rope_ext_factor, attn_factor=attn_factor,
        beta_fast=cfg.rope_beta_fast, beta_slow=cfg.rope_beta_slow,
        n_ctx_orig=cfg.rope_n_ctx_orig or cfg.n_ctx_train,
        freq_factors=None if swa else layer.rope_freqs,
    )  # fmt: skip


def _normed(cfg: LlamaConfig, x: Tensor, weight: Tensor | None) -> Tensor:
    """``rms_norm(x) · weight`` (per head when ``x`` is (T, heads, head_dim)); ``x``
    itself without a weight."""
    return x if weight is None else ops.mul(ops.rms_norm(x, cfg.eps), weight)


def _pre_normed(cfg: LlamaConfig, x: Tensor, weight: Tensor | None, name: str) -> Tensor:
    """A branch's input: the residual stream RMS-normed (named ``name``), or the stream
    itself where the architecture has no pre-norm (OLMo 2)."""
    return x if weight is None else _normed(cfg, x, weight).set_name(name)


def _biased(x: Tensor, bias: Tensor | None) -> Tensor:
    """``x + bias`` (a projection's bias, broadcast over tokens); ``x`` without one."""
    return x if bias is None else ops.add(x, bias)


def _adapted(w: Tensor, x: Tensor, pairs: list[LoraPair]) -> Tensor:
    """``w·x``, plus each LoRA pair's ``scale·B·(A·x)`` (llama.cpp's ``build_lora_mm``)."""
    out = ops.mul_mat(w, x)
    for pair in pairs:
        out = ops.add(out, ops.scale(ops.mul_mat(pair.b, ops.mul_mat(pair.a, x)), pair.scale))
    return out


def _product(L: LayerWeights, name: str, x: Tensor) -> Tensor:
    """The block's product by its weight ``name`` ("wq", "w_up", ...), LoRA applied."""
    w = getattr(L, name)
    assert w is not None
    return _adapted(w, x, L.lora.get(name, []))


def _qkv(cfg: LlamaConfig, L: LayerWeights, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The Q, K and V projections (T, n_embd_q) and (T, n_embd_kv) x 2, with their biases:
    three products, or one fused product whose rows are cut into the three by views
    (contiguous copies: rope and the cache writes read whole rows)."""
    if L.wqkv is None:
        assert L.wq is not None and L.wk is not None and L.wv is not None
        q = _biased(_product(L, "wq", h), L.bq)
        k = _biased(_product(L, "wk", h), L.bk)
        return q, k, _biased(_product(L, "wv", h), L.bv)
    qkv = _product(L, "wqkv", h)  # (T, n_embd_q + 2·n_embd_kv), F32
    row, f32 = qkv.strides[0], qkv.type.type_size
    q_end, k_end = cfg.n_embd_q, cfg.n_embd_q + cfg.n_embd_kv
    cut = [(0, q_end), (q_end, k_end), (k_end, k_end + cfg.n_embd_kv)]
    q, k, v = (ops.cont(ops.view(qkv, (qkv.shape[0], b - a), (row, f32), a * f32)) for a, b in cut)
    return q, k, v


def _dense_ffn(cfg: LlamaConfig, L: LayerWeights, h: Tensor, i: int) -> Tensor:
    """The gated FFN: ``act(h·gateᵀ)·(h·upᵀ)`` then down; with a fused gate-up matrix the
    gate is the first half of one product's rows (ggml's split GLU, as Phi-3's)."""
    glu = ops.geglu if cfg.arch.ffn == "geglu" else ops.swiglu
    up = _product(L, "w_up", h).set_name(f"ffn_up-{i}")  # llama.cpp's names, for dumps
    gate = None if L.w_gate is None else _product(L, "w_gate", h).set_name(f"ffn_gate-{i}")
    g = glu(up) if gate is None else glu(gate, up)
    return _product(L, "w_down", g.set_name(f"ffn_glu-{i}")).set_name(f"ffn_out-{i}")


def _moe_ffn(cfg: LlamaConfig, L: LayerWeights, h: Tensor, T: int, i: int) -> Tensor:
    """A mixture of experts as llama.cpp's ``build_moe_ffn`` with softmax gating (Mixtral,
    Qwen 3 MoE): softmax over the router's logits, the ``n_expert_used`` most probable
    experts (ggml's top-k: argsort then a view), their probabilities renormalised to sum
    to 1 (unless the file's ``expert_weights_norm`` says not to), each chosen expert's
    SwiGLU FFN (``mul_mat_id``), and the weighted sum of their outputs."""
    assert L.ffn_gate_inp is not None and L.w_gate is not None
    E, k = cfg.n_expert, cfg.n_expert_used
    probs = ops.soft_max(ops.mul_mat(L.ffn_gate_inp, h)).set_name(f"ffn_moe_probs-{i}")
    chosen = ops.argsort_top_k(probs, k).set_name(f"ffn_moe_topk-{i}")  # (T, k)
    weights = ops.get_rows(ops.reshape(probs, (T, E, 1)), chosen)  # (T, k, 1)
    if cfg.expert_weights_norm:
        total = ops.sum_rows(ops.reshape(weights, (T, k)))  # (T, 1)
        weights = ops.div(weights, ops.reshape(total, (T, 1, 1)))
    weights = weights.set_name(f"ffn_moe_w-{i}")
    rows = ops.reshape(h, (T, 1, cfg.n_embd))  # every chosen expert reads the token's row
    gate = ops.mul_mat_id(L.w_gate, rows, chosen)  # (T, k, n_ff)
    up = ops.mul_mat_id(L.w_up, rows, chosen)
    experts = ops.mul_mat_id(L.w_down, ops.swiglu(gate, up), chosen)  # (T, k, n_embd)
    experts = ops.mul(experts, weights).set_name(f"ffn_moe_weighted-{i}")
    # sum over the k experts: rows of (T, n_embd, k)
    summed = ops.sum_rows(ops.cont(ops.permute(experts, (0, 2, 1))))
    return ops.reshape(summed, (T, cfg.n_embd)).set_name(f"ffn_out-{i}")


def attend(
    cfg: LlamaConfig,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_idx: Tensor,
    mask: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    n_kv: int,
    i: int = 0,
    order: Tensor | None = None,
) -> Tensor:
    """Attention of this step's queries ``q`` (T, n_head, head_dim) over the cache: ``k``
    (T, n_head_kv, head_dim) and ``v`` (T, n_embd_kv) written at rows ``kv_idx``, rows
    ``[0, n_kv)`` read under ``mask`` (grouped-query flash attention, with the
    architecture's scale and soft-cap), their terms summed in ``order`` (the rows by
    position) when given. Returns (T, n_embd_q), before the output projection. Decoders
    and encoders alike attend here; only their masks differ. A quantized cache's rows
    are rotated as llama.cpp rotates them (:func:`kv_rotation`): Q and K by K's rotation,
    V by V's, and the output rotated back."""
    T, hd = q.shape[0], cfg.head_dim
    rot_k = kv_rotation(k_cache.type, hd, widest=True)
    rot_v = kv_rotation(v_cache.type, hd, widest=False)
    if rot_k:  # scores unchanged (the rotation is orthonormal), K quantized rotated
        q, k = ops.hadamard(q, rot_k), ops.hadamard(k, rot_k)
    if rot_v:
        v = ops.hadamard(v, rot_v)
    v = v.set_name(f"Vcur-{i}")
    k_all = ops.set_rows(k_cache, ops.reshape(k.set_name(f"Kcur-{i}"), (T, cfg.n_embd_kv)), kv_idx)
    v_all = ops.set_rows(v_cache, v, kv_idx)
    kv_shape = (n_kv, cfg.n_head_kv, hd)
    K = ops.permute(ops.view(k_all.set_name(f"k_store-{i}"), kv_shape), (1, 0, 2))
    V = ops.permute(ops.view(v_all.set_name(f"v_store-{i}"), kv_shape), (1, 0, 2))
    Q = ops.permute(q.set_name(f"Qcur-{i}"), (1, 0, 2))
    attn = ops.flash_attn_ext(
        Q,
        K,
        V,
        mask,
        scale=cfg.kq_scale,
        logit_softcap=cfg.attn_softcap,
        order=order,
        online=cfg.flash_attn,
    ).set_name(f"attn-{i}")
    out = ops.reshape(attn, (T, cfg.n_embd_q))
    return ops.hadamard(out, rot_v) if rot_v else out  # V's rotation undone


def decoder_block(
    cfg: LlamaConfig,
    L: LayerWeights,
    x: Tensor,
    pos: Tensor,
    kv_idx: Tensor,
    mask: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    n_kv: int,
    i: int = 0,
    order: Tensor | None = None,
) -> Tensor:
    """One decoder block of ``cfg.arch`` over the tokens ``x`` (T, n_embd): attention
    through the KV cache (this step's K and V written at rows ``kv_idx``, rows
    ``[0, n_kv)`` read under ``mask``, summed in ``order``), then the FFN, each around a
    residual. The architecture's switches (biases, Q/K norms, rope, sandwich norms, GLU,
    experts) decide the details; every model, and the demo's single block, is built
    here."""
    T, hd = x.shape[0], cfg.head_dim
    swa = cfg.is_swa(i)
    h = _pre_normed(cfg, x, L.attn_norm, f"attn_norm-{i}")
    q, k, v = _qkv(cfg, L, h)
    if cfg.arch.qk_norm_full:  # OLMo 2: over the whole projection, then into heads
        q, k = _normed(cfg, q, L.q_norm), _normed(cfg, k, L.k_norm)
        q, k = ops.reshape(q, (T, cfg.n_head, hd)), ops.reshape(k, (T, cfg.n_head_kv, hd))
    else:
        q = _normed(cfg, ops.reshape(q, (T, cfg.n_head, hd)), L.q_norm)
        k = _normed(cfg, ops.reshape(k, (T, cfg.n_head_kv, hd)), L.k_norm)
    if cfg.uses_rope(i):
        q, k = _rope(cfg, q, pos, L, swa), _rope(cfg, k, pos, L, swa)
    attn = attend(cfg, q, k, v, kv_idx, mask, k_cache, v_cache, n_kv, i, order)
    attn = _product(L, "wo", attn).set_name(f"attn_out-{i}")
    x = ops.add(x, _branch(cfg, attn, L.post_attn_norm)).set_name(f"ffn_inp-{i}")
    h = _pre_normed(cfg, x, L.ffn_norm, f"ffn_norm-{i}")
    ffn = _moe_ffn(cfg, L, h, T, i) if L.ffn_gate_inp is not None else _dense_ffn(cfg, L, h, i)
    return ops.add(x, _branch(cfg, ffn, L.post_ffn_norm)).set_name(f"l_out-{i}")


def _branch(cfg: LlamaConfig, out: Tensor, norm: Tensor | None) -> Tensor:
    """A block branch's output as it joins the residual: normed again (sandwich norms)
    and scaled (Granite's residual multiplier) where the architecture says so."""
    out = _normed(cfg, out, norm)
    return ops.scale(out, cfg.residual_scale) if cfg.residual_scale else out


def build_step(
    cfg: LlamaConfig,
    w: LlamaWeights,
    cache: KVCache,
    n_tokens: int,
    n_kv: int,
    n_outputs: int,
    embeddings: bool = False,
) -> StepGraph:
    """The forward pass of ``n_tokens`` tokens over cache rows ``[0, n_kv)``.

    With ``embeddings`` the graph ends at the normed hidden states (llama.cpp's
    ``t_embd``, ``result_norm``), F32 ``(n_outputs, n_embd)`` in ``logits``' place,
    and the output layer is not computed."""
    if not 0 < n_outputs <= n_tokens:
        raise RunError(f"n_outputs must be in 1..n_tokens={n_tokens}, got {n_outputs}")
    if not n_tokens <= n_kv <= cache.n_ctx:
        raise RunError(f"need n_tokens ({n_tokens}) <= n_kv ({n_kv}) <= n_ctx ({cache.n_ctx})")
    T = n_tokens
    tokens = new_tensor(Type.I32, (T,), "inp_tokens").set_input()
    pos = new_tensor(Type.I32, (T,), "inp_pos").set_input()
    kv_idx = new_tensor(Type.I64, (T,), "inp_kv_idx").set_input()
    # one mask input per kind of layer present (an input no node reads gets no memory)
    swa_layers = sum(cfg.is_swa(i) for i in range(cfg.n_layer))
    mask_window = cfg.n_swa if swa_layers == cfg.n_layer else 0
    mask = new_tensor(Type.F16, (T, n_kv), "kq_mask_swa" if mask_window else "kq_mask").set_input()
    mask_swa = None
    if 0 < swa_layers < cfg.n_layer:
        mask_swa = new_tensor(Type.F16, (T, n_kv), "kq_mask_swa").set_input()
    kv_order = new_tensor(Type.I32, (n_kv,), "inp_kv_order").set_input()
    arch = cfg.arch

    x = ops.get_rows(w.tok_embd, tokens).set_name("inp_embd")
    if arch.embd_scale or cfg.embd_multiplier:
        factor = cfg.embd_multiplier or math.sqrt(cfg.n_embd)
        x = ops.scale(x, factor).set_name("inp_scaled")
    for i, L in enumerate(w.layers):
        swa = cfg.is_swa(i)
        layer_mask = mask_swa if swa and mask_swa is not None else mask
        x = decoder_block(cfg, L, x, pos, kv_idx, layer_mask, cache.k[i], cache.v[i], n_kv, i,
                          kv_order)  # fmt: skip

    out_ids = None
    if n_outputs < n_tokens:
        out_ids = new_tensor(Type.I32, (n_outputs,), "inp_out_ids").set_input()
        x = ops.get_rows(x, out_ids).set_name("out_rows")
    x = ops.mul(ops.rms_norm(x, cfg.eps), w.output_norm).set_name("result_norm")
    if embeddings:
        logits = x.set_output()
    else:
        logits = _adapted(w.output, x, w.output_lora)
        if cfg.final_softcap:  # Gemma 2: c·tanh(logits / c)
            c = cfg.final_softcap
            logits = ops.scale(ops.tanh(ops.scale(logits, 1.0 / c)), c)
        if cfg.logit_scale:  # Granite
            logits = ops.scale(logits, 1.0 / cfg.logit_scale)
        logits = logits.set_name("result_output").set_output()
    return StepGraph(
        Graph(logits), T, n_kv, n_outputs, tokens, pos, kv_idx, mask, out_ids, logits, mask_swa,
        mask_window, kv_order,
    )  # fmt: skip


@dataclass
class ShiftGraph:
    """Re-roping K cache rows after their positions moved (llama.cpp's K-shift): inputs
    ``cells`` I32 ``(n,)`` (the rows) and ``delta`` I32 ``(n,)`` (by how many
    positions each moved). V rows carry no position and stay."""

    graph: Graph
    cells: Tensor
    delta: Tensor


def build_k_shift(cfg: LlamaConfig, w: LlamaWeights, cache: KVCache, n: int) -> ShiftGraph:
    """Rotate ``n`` K rows of every block by their ``delta``: read the rows (F32), rope
    them by the delta (rotations compose: rope(rope(k, p), d) = rope(k, p + d) up to
    rounding) and write them back where they were."""
    cells = new_tensor(Type.I32, (n,), "shift_cells").set_input()
    delta = new_tensor(Type.I32, (n,), "shift_delta").set_input()
    outs = []
    for i, L in enumerate(w.layers):
        if not cfg.uses_rope(i):  # SmolLM3's NoPE blocks: their keys carry no position
            continue
        rows = ops.reshape(ops.get_rows(cache.k[i], cells), (n, cfg.n_head_kv, cfg.head_dim))
        rot = kv_rotation(cache.type_k, cfg.head_dim, widest=True)
        if rot:  # the rows as roped (the rotation is its own inverse), then rotated again
            rows = ops.hadamard(rows, rot)
        roped = _rope(cfg, rows, delta, L, cfg.is_swa(i), shift=True)
        if rot:
            roped = ops.hadamard(roped, rot)
        outs.append(ops.set_rows(cache.k[i], ops.reshape(roped, (n, cfg.n_embd_kv)), cells))
    return ShiftGraph(Graph(outs), cells, delta)

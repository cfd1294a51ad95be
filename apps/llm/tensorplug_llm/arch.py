"""The architectures the runner builds, as a table over one block builder.

A decoder-only transformer of the llama family differs from its relatives in a few
switches, each a fact of llama.cpp's graph for that architecture (``src/models/``):
how rope pairs dimensions, which gated FFN it uses, whether the Q/K/V projections have
biases, whether Q and K are RMS-normed per head, whether attention and FFN outputs
are normed again before the residual ("sandwich" norms), whether embeddings are
scaled, and which layers attend through a sliding window with their own rope base.
``model.build_step`` reads these switches; adding an architecture means adding a row
here once its graph is only these switches.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorplug.opcodes import RopeMode

__all__ = ["ARCHITECTURES", "Architecture", "architecture"]


@dataclass(frozen=True)
class Architecture:
    name: str
    #: rope on adjacent pairs (llama.cpp's converter permutes llama's Q/K for it) or on
    #: the two halves of each head (NEOX: Gemma, Qwen)
    rope_mode: RopeMode = RopeMode.NORMAL
    #: gated FFN: silu(gate)·up (SwiGLU) or gelu_tanh(gate)·up (GeGLU)
    ffn: str = "swiglu"
    #: biases added to the Q, K and V projections (attn_q.bias ...: Qwen 2)
    qkv_bias: bool = False
    #: per-head RMS norm of Q and K before rope (attn_q_norm / attn_k_norm)
    qk_norm: bool = False
    #: the Q and K norms over the whole projection, not per head (OLMo 2)
    qk_norm_full: bool = False
    #: RMS norms before attention and FFN (attn_norm / ffn_norm); OLMo 2 has only the
    #: post-norms
    pre_norms: bool = True
    #: RMS norms of the attention and FFN outputs before the residual add
    post_norms: bool = False
    #: token embeddings multiplied by sqrt(n_embd)
    embd_scale: bool = False
    #: every ``swa_period``-th layer attends globally, the others through the window
    #: ``{arch}.attention.sliding_window`` (0: no sliding window)
    swa_period: int = 0
    #: rope base of the sliding-window layers (not in Gemma 3's files: its config's
    #: rope_local_base_freq, fixed in llama.cpp); None: the file's own base (Gemma 2)
    swa_rope_base: float | None = 10000.0
    #: Q, K and V as one product (``attn_qkv``) and the FFN's gate and up halves as one
    #: (``ffn_up`` of 2·n_ff rows, no ``ffn_gate``): Phi-3
    fused: bool = False
    #: tanh soft-capping of the attention logits and of the output logits, by the caps
    #: ``{arch}.attn_logit_softcapping`` and ``{arch}.final_logit_softcapping``: Gemma 2
    softcap: bool = False
    #: a bidirectional encoder of the BERT family (``encoder.py``): absolute position and
    #: token-type embeddings, post-LayerNorm blocks with biases, a GELU FFN, no causal
    #: mask and no output layer; it gives embeddings, not next-token logits
    encoder: bool = False
    #: every ``nope_period``-th layer attends without rope (SmolLM3's NoPE layers)
    nope_period: int = 0
    #: Granite's multipliers from the file: ``{arch}.embedding_scale`` on the embeddings,
    #: ``residual_scale`` on each branch before its residual add, ``attention.scale`` on
    #: the attention logits and 1/``logit_scale`` on the output logits
    scales: bool = False
    models: str = ""


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", models="Llama 1-3, Mistral, TinyLlama, SmolLM2, Mixtral"),
    "qwen2": Architecture(
        "qwen2", rope_mode=RopeMode.NEOX, qkv_bias=True, models="Qwen 2, Qwen 2.5 (dense)"
    ),
    "qwen3": Architecture("qwen3", rope_mode=RopeMode.NEOX, qk_norm=True, models="Qwen 3 (dense)"),
    "gemma3": Architecture(
        "gemma3",
        rope_mode=RopeMode.NEOX,
        ffn="geglu",
        qk_norm=True,
        post_norms=True,
        embd_scale=True,
        swa_period=6,
        models="Gemma 3 (text)",
    ),
    "phi3": Architecture(
        "phi3", rope_mode=RopeMode.NEOX, fused=True, models="Phi-3, Phi-3.5, Phi-4"
    ),
    "gemma2": Architecture(
        "gemma2",
        rope_mode=RopeMode.NEOX,
        ffn="geglu",
        post_norms=True,
        embd_scale=True,
        swa_period=2,
        swa_rope_base=None,
        softcap=True,
        models="Gemma 2",
    ),
    "qwen3moe": Architecture(
        "qwen3moe", rope_mode=RopeMode.NEOX, qk_norm=True, models="Qwen 3 MoE (30B-A3B ...)"
    ),
    "smollm3": Architecture("smollm3", nope_period=4, models="SmolLM3"),
    "granite": Architecture("granite", scales=True, models="Granite 3 (dense)"),
    "olmo2": Architecture(
        "olmo2",
        rope_mode=RopeMode.NEOX,
        qk_norm=True,
        qk_norm_full=True,
        pre_norms=False,
        post_norms=True,
        models="OLMo 2",
    ),
    # llama's block; its YaRN is llama's too in llama.cpp 0.3.36 (later versions cancel
    # YaRN's magnitude factor; the recorded test would show a change)
    "mistral3": Architecture("mistral3", models="Mistral 3 / Ministral 3 (text)"),
    "bert": Architecture(
        "bert", encoder=True, models="BERT encoders for embeddings (all-MiniLM, bge, e5 ...)"
    ),
}


def architecture(name: str, where: str) -> Architecture:
    """The row for ``general.architecture`` = ``name``, or an error naming the ones
    there are (``where``: the file, for the message)."""
    arch = ARCHITECTURES.get(name)
    if arch is None:
        known = "; ".join(f"'{a.name}' ({a.models})" for a in ARCHITECTURES.values())
        from tensorplug.gguf import GGUFError

        raise GGUFError(
            f"{where}: general.architecture is {name!r}, which this runner does not implement; "
            f"it runs {known}"
        )
    return arch

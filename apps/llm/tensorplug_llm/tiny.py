"""Random-weight llama models written as real GGUF files, for demos, tests and benchmarks.

:func:`write_tiny_llama` writes what llama.cpp's converter would write for a llama
model — the ``llama.*`` hyper-parameters, a SentencePiece vocabulary and the weight
tensors under their GGUF names — with the ``gguf`` package's writer, so everything
downstream (reader, loader, tokenizer, graphs) runs exactly as for a downloaded model.
The weights are seeded random numbers: the text is gibberish, the arithmetic is real.

The master weights depend only on ``seed`` and the dimensions, never on the storage
type, so an F32 and a Q4_0 file written with the same seed hold the same model up to
quantization error.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tensorplug.quants import quantize
from tensorplug.types import Type

from .tokenizer import SPACE, TokenType

__all__ = ["TINY_ARCHITECTURES", "TINY_DIMS", "TINY_WORDS", "tiny_vocab", "write_tiny_llama"]

#: The architectures :func:`write_tiny_llama` writes.
TINY_ARCHITECTURES = (
    "llama", "gemma2", "gemma3", "granite", "mistral3", "olmo2", "phi3", "qwen2", "qwen3",
    "qwen3moe", "smollm3",
)  # fmt: skip

#: The default tiny model: small enough for tests, shaped like a real llama (GQA, SwiGLU).
TINY_DIMS: dict[str, int] = {
    "n_vocab": 320,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_head_kv": 2,
    "n_ff": 128,
    "n_ctx": 256,
    "n_expert": 0,  # > 0: a Mixtral-style mixture of experts in every layer
    "n_expert_used": 0,
    "head_dim": 0,  # > 0: each head's size (attention.key_length); 0: n_embd / n_head
}

TINY_WORDS = """
the of and to in is that it for was on are as with be at by this had not but from or have an
they which one you were all we her she there would their will when who him been has more if
no out so said what up its about into than them can only other new some time could these two
may first then do any like my now over such our man me even most made after also did many
before must through back years where much your way well down should because each just those
people how too little state good very make world still own see men work long get here between
both life being under never day same another know while last might us great old year off come
since against go came right used take three hello tensor plug graph device
""".split()  # noqa: SIM905 (a paragraph reads better than 150 quoted words)


def tiny_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A llama-style vocabulary of exactly ``n_vocab`` entries (at least 259).

    Ids 0-2 are ``<unk>``, ``<s>``, ``</s>``; 3-258 the byte tokens ``<0x00>`` ..
    ``<0xFF>``; then ``▁`` and the lowercase letters, common words with and without a
    leading ``▁`` and their prefixes (so that SentencePiece merges can reach them), the
    other printable ASCII characters, then synthetic letter pairs, triples and
    quadruples (Gemma 3's 262,144 entries): a small vocabulary spells capitals and
    punctuation with byte tokens. Scores fall with the
    id, as merge priority does.
    """
    if n_vocab < 259:
        raise ValueError(
            f"a llama vocabulary with byte fallback needs >= 259 tokens, not {n_vocab}"
        )
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    seen = set(tokens)

    def candidates() -> itertools.chain[str]:
        letters = [SPACE, *string.ascii_lowercase]
        others = [c for c in string.printable if c.isprintable() and c not in (*letters, " ")]
        words = [w for word in TINY_WORDS for w in (SPACE + word, word)]
        prefixes = [w[:k] for w in words for k in range(2, len(w) + 1)]
        pairs = ("".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2))
        triples = ("".join(p) for p in itertools.product(string.ascii_lowercase, repeat=3))
        spaced = (SPACE + "".join(p) for p in itertools.product(string.ascii_lowercase, repeat=3))
        quads = ("".join(p) for p in itertools.product(string.ascii_lowercase, repeat=4))
        return itertools.chain(letters, prefixes, others, pairs, triples, spaced, quads)

    for text in candidates():
        if len(tokens) == n_vocab:
            break
        if text not in seen:
            seen.add(text)
            tokens.append(text)
            types.append(TokenType.NORMAL)
    if len(tokens) < n_vocab:
        raise ValueError(f"tiny_vocab can make at most {len(tokens)} tokens, not {n_vocab}")
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, types


def write_tiny_llama(
    path: str | Path,
    weight_type: Type | str = Type.F32,
    seed: int = 0,
    *,
    tied: bool = False,
    rope_freqs: bool = False,
    rope_base: float = 10000.0,
    rope_scaling: tuple[str, float] | None = None,
    eps: float = 1e-5,
    arch: str = "llama",
    sliding_window: int = 4,
    long_rope: bool = False,
    metadata: Mapping[str, Any] | None = None,
    **dims: int,
) -> Path:
    """Write a random-weight llama GGUF file and return its path.

    ``dims`` override :data:`TINY_DIMS` (``n_vocab``, ``n_embd``, ``n_layer``,
    ``n_head``, ``n_head_kv``, ``n_ff``, ``n_ctx``, ``head_dim`` where heads are not
    ``n_embd / n_head`` wide, and ``n_expert``/``n_expert_used`` for a Mixtral-style
    mixture of experts in every layer). Matrices are stored as
    ``weight_type`` (F32, F16, Q8_0, Q4_0, K-quants, IQ4_NL, IQ4_XS...; rows must be
    multiples of 32 for the quantized ones, of 256 for the K-quants and IQ4_XS: pass
    ``n_embd=256, n_ff=512``), norms as F32. ``tied`` leaves out ``output.weight`` so the
    output layer reuses the token embeddings; ``rope_freqs`` adds Llama 3.1's
    ``rope_freqs.weight`` (per-pair frequency divisors, here 1 to 8); ``rope_scaling``
    = ``(type, factor)`` writes ``llama.rope.scaling.*`` (``linear`` or ``yarn``, the
    original context being ``n_ctx / factor``). ``arch="gemma3"`` writes Gemma 3's
    block instead (per-head Q/K norms, post-attention and post-FFN norms, NEOX rope, a
    ``sliding_window`` on 5 of every 6 blocks; the output is always tied);
    ``"qwen2"`` adds biases to the Q/K/V projections, ``"qwen3"`` per-head Q/K norms
    (both with NEOX rope), ``"qwen3moe"`` Qwen 3's block with ``n_expert`` experts
    (default 4, 2 used) of ``n_ff`` each. ``"phi3"`` fuses Q/K/V into ``attn_qkv`` and
    gate and up into one ``ffn_up`` of 2·n_ff rows; ``long_rope`` adds its LongRoPE
    factors (``rope_factors_short``/``_long``, an original context of n_ctx / 4, and the
    ``attn_factor`` its converter computes). ``"gemma2"`` writes Gemma 2's block (sandwich
    norms, GELU FFN, a ``sliding_window`` on every other block, tied output) with small
    soft-caps (attention 3, output 15) so that they change the result. ``"smollm3"`` is
    llama's block without rope in every fourth; ``"granite"`` llama's with Granite's
    embedding, residual, attention and logit multipliers; ``"olmo2"`` OLMo 2's (no
    pre-norms, post-norms, Q/K norms over whole projections, NEOX rope). The vocabulary is
    the tiny SentencePiece one for every architecture. ``metadata`` adds keys or replaces
    the ones written (a bool, int, float, str or list of one of those; ints are written
    as INT64, floats as FLOAT32): the hostile tests write damaged files with it.
    """
    from gguf import GGMLQuantizationType, GGUFWriter  # deferred: slow to import

    unknown = set(dims) - set(TINY_DIMS)
    if unknown:
        raise TypeError(f"unknown dimension(s) {sorted(unknown)}; known: {sorted(TINY_DIMS)}")
    d = {**TINY_DIMS, **dims}
    wtype = Type.parse(weight_type)
    n_embd, n_head, n_head_kv, n_ff = d["n_embd"], d["n_head"], d["n_head_kv"], d["n_ff"]
    head_dim = d["head_dim"] or n_embd // n_head
    n_q, n_kv = head_dim * n_head, head_dim * n_head_kv
    rng = np.random.default_rng(seed)
    path = Path(path)

    if arch not in TINY_ARCHITECTURES:
        raise ValueError(f"the tiny writer knows {', '.join(TINY_ARCHITECTURES)}; not {arch!r}")
    gemma = arch in ("gemma2", "gemma3")
    qk_norm = arch in ("gemma3", "qwen3", "qwen3moe")
    olmo = arch == "olmo2"  # post-norms only; Q/K norms over the whole projections
    fused = arch == "phi3"
    tied = tied or gemma
    if arch == "qwen3moe" and not d["n_expert"]:
        d["n_expert"], d["n_expert_used"] = 4, 2
    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-llama-{wtype.name.lower()}-seed{seed}")
    writer.add_context_length(d["n_ctx"])
    writer.add_embedding_length(n_embd)
    writer.add_block_count(d["n_layer"])
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    if d["head_dim"]:  # Gemma 3's heads are larger than n_embd / n_head (270M: 256, not 160)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(eps)
    if rope_scaling is not None:
        from gguf import RopeScalingType

        kind, factor = rope_scaling
        writer.add_rope_scaling_type(RopeScalingType(kind))
        writer.add_rope_scaling_factor(factor)
        writer.add_rope_scaling_orig_ctx_len(int(d["n_ctx"] / factor))
    writer.add_vocab_size(d["n_vocab"])
    n_expert = d["n_expert"]
    if n_expert:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(d["n_expert_used"] or min(2, n_expert))
        if arch == "qwen3moe":
            writer.add_expert_feed_forward_length(n_ff)
    if arch == "granite":  # small multipliers of the kinds Granite 3 has (12, 0.22, 1/128, 8)
        writer.add_embedding_scale(2.0)
        writer.add_residual_scale(0.5)
        writer.add_attention_scale(0.2)
        writer.add_logit_scale(3.0)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(3.0)
        writer.add_final_logit_softcapping(15.0)
    if long_rope:  # Phi-3's converter: attn_factor = sqrt(1 + ln(scale) / ln(n_ctx_orig))
        n_orig = d["n_ctx"] // 4
        writer.add_rope_scaling_orig_ctx_len(n_orig)
        writer.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(4) / np.log(n_orig))))
    writer.add_file_type({Type.F32: 0, Type.F16: 1, Type.Q4_0: 2, Type.Q8_0: 7}.get(wtype, 0))
    tokens, scores, types = tiny_vocab(d["n_vocab"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)

    def matrix(name: str, n_out: int, n_in: int, scale: float = 1.0, n_stack: int = 0) -> None:
        shape = (n_stack, n_out, n_in) if n_stack else (n_out, n_in)
        values = rng.standard_normal(shape, dtype=np.float32) * float(scale / n_in**0.5)
        if wtype == Type.F32:
            writer.add_tensor(name, values)
        elif wtype == Type.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            raw = quantize(values, wtype)
            writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType(wtype.value))

    def norm(name: str, n: int = n_embd) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    if gemma:
        writer.add_sliding_window(sliding_window)
    if long_rope:
        for kind, top in (("short", 1.5), ("long", 6.0)):
            factors = np.linspace(1, top, head_dim // 2, dtype=np.float32)
            writer.add_tensor(f"rope_factors_{kind}.weight", factors)

    # token embeddings of unit rms, so that activations start at a llama-like scale
    matrix("token_embd.weight", d["n_vocab"], n_embd, scale=np.sqrt(n_embd))
    for i in range(d["n_layer"]):
        p = f"blk.{i}."
        if not olmo:
            norm(p + "attn_norm.weight")
        if fused:
            matrix(p + "attn_qkv.weight", n_q + 2 * n_kv, n_embd)
        else:
            matrix(p + "attn_q.weight", n_q, n_embd)
            matrix(p + "attn_k.weight", n_kv, n_embd)
            matrix(p + "attn_v.weight", n_kv, n_embd)
        matrix(p + "attn_output.weight", n_embd, n_q)
        if not olmo:  # (the order of the draws keeps every earlier tiny file as it was)
            norm(p + "ffn_norm.weight")
        if olmo:
            norm(p + "attn_q_norm.weight", n_q)
            norm(p + "attn_k_norm.weight", n_kv)
        if qk_norm:
            norm(p + "attn_q_norm.weight", head_dim)
            norm(p + "attn_k_norm.weight", head_dim)
        if gemma or olmo:
            norm(p + "post_attention_norm.weight")
            norm(p + "post_ffw_norm.weight")
        if arch == "qwen2":  # biases of the three projections, F32 as converters keep them
            for name, n in (("attn_q", n_q), ("attn_k", n_kv), ("attn_v", n_kv)):
                writer.add_tensor(f"{p}{name}.bias", 0.5 * rng.standard_normal(n, np.float32))
        if n_expert:  # the router (F32, as converters keep it) and the stacked experts
            router = rng.standard_normal((n_expert, n_embd), dtype=np.float32)
            writer.add_tensor(p + "ffn_gate_inp.weight", router / np.float32(n_embd**0.5))
            matrix(p + "ffn_gate_exps.weight", n_ff, n_embd, n_stack=n_expert)
            matrix(p + "ffn_up_exps.weight", n_ff, n_embd, n_stack=n_expert)
            matrix(p + "ffn_down_exps.weight", n_embd, n_ff, n_stack=n_expert)
        elif fused:
            matrix(p + "ffn_up.weight", 2 * n_ff, n_embd)
            matrix(p + "ffn_down.weight", n_embd, n_ff)
        else:
            matrix(p + "ffn_gate.weight", n_ff, n_embd)
            matrix(p + "ffn_up.weight", n_ff, n_embd)
            matrix(p + "ffn_down.weight", n_embd, n_ff)
    norm("output_norm.weight")
    if not tied:
        matrix("output.weight", d["n_vocab"], n_embd)
    if rope_freqs:
        writer.add_tensor("rope_freqs.weight", np.linspace(1, 8, head_dim // 2, dtype=np.float32))

    for key, value in (metadata or {}).items():
        writer.kv_data[0].pop(key, None)  # replaced without the writer's duplicate warning
        writer.add_key_value(key, value, *_value_type(value))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _value_type(value: Any) -> tuple[Any, Any]:
    """The GGUF value type (and item type, for a list) a metadata value is written as."""
    from gguf import GGUFValueType as V

    def scalar(v: Any) -> Any:
        if isinstance(v, bool):
            return V.BOOL
        if isinstance(v, int):
            return V.INT64
        if isinstance(v, float):
            return V.FLOAT32
        if isinstance(v, str):
            return V.STRING
        raise TypeError(f"cannot write metadata value {v!r}")

    if isinstance(value, list):
        return V.ARRAY, scalar(value[0]) if value else V.INT32
    return scalar(value), None

"""Random-weight BERT encoders written as real GGUF files, for tests of embeddings.

:func:`write_tiny_bert` writes what llama.cpp's converter writes for a BERT model
(``bert.*`` hyper-parameters with ``pooling_type``, a WordPiece vocabulary, the
embedding, block and LayerNorm tensors with their biases) with the ``gguf`` package's
writer, so the reader, the WordPiece tokenizer, the loader and the encoder graph run
as for a downloaded sentence-embedding model. Weights are seeded random numbers.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from .tiny import TINY_WORDS
from .tokenizer import SPACE, TokenType

__all__ = ["BERT_SPECIALS", "tiny_wordpiece_vocab", "write_tiny_bert"]

#: [PAD], [UNK], [CLS], [SEP], [MASK] at ids 0-4
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def tiny_wordpiece_vocab(n_vocab: int) -> list[str]:
    """``n_vocab`` WordPiece entries as llama.cpp's converter stores them: the specials,
    word-initial pieces with a ``▁`` (every letter, digit and ASCII punctuation mark, so
    that any lowercase ASCII text can be cut, then common words) and continuation pieces
    without ``##`` (letters, then word endings)."""
    first = [SPACE + c for c in string.ascii_lowercase + string.digits + string.punctuation]
    words = [SPACE + w for w in TINY_WORDS]
    tails = [w[k:] for w in TINY_WORDS for k in range(1, len(w) - 1)]
    tokens = list(BERT_SPECIALS)
    seen = set(tokens)
    for text in [*first, *string.ascii_lowercase, *string.digits, *words, *tails]:
        if len(tokens) == n_vocab:
            break
        if text not in seen:
            seen.add(text)
            tokens.append(text)
    if len(tokens) < n_vocab:
        raise ValueError(f"tiny_wordpiece_vocab can make at most {len(tokens)} tokens")
    return tokens


def write_tiny_bert(
    path: str | Path,
    seed: int = 0,
    *,
    pooling: str = "mean",
    n_vocab: int = 400,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int = 128,
    n_ctx: int = 128,
    eps: float = 1e-12,
) -> Path:
    """Write a random-weight BERT GGUF file (F32) and return its path; ``pooling`` is
    written as ``bert.pooling_type`` (``none``, ``mean``, ``cls`` or ``last``)."""
    from gguf import GGUFWriter, PoolingType  # deferred: slow to import

    rng = np.random.default_rng(seed)
    path = Path(path)
    tokens = tiny_wordpiece_vocab(n_vocab)
    writer = GGUFWriter(str(path), "bert")
    writer.add_name(f"tiny-bert-seed{seed}")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_layer_norm_eps(eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(PoolingType[pooling.upper()])
    writer.add_file_type(0)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [TokenType.CONTROL] * len(BERT_SPECIALS)
        + [TokenType.NORMAL] * (n_vocab - len(BERT_SPECIALS))
    )
    writer.add_token_type_count(2)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(1)
    writer.add_bos_token_id(2)  # [CLS] opens, [SEP] closes every input
    writer.add_sep_token_id(3)
    writer.add_mask_token_id(4)
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)

    def matrix(name: str, n_out: int, n_in: int, scale: float = 1.0) -> None:
        values = rng.standard_normal((n_out, n_in), dtype=np.float32) * float(scale / n_in**0.5)
        writer.add_tensor(name, values)

    def vector(name: str, n: int, mean: float = 0.0) -> None:
        writer.add_tensor(name, (mean + 0.1 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", n_vocab, n_embd, scale=np.sqrt(n_embd))
    matrix("token_types.weight", 2, n_embd, scale=np.sqrt(n_embd))
    matrix("position_embd.weight", n_ctx, n_embd, scale=np.sqrt(n_embd))
    vector("token_embd_norm.weight", n_embd, 1.0)
    vector("token_embd_norm.bias", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes = {"attn_q": (n_embd, n_embd), "attn_k": (n_embd, n_embd),
                  "attn_v": (n_embd, n_embd), "attn_output": (n_embd, n_embd),
                  "ffn_up": (n_ff, n_embd), "ffn_down": (n_embd, n_ff)}  # fmt: skip
        for name, (n_out, n_in) in shapes.items():
            matrix(f"{p}{name}.weight", n_out, n_in)
            vector(f"{p}{name}.bias", n_out)
        for norm in ("attn_output_norm", "layer_output_norm"):
            vector(f"{p}{norm}.weight", n_embd, 1.0)
            vector(f"{p}{norm}.bias", n_embd)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

"""Tokenizers as llama.cpp implements them, from a GGUF file's ``tokenizer.ggml.*`` keys.

::

    vocab = Vocab.from_gguf(GGUFFile("model.gguf"))
    ids = vocab.encode("Hello world")                       # BOS etc. as the file asks
    ids = vocab.encode(chat_text, parse_special=True)       # <|im_start|> → its id
    text = vocab.decode(ids)

Modules, one job each: :mod:`.vocab` (the vocabulary, dispatch, decoding),
:mod:`.spm` (SentencePiece), :mod:`.bpe` (byte-level BPE), :mod:`.pretokenize` (the
BPE pre-tokenizer regexes by ``tokenizer.ggml.pre``), :mod:`.wpm` (WordPiece),
:mod:`.special` (special tokens in raw text), :mod:`.merge` (the merge loop SPM and
BPE share) and :mod:`.cli` (``tensorplug tokenize``).
"""

from __future__ import annotations

from .spm import SPACE
from .vocab import MODELS, StreamDecoder, TokenType, Vocab

__all__ = ["MODELS", "SPACE", "StreamDecoder", "TokenType", "Vocab"]

"""Text to token ids and back in bytes, as llama-cpp-python's ``LlamaTokenizer`` does
(``Llama.tokenize``/``detokenize`` and ``Llama.tokenizer()`` are this)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tokenizer import Vocab

__all__ = ["LlamaTokenizer"]


class LlamaTokenizer:
    """A model's vocabulary in llama-cpp-python's terms: ``tokenize`` takes UTF-8 bytes,
    ``detokenize`` gives bytes (a token may hold part of a character); ``encode`` and
    ``decode`` take and give ``str``."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        """``add_bos``: what the model asks for at the start (BOS where it wants one);
        ``special``: control tokens written in the text are parsed."""
        if isinstance(text, str):
            raise TypeError("tokenize takes bytes (text.encode('utf-8')), as llama-cpp-python")
        return self.vocab.encode(
            bytes(text).decode("utf-8", errors="replace"),
            add_bos=None if add_bos else False,
            parse_special=special,
        )

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        """The tokens' bytes, control tokens written only with ``special``; the space a
        sentencepiece model puts after BOS is dropped, as llama.cpp does.
        ``prev_tokens`` is accepted and, as in llama-cpp-python, not needed."""
        ids = [int(t) for t in tokens]
        out = b"".join(self.vocab.piece(t, special) for t in ids)
        if ids and ids[0] == self.vocab.bos and out[:1] == b" ":
            return out[1:]
        return out

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos, special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> LlamaTokenizer:
        """The vocabulary of the GGUF file at ``path``, without its weights."""
        from tensorplug.gguf import GGUFFile

        from ..tokenizer import Vocab

        return cls(Vocab.from_gguf(GGUFFile(path)))

"""``Llama.tokenizer()``: llama-cpp-python's ``LlamaTokenizer`` over a model's vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .llama import Llama

__all__ = ["LlamaTokenizer"]


class LlamaTokenizer:
    """Text to token ids and back, as the model's own ``tokenize``/``detokenize``;
    ``encode``/``decode`` take and give ``str`` (and parse control tokens by default,
    as llama-cpp-python's tokenizer object does)."""

    def __init__(self, llama: Llama) -> None:
        self._model = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._model.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        return self._model.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos, special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> LlamaTokenizer:
        from .llama import Llama

        return cls(Llama(model_path=path, vocab_only=True, verbose=False))

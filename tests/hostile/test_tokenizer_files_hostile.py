"""Tokenizer arrays of the wrong kind in a model file: each is refused with a GGUFError
naming the GGUF key, the offending item and what the key must hold — never a traceback
from deep inside the tokenizer, and never accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tensorplug.gguf import GGUFError, GGUFFile
from tensorplug_llm.tiny import write_tiny_llama
from tensorplug_llm.tokenizer import Vocab


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        (
            {"tokenizer.ggml.tokens": list(range(320))},
            r"ggml.tokens must be a list of strings, but item 0 is int 0",
        ),
        (
            {"tokenizer.ggml.scores": ["1.5"] * 320},
            r"ggml.scores must be a list of numbers, but item 0 is str '1.5'",
        ),
        (
            {"tokenizer.ggml.token_type": [1.5] * 320},
            r"token_type must be a list of integers, but item 0 is float 1.5",
        ),
        (
            {"tokenizer.ggml.token_type": [2**40] * 320},  # llama.cpp reads int32
            r"tokenizer.ggml.token_type holds integers outside 32 bits",
        ),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": [1, 2, 3]},
            r"tokenizer.ggml.merges must be a list of strings like 'a b', but item 0 is int 1",
        ),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["ab"]},
            r"tokenizer.ggml.merges must be a list of strings like 'a b', but item 0 is str 'ab'",
        ),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["a b", " c d", "ef", "g"]},
            r"tokenizer.ggml.merges must be a list of strings like 'a b', but item 2 is str 'ef'",
        ),
    ],
)
def test_tokenizer_arrays_of_the_wrong_kind_are_refused_naming_the_key(
    tmp_path: Path, metadata: dict[str, Any], match: str
) -> None:
    path = write_tiny_llama(tmp_path / "vocab.gguf", metadata=metadata)
    with pytest.raises(GGUFError, match=match):
        Vocab.from_gguf(GGUFFile(path))

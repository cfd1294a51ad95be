"""The served model described as llama-server's ``/v1/models`` and ``/props`` do."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ..api import LLM

__all__ = ["build_info", "model_list", "system_fingerprint"]

#: llama.cpp's ``llama_vocab_type`` by the GGUF's ``tokenizer.ggml.model``
VOCAB_TYPES = {"llama": 1, "gpt2": 2, "bert": 3, "t5": 4, "rwkv": 5}

_STARTED = int(time.time())


@cache
def _version() -> str | None:
    try:
        return version("tensorplug-llm")
    except PackageNotFoundError:
        return None


def build_info() -> str:
    """``/props``' ``build_info``: the distribution and its version."""
    v = _version()
    return f"tensorplug-llm {v}" if v else "tensorplug-llm"


def system_fingerprint() -> str:
    """OpenAI's ``system_fingerprint`` in llama-server's shape (its ``b<build>-<commit>``):
    ``b<version>-tensorplug-llm``, which changes with the server's code as llama-server's
    does."""
    return f"b{_version() or 0}-tensorplug-llm"


def model_meta(llm: LLM) -> dict[str, Any]:
    f = llm.llama.file
    config = llm.llama.config
    return {
        "vocab_type": VOCAB_TYPES.get(llm.vocab.model, 0),
        "n_vocab": len(llm.vocab.tokens),
        "n_ctx_train": config.n_ctx_train,
        "n_embd": config.n_embd,
        "n_params": sum(math.prod(t.shape) for t in f.tensors.values()),
        "size": sum(t.nbytes for t in f.tensors.values()),
    }


def model_list(llm: LLM, aliases: Sequence[str] = (), tags: Sequence[str] = ()) -> dict[str, Any]:
    """``/v1/models``: OpenAI's list with llama-server's ``aliases``, ``tags`` and
    ``meta``, and the same model in Ollama's ``models`` shape (llama-server answers both
    at once)."""
    name = llm.model_name
    capabilities = ["embedding"] if llm.llama.config.arch.encoder else ["completion"]
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "aliases": list(aliases),
                "tags": list(tags),
                "object": "model",
                "created": _STARTED,
                "owned_by": "llamacpp",
                "meta": model_meta(llm),
            }
        ],
        "models": [
            {
                "name": name,
                "model": name,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": capabilities,
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        ],
    }

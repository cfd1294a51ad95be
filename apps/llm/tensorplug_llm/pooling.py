"""Pooling a sequence's final hidden states into one embedding (llama.cpp's pooling types).

One function for both ways an embedding is computed, :meth:`ModelRunner.embed
<tensorplug_llm.runner.ModelRunner.embed>` (a model of its own, the context cleared) and the
engine's embedding requests (a sequence beside others in the shared cache), so that the
two pool the same rows the same way, bit for bit.
"""

from __future__ import annotations

import numpy as np

from tensorplug.errors import RunError

from .model import POOLING_TYPES

__all__ = ["pool", "pooling_kind"]


def pooling_kind(requested: str | None, file_pooling: str) -> str:
    """The pooling to use: ``requested``, else the file's ``pooling_type``, else ``mean``
    (a file without one would give llama.cpp per-token rows, which its server's
    embeddings endpoint refuses). RunError for an unknown kind."""
    kind = requested or (file_pooling if file_pooling != "none" else "mean")
    if kind not in POOLING_TYPES[:4]:
        raise RunError(f"pooling must be one of {', '.join(POOLING_TYPES[:4])}; got {kind!r}")
    return kind


def pool(hidden: np.ndarray, kind: str, *, normalize: bool = False) -> np.ndarray:
    """``hidden`` ``(n_tokens, n_embd)`` pooled by ``kind`` (``mean``, ``cls``: the first
    token, ``last``, ``none``: every row), float32; ``normalize`` divides by the
    Euclidean norm (llama-server's)."""
    pooled = {"mean": lambda: hidden.mean(axis=0), "cls": lambda: hidden[0],
              "last": lambda: hidden[-1], "none": lambda: hidden}[kind]()  # fmt: skip
    if normalize:
        norm = np.linalg.norm(pooled, axis=-1, keepdims=True)
        pooled = pooled / np.where(norm > 0, norm, 1)
    return np.asarray(pooled, dtype=np.float32)

"""Pooling a sequence's final hidden states into one embedding (llama.cpp's pooling types).

One function for both ways an embedding is computed, :meth:`ModelRunner.embed
<tensorplug_llm.runner.ModelRunner.embed>` (a model of its own, the context cleared) and the
engine's embedding requests (a sequence beside others in the shared cache), so that the
two pool the same rows the same way, bit for bit; and scaling embeddings as llama.cpp's
``--embd-normalize`` does (:func:`normalize`), for ``tensorplug embed``.
"""

from __future__ import annotations

import numpy as np

from tensorplug.errors import RunError

from .model import POOLING_TYPES

__all__ = ["NORMALIZE_NAMES", "normalize", "pool", "pooling_kind"]


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


#: llama.cpp's ``--embd-normalize`` values with names of their own; any larger value is a p-norm
NORMALIZE_NAMES = {-1: "none", 0: "max-abs to int16", 1: "taxicab", 2: "euclidean"}


def normalize(rows: np.ndarray, p: int) -> np.ndarray:
    """Each row of ``rows`` (``(..., n_embd)``) scaled as llama.cpp's ``common_embd_normalize``:
    ``p`` -1 leaves it, 0 scales its largest magnitude to 32760 (int16's range; the values
    stay float), 1 divides by the taxicab norm, 2 by the Euclidean one, larger ``p`` by the
    p-norm. As there, the norm is summed in double and each row multiplied by its float
    reciprocal, so that the float32 results are llama.cpp's; a zero row stays zero.
    RunError for ``p`` < -1, which llama.cpp gives no meaning."""
    if p < -1:
        raise RunError(
            f"--embd-normalize {p}: use -1 (none), 0 (max-abs, int16 range), 1 (taxicab), "
            "2 (euclidean) or a larger p for the p-norm"
        )
    x = np.asarray(rows, dtype=np.float32)
    if p == -1:
        return x.copy()
    if p == 0:
        norm = np.abs(x).max(axis=-1, keepdims=True).astype(np.float64) / 32760.0
    elif p == 2:  # float products summed in double, as the C loop does
        norm = np.sqrt(np.sum((x * x).astype(np.float64), axis=-1, keepdims=True))
    else:
        norm = np.sum(np.abs(x).astype(np.float64) ** p, axis=-1, keepdims=True) ** (1.0 / p)
    with np.errstate(divide="ignore"):
        scale = np.where(norm > 0, 1.0 / norm, 0.0).astype(np.float32)
    return x * scale

"""Choosing the next token from logits: greedy, or top-k → top-p → temperature → draw.

The chain and its order are llama.cpp's default sampler chain without penalties:
top-k keeps the ``k`` largest logits, top-p the smallest set of those whose
probabilities (softmax at temperature 1) add up to ``p``, then the survivors' logits
are divided by the temperature and one is drawn from their softmax with a seeded
generator. A temperature of 0 or less is greedy decoding (the first maximum).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorplug.errors import RunError

__all__ = ["Sampler", "SamplerParams"]


@dataclass(frozen=True)
class SamplerParams:
    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 40  # <= 0: keep every token
    top_p: float = 0.95  # >= 1: keep every token
    seed: int = 0


class Sampler:
    """Picks token ids from logits; the same seed and logits give the same tokens."""

    def __init__(self, params: SamplerParams | None = None) -> None:
        self.params = params or SamplerParams()
        if self.params.top_p <= 0.0:
            raise RunError(f"top_p must be positive (1 keeps every token), got {self.params.top_p}")
        self.rng = np.random.default_rng(self.params.seed)

    @property
    def greedy(self) -> bool:
        return self.params.temperature <= 0.0

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids that survive top-k and top-p, best first, and their probabilities
        at the sampler's temperature."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float64).reshape(-1)
        n = logits.size
        k = p.top_k if 0 < p.top_k < n else n
        ids = np.argpartition(-logits, k - 1)[:k] if k < n else np.arange(n)
        ids = ids[np.lexsort((ids, -logits[ids]))]  # by logit, descending; ties: lower id
        z = logits[ids]
        if p.top_p < 1.0:
            probs = _softmax(z)
            keep = min(int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1, ids.size)
            ids, z = ids[:keep], z[:keep]
        temperature = p.temperature if p.temperature > 0 else 1.0
        return ids, _softmax(z / temperature)

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        ids, probs = self.candidates(logits)
        choice = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum()))
        return int(ids[min(choice, ids.size - 1)])


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    out: np.ndarray = e / e.sum()
    return out

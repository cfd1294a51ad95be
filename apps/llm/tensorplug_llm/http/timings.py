"""llama-server's ``timings`` of one generation: the prompt's part and the reply's, in
milliseconds, with their rates."""

from __future__ import annotations

from typing import Any

__all__ = ["llama_timings"]


def llama_timings(
    started: float, first: float, now: float, prompt_n: int, predicted_n: int, cache_n: int = 0
) -> dict[str, Any]:
    """The ``timings`` object for a generation that began at ``started``, gave its first
    token at ``first`` and stands at ``now`` (``time.monotonic()`` seconds), having
    evaluated ``prompt_n`` prompt tokens (``cache_n`` more taken from the cache) and
    generated ``predicted_n``. The reply's rates are over its decode steps, one fewer
    than its tokens (the first comes with the prompt's logits), as llama-server's."""
    prompt_ms, predicted_ms = (first - started) * 1000, (now - first) * 1000
    steps = max(predicted_n - 1, 0)
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": steps / predicted_ms * 1000 if steps and predicted_ms > 0 else 0.0,
    }

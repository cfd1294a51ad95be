"""The catalogue cases the in-tree GPU plugins leave to the CPU backend, by name."""

from __future__ import annotations

import re

__all__ = ["left_to_the_cpu"]

_QUANTIZED_CACHE = re.compile(r"type_(kv|k|v)=i?q\d")


def left_to_the_cpu(name: str) -> bool:
    """Writes into K-quants (as ggml's GPU backends leave them), and a quantized KV
    cache: its rotation (``hadamard``, op contract 1.4, which the GPU plugins do not
    declare) and flash attention over quantized K or V."""
    if name.startswith("HADAMARD("):
        return True
    if name.startswith("FLASH_ATTN_EXT("):
        return _QUANTIZED_CACHE.search(name) is not None
    return "_k" in name.lower()

"""How many leading tokens two sequences share: what reusing a KV cache's prefix rests on
(the engine's slots, the chat's turns, the Python API's next prompt)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["common_prefix"]


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n

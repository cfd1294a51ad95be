"""Host-side constants of the op contracts, computed once for every backend.

rope's YaRN correction dims and soft_max/flash_attn_ext's ALiBi slopes are part of
what the op means, and ggml computes them in float32 on the host. Every backend
must use exactly these values, so they live here rather than in each plugin.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["alibi_params", "alibi_slopes", "rope_yarn_corr_dims"]

_F32 = np.float32


def rope_yarn_corr_dims(
    n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """``ggml_rope_yarn_corr_dims``: the first and last dims YaRN's ramp blends.

    In float32 as ggml's ``logf`` formula; ``n_ctx_orig <= 0`` gives ``(0, -inf)``,
    which turns the ramp off, exactly as the C code does for 0.
    """

    def corr_dim(n_rot: float) -> np.float32:
        if n_ctx_orig <= 0:
            return _F32(-np.inf)
        ratio = _F32(n_ctx_orig) / (_F32(n_rot) * _F32(2) * _F32(math.pi))
        return _F32(n_dims) * np.log(ratio) / (_F32(2) * np.log(_F32(freq_base)))

    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    return float(max(_F32(0), start)), float(min(_F32(n_dims - 1), end))


def alibi_params(n_head: int, max_bias: float) -> tuple[np.float32, np.float32, int]:
    """ggml's ALiBi constants ``(m0, m1, n_head_log2)`` for ``n_head`` heads."""
    n_head_log2 = 1 << math.floor(math.log2(max(n_head, 1)))
    m0 = _F32(2.0) ** _F32(-max_bias / n_head_log2)
    m1 = _F32(2.0) ** _F32(-(max_bias / 2.0) / n_head_log2)
    return m0, m1, n_head_log2


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """The float32 ALiBi slope of each head; all ones when ``max_bias <= 0``."""
    if max_bias <= 0:
        return np.ones(n_head, _F32)
    m0, m1, n_head_log2 = alibi_params(n_head, max_bias)
    h = np.arange(n_head)
    return np.where(
        h < n_head_log2,
        m0 ** (h + 1).astype(_F32),
        m1 ** (2 * (h - n_head_log2) + 1).astype(_F32),
    ).astype(_F32)

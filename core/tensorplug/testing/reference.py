"""Independent numpy formulas for every op: the oracle the CPU backend is judged by.

Each function restates the contract in the docstring of its builder in
:mod:`tensorplug.ops` (and ggml's semantics where the docstring points to them) as
plain numpy, written separately from any backend's kernels so that a shared mistake
is unlikely. Arguments are *logical* arrays (numpy order, already decoded from their
storage type); results are logical arrays too. Encoding to a storage type, memory,
strides and views are the caller's business (:mod:`tensorplug.testing.refbackend`).

The formulas are dtype-preserving: fed float64 they compute in float64 (how the
conformance check uses them), fed float32 they compute in float32 — which makes the
same code the numpy baseline of ``tensorplug bench``. Python scalars are "weak" in
numpy >= 2, so constants never widen the computation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = [
    "add", "argmax", "argsort", "clamp", "concat", "div", "flash_attn_ext", "get_rows",
    "glu", "hadamard", "mul", "mul_mat", "mul_mat_id", "norm", "pad", "repeat", "rms_norm", "rope",
    "rope_yarn_corr_dims", "scale", "set_rows", "soft_max", "sub", "sum_rows", "tile_to",
    "top_k", "UNARY",
]  # fmt: skip


def _pad4(x: np.ndarray) -> np.ndarray:
    """``x`` with leading axes of 1 added up to four dimensions (a view)."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


# -- elementwise --------------------------------------------------------------------------


def tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``b`` repeated (``np.tile``) until it has ``shape``: ggml's can_repeat broadcast."""
    bp = b.reshape((1,) * (len(shape) - b.ndim) + b.shape)
    extents: tuple[int, ...] = bp.shape
    reps = tuple(s // d for s, d in zip(shape, extents, strict=True))
    return np.tile(bp, reps)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + tile_to(b, a.shape)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a - tile_to(b, a.shape)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a * tile_to(b, a.shape)


def div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a / tile_to(b, a.shape)


def hadamard(a: np.ndarray, n: int) -> np.ndarray:
    """Each run of ``n`` values of ``a``'s rows times ``H_n/√n`` (Sylvester's order)."""
    signs = np.ones((1, 1))
    while signs.shape[0] < n:  # Sylvester's doubling: [[H, H], [H, −H]]
        signs = np.block([[signs, signs], [signs, -signs]])
    h = signs.astype(a.dtype) / np.sqrt(a.dtype.type(n))
    runs = a.reshape(*a.shape[:-1], a.shape[-1] // n, n)
    return (runs @ h.T).reshape(a.shape)


def clamp(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """ggml's ``MAX(MIN(x, hi), lo)`` with C's comparisons: ``x < hi`` is false for NaN."""
    m = np.where(a < hi, a, hi)
    return np.where(m > lo, m, lo).astype(a.dtype)


def repeat(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return tile_to(a, shape)


def pad(a: np.ndarray, after: tuple[int, ...]) -> np.ndarray:
    return np.pad(a, [(0, w) for w in after])


def scale(a: np.ndarray, s: float, bias: float = 0.0) -> np.ndarray:
    return a * s + bias


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # e^-x overflowing to inf is how σ reaches 0
        return 1 / (1 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:
    # ggml's tanh approximation (not the erf form), with ggml's clamps: 0 at and below
    # -10 (the limit; the formula gives NaN at -inf), x at and above 10
    with np.errstate(invalid="ignore", over="ignore"):
        y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, y))


def _gelu_quick(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(1.702 * x)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    # 1 + erf(z) = erfc(-z): exact in the far negative tail, where 1 + erf cancels
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return (0.5 * x * erfc(-x / math.sqrt(2))).astype(x.dtype)


#: Elementwise functions by :class:`~tensorplug.UnaryOp` value.
UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "neg": np.negative,
    "relu": lambda x: np.where(x > 0, x, 0.0),  # ggml: x > 0 ? x : 0, so NaN gives 0
    "gelu": _gelu,
    "silu": lambda x: x * _sigmoid(x),
    "exp": np.exp,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "gelu_quick": _gelu_quick,
    "gelu_erf": _gelu_erf,
}

#: The activation of each gated unit by :class:`~tensorplug.GluOp` value.
GLU_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "swiglu": lambda x: x * _sigmoid(x),
    "reglu": lambda x: np.where(x > 0, x, 0.0),
    "geglu": _gelu,
    "geglu_erf": _gelu_erf,
    "geglu_quick": _gelu_quick,
}


def glu(
    a: np.ndarray, b: np.ndarray | None = None, swapped: bool = False, fn: str = "swiglu"
) -> np.ndarray:
    """``act(x)·g`` with ``(x, g) = (a, b)``, or the halves of ``a``'s last axis
    (exchanged when ``swapped``; as in ggml, ``swapped`` means nothing when ``b`` is
    given). geglu is 0 wherever x <= -10, whatever g is, as ggml's loop sets it."""
    if b is None:
        n = a.shape[-1] // 2
        x, g = a[..., :n], a[..., n:]
        if swapped:
            x, g = g, x
    else:
        x, g = a, b
    y = GLU_ACTIVATIONS[fn](x) * g
    return np.where(x <= -10, 0.0, y) if fn == "geglu" else y


# -- normalisation -------------------------------------------------------------------------


def norm(a: np.ndarray, eps: float) -> np.ndarray:
    mean = a.mean(axis=-1, keepdims=True)
    centred = a - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + eps)


def rms_norm(a: np.ndarray, eps: float) -> np.ndarray:
    return a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + eps)


# -- matrix products and attention -----------------------------------------------------------


def mul_mat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[..., t, o] = Σᵢ b[..., t, i]·a[..., o, i]``; a's batches repeat onto b's."""
    ndim = max(a.ndim, b.ndim, 2)
    a4, b4 = _pad4(a), _pad4(b)
    for axis in (0, 1):
        reps = b4.shape[axis] // a4.shape[axis]
        # np.repeat gives [A0, A0, A1, A1]: batch j of b uses batch j // reps of a
        a4 = np.repeat(a4, reps, axis=axis)
    out = np.matmul(b4, np.swapaxes(a4, -1, -2))
    return out.reshape(out.shape[4 - ndim :])


def mul_mat_id(as_: np.ndarray, b: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``out[t, e, :] = as_[ids[t, e]] @ b[t, e % n_b, :]`` (``ggml_mul_mat_id``)."""
    n_tokens, n_used = ids.shape
    out = np.zeros((n_tokens, n_used, as_.shape[1]), dtype=np.result_type(as_, b))
    for t in range(n_tokens):
        for e in range(n_used):
            out[t, e] = as_[ids[t, e]] @ b[t, e % b.shape[1]]
    return out


def alibi_slopes(n_head: int, max_bias: float, dtype: np.dtype) -> np.ndarray:
    """Per-head ALiBi slope as ggml computes it; all ones when ``max_bias`` is 0."""
    if max_bias <= 0:
        return np.ones(n_head, dtype=dtype)
    m = 2 ** math.floor(math.log2(n_head))
    m0 = 2 ** (-max_bias / m)
    m1 = 2 ** (-max_bias / 2 / m)
    h = np.arange(n_head)
    slopes = np.where(h < m, m0 ** (h + 1), m1 ** (2 * (h - m) + 1))
    return slopes.astype(dtype)


def _softmax_last(x: np.ndarray) -> np.ndarray:
    """Row softmax where ``-inf`` logits get weight 0 (rows must keep one finite entry)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _mask_rows(mask: np.ndarray, rows: int) -> np.ndarray:
    """The 4-d mask cut to the first ``rows`` rows (row r of the logits uses mask row r)."""
    return _pad4(mask)[:, :, :rows, :]


def soft_max(
    a: np.ndarray, mask: np.ndarray | None = None, scale: float = 1.0, max_bias: float = 0.0
) -> np.ndarray:
    """Row softmax of ``a·scale + slope·mask`` (``ggml_soft_max_ext``); a mask with fewer
    heads or batches than ``a`` is tiled (head ``h`` uses mask head ``h % n``)."""
    a4 = _pad4(a)
    x = a4 * scale
    if mask is not None:
        slopes = alibi_slopes(a4.shape[1], max_bias, a.dtype).reshape(1, -1, 1, 1)
        m = _mask_rows(mask, a4.shape[2])
        pairs = zip(a4.shape[:2], m.shape[:2], strict=True)
        m = tile_to(m, (*(da if dm != 1 else 1 for da, dm in pairs), *m.shape[2:]))
        # slope·mask with slope 1 keeps -inf; slope·(-inf) stays -inf for slope > 0
        x = x + (slopes * m if max_bias > 0 else m)
    return _softmax_last(x).reshape(a.shape)


def flash_attn_ext(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float = 1.0,
    max_bias: float = 0.0,
    logit_softcap: float = 0.0,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """``softmax(q·kᵀ·scale [softcapped] + slope·mask)·v``, output ``(B, n_q, H, D_v)``
    (``order`` only groups a backend's sums: the same function, ignored here)."""
    q4, k4, v4 = _pad4(q), _pad4(k), _pad4(v)
    group = q4.shape[1] // k4.shape[1]
    k4 = np.repeat(k4, group, axis=1)  # query head h uses kv head h // group
    v4 = np.repeat(v4, group, axis=1)
    s = np.matmul(q4, np.swapaxes(k4, -1, -2)) * scale
    if logit_softcap > 0:
        s = logit_softcap * np.tanh(s / logit_softcap)
    if mask is not None:
        slopes = alibi_slopes(q4.shape[1], max_bias, q.dtype).reshape(1, -1, 1, 1)
        m = _mask_rows(mask, q4.shape[2])
        s = s + (slopes * m if max_bias > 0 else m)
    out = np.matmul(_softmax_last(s), v4)  # (B, H, n_q, D_v)
    out = np.swapaxes(out, 1, 2)  # (B, n_q, H, D_v): heads and tokens swapped, as ggml
    return out.reshape(out.shape[4 - q.ndim :])


# -- rope ------------------------------------------------------------------------------------


def rope_yarn_corr_dims(
    n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """ggml's ``ggml_rope_yarn_corr_dims``: the pair indices where the YaRN ramp runs."""

    def corr_dim(n_rot: float) -> float:
        if n_ctx_orig <= 0:
            return -math.inf  # log(0): the ramp degenerates, as it does in ggml
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))

    start = math.floor(corr_dim(beta_fast)) if n_ctx_orig > 0 else -math.inf
    end = math.ceil(corr_dim(beta_slow)) if n_ctx_orig > 0 else -math.inf
    return max(0.0, start), min(float(n_dims - 1), end)


def rope(
    x: np.ndarray,
    pos: np.ndarray,
    n_dims: int,
    mode: int = 0,
    *,
    freq_base: float = 10000.0,
    freq_scale: float = 1.0,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    n_ctx_orig: int = 0,
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    """Rotary embedding with YaRN scaling; ``x`` is ``(…, n_tokens, n_head, head_dim)``.

    ``mode`` 0 (NORMAL) rotates pairs ``(x[2i], x[2i+1])``; 2 (NEOX) rotates
    ``(x[i], x[i + n_dims/2])``. Dimensions past ``n_dims`` are copied.
    """
    dt = x.dtype
    half = n_dims // 2
    i = np.arange(half)
    exponent = (-2 * i / n_dims).astype(dt)
    theta_extrap = pos.astype(dt)[:, None] * np.power(dt.type(freq_base), exponent)
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors.astype(dt)
    theta = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0:
        low, high = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        y = (i - low) / max(0.001, high - low)
        ramp = 1 - np.minimum(1, np.maximum(0, y))
        mix = (ramp * ext_factor).astype(dt)
        theta = theta * (1 - mix) + theta_extrap * mix
        mscale = attn_factor * (1 + 0.1 * math.log(1 / freq_scale))
    cos = (np.cos(theta) * mscale).astype(dt)[:, None, :]  # (n_tokens, 1, half)
    sin = (np.sin(theta) * mscale).astype(dt)[:, None, :]
    out = x.copy()
    if mode == 2:
        x0, x1 = x[..., :half], x[..., half:n_dims]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_dims] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    return out


# -- gathers, scatters, joins --------------------------------------------------------------------


def get_rows(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``out[…, j, :] = a[…, rows[…, j], :]``."""
    if a.ndim == 2:
        return a[rows.astype(np.intp)]  # the same, as numpy users write it
    return np.take_along_axis(a, rows.astype(np.intp)[..., None], axis=-2)


def set_rows(
    a: np.ndarray, b: np.ndarray, rows: np.ndarray, *, in_place: bool = False
) -> np.ndarray:
    """``a`` with ``a[…, rows[…, j], :] = b[…, j, :]`` (rows broadcast onto b's).

    A copy of ``a`` is written unless ``in_place`` (b is cast to a's dtype either way).
    """
    out = a if in_place else a.copy()
    if a.ndim == 2 and rows.ndim == 1:
        out[rows.astype(np.intp)] = b  # the same, as numpy users write it
        return out
    idx = np.broadcast_to(
        rows.reshape((1,) * (b.ndim - 1 - rows.ndim) + rows.shape), b.shape[:-1]
    ).astype(np.intp)
    np.put_along_axis(out, np.broadcast_to(idx[..., None], b.shape), b, axis=-2)
    return out


def concat(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    return np.concatenate([a, b], axis=axis)


# -- reductions --------------------------------------------------------------------------------


def sum_rows(a: np.ndarray) -> np.ndarray:
    return a.sum(axis=-1, keepdims=True)


def argmax_row(row: np.ndarray) -> int:
    """ggml's CPU argmax, element by element: the running maximum ``MAX(m, x)`` (``>``),
    and the index moves whenever ``x`` equals it — so the last maximum wins on ties, and
    a NaN restarts the search at the next element (a trailing NaN changes nothing)."""
    m, idx = -math.inf, 0
    for i, x in enumerate(row.tolist()):
        m = m if m > x else x
        if m == x:
            idx = i
    return idx


def argmax(a: np.ndarray) -> np.ndarray:
    """Index of each row's maximum as ggml's CPU backend gives it (:func:`argmax_row`);
    a 1-d input gives shape ``(1,)``."""
    rows = a.reshape(-1, a.shape[-1])
    out = np.array([argmax_row(r) for r in rows], dtype=np.int64)
    return out.reshape(a.shape[:-1] or (1,))
    """Last index of the row maximum (ggml's CPU), NaN counting as -inf; a 1-d input
    gives shape ``(1,)``."""
    x = np.where(np.isnan(a), -np.inf, a)
    best = x.max(axis=-1, keepdims=True)
    cols = np.arange(a.shape[-1])
    last = np.where(x == best, cols, -1).max(axis=-1)
    return last.reshape(a.shape[:-1] or (1,))


def top_k(a: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest per row, largest first, ties by lower index."""
    cols = np.broadcast_to(np.arange(a.shape[-1]), a.shape)
    order = np.lexsort((cols, -a), axis=-1)  # by value descending, then by index
    return order[..., :k]


def argsort(a: np.ndarray, descending: bool = False) -> np.ndarray:
    """Stable per-row sort order (descending keeps ties in their original order)."""
    return np.argsort(-a if descending else a, axis=-1, kind="stable")

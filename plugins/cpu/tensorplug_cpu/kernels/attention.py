"""soft_max (with mask and ALiBi), rope (with YaRN) and flash_attn_ext, as ggml computes them.

The per-token work is vectorised over whole tensors, but the float32 arithmetic is
ggml's: the rope angle of pair ``i`` is built by repeated multiplication by
``theta_scale`` exactly like ``ggml_rope_cache_init``, the YaRN ramp uses
``ggml_rope_yarn_corr_dims``, softmax sums accumulate in float64 like
``ggml_vec_soft_max_f32``, and fully masked attention rows give zeros like ggml's
``S == 0`` guard.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.opcodes import RopeMode
from tensorplug.opmath import rope_yarn_corr_dims
from tensorplug.types import Type

from ..settings import EXACT_ATTENTION_ROWS
from ..workers import POOL
from .activations import round_rows
from .attention_mask import masked_logits
from .cache_decode import decoded_cells, is_quantized_cache
from .common import F32, BuildContext, Step, padded4, sequence
from .flash import build_online_attention
from .kernel_shapes import DOT_LANES, HALF_PRODUCTS, NARROW_SCORES, TINYBLAS_LANES
from .numpy_kernels import scaled_softmax

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .provider import Kernels

__all__ = ["build_flash_attn_ext", "build_rope", "build_soft_max"]

#: Largest attention score block computed at once, in float32 elements (32 MiB).
SCORE_ELEMS = 1 << 23


def build_soft_max(node: Tensor, ctx: BuildContext) -> Step:
    """``softmax(a·scale + slope·mask)`` per row, as ``ggml_compute_forward_soft_max_f32``."""
    a_t = node.src[0]
    a4, out4 = padded4(ctx.view(a_t)), padded4(ctx.view(node))
    scale = F32.type(node.op_params["scale"])
    max_bias = node.op_params.get("max_bias", 0.0)
    mask_t = node.src[1] if len(node.src) > 1 else None
    term, prep = masked_logits(ctx, mask_t, a4.shape[2], a4.shape, max_bias)
    w = ctx.scratch(a4.shape)
    rows = (*a4.shape[:-1], 1)
    peak, acc, inv = ctx.scratch(rows), ctx.scratch(rows, np.float64), ctx.scratch(rows)

    def run() -> None:
        np.multiply(a4, scale, out=w)
        if term is not None:
            np.add(w, term, out=w)
        np.max(w, axis=-1, keepdims=True, out=peak)
        np.subtract(w, peak, out=w)
        np.exp(w, out=w)
        np.sum(w, axis=-1, keepdims=True, dtype=np.float64, out=acc)
        np.divide(1.0, acc, out=acc)
        np.copyto(inv, acc, casting="same_kind")
        np.multiply(w, inv, out=out4)

    return sequence(prep, run)


# -- rope ---------------------------------------------------------------------------------


def build_rope(node: Tensor, ctx: BuildContext) -> Step:
    """Rotary embedding over ``(…, n_tokens, n_head, head_dim)``, ggml's ``rope_f32``:
    the op's scalars in float32 as ggml derives them (YaRN's ramp from
    ``ggml_rope_yarn_corr_dims``), the rotation the provider's."""
    a_t, pos_t = node.src[0], node.src[1]
    p = node.op_params
    n_dims = p["n_dims"]
    half = n_dims // 2
    x, load = ctx.f32_in(a_t)
    out, store = ctx.f32_out(node)
    pos = ctx.view(pos_t)
    ff = ctx.view(node.src[2]) if len(node.src) > 2 else None

    f = F32.type
    theta_scale = f(p["freq_base"]) ** f(-2.0 / n_dims)
    freq_scale, ext_factor = f(p["freq_scale"]), f(p["ext_factor"])
    mscale = f(p["attn_factor"])
    ramp_mix = keep = None
    if ext_factor != 0:
        low, high = rope_yarn_corr_dims(
            n_dims, p["n_ctx_orig"], p["freq_base"], p["beta_fast"], p["beta_slow"]
        )
        y = (np.arange(half, dtype=F32) - f(low)) / max(f(0.001), f(high) - f(low))
        ramp_mix = ((f(1) - np.minimum(f(1), np.maximum(f(0), y))) * ext_factor).astype(F32)
        keep = (f(1) - ramp_mix).astype(F32)
        mscale = mscale * (f(1) + f(0.1) * np.log(f(1) / freq_scale))

    neox = RopeMode(p["mode"]) == RopeMode.NEOX
    rope = ctx.kernels.bind_rope(x, out, pos, ff, ramp_mix, keep, neox, n_dims,
                                 (theta_scale, freq_scale, mscale), ctx.scratch)  # fmt: skip
    return sequence(load, rope, store)


# -- flash attention ---------------------------------------------------------------------------


def exact_rows_limit() -> int:
    """The query rows up to which flash attention runs in the numba kernel when there is
    one: llama.cpp's arithmetic to the bit (``_numba_attention.attend``), the same bits
    for a row whatever the other rows of the step. By default every step (though on a
    prompt's many rows the exact kernel is slower than BLAS); the setting
    ``TENSORPLUG_CPU_EXACT_ATTENTION_ROWS`` lowers it, and steps above it take BLAS's
    batched products, an ulp from ggml's sums and rounded by the step's row count. Read
    when a graph's plan is built."""
    return EXACT_ATTENTION_ROWS.get()


def weights_v_lanes(n_q: int, ggml_order: bool) -> int:
    """The lanes the exact kernel sums a row's weights·V product in: with ``ggml_order``
    (``CpuBackend.ggml_order``) ggml's own choice for a step of ``n_q`` query rows,
    tinyBLAS's 16 from two rows on, else ggml_vec_dot_f32's 64 whatever the step (a
    row's bits then do not depend on the rows beside it)."""
    if ggml_order and n_q >= 2:
        return TINYBLAS_LANES
    return DOT_LANES


def products(n_q: int, ggml_order: bool, half: bool, head_dim: int) -> int:
    """The exact kernel's ``lanes`` for a step of ``n_q`` query rows over a cache whose
    K and V are F16 (``half``) or float32: llama.cpp's products as llama-cpp-python runs
    them (no flash attention). A float32 cache: K·Q by ``ggml_vec_dot_f32`` and
    weights·V by :func:`weights_v_lanes`. An F16 cache (both libraries' default): ggml
    rounds the query and the weights to f16 (:data:`HALF_PRODUCTS`), and with
    ``ggml_order`` from two rows on takes tinyBLAS for K·Q as well
    (:data:`NARROW_SCORES`, where the head size is a multiple of its 16 lanes; else
    ``ggml_vec_dot_f16``). The roundings depend on nothing but the row, so a
    batch-invariant backend keeps them and only the orders stay one token's."""
    lanes = weights_v_lanes(n_q, ggml_order)
    if not half:
        return lanes
    narrow = ggml_order and n_q >= 2 and head_dim % TINYBLAS_LANES == 0
    return lanes | HALF_PRODUCTS | (NARROW_SCORES if narrow else 0)


def build_flash_attn_ext(node: Tensor, ctx: BuildContext) -> Step:
    """``softmax(q·kᵀ·scale (softcapped) + slope·mask)·v``; result ``(B, n_q, H, D_v)``.

    Query heads are grouped onto their KV head by splitting the head axis (a view), so
    every product is one batched BLAS call. Query rows are processed in chunks so the
    score block stays under :data:`SCORE_ELEMS`.

    Only the cache rows in use are read: a runner pads ``n_kv`` (to reuse graphs) and
    masks the padding with -inf, and columns that are -inf for every query contribute
    exactly nothing, so each run finds the last column any query can see and computes
    (and widens F16/BF16 K and V) up to it — as ggml's kernel skips -inf entries.

    The exact kernel sums a row's visible cells in the op's ``order`` (src 4) when it has
    one, by position in the engine's cache; BLAS's products have their own order.
    """
    q_t, k_t, v_t = node.src[:3]
    quantized = is_quantized_cache(k_t, v_t)
    if node.op_params.get("online") or quantized:
        # ggml's own flash attention kernel's arithmetic (the only one a quantized V
        # has in llama.cpp, whose graph without it refuses one)
        online = build_online_attention(node, ctx)
        if online is not None:
            return online
    mask_t = node.src[3] if len(node.src) > 3 else None
    order = ctx.view(node.src[4]) if len(node.src) > 4 else _CACHE_ORDER
    p = node.op_params
    scale, softcap = F32.type(p["scale"]), F32.type(p.get("logit_softcap", 0.0))
    max_bias = p.get("max_bias", 0.0)
    if softcap != 0:
        scale = scale / softcap
    q4 = padded4(ctx.view(q_t))
    B, H, n_q, _ = q4.shape
    n_kv = k_t.shape[-2]
    term, prep = masked_logits(ctx, mask_t, n_q, (B, H, n_q, n_kv), max_bias)
    mask4 = padded4(ctx.view(mask_t))[:, :, :n_q, :n_kv] if mask_t is not None else None
    # the mask as the numba kernels read it: raw halves, in place
    raw_mask = None
    if mask4 is not None:
        raw_mask = mask4.view(np.uint16) if mask4.dtype == np.float16 else mask4
    compiled, kernels = ctx.compiled, ctx.kernels
    exact_ok = k_t.type == v_t.type and k_t.type in (Type.F32, Type.F16)
    if compiled is not None and n_q <= exact_rows_limit() and exact_ok:
        # F16 caches are read in place as raw halves: no widening step at all
        k_in, v_in = padded4(ctx.view(k_t)), padded4(ctx.view(v_t))
        if k_t.type == Type.F16:
            k_in, v_in = k_in.view(np.uint16), v_in.view(np.uint16)
        out4 = padded4(ctx.view(node))
        no_mask = np.zeros((0, 0, 0, 0), np.float32)
        # One array layout for every step, so numba compiles the kernel once: a prompt's
        # q (a permuted view) is strided where a generated token's is contiguous, and
        # each layout would be a compile of its own, a long one in a first run. The
        # kernel reads mask columns below ``used`` only, so the mask goes unsliced.
        q_in = q4 if q4.flags.c_contiguous else ctx.scratch(q4.shape)
        bias = no_mask if term is None else term
        if bias.dtype == np.float16:
            bias = bias.view(np.uint16)  # read in place through the f16 table
        copy_q = None if q_in is q4 else partial(np.copyto, q_in, q4)
        lanes = products(n_q, ctx.ggml_order, k_t.type == Type.F16, q4.shape[3])
        attend = compiled.bind_attend(q_in, k_in, v_in, raw_mask, bias, order, float(scale),
                                      float(softcap), lanes, out4)  # fmt: skip
        return sequence(prep, copy_q, attend)

    # the batched products below, on K and V widened to float32 (only here: the exact
    # kernel above reads the cache as it is; otherwise a new plan of SmolLM2 would bind
    # the widening of every layer's K and V for nothing, 30 × 2 views, scratch and kernel
    # bindings)
    ctx.uses_blas = True
    k4, widen_k = _widened(ctx, k_t)
    v4, widen_v = _widened(ctx, v_t)
    half = k_t.type == v_t.type == Type.F16  # the query and the weights in f16, as HALF_PRODUCTS
    if half:
        q16, q4 = ctx.scratch(q4.shape, np.float16), ctx.scratch(q4.shape)
        q_rounded = (partial(np.copyto, q16, padded4(ctx.view(q_t))), partial(np.copyto, q4, q16))
        prep = sequence(prep, *q_rounded)
    elif quantized:  # the query as K's vec_dot_type has it (cache_decode)
        q_raw, q4 = q4, ctx.scratch(q4.shape)
        prep = sequence(prep, partial(round_rows, q_raw, k_t.type, q4))
    h_kv, d_v = k4.shape[1], v4.shape[3]
    g = H // h_kv
    kT5 = k4.swapaxes(-1, -2)[:, :, None]  # (B, H_kv, 1, D, n_kv)
    v5 = v4[:, :, None]  # (B, H_kv, 1, n_kv, D_v)
    # (B, n_q, H, D_v) seen as (B, H_kv, g, n_q, D_v): a transpose and an axis split
    out5 = padded4(ctx.view(node)).transpose(0, 2, 1, 3).reshape(B, h_kv, g, n_q, d_v)
    if term is not None and term.dtype != F32:
        # an F16 mask added as is costs numpy a slow mixed-type loop per chunk: widen once
        raw_term, term = term, ctx.scratch(term.shape)
        # term is the mask itself here: 4-d, all its rows
        prep = sequence(prep, partial(kernels.bind_widen_f16_rows(raw_term, term),
                                      raw_term.shape[2]))  # fmt: skip
    step = max(1, min(n_q, SCORE_ELEMS // max(1, B * H * n_kv)))
    s_full = ctx.scratch((B, h_kv, g, step, n_kv))
    o_full = ctx.scratch((B, h_kv, g, step, d_v))
    row_full = ctx.scratch((B, h_kv, g, step, 1))
    chunks = []
    for r0 in range(0, n_q, step):
        r1 = min(n_q, r0 + step)
        n = r1 - r0
        s5 = s_full[:, :, :, :n]
        mterm = None
        if term is not None:
            t4 = term[:, :, r0:r1]
            # (Bm, Hm, n, n_kv) → 5-d matching s5: split the head axis when it is full
            mterm = (
                t4.reshape(t4.shape[0], h_kv, g, n, n_kv) if t4.shape[1] == H else t4[:, :, None]
            )
        q5 = q4[:, :, r0:r1].reshape(B, h_kv, g, n, q4.shape[3])
        chunks.append(
            (q5, s5, mterm, row_full[:, :, :, :n], o_full[:, :, :, :n], out5[:, :, :, r0:r1])
        )

    if raw_mask is None:
        visible: Callable[[], int] = lambda: n_kv  # noqa: E731
    else:
        visible = partial(kernels.visible_columns, raw_mask)

    def run() -> None:
        used = visible()
        if widen_k is not None:
            widen_k(used)
        if widen_v is not None:
            widen_v(used)
        kT, v = kT5[..., :used], v5[:, :, :, :used]
        for chunk in chunks:
            # one task per KV head (its group of query heads batched), on the worker pool
            POOL.run(h_kv, partial(_attend_group, chunk, kT, v, used, scale, softcap, half,
                                   kernels))  # fmt: skip

    return sequence(prep, run)


def _attend_group(
    chunk: tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, np.ndarray],
    kT: np.ndarray,
    v: np.ndarray,
    used: int,
    scale: np.float32,
    softcap: np.float32,
    half: bool,
    kernels: Kernels,
    h: int,
    slot: int,
) -> None:
    """KV head ``h`` and its query heads for a chunk of query rows: scores, softmax,
    times V (5-d operands ``(B, H_kv, g, …)``; a mask term may have 1 for head axes),
    with ``half`` the weights rounded to f16 before their product with V. The softmax
    is the provider's by rows where its contract takes the block (one sequence, no
    softcap, a float32 mask: numba's is one pass), else numpy's whole-block passes."""
    q5, s_all, m_all, row_all, o_all, dst_all = chunk
    head = slice(h, h + 1)
    s = s_all[:, head, :, :, :used]
    row, o = row_all[:, head], o_all[:, head]
    np.matmul(q5[:, head], kT[:, head], out=s)
    mask_ok = m_all is None or (m_all.shape[0] == 1 and m_all.dtype == np.float32)
    if softcap == 0 and s.shape[0] == 1 and mask_ok:
        # whole rows of the scratch and the mask (unit stride), `used` columns read
        mask3 = _NO_MASK3 if m_all is None else m_all[0, h if m_all.shape[1] > 1 else 0]
        kernels.softmax_rows(s_all[0, h], mask3, used, float(scale), row[0, 0, :, :, 0])
    else:
        term = None
        if m_all is not None:
            term = m_all[:, head if m_all.shape[1] > 1 else slice(None), ..., :used]
        scaled_softmax(s, term, row, scale, softcap)
    _weighted(s, row, v[:, head], o, half)
    np.copyto(dst_all[:, head], o)


def _weighted(e: np.ndarray, inv: np.ndarray, v: np.ndarray, o: np.ndarray, half: bool) -> None:
    """``o = (e·inv)·v`` for exponentials ``e`` and their rows' reciprocal sums ``inv``:
    with ``half`` the weights ``e·inv`` rounded to f16 first (as ggml's product with an
    F16 V), else the normalization applied to the product."""
    if half:
        e *= inv
        np.copyto(e, e.astype(np.float16))
        np.matmul(e, v, out=o)
        return
    np.matmul(e, v, out=o)
    o *= inv


_NO_MASK3 = np.zeros((0, 0, 0), np.float32)
#: no ``order``: the exact kernel sums in cache order
_CACHE_ORDER = np.zeros(0, np.int32)


def _widened(ctx: BuildContext, t: Tensor) -> tuple[np.ndarray, Callable[[int], None] | None]:
    """K or V as float32 ``(B, H, n_kv, D)`` and, for F16/BF16, a function widening the
    first ``used`` rows into it (the rest of the scratch is never read); a quantized
    cache's function decodes every cell (:mod:`.cache_decode`)."""
    if t.type.is_quantized:
        decoded, decode = decoded_cells(ctx, t)

        def every_cell(used: int) -> None:
            decode()

        return decoded, every_cell
    raw = padded4(ctx.view(t))
    if t.type == Type.F32:
        return raw, None
    buf = padded4(ctx.scratch(t.shape))
    if t.type == Type.F16:
        return buf, ctx.kernels.bind_widen_f16_rows(raw, buf)
    if t.type == Type.BF16:
        bits = buf.view(np.uint32)
        return buf, lambda used: np.left_shift(
            raw[:, :, :used], 16, out=bits[:, :, :used], dtype=np.uint32
        )
    raise AssertionError(f"flash_attn_ext: {t.describe()} is not a float tensor")

"""The neural-network ops: normalisation, matrix products (mul_mat, mul_mat_id),
softmax, rope and fused attention."""

from __future__ import annotations

from ..errors import OpParamError
from ..opcodes import Op, RopeMode
from ..tensor import Tensor
from ..types import Type
from ._build import (
    CACHE_TYPES,
    FLOAT_TYPES,
    WEIGHT_TYPES,
    check_type,
    checked_eps,
    enum_member,
    fail,
    new_result,
    padded,
)
from .elementwise import add, mul

# -- normalisation -------------------------------------------------------------------------


def norm(a: Tensor, eps: float) -> Tensor:
    """Per row: ``(x - mean(x)) / sqrt(var(x) + eps)`` (population variance)."""
    check_type("norm", "a", a, FLOAT_TYPES)
    return new_result(a.type, a.shape, Op.NORM, (a,), {"eps": checked_eps("norm", eps)})


def layer_norm(a: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm: ``norm(a, eps)·weight + bias``, either factor optional.

    ggml has no fused op for this (llama.cpp composes ``ggml_norm``, ``ggml_mul`` and
    ``ggml_add``); this helper does the same, so each backend sees only ops it already
    has, and ``weight``/``bias`` broadcast (or tile) as :func:`mul` and :func:`add` say.
    """
    out = norm(a, eps)
    if weight is not None:
        out = mul(out, weight)
    if bias is not None:
        out = add(out, bias)
    return out


def rms_norm(a: Tensor, eps: float) -> Tensor:
    """Per row: ``x / sqrt(mean(x²) + eps)``, as llama's RMSNorm before its weight."""
    check_type("rms_norm", "a", a, FLOAT_TYPES)
    return new_result(a.type, a.shape, Op.RMS_NORM, (a,), {"eps": checked_eps("rms_norm", eps)})


# -- matrix products and attention -----------------------------------------------------------


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """``b · aᵀ`` per batch (``ggml_mul_mat``): the result is F32.

    ``a`` is the weight ``(…, n_out, n_in)`` of any float or quantized type; ``b`` the
    activations ``(…, n_tokens, n_in)`` in a float type. Result ``(…, n_tokens, n_out)``
    with ``out[..., t, o] = Σᵢ b[..., t, i] · a[..., o, i]``. Batch axes (the first
    two of four) of ``a`` are repeated onto ``b``'s: each of ``b``'s batch extents must
    be a multiple of ``a``'s, and batch ``j`` of ``b`` uses batch ``j // (nb/na)`` of
    ``a`` (consecutive query heads share a KV head, as grouped-query attention needs).
    ``a`` must have dense rows (quantized rows are read block by block).
    """
    check_type("mul_mat", "a", a, WEIGHT_TYPES)
    check_type("mul_mat", "b", b, FLOAT_TYPES)
    if a.shape[-1] != b.shape[-1]:
        raise fail(
            "mul_mat",
            f"a {a.describe()} and b {b.describe()} must share their last (n_in) dimension",
        )
    if a.type.is_quantized and not a.rows_contiguous:
        raise fail("mul_mat", f"quantized a {a.describe()} must have dense rows")
    ndim = max(a.ndim, b.ndim, 2)
    pa, pb = padded(a.shape, ndim), padded(b.shape, ndim)
    for da, db in zip(pa[:-2], pb[:-2], strict=True):
        if db % da:
            raise fail(
                "mul_mat",
                f"batch dimensions of b {b.describe()} must be multiples of a's {a.describe()}",
            )
    return new_result(Type.F32, (*pb[:-2], pb[-2], pa[-2])[-ndim:], Op.MUL_MAT, (a, b))


def mul_mat_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Mixture-of-experts product: each token's rows meet the experts it chose
    (``ggml_mul_mat_id``). The result is F32.

    ``a`` stacks the experts' weights, ``(n_expert, n_out, n_in)`` (ggml ``[n_in, n_out,
    n_expert]``), any float or quantized type with dense rows; ``b`` is the activations
    ``(n_tokens, n_b, n_in)`` in a float type, where ``n_b`` divides ``n_used`` (1: one
    row per token shared by all its experts, or ``n_used``: a row per slot); ``ids`` is
    I32 ``(n_tokens, n_used)``, expert indices in ``[0, n_expert)``. Result ``(n_tokens,
    n_used, n_out)`` with ``out[t, e, :] = a[ids[t, e]] · b[t, e % n_b, :]``. An index
    outside ``[0, n_expert)`` is an :class:`~tensorplug.OutOfBoundsError` when computed.
    """
    check_type("mul_mat_id", "a", a, WEIGHT_TYPES)
    check_type("mul_mat_id", "b", b, FLOAT_TYPES)
    check_type("mul_mat_id", "ids", ids, {Type.I32})
    if a.ndim != 3 or b.ndim != 3 or ids.ndim != 2:
        raise fail(
            "mul_mat_id",
            f"expected a (n_expert, n_out, n_in), b (n_tokens, n_b, n_in) and ids (n_tokens, "
            f"n_used); got a {a.describe()}, b {b.describe()}, ids {ids.describe()}",
        )
    if a.shape[-1] != b.shape[-1]:
        raise fail(
            "mul_mat_id", f"a {a.describe()} and b {b.describe()} must share their last (n_in) axis"
        )
    if ids.shape[0] != b.shape[0]:
        raise fail(
            "mul_mat_id", f"ids {ids.describe()} needs one row per token of b {b.describe()}"
        )
    if ids.shape[1] % b.shape[1]:
        raise fail(
            "mul_mat_id",
            f"b's rows per token ({b.shape[1]}) must divide the experts used per token "
            f"({ids.shape[1]})",
        )
    if not a.rows_contiguous:
        raise fail("mul_mat_id", f"a {a.describe()} must have dense rows")
    return new_result(Type.F32, (b.shape[0], ids.shape[1], a.shape[1]), Op.MUL_MAT_ID, (a, b, ids))


def soft_max(
    a: Tensor, mask: Tensor | None = None, scale: float = 1.0, max_bias: float = 0.0
) -> Tensor:
    """Row-wise softmax of ``a·scale + slope·mask`` (``ggml_soft_max_ext``).

    ``a`` is F32 ``(…, rows, n)``. ``mask`` (F32 or F16) has last axis ``n``, at least
    ``rows`` rows (row ``r`` of ``a`` uses mask row ``r``), and outer axes that divide
    ``a``'s: head ``h`` of ``a`` uses mask head ``h % n_mask_heads`` (ggml's ``i02 %
    ne12``; 2 mask heads serve 4 heads as 0, 1, 0, 1), the same for the batch axis.
    ``slope`` is 1 unless ``max_bias > 0`` (ALiBi): then for head ``h``
    (``a``'s third-from-last axis, ``n_head`` heads), with ``m = 2^⌊log2 n_head⌋``,
    ``slope = 2^(-max_bias/m)^(h+1)`` for ``h < m`` else
    ``2^(-max_bias/(2m))^(2(h-m)+1)``. ``-inf`` mask entries give weight 0.
    """
    check_type("soft_max", "a", a, {Type.F32})
    params = {"scale": float(scale), "max_bias": float(max_bias)}
    if mask is None:
        if max_bias > 0:
            raise fail("soft_max", "max_bias (ALiBi) needs a mask to add the bias to")
        return new_result(Type.F32, a.shape, Op.SOFT_MAX, (a,), params)
    check_type("soft_max", "mask", mask, {Type.F32, Type.F16})
    if mask.ndim < 2 or mask.shape[-1] != a.shape[-1] or mask.shape[-2] < padded(a.shape)[-2]:
        raise fail(
            "soft_max",
            f"mask {mask.describe()} must be (…, >= {padded(a.shape)[-2]}, {a.shape[-1]}) "
            f"for a {a.describe()}",
        )
    if mask.ndim > max(a.ndim, 2) or any(
        da % dm for da, dm in zip(padded(a.shape)[:-2], padded(mask.shape)[:-2], strict=True)
    ):
        raise fail("soft_max", f"mask {mask.describe()} outer axes must divide a's {a.describe()}")
    return new_result(Type.F32, a.shape, Op.SOFT_MAX, (a, mask), params)


def rope(
    a: Tensor,
    pos: Tensor,
    n_dims: int,
    mode: RopeMode | int = RopeMode.NORMAL,
    *,
    freq_base: float = 10000.0,
    freq_scale: float = 1.0,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    n_ctx_orig: int = 0,
    freq_factors: Tensor | None = None,
) -> Tensor:
    """Rotary position embedding with YaRN scaling (``ggml_rope_ext``).

    ``a`` is ``(…, n_tokens, n_head, head_dim)`` (ggml ``[head_dim, n_head, n_tokens]``)
    in F32 or F16; ``pos`` is I32 ``(n_tokens,)``. The first ``n_dims`` (even, at most
    ``head_dim``) values of each head are rotated, the rest copied. For pair ``i`` in
    ``0 .. n_dims/2``: ``θ = pos · freq_base^(-2i/n_dims) / ff[i]`` (``ff`` =
    ``freq_factors``, F32 ``(n_dims/2,)``, or 1) and the pair is rotated by the YaRN
    angle and magnitude of ggml's ``rope_yarn(θ, freq_scale, corr_dims, i, ext_factor,
    attn_factor)``: ``θ_i = freq_scale·θ`` mixed towards ``θ`` by the ramp between the
    correction dims from ``beta_fast``/``beta_slow``/``n_ctx_orig`` when ``ext_factor``
    ≠ 0, and ``mscale = attn_factor·(1 + 0.1·ln(1/freq_scale))`` in that case, else
    ``attn_factor``. NORMAL mode pairs ``(x[2i], x[2i+1])``; NEOX mode pairs
    ``(x[i], x[i + n_dims/2])``. Rotation: ``(x0·cos - x1·sin, x0·sin + x1·cos)·mscale``.
    """
    check_type("rope", "a", a, {Type.F32, Type.F16})
    check_type("rope", "pos", pos, {Type.I32})
    mode = enum_member("rope", "mode", RopeMode, mode)
    if a.ndim < 3:
        raise fail("rope", f"a {a.describe()} must be (…, n_tokens, n_head, head_dim)")
    if pos.ndim != 1 or pos.shape[0] != a.shape[-3]:
        raise fail("rope", f"pos {pos.describe()} must be ({a.shape[-3]},): one position per token")
    if n_dims <= 0 or n_dims % 2 or n_dims > a.shape[-1]:
        raise fail(
            "rope", f"n_dims={n_dims} must be even, positive and at most head_dim={a.shape[-1]}"
        )
    src: tuple[Tensor, ...] = (a, pos)
    if freq_factors is not None:
        check_type("rope", "freq_factors", freq_factors, {Type.F32})
        if freq_factors.shape != (n_dims // 2,):
            raise fail("rope", f"freq_factors {freq_factors.describe()} must be ({n_dims // 2},)")
        src = (a, pos, freq_factors)
    params = {
        "n_dims": int(n_dims), "mode": mode, "freq_base": float(freq_base),
        "freq_scale": float(freq_scale), "ext_factor": float(ext_factor),
        "attn_factor": float(attn_factor), "beta_fast": float(beta_fast),
        "beta_slow": float(beta_slow), "n_ctx_orig": int(n_ctx_orig),
    }  # fmt: skip
    return new_result(a.type, a.shape, Op.ROPE, src, params)


def flash_attn_ext(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float = 1.0,
    max_bias: float = 0.0,
    logit_softcap: float = 0.0,
    order: Tensor | None = None,
    online: bool = False,
) -> Tensor:
    """Fused attention ``softmax(q·kᵀ·scale + mask)·v`` (``ggml_flash_attn_ext``).

    ``q`` ``(B, H, n_q, D)`` F32; ``k`` ``(B, H_kv, n_kv, D)`` and ``v``
    ``(B, H_kv, n_kv, D_v)`` in F32, F16 or BF16, the same type, or a quantized cache
    (contract 1.4: either in Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL, each in its own
    type, as llama.cpp's ``-ctk``/``-ctv`` store them; the query is rounded as K's type
    rounds a product's activations), ``H`` a multiple of ``H_kv`` (query head
    ``h`` uses KV head ``h // (H/H_kv)``); ``mask`` F16 or F32 ``(…, >= n_q, n_kv)``
    with outer axes 1 or matching. With ``logit_softcap`` ``c > 0`` the logits are
    ``c·tanh(logits/c)`` before the mask; ``max_bias`` applies ALiBi as in
    :func:`soft_max`. The result is F32 ``(B, n_q, H, D_v)`` — heads and tokens swapped
    relative to ``q``, as in ggml, so it reshapes directly to ``(B, n_q, H·D_v)``.
    Leading batch axes may be omitted (3-d operands).

    ``order`` (tensorplug's, not ggml's; needs a mask) is an I32 ``(n_kv,)`` permutation
    of the cache rows: the order in which a backend that sums in a fixed order adds
    their terms (the CPU's exact kernel; others may ignore it: the sum is the same up
    to rounding). A unified cache passes its cells sorted by position, so a row's bits
    do not depend on where its cells lie.

    ``online`` (tensorplug's) asks a backend that follows one of ggml's arithmetics for
    that of ggml's own flash attention kernel (an online softmax; an F16 V accumulated
    in f16) rather than that of llama.cpp's graph without flash attention
    (``mul_mat``, ``soft_max_ext``, ``mul_mat``): the same function up to rounding.
    """
    check_type("flash_attn_ext", "q", q, {Type.F32})
    check_type("flash_attn_ext", "k", k, CACHE_TYPES)
    check_type("flash_attn_ext", "v", v, CACHE_TYPES)
    if not (k.type.is_quantized or v.type.is_quantized):
        check_type("flash_attn_ext", "v (as k is not quantized)", v, {k.type})
    if not 3 <= q.ndim == k.ndim == v.ndim:
        raise fail(
            "flash_attn_ext",
            f"q, k and v must all be 3-d or 4-d (…, heads, tokens, dim); got {q.describe()}, "
            f"{k.describe()}, {v.describe()}",
        )
    pq, pk, pv = padded(q.shape), padded(k.shape), padded(v.shape)
    if pk[-1] != pq[-1] or pk[-2] != pv[-2] or pk[:-3] != pq[:-3] or pv[:-2] != pk[:-2]:
        raise fail(
            "flash_attn_ext",
            f"shapes do not agree: q {q.describe()}, k {k.describe()}, v {v.describe()} "
            "(q/k share head dim; k/v share batch, heads and n_kv)",
        )
    if pq[-3] % pk[-3]:
        raise fail("flash_attn_ext", f"q heads {pq[-3]} must be a multiple of k/v heads {pk[-3]}")
    src: tuple[Tensor, ...] = (q, k, v)
    if mask is not None:
        check_type("flash_attn_ext", "mask", mask, {Type.F32, Type.F16})
        pm = padded(mask.shape)
        if mask.shape[-1] != pk[-2] or pm[-2] < pq[-2]:
            raise fail(
                "flash_attn_ext",
                f"mask {mask.describe()} must be (…, >= {pq[-2]}, {pk[-2]})",
            )
        if any(dm not in (1, dq) for dq, dm in zip(pq[:-2], pm[:-2], strict=True)):
            raise fail("flash_attn_ext", f"mask {mask.describe()} outer axes must be 1 or match q")
        src = (q, k, v, mask)
    elif max_bias > 0:
        raise fail("flash_attn_ext", "max_bias (ALiBi) needs a mask")
    if order is not None:
        if mask is None:
            raise fail("flash_attn_ext", "an order needs a mask (pass one of zeros)")
        check_type("flash_attn_ext", "order", order, {Type.I32})
        if order.shape != (pk[-2],):
            raise fail(
                "flash_attn_ext", f"order {order.describe()} must be ({pk[-2]},): one per k row"
            )
        src = (*src, order)
    out_shape = (*pq[:-3], pq[-2], pq[-3], pv[-1])[-q.ndim :]
    params = {"scale": float(scale), "max_bias": float(max_bias),
              "logit_softcap": float(logit_softcap), "online": bool(online)}  # fmt: skip
    return new_result(Type.F32, out_shape, Op.FLASH_ATTN_EXT, src, params)


def hadamard(a: Tensor, n: int) -> Tensor:
    """Each run of ``n`` values along ``a``'s rows times the orthonormal Walsh–Hadamard
    matrix ``H_n/√n`` (Sylvester's order: entry ``(i, j)`` is ``(−1)^popcount(i & j)/√n``).

    llama.cpp rotates the queries, keys and values of a quantized KV cache by this matrix
    (``llama_mul_mat_hadamard``: a ``mul_mat`` its CPU computes as a fast transform),
    which spreads each head's outliers before the cache quantizes it; the matrix is its
    own inverse, so a second rotation of the attention output undoes V's. ``a`` F32 of
    any layout, ``n`` a power of two from 2 dividing ``a``'s last extent. The result is
    F32 of ``a``'s shape, contiguous. ggml's arithmetic: each value times
    ``1/sqrtf(n)``, then the butterflies ``(u + v, u − v)`` over spans 1, 2, 4… n/2.
    """
    check_type("hadamard", "a", a, {Type.F32})
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n & (n - 1):
        raise OpParamError(f"hadamard: n must be a power of two from 2, got {n!r}")
    if a.shape[-1] % n:
        raise fail("hadamard", f"n={n} must divide the rows of {a.describe()}")
    return new_result(Type.F32, a.shape, Op.HADAMARD, (a,), {"n": n})

"""Catalogue families for the attention-shaped ops: mul_mat, soft_max, rope, flash_attn_ext.

The quantized ``mul_mat`` matrix runs every weight type (float and quantized) against
token batches of 1 (decode), 7 (odd, below any tile), 32 and 129 (one past a tile
multiple), with an odd number of output rows. Batched and broadcast products
(grouped-query shapes), permuted batches and strided activations follow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from .. import ops
from ..opcodes import Op, RopeMode
from ..tensor import Tensor
from ..types import Type
from .cases import Case, InitFn, Inputs, causal_mask, positions, random_mask, uniform
from .operands import FLOAT_TYPES, QUANT_TYPES, Layout, Shape, leaf, make, strided, transposed

__all__ = ["FAMILIES", "MUL_MAT_BATCHES"]

#: Token batches of the quantized mul_mat matrix.
MUL_MAT_BATCHES = (1, 7, 32, 129)


def swapped_batch(ins: Inputs, t: Type, shape: Shape, init: InitFn | None = None) -> Tensor:
    """A ``(B, R, K)`` tensor stored as ``(R, B, K)``: dense rows, permuted batch axis."""
    base = ins.new(t, (shape[-2], shape[-3], shape[-1]), init)
    return ops.permute(base, (1, 0, 2))


# -- mul_mat -------------------------------------------------------------------------------------


def mm_build(
    a: Layout, ta: Type, a_shape: Shape, b: Layout, tb: Type, b_shape: Shape, ins: Inputs
) -> Tensor:
    return ops.mul_mat(a(ins, ta, a_shape), b(ins, tb, b_shape))


def _mm(
    quick: bool,
    a: Layout,
    ta: Type,
    a_shape: Shape,
    b: Layout,
    tb: Type,
    b_shape: Shape,
    **extra: Any,
) -> Case:
    build = partial(mm_build, a, ta, a_shape, b, tb, b_shape)
    return make(Op.MUL_MAT, build, quick, type_a=ta, type_b=tb, a=a_shape, b=b_shape, **extra)


def _mul_mat() -> Iterator[Case]:
    f32 = Type.F32
    for (m, k), quick in (((33, 64), True), ((67, 256), False)):
        for t in (*FLOAT_TYPES, *QUANT_TYPES):
            for n in MUL_MAT_BATCHES:
                yield _mm(quick, leaf, t, (m, k), leaf, f32, (n, k))
    for t in (Type.F32, Type.F16, Type.Q8_0, Type.Q4_0):
        quick = t in (Type.F32, Type.Q4_0)
        yield _mm(quick, leaf, t, (2, 1, 16, 64), leaf, f32, (2, 3, 5, 64))
        yield _mm(quick, leaf, t, (1, 2, 16, 64), leaf, f32, (1, 6, 5, 64))  # GQA: 3 per head
        yield _mm(False, leaf, t, (3, 16, 64), leaf, f32, (3, 5, 64))
        yield _mm(False, leaf, t, (16, 64), leaf, f32, (2, 3, 5, 64))
        yield _mm(quick, swapped_batch, t, (2, 16, 64), leaf, f32, (2, 5, 64), a_layout="swapped")
        yield _mm(quick, leaf, t, (2, 16, 64), swapped_batch, f32, (2, 5, 64), b_layout="swapped")
        yield _mm(quick, leaf, t, (16, 64), strided, f32, (7, 64), b_layout="strided")
    yield _mm(False, transposed, f32, (16, 40), leaf, f32, (7, 40), a_layout="transposed")
    yield _mm(False, leaf, f32, (16, 40), transposed, f32, (7, 40), b_layout="transposed")
    for t in (Type.F16, Type.BF16):
        yield _mm(t == Type.F16, leaf, t, (33, 64), leaf, t, (7, 64))


# -- soft_max ------------------------------------------------------------------------------------


def _softmax_build(
    a: Layout,
    shape: Shape,
    mask: tuple[Type, Shape] | None,
    scale: float,
    max_bias: float,
    ins: Inputs,
) -> Tensor:
    m = ins.new(mask[0], mask[1], random_mask()) if mask else None
    return ops.soft_max(a(ins, Type.F32, shape), m, scale, max_bias)


def _soft_max() -> Iterator[Case]:
    shape = (2, 4, 7, 33)
    variants: list[tuple[bool, Layout, Shape, tuple[Type, Shape] | None, float, float]] = [
        (True, leaf, shape, None, 1.0, 0.0),
        (True, leaf, shape, None, 0.125, 0.0),
        (True, leaf, shape, (Type.F32, (1, 1, 7, 33)), 0.125, 0.0),
        (True, leaf, shape, (Type.F16, (2, 1, 8, 33)), 1.0, 0.0),  # more mask rows than a
        (False, leaf, shape, (Type.F32, (2, 4, 7, 33)), 1.0, 0.0),
        (False, leaf, shape, (Type.F16, (7, 33)), 0.5, 0.0),
        (True, leaf, shape, (Type.F32, (1, 1, 7, 33)), 1.0, 8.0),  # ALiBi, 4 heads
        (True, leaf, (1, 6, 3, 33), (Type.F16, (1, 1, 3, 33)), 1.0, 8.0),  # 6 heads: 2nd slope
        (True, leaf, (3, 1), None, 1.0, 0.0),
        (True, leaf, (33,), None, 1.0, 0.0),
        (False, leaf, (2, 1025), (Type.F32, (2, 1025)), 1.0, 0.0),
        (True, transposed, (9, 17), None, 1.0, 0.0),
        (False, strided, (4, 5, 33), (Type.F16, (5, 33)), 1.0, 0.0),
        # fewer mask heads than heads: tiled, head h uses mask head h % 2 (ggml's i02 % ne12)
        (True, leaf, shape, (Type.F32, (1, 2, 7, 33)), 1.0, 0.0),
        (False, leaf, (2, 6, 3, 33), (Type.F16, (1, 3, 3, 33)), 1.0, 8.0),
    ]
    for quick, layout, s, mask, scale, max_bias in variants:
        extra: dict[str, Any] = {}
        if layout is not leaf:
            extra["a"] = layout.__name__
        if mask:
            extra.update(mask=mask[0], mask_shape=mask[1])
        yield make(
            Op.SOFT_MAX,
            partial(_softmax_build, layout, s, mask, scale, max_bias),
            quick,
            type=Type.F32,
            shape=s,
            scale=scale,
            max_bias=max_bias,
            **extra,
        )


# -- rope ----------------------------------------------------------------------------------------


def _qkv_view(ins: Inputs, t: Type, shape: Shape, init: InitFn | None = None) -> Tensor:
    """The K part of a fused ``(T, 3·H·D)`` QKV tensor seen as ``(T, H, D)``."""
    n_tokens, n_head, dim = shape
    sz = t.type_size
    base = ins.new(t, (n_tokens, 3 * n_head * dim), init)
    return ops.view(base, shape, (3 * n_head * dim * sz, dim * sz, sz), n_head * dim * sz)


def _rope_build(
    a: Layout,
    t: Type,
    shape: Shape,
    n_dims: int,
    mode: RopeMode,
    pos_high: int,
    with_ff: bool,
    params: dict[str, Any],
    ins: Inputs,
) -> Tensor:
    x = a(ins, t, shape)
    pos = ins.new(Type.I32, (shape[-3],), positions(pos_high))
    ff = ins.new(Type.F32, (n_dims // 2,), uniform(1.0, 4.0)) if with_ff else None
    return ops.rope(x, pos, n_dims, mode, freq_factors=ff, **params)


_YARN = {"freq_scale": 0.25, "ext_factor": 1.0, "attn_factor": 0.9, "n_ctx_orig": 512}


def _rope() -> Iterator[Case]:
    for t in (Type.F32, Type.F16):
        for mode in RopeMode:
            f32 = t == Type.F32
            variants: list[tuple[bool, Layout, Shape, int, dict[str, Any], bool, str]] = [
                (True, leaf, (5, 4, 32), 32, {}, False, ""),
                (f32, leaf, (5, 3, 40), 16, {}, False, "partial"),
                (f32 and mode == RopeMode.NORMAL, leaf, (2, 5, 4, 32), 32, {}, False, ""),
                (f32, leaf, (5, 4, 32), 32, {}, True, "freq_factors"),
                (f32, leaf, (5, 4, 32), 32, _YARN, False, "yarn"),
                (False, leaf, (6, 2, 64), 64, {"freq_base": 500000.0}, False, "base"),
                (f32, _qkv_view, (5, 4, 32), 32, {}, False, "qkv_view"),
            ]
            for quick, layout, shape, n_dims, params, with_ff, label in variants:
                build = partial(_rope_build, layout, t, shape, n_dims, mode, 256, with_ff, params)
                extra: dict[str, Any] = {"variant": label} if label else {}
                yield make(
                    Op.ROPE,
                    build,
                    quick,
                    type=t,
                    shape=shape,
                    n_dims=n_dims,
                    mode=mode.name.lower(),
                    **params,
                    **extra,
                )
    # long contexts: a real kernel evaluates the angle pos·θ_i in f32, so its absolute error
    # grows with the position. ggml's f32 recipe (θ_i as a running product of
    # freq_base^(-2/n_dims)) scores NMSE ~1e-8 on inputs like these against float64; the
    # threshold leaves room for f32 sin/cos of arguments up to 3e4 rad as well.
    build = partial(_rope_build, leaf, Type.F32, (4, 2, 32), 32, RopeMode.NEOX, 32768, False, {})
    yield make(
        Op.ROPE,
        build,
        False,
        type=Type.F32,
        shape=[4, 2, 32],
        n_dims=32,
        mode="neox",
        positions="<32768",
        max_nmse=1e-6,
    )


# -- flash attention ------------------------------------------------------------------------------


def _fa_build(
    q_shape: Shape,
    kv_heads: int,
    n_kv: int,
    d_v: int,
    kv_type: Type | tuple[Type, Type],
    mask: tuple[Type, Shape, str] | None,
    softcap: float,
    max_bias: float,
    views: bool | str,
    ins: Inputs,
) -> Tensor:
    """Attention operands; with ``views`` laid out as llama.cpp makes them: q permuted from
    ``(B, n_q, H, D)`` and k/v the first ``n_kv`` rows of a longer cache; with
    ``views="rows"`` that cache is one row per cell, every head's values side by side
    (a KV cache's own rows, seen per head through a permuted view). ``kv_type``: one
    type for both, or K's and V's (a quantized cache's may differ)."""
    *batch, n_head, n_q, dim = q_shape
    k_type, v_type = kv_type if isinstance(kv_type, tuple) else (kv_type, kv_type)
    if views == "rows":
        cells = (0, 2, 1, 3) if batch else (1, 0, 2)
        q = ops.permute(ins.new(Type.F32, (*batch, n_q, n_head, dim)), cells)
        cache_k = ins.new(k_type, (*batch, n_kv + 31, kv_heads * dim))
        cache_v = ins.new(v_type, (*batch, n_kv + 31, kv_heads * d_v))
        k = ops.permute(ops.view(cache_k, (*batch, n_kv, kv_heads, dim)), cells)
        v = ops.permute(ops.view(cache_v, (*batch, n_kv, kv_heads, d_v)), cells)
    elif views:
        q = ops.permute(ins.new(Type.F32, (*batch, n_q, n_head, dim)), (0, 2, 1, 3))
        cache_k = ins.new(k_type, (*batch, kv_heads, n_kv + 31, dim))
        cache_v = ins.new(v_type, (*batch, kv_heads, n_kv + 31, d_v))
        k = ops.view(cache_k, (*batch, kv_heads, n_kv, dim), cache_k.strides)
        v = ops.view(cache_v, (*batch, kv_heads, n_kv, d_v), cache_v.strides)
    else:
        q = ins.new(Type.F32, q_shape)
        k = ins.new(k_type, (*batch, kv_heads, n_kv, dim))
        v = ins.new(v_type, (*batch, kv_heads, n_kv, d_v))
    m = None
    if mask is not None:
        init = causal_mask(n_kv - n_q) if mask[2] == "causal" else random_mask()
        m = ins.new(mask[0], mask[1], init)
    scale = 1 / math.sqrt(dim)
    return ops.flash_attn_ext(q, k, v, m, scale, max_bias, softcap)


def _flash_attn() -> Iterator[Case]:
    f16, f32 = Type.F16, Type.F32
    Mask = tuple[Type, Shape, str] | None
    q8, q4, q5_1 = Type.Q8_0, Type.Q4_0, Type.Q5_1
    KV = Type | tuple[Type, Type]
    variants: list[tuple[bool, Shape, int, int, int, KV, Mask, float, float, bool | str]] = [
        (True, (1, 4, 7, 32), 4, 33, 32, f16, (f16, (1, 1, 7, 33), "causal"), 0.0, 0.0, False),
        (True, (1, 4, 7, 32), 4, 33, 32, f32, (f32, (1, 1, 8, 33), "random"), 0.0, 0.0, False),
        (True, (1, 4, 1, 32), 2, 33, 32, f16, (f16, (1, 1, 1, 33), "causal"), 0.0, 0.0, False),
        (True, (1, 4, 7, 32), 1, 33, 32, f16, None, 0.0, 0.0, False),
        (True, (1, 4, 7, 32), 4, 33, 16, f32, (f16, (1, 4, 7, 33), "random"), 0.0, 0.0, False),
        (True, (1, 4, 7, 32), 2, 33, 32, f16, (f16, (1, 1, 7, 33), "causal"), 2.0, 0.0, False),
        (True, (1, 4, 7, 32), 4, 33, 32, f16, (f16, (1, 1, 7, 33), "random"), 0.0, 8.0, False),
        (True, (4, 5, 32), 2, 33, 32, f16, (f16, (5, 33), "causal"), 0.0, 0.0, False),
        (True, (1, 4, 7, 32), 2, 33, 32, f16, (f16, (1, 1, 7, 33), "causal"), 0.0, 0.0, True),
        (False, (2, 8, 7, 64), 2, 256, 64, f16, (f16, (2, 1, 7, 256), "causal"), 0.0, 0.0, False),
        (False, (1, 6, 9, 40), 3, 67, 40, f16, (f32, (1, 1, 9, 67), "random"), 0.0, 8.0, False),
        (False, (1, 4, 7, 32), 2, 33, 32, Type.BF16, (f16, (1, 1, 7, 33), "causal"), 0, 0, False),
        (False, (1, 4, 32, 64), 4, 129, 64, f32, (f16, (1, 1, 32, 129), "causal"), 5.0, 0, True),
        # quantized caches (llama.cpp's -ctk/-ctv): both Q8_0, K and V apart, Q8_1 keys
        (True, (1, 4, 1, 64), 2, 33, 64, q8, (f16, (1, 1, 1, 33), "causal"), 0.0, 0.0, True),
        (True, (4, 5, 64), 2, 33, 64, q8, (f16, (5, 33), "causal"), 0.0, 0.0, "rows"),
        (True, (6, 1, 32), 3, 40, 32, (q8, q4), (f16, (1, 40), "causal"), 0, 0, "rows"),
        (True, (1, 4, 7, 64), 2, 33, 64, (q4, f16), (f16, (1, 1, 7, 33), "causal"), 0, 0, False),
        (False, (1, 4, 7, 32), 4, 40, 32, q5_1, (f16, (1, 1, 7, 40), "random"), 0.0, 8.0, True),
    ]
    for quick, q_shape, kv_heads, n_kv, d_v, kv_type, mask, softcap, max_bias, views in variants:
        extra: dict[str, Any] = {}
        if mask:
            extra.update(mask=mask[0], mask_shape=mask[1], mask_kind=mask[2])
        if views:
            extra.update(q="permuted", kv="cache_rows" if views == "rows" else "cache_view")
        if isinstance(kv_type, tuple):
            extra.update(type_k=kv_type[0], type_v=kv_type[1])
        else:
            extra.update(type_kv=kv_type)
        build = partial(
            _fa_build, q_shape, kv_heads, n_kv, d_v, kv_type, mask, softcap, max_bias, views
        )
        yield make(
            Op.FLASH_ATTN_EXT,
            build,
            quick,
            shape=q_shape,
            kv_heads=kv_heads,
            n_kv=n_kv,
            d_v=d_v,
            softcap=float(softcap),
            max_bias=float(max_bias),
            **extra,
        )


# -- hadamard --------------------------------------------------------------------------------------


def _hadamard_build(a: Layout, shape: Shape, n: int, ins: Inputs) -> Tensor:
    return ops.hadamard(a(ins, Type.F32, shape, uniform(-2, 2)), n)


def _hadamard() -> Iterator[Case]:
    """A head's rotation (64), the larger ones llama.cpp takes for K (128, 256), the
    smallest, and rows reached through strided and transposed views."""
    cases: list[tuple[bool, Layout, Shape, int]] = [
        (True, leaf, (5, 3, 64), 64),
        (True, leaf, (4, 256), 128),
        (True, strided, (3, 7, 128), 64),
        (True, transposed, (2, 16, 64), 2),
        (False, leaf, (2, 512), 256),
    ]
    for quick, layout, shape, n in cases:
        yield make(Op.HADAMARD, partial(_hadamard_build, layout, shape, n), quick,
                   shape=shape, n=n, layout=layout.__name__)  # fmt: skip


FAMILIES: list[Callable[[], Iterator[Case]]] = [
    _mul_mat, _soft_max, _rope, _flash_attn, _hadamard,
]  # fmt: skip

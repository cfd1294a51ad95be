"""Launches for the two heavy ops: mul_mat (tiled or generic) and flash_attn_ext."""

from __future__ import annotations

import numpy as np

from tensorplug.opmath import alibi_params
from tensorplug.tensor import Tensor
from tensorplug.types import Type

from .launch import Launch, Limits, dummy_args, round_up, row_launch, tensor_args
from .program import (
    MM_TILE_TYPES,
    MM_TILES,
    mm_kernel_name,
    mm_local_kernel_name,
    mv_kernel_name,
)

__all__ = [
    "encode_flash_attn",
    "encode_mul_mat",
    "flash_attn_fits",
    "mm_variant",
    "mul_mat_ok",
    "tileable",
]

_FLOAT = frozenset({Type.F32, Type.F16, Type.BF16})

#: Work-group shape of the tiled kernels, (outputs, tokens) work-items: for one token
#: (matrix-vector) every work-item takes other rows of a, else a 16 x 4 block of tiles.
_GROUP_VECTOR, _GROUP_TILES = (64, 1), (16, 4)


def mul_mat_ok(node: Tensor, lim: Limits) -> bool:
    a, b = node.src
    known = a.type in _FLOAT or a.type.is_quantized
    return known and b.type in _FLOAT and (not a.type.is_quantized or a.rows_contiguous)


def tileable(node: Tensor) -> bool:
    """The fast kernels need dense rows in a and an f32 b with dense rows."""
    a, b = node.src
    return (
        a.type in MM_TILE_TYPES
        and (a.rows_contiguous or a.shape[-1] == 1)
        and b.type == Type.F32
        and (b.rows_contiguous or b.shape[-1] == 1)
    )


def mm_variant(node: Tensor, lim: Limits) -> str:
    """Which kernel computes this mul_mat: ``tiled`` (register tiles, for CPUs),
    ``local`` (local-memory tiles, for GPUs), ``vector`` (one token on a GPU) or
    ``generic`` (any types and strides)."""
    if not tileable(node):
        return "generic"
    if lim.gpu:
        return "vector" if node.ne()[1] == 1 else "local"
    return "tiled"


def encode_mul_mat(node: Tensor, lim: Limits) -> list[Launch]:
    a, b = node.src
    ane, dne = a.ne(), node.ne()
    r2, r3 = dne[2] // ane[2], dne[3] // ane[3]
    args = (
        np.int32(r2),
        np.int32(r3),
        *tensor_args(a, lim),
        *tensor_args(b, lim),
        *tensor_args(node, lim),
    )
    n_out, n_tok, batches = dne[0], dne[1], dne[2] * dne[3]
    variant = mm_variant(node, lim)
    if variant == "generic":
        return row_launch("k_mul_mat", n_tok * batches, lim, *args)
    if variant == "vector":
        return row_launch(mv_kernel_name(a.type), n_out * n_tok * batches, lim, *args)
    if variant == "local":
        gsize = (round_up(n_out, 64) // 4, round_up(n_tok, 64) // 4, batches)
        return [Launch(mm_local_kernel_name(a.type), gsize, (16, 16, 1), args)]
    tm = max(MM_TILES) if n_tok > 1 else 1
    tn = MM_TILES[tm]
    g0, g1 = _GROUP_VECTOR if tm == 1 else _GROUP_TILES
    gsize = (round_up(-(-n_out // tn), g0), round_up(-(-n_tok // tm), g1), batches)
    return [Launch(mm_kernel_name(a.type, tm), gsize, (g0, g1, 1), args)]


def _fa_local_bytes(node: Tensor, lim: Limits) -> int:
    q, _, v = node.src[:3]
    return 4 * (q.ne()[0] + v.ne()[0] + 2 * lim.wg)


def flash_attn_fits(node: Tensor, lim: Limits) -> bool:
    q, k, v = node.src[:3]
    mask_ok = all(m.type in (Type.F32, Type.F16) for m in node.src[3:])
    types_ok = q.type == Type.F32 and k.type in _FLOAT and v.type == k.type
    return mask_ok and types_ok and _fa_local_bytes(node, lim) <= lim.local_mem


def encode_flash_attn(node: Tensor, lim: Limits) -> list[Launch]:
    import pyopencl as cl

    q, k, v = node.src[:3]
    mask = node.src[3] if len(node.src) > 3 else None
    p = node.op_params
    m0, m1, nhl2 = alibi_params(q.ne()[2], p["max_bias"])
    args = (
        np.float32(p["scale"]),
        np.float32(p["max_bias"]),
        m0,
        m1,
        np.int32(nhl2),
        np.float32(p["logit_softcap"]),
        np.int32(mask is not None),
        *tensor_args(q, lim),
        *tensor_args(k, lim),
        *tensor_args(v, lim),
        *(tensor_args(mask, lim) if mask is not None else dummy_args(node, lim)),
        *tensor_args(node, lim),
        cl.LocalMemory(4 * q.ne()[0]),
        cl.LocalMemory(4 * v.ne()[0]),
    )
    qne = q.ne()
    return row_launch("k_flash_attn", qne[1] * qne[2] * qne[3], lim, *args)

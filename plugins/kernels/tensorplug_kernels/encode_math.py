"""Launches for the two heavy ops: mul_mat (tiled or generic) and flash_attn_ext."""

from __future__ import annotations

from dataclasses import replace

from tensorplug.opmath import alibi_params
from tensorplug.tensor import Tensor
from tensorplug.types import Type

from .launch import Launch, Limits, dummy_arg, round_up, row_launch, tensor_arg
from .source import (
    MM_TILE_TYPES,
    MM_TILES,
    MMVQ_TYPES,
    QUANT,
    mm_kernel_name,
    mm_local_kernel_name,
    mmvq_kernel_name,
    mv_kernel_name,
)

__all__ = [
    "encode_flash_attn",
    "encode_mul_mat",
    "flash_attn_fits",
    "mm_variant",
    "mmvq_scratch_bytes",
    "mul_mat_ok",
    "tileable",
]

_FLOAT = frozenset({Type.F32, Type.F16, Type.BF16})

#: Most tokens the 8-bit integer matrix-vector kernels take (MMVQ_MAX_TOKENS, q8_1.tpk).
MMVQ_MAX_TOKENS = 8
#: Bytes of one Q8_1 activation block (Q8_1_BYTES, q8_1.tpk): f32 d, f32 d*sum, 32 int8.
Q8_1_BYTES = 40
_MMVQ = frozenset(MMVQ_TYPES)

#: Work-group shape of the tiled kernels, (outputs, tokens) work-items: for one token
#: (matrix-vector) every work-item takes other rows of a, else a 16 x 4 block of tiles.
_GROUP_VECTOR, _GROUP_TILES = (64, 1), (16, 4)


def mul_mat_ok(node: Tensor, lim: Limits) -> bool:
    a, b = node.src
    known = a.type in _FLOAT or a.type in QUANT
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


def _mmvq_ok(node: Tensor, lim: Limits) -> bool:
    a, b = node.src
    return (
        lim.gpu
        and lim.scratch
        and a.type in _MMVQ
        and a.rows_contiguous
        and b.type in _FLOAT
        and node.ne()[1] <= MMVQ_MAX_TOKENS
    )


def mmvq_scratch_bytes(b: Tensor) -> int:
    """Scratch for ``b`` quantized to Q8_1 blocks: every row, K / 32 blocks each."""
    ne = b.ne()
    return ne[1] * ne[2] * ne[3] * (ne[0] // 32) * Q8_1_BYTES


def mm_variant(node: Tensor, lim: Limits) -> str:
    """Which kernel computes this mul_mat: ``tiled`` (register tiles, for CPUs),
    ``local`` (local-memory tiles, for GPUs), ``vector`` (one token on a GPU),
    ``mmvq`` (quantized weights and at most 8 tokens on a GPU: 8-bit integer dot
    products on activations quantized to Q8_1, as ggml's mmvq) or ``generic`` (any
    types and strides)."""
    if _mmvq_ok(node, lim):
        return "mmvq"
    if not tileable(node):
        return "generic"
    if lim.gpu:
        return "vector" if node.ne()[1] == 1 else "local"
    return "tiled"


def encode_mul_mat(node: Tensor, lim: Limits) -> list[Launch]:
    a, b = node.src
    ane, dne = a.ne(), node.ne()
    r2, r3 = dne[2] // ane[2], dne[3] // ane[3]
    args = {"a": tensor_arg(a), "b": tensor_arg(b), "d": tensor_arg(node), "r2": r2, "r3": r3}
    n_out, n_tok, batches = dne[0], dne[1], dne[2] * dne[3]
    variant = mm_variant(node, lim)
    if variant == "generic":
        return row_launch("k_mul_mat", n_tok * batches, lim, **args)
    if variant == "mmvq":  # quantize b into scratch, then the integer mat-vec reads it
        launches = [
            *row_launch("k_quantize_q8_1", n_tok * batches, lim, b=args["b"]),
            *row_launch(mmvq_kernel_name(a.type), n_out * batches, lim, **args),
        ]
        return [replace(ln, scratch=mmvq_scratch_bytes(b)) for ln in launches]
    if variant == "vector":
        return row_launch(mv_kernel_name(a.type), n_out * n_tok * batches, lim, **args)
    if variant == "local":
        gsize = (round_up(n_out, 64) // 4, round_up(n_tok, 64) // 4, batches)
        return [Launch(mm_local_kernel_name(a.type), gsize, (16, 16, 1), args)]
    tm = max(MM_TILES) if n_tok > 1 else 1
    tn = MM_TILES[tm]
    g0, g1 = _GROUP_VECTOR if tm == 1 else _GROUP_TILES
    gsize = (round_up(-(-n_out // tn), g0), round_up(-(-n_tok // tm), g1), batches)
    return [Launch(mm_kernel_name(a.type, tm), gsize, (g0, g1, 1), args)]


#: Largest head size flash attention holds in local memory (FA_MAX_D of attention.tpk).
FA_MAX_D = 512


def _fa_local_bytes(lim: Limits) -> int:
    return 4 * (2 * FA_MAX_D + 2 * lim.wg)


def flash_attn_fits(node: Tensor, lim: Limits) -> bool:
    q, k, v = node.src[:3]
    # an order (src 4) only says how a fixed-order sum is grouped: these kernels ignore it
    mask_ok = all(m.type in (Type.F32, Type.F16) for m in node.src[3:4])
    types_ok = q.type == Type.F32 and k.type in _FLOAT and v.type == k.type
    sizes_ok = q.ne()[0] <= FA_MAX_D and v.ne()[0] <= FA_MAX_D
    return mask_ok and types_ok and sizes_ok and _fa_local_bytes(lim) <= lim.local_mem


def encode_flash_attn(node: Tensor, lim: Limits) -> list[Launch]:
    q, k, v = node.src[:3]
    mask = node.src[3] if len(node.src) > 3 else None
    p = node.op_params
    m0, m1, nhl2 = alibi_params(q.ne()[2], p["max_bias"])
    qne = q.ne()
    return row_launch(
        "k_flash_attn", qne[1] * qne[2] * qne[3], lim,
        q=tensor_arg(q), k=tensor_arg(k), v=tensor_arg(v),
        m=tensor_arg(mask) if mask is not None else dummy_arg(node),
        d=tensor_arg(node),
        scale=float(p["scale"]), max_bias=float(p["max_bias"]), m0=float(m0), m1=float(m1),
        n_head_log2=int(nhl2), softcap=float(p["logit_softcap"]), has_mask=int(mask is not None),
    )  # fmt: skip

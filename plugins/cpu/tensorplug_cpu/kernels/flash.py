"""flash_attn_ext with ``online`` set: ggml's own flash attention kernel's arithmetic
(:mod:`._numba_flash`), what llama.cpp computes with flash attention on."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tensorplug.types import Type

from .attention_mask import masked_logits
from .common import F32, BuildContext, Step, padded4, sequence
from .kernel_shapes import FLASH_TILE_Q

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor


__all__ = ["ONLINE_TYPES", "build_online_attention"]

#: the cache types whose cells the kernel reads
ONLINE_TYPES = (Type.F16, Type.F32)

_NO_MASK = np.zeros((0, 0, 0, 0), np.float32)
_CACHE_ORDER = np.zeros(0, np.int32)


def build_online_attention(node: Tensor, ctx: BuildContext) -> Step | None:
    """The step of an ``online`` flash_attn_ext, or None where no compiled kernel takes
    it (numpy's provider, K and V of other types): the caller's arithmetic then runs,
    the same function up to rounding."""
    q_t, k_t, v_t = node.src[:3]
    compiled = ctx.compiled
    if compiled is None or k_t.type != v_t.type or k_t.type not in ONLINE_TYPES:
        return None
    mask_t = node.src[3] if len(node.src) > 3 else None
    order = ctx.view(node.src[4]) if len(node.src) > 4 else _CACHE_ORDER
    p = node.op_params
    scale, softcap = F32.type(p["scale"]), F32.type(p.get("logit_softcap", 0.0))
    if softcap != 0:
        scale = scale / softcap
    q4 = padded4(ctx.view(q_t))
    B, H, n_q, _ = q4.shape
    n_kv = k_t.shape[-2]
    term, prep = masked_logits(ctx, mask_t, n_q, (B, H, n_q, n_kv), p.get("max_bias", 0.0))
    k_in, v_in = padded4(ctx.view(k_t)), padded4(ctx.view(v_t))
    casts = None
    if k_t.type == Type.F32:
        # llama.cpp casts an F32 cache to F16 for its flash attention (build_attn_mha)
        k16, v16 = ctx.scratch(k_in.shape, np.float16), ctx.scratch(v_in.shape, np.float16)
        casts = ((k16, k_in), (v16, v_in))
        k_in, v_in = k16, v16
    k_in, v_in = k_in.view(np.uint16), v_in.view(np.uint16)  # raw halves, read in place
    bias = _NO_MASK if term is None else term
    if bias.dtype == np.float16:
        bias = bias.view(np.uint16)
    raw_mask = None
    if mask_t is not None:
        mask4 = padded4(ctx.view(mask_t))[:, :, :n_q, :n_kv]
        raw_mask = mask4.view(np.uint16) if mask4.dtype == np.float16 else mask4
    out4 = padded4(ctx.view(node))
    scale_f, softcap_f = float(scale), float(softcap)
    # ggml's tiles for a prompt's many rows; a batch-invariant backend keeps one row's way
    tiled = ctx.ggml_order and n_q >= FLASH_TILE_Q
    if casts is None and raw_mask is not None and raw_mask.dtype == bias.dtype == np.uint16:
        # an F16 cache and mask (what the runner keeps): a job of the compiled program,
        # which reads q and out in any layout
        attend = compiled.bind_online_attend(q4, k_in, v_in, raw_mask, bias, order, scale_f,
                                             softcap_f, tiled, out4)  # fmt: skip
        return sequence(prep, attend)
    # one layout for every step (a prompt's q is a permuted view): one compile
    q_in = q4 if q4.flags.c_contiguous else ctx.scratch(q4.shape)

    def run() -> None:
        if q_in is not q4:
            np.copyto(q_in, q4)
        used = n_kv if raw_mask is None else compiled.visible_columns(raw_mask)
        if casts is not None:
            for dst, src in casts:
                np.copyto(dst[:, :, :used], src[:, :, :used])
        compiled.online_attend(q_in, k_in, v_in, bias, order, used, scale_f, softcap_f, tiled,
                               out4)  # fmt: skip

    return sequence(prep, run)

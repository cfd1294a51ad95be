"""flash_attn_ext with ``online`` set: ggml's own flash attention kernel's arithmetic
(:mod:`._numba_flash`), what llama.cpp computes with flash attention on."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.types import Type

from .attention_mask import masked_logits
from .cache_decode import decoded_cells, is_quantized_cache, rounded_query
from .common import F32, BuildContext, Step, padded4, sequence
from .kernel_shapes import FLASH_TILE_Q
from .steps import reshape_view

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor


__all__ = ["ONLINE_TYPES", "build_online_attention"]

#: the cache types whose cells the kernel reads
ONLINE_TYPES = (Type.F16, Type.F32)

_NO_MASK = np.zeros((0, 0, 0, 0), np.float32)
_CACHE_ORDER = np.zeros(0, np.int32)


def build_online_attention(node: Tensor, ctx: BuildContext) -> Step | None:
    """The step of an ``online`` flash_attn_ext, or None where no compiled kernel takes
    it (numpy's provider, K and V of two float types or BF16): the caller's arithmetic
    then runs, the same function up to rounding. A quantized cache is decoded to
    float32 first (:mod:`.cache_decode`), as ggml reads a cache that is neither F16 nor
    F32: a row at a time, values accumulated in float32."""
    q_t, k_t, v_t = node.src[:3]
    compiled = ctx.compiled
    quantized = is_quantized_cache(k_t, v_t)
    floats = k_t.type == v_t.type and k_t.type in ONLINE_TYPES
    if compiled is None or not (quantized or floats):
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
    bias = _NO_MASK if term is None else term
    if bias.dtype == np.float16:
        bias = bias.view(np.uint16)
    raw_mask = None
    if mask_t is not None:
        mask4 = padded4(ctx.view(mask_t))[:, :, :n_q, :n_kv]
        raw_mask = mask4.view(np.uint16) if mask4.dtype == np.float16 else mask4
    out4 = padded4(ctx.view(node))
    scale_f, softcap_f = float(scale), float(softcap)
    if quantized:
        return _decoded_attention(node, ctx, q4, raw_mask, bias, order, scale_f, softcap_f,
                                  out4, prep)  # fmt: skip
    k_in, v_in = padded4(ctx.view(k_t)), padded4(ctx.view(v_t))
    casts = None
    if k_t.type == Type.F32:
        # llama.cpp casts an F32 cache to F16 for its flash attention (build_attn_mha)
        k16, v16 = ctx.scratch(k_in.shape, np.float16), ctx.scratch(v_in.shape, np.float16)
        casts = ((k16, k_in), (v16, v_in))
        k_in, v_in = k16, v16
    k_in, v_in = k_in.view(np.uint16), v_in.view(np.uint16)  # raw halves, read in place
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


def _decoded_attention(node: Tensor, ctx: BuildContext, q4: np.ndarray,
                       raw_mask: np.ndarray | None, bias: np.ndarray, order: np.ndarray,
                       scale: float, softcap: float, out4: np.ndarray,
                       prep: Step | None) -> Step:  # fmt: skip
    """ggml's ``one_chunk`` over a quantized cache. Quantized keys are read in their
    blocks, each score K's own ``vec_dot`` of the query quantized to its
    ``vec_dot_type`` (:mod:`._numba_flash_blocks`); float keys beside a quantized V are
    widened and the query rounded as ggml rounds it (:mod:`.cache_decode`). A quantized
    or BF16 V is decoded to float32 and accumulated in float32, an F16 one (an F32 one
    cast to it, as llama.cpp casts) in f16."""
    compiled = ctx.compiled
    assert compiled is not None
    k_t, v_t = node.src[1:3]
    n_kv = k_t.shape[-2]
    keys = _key_blocks(ctx, k_t)
    if keys is None:
        k_in, decode_k = decoded_cells(ctx, k_t)
        v_in, decode_v = decoded_cells(ctx, v_t)
        q_in, round_q = rounded_query(ctx, q4, k_t)

        def run() -> None:
            used = n_kv if raw_mask is None else compiled.visible_columns(raw_mask)
            round_q()
            decode_k()
            decode_v()
            compiled.online_attend(q_in, k_in, v_in, bias, order, used, scale, softcap, False,
                                   out4, half=False)  # fmt: skip

        return sequence(prep, run)
    half_v = v_t.type in (Type.F16, Type.F32)
    widen_v: Step | None
    if v_t.type == Type.F16:
        v_in, widen_v = padded4(ctx.view(v_t)).view(np.uint16), None
    elif v_t.type == Type.F32:  # llama.cpp casts an F32 V to F16 for its flash attention
        v32 = padded4(ctx.view(v_t))
        v16 = ctx.scratch(v32.shape, np.float16)
        v_in, widen_v = v16.view(np.uint16), partial(np.copyto, v16, v32)
    else:
        v_in, widen_v = decoded_cells(ctx, v_t)
    q_in = q4 if q4.flags.c_contiguous else ctx.scratch(q4.shape)
    rows, dim = q4.shape[0] * q4.shape[1] * q4.shape[2], q4.shape[3]
    quantized = (ctx.scratch((rows, dim), np.int8), ctx.scratch((rows, dim // 32)),
                 ctx.scratch((rows, dim // 32), np.int32))  # fmt: skip
    kind = int(k_t.type)

    def run_blocks() -> None:
        used = n_kv if raw_mask is None else compiled.visible_columns(raw_mask)
        if q_in is not q4:
            np.copyto(q_in, q4)
        if widen_v is not None:
            widen_v()
        compiled.blocks_attend(q_in, quantized, keys, v_in, bias, order, used, scale, softcap,
                               kind, half_v, out4)  # fmt: skip

    return sequence(prep, run_blocks)


def _key_blocks(ctx: BuildContext, k: Tensor) -> np.ndarray | None:
    """A quantized K as ``(B, H_kv, n_kv, bytes)``: each cell's head, its blocks' raw
    bytes side by side (None for float keys, or blocks that do not lie so)."""
    if not k.type.is_quantized:
        return None
    raw = ctx.view(k)  # (…, H, n_kv, n_blocks, type_size)
    rows = reshape_view(raw, (*raw.shape[:-2], raw.shape[-2] * raw.shape[-1]))
    return None if rows is None else padded4(rows)

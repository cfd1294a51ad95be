"""flash_attn_ext's K and V from a quantized KV cache, decoded to float32.

ggml's flash attention reads a quantized cache block by block: each score is K's
``vec_dot`` of a key row with the query rounded to K's ``vec_dot_type``
(:mod:`.activations`: Q8_0 for Q8_0, Q4_0, Q5_0 and IQ4_NL keys, Q8_1 for Q4_1 and
Q5_1), and each value row is decoded to float32 and accumulated in float32. Here a
step decodes the cells to float32 and rounds the query as ggml rounds it, and the
kernels for a float32 cache then sum the same terms. Two roundings differ: a score's
terms are summed as a float32 dot product, not block by block in integers (the last
bits of a score), and Q8_1's ``s`` (the f16-rounded offset term of Q4_1 and Q5_1 keys)
is taken at full precision.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.quants import dequantize_blocks

from .activations import Q8_1, round_rows, vec_dot_type
from .common import BuildContext, Step, padded4
from .steps import reshape_view

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

__all__ = ["decoded_cells", "is_quantized_cache", "rounded_query"]


def is_quantized_cache(k: Tensor, v: Tensor) -> bool:
    """Whether flash_attn_ext's K or V is stored in a quantized type."""
    return k.type.is_quantized or v.type.is_quantized


def decoded_cells(ctx: BuildContext, t: Tensor) -> tuple[np.ndarray, Step]:
    """K or V of flash_attn_ext (a view ``(…, H, n_kv, D)`` of cache rows) as float32
    ``(B, H, n_kv, D)``, and the step that writes every cell's values there.

    A quantized cache row holds every head's blocks side by side, so the cells decode
    as whole rows, by the provider's compiled decoder (one call for the step's cells);
    float tensors are widened as any input is. Cells past the ones a query sees are
    decoded too (they are never read): a runner pads ``n_kv`` little, and a decoder
    bound once costs no Python per call."""
    if not t.type.is_quantized:
        values, widen = ctx.f32_in(t)
        return padded4(values), widen if widen is not None else _nothing
    raw = ctx.view(t)  # (…, H, n_kv, n_blocks, type_size) raw blocks
    *lead, n_head, n_kv, n_blocks, type_size = raw.shape
    dim = n_blocks * t.type.block_size
    rows = raw.swapaxes(-4, -3)  # (…, n_kv, H, n_blocks, type_size): the cache's rows
    out = ctx.scratch((*lead, n_kv, n_head * dim))
    decoded = padded4(out.reshape(*lead, n_kv, n_head, dim).swapaxes(-3, -2))
    blocks = reshape_view(rows, (*lead, n_kv, n_head * n_blocks, type_size))
    if blocks is None or ctx.compiled is None:
        # heads apart in a row, or numpy's codec: decode in numpy (cells never written
        # hold whatever the buffer held; their decoding may overflow, unread)
        return decoded, partial(_numpy_decode, rows, t, out)
    bound = ctx.kernels.bind_dequantize(t.type, blocks, out)
    return decoded, partial(bound, out)


def rounded_query(ctx: BuildContext, q: np.ndarray, k: Tensor) -> tuple[np.ndarray, Step]:
    """Float32 ``q`` as ggml rounds it for a product with K's type (its ``vec_dot_type``:
    Q8 codes times their scale, or f16), in a scratch, and the step that rounds it."""
    out = ctx.scratch(q.shape)
    if not k.type.is_quantized:
        return out, partial(round_rows, q, k.type, out)
    # the offsets' correction of Q8_1 (Q4_1, Q5_1 keys) is computed, and left unused
    corr = ctx.scratch((*q.shape[:-1], q.shape[-1] // 32)) if vec_dot_type(k.type) == Q8_1 else None
    return out, ctx.kernels.bind_round_rows(k.type, q, out, corr)


def _numpy_decode(rows: np.ndarray, t: Tensor, out: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        values = dequantize_blocks(rows, t.type)
    np.copyto(out, values.reshape(out.shape))


def _nothing() -> None:
    """The step of a tensor that needs no conversion."""

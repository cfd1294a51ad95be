"""flash_attn_ext's K and V from a quantized KV cache, decoded to float32.

Quantized keys are read in their blocks (:mod:`._numba_flash_blocks`); what is decoded
here is the rest: a quantized V beside float keys (ggml decodes each value row to
float32 and accumulates in float32, as the float32 kernels then do), and both K and V
for numpy's provider, which computes the same function from the decoded rows with the
query rounded as K's ``vec_dot_type`` rounds it (:func:`.activations.round_rows`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.quants import dequantize_blocks

from .activations import round_rows
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
    """Float32 ``q`` as ggml rounds it for float keys of ``k``'s type (f16, or as it is
    for F32), in a scratch, and the step that rounds it."""
    out = ctx.scratch(q.shape)
    return out, partial(round_rows, q, k.type, out)


def _numpy_decode(rows: np.ndarray, t: Tensor, out: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        values = dequantize_blocks(rows, t.type)
    np.copyto(out, values.reshape(out.shape))


def _nothing() -> None:
    """The step of a tensor that needs no conversion."""

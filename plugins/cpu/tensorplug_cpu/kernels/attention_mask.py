"""The term a mask adds to attention's logits: ``slope·mask``, ALiBi's slopes per head
where ``max_bias`` asks for them, a mask of fewer heads tiled over the heads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tensorplug.opmath import alibi_slopes

from .common import BuildContext, Step, padded4, tiled_operands

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

__all__ = ["masked_logits"]


def masked_logits(
    ctx: BuildContext,
    mask_t: Tensor | None,
    rows: int,
    shape4: tuple[int, ...],
    max_bias: float,
) -> tuple[np.ndarray | None, Step | None]:
    """The term ``slope·mask`` to add to 4-d logits of ``shape4`` (and its step)."""
    if mask_t is None:
        return None, None
    m4 = padded4(ctx.view(mask_t))[:, :, :rows, :]
    tiles = any(dm not in (1, da) for da, dm in zip(shape4[:2], m4.shape[:2], strict=True))
    if max_bias <= 0 and not tiles:
        return m4, None  # numpy widens an F16 mask exactly while adding
    slopes = alibi_slopes(shape4[1], max_bias).reshape(1, -1, 1, 1)
    # a mask with fewer heads (or batches) than a is tiled: head h uses mask head h % n
    outer = tuple(da if dm != 1 else 1 for da, dm in zip(shape4[:2], m4.shape[:2], strict=True))
    term = ctx.scratch(np.broadcast_shapes((*outer, *m4.shape[2:]), slopes.shape))
    full = ctx.scratch((*outer, *m4.shape[2:])) if tiles else None
    if full is not None:
        dst, src, _ = tiled_operands(full, m4, full)

    def scaled() -> None:
        m = m4
        if full is not None:
            np.copyto(dst, src)
            m = full
        if max_bias > 0:
            np.multiply(m, slopes, out=term)
        else:
            np.copyto(term, m)

    return term, scaled

"""hadamard: llama.cpp's rotation of a quantized KV cache's rows, as ggml computes it.

llama.cpp multiplies the queries, keys and values of a quantized cache by a
Walsh–Hadamard matrix (``llama_mul_mat_hadamard``), a product its CPU computes as the
fast transform ``ggml_compute_forward_fwht``: each value scaled by ``1/sqrtf(n)``, then
``log2(n)`` rounds of butterflies. The same float32 additions here, so the rotated rows,
and the cache's blocks quantized from them, are llama.cpp's bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .common import BuildContext, Step
from .steps import reshape_view

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

__all__ = ["build_hadamard"]


def build_hadamard(node: Tensor, ctx: BuildContext) -> Step:
    """Rows of ``src[0]`` (any layout) rotated into the node (contiguous)."""
    a = node.src[0]
    n = int(node.op_params["n"])
    width = a.shape[-1]
    x = ctx.view(a)
    out = ctx.view(node).reshape(-1, width)
    x2 = reshape_view(x, (-1, width)) if x.ndim != 2 else x
    copy = None
    if x2 is None:  # rows that no 2-d view reaches: gathered first
        x2 = ctx.scratch(out.shape)
        copy = x
    bound = ctx.kernels.bind_hadamard(x2, out, n)
    if copy is None:
        return bound
    src, dst = copy, x2

    def gathered() -> None:
        np.copyto(dst.reshape(src.shape), src)
        bound()

    return gathered

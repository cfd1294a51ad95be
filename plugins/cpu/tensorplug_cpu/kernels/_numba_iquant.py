"""numba kernels for IQ4_NL and IQ4_XS weights; imported only by :mod:`.jit`.

The same two shapes as :mod:`._numba_quant` (same arguments): a matrix × a few float32
rows with each block decoded in registers, and decoding to float32 for BLAS. A 4-bit
code indexes ggml's ``kvalues_iq4nl`` (:data:`tensorplug.iquants.KVALUES_IQ4NL`), read
from a 16-entry float32 table; IQ4_XS scales each 32-value block by ``d * (ls - 32)``
with ``ls`` six bits split between ``scales_l`` (low nibble) and ``scales_h`` (two bits).

Decoding performs ``d·level`` (IQ4_XS: ``(d·(ls - 32))·level``) in float32 without
fast-math, as :mod:`tensorplug.quants` and ggml do, so decoded weights are bit-identical.
The dot products allow reassociation, as ggml's SIMD reductions do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from tensorplug.iquants import KVALUES_IQ4NL

from ._numba_cache import kernel
from ._numba_quant import DOT_FASTMATH, ROW_CHUNKS, chunk_span

_LEVELS = KVALUES_IQ4NL.astype(np.float32)  # a global array: numba freezes it in


@njit(inline="always")
def f16_at(blk: Any, off: int, table: Any) -> Any:
    return table[np.int32(blk[off]) | (np.int32(blk[off + 1]) << 8)]


@njit(inline="always")
def _xs_scale(blk: Any, ib: int, table: Any) -> Any:
    """Block ``ib``'s scale ``d * (ls - 32)`` of an IQ4_XS super-block."""
    scales_h = np.int32(blk[2]) | (np.int32(blk[3]) << 8)
    low = (np.int32(blk[4 + ib // 2]) >> (4 * (ib % 2))) & 15
    ls = low | (((scales_h >> (2 * ib)) & 3) << 4)
    return f16_at(blk, 0, table) * np.float32(ls - 32)


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_iq4_nl(blocks: Any, x: Any, out: Any, table: Any) -> None:
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                xr = x[t]
                for b in range(blocks.shape[1]):
                    blk = blocks[o, b]
                    d = f16_at(blk, 0, table)
                    for j in range(16):
                        q = np.int32(blk[2 + j])
                        acc[j] += d * _LEVELS[q & 15] * xr[b * 32 + j]
                        acc[16 + j] += d * _LEVELS[q >> 4] * xr[b * 32 + 16 + j]
                out[t, o] = acc.sum()


@kernel(parallel=True, fastmath=DOT_FASTMATH)
def matvec_iq4_xs(blocks: Any, x: Any, out: Any, table: Any) -> None:
    n = blocks.shape[0]
    scratch = np.empty((ROW_CHUNKS, 32), np.float32)
    for c in prange(ROW_CHUNKS):
        acc = scratch[c]
        for o in range(*chunk_span(c, n, 1)):
            for t in range(x.shape[0]):
                acc[:] = 0
                xr = x[t]
                for b in range(blocks.shape[1]):
                    blk = blocks[o, b]
                    for ib in range(8):
                        dl = _xs_scale(blk, ib, table)
                        at = b * 256 + ib * 32
                        for j in range(16):
                            q = np.int32(blk[8 + 16 * ib + j])
                            acc[j] += dl * _LEVELS[q & 15] * xr[at + j]
                            acc[16 + j] += dl * _LEVELS[q >> 4] * xr[at + 16 + j]
                out[t, o] = acc.sum()


@kernel(nogil=True)
def dequantize_iq4_nl(blocks: Any, out: Any, table: Any) -> None:
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            blk = blocks[r, b]
            d = f16_at(blk, 0, table)
            for j in range(16):
                q = np.int32(blk[2 + j])
                out[r, b * 32 + j] = d * _LEVELS[q & 15]
                out[r, b * 32 + 16 + j] = d * _LEVELS[q >> 4]


@kernel(nogil=True)
def dequantize_iq4_xs(blocks: Any, out: Any, table: Any) -> None:
    for r in range(blocks.shape[0]):
        for b in range(blocks.shape[1]):
            blk = blocks[r, b]
            for ib in range(8):
                dl = _xs_scale(blk, ib, table)
                at = b * 256 + ib * 32
                for j in range(16):
                    q = np.int32(blk[8 + 16 * ib + j])
                    out[r, at + j] = dl * _LEVELS[q & 15]
                    out[r, at + 16 + j] = dl * _LEVELS[q >> 4]

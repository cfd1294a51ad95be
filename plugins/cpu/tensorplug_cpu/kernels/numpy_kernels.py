"""The numpy provider: every operation of :class:`.provider.Kernels` as numpy's
whole-array loops, with ggml's arithmetic.

numpy is always there, so this provider is the plugin's floor: a backend without
compiled kernels (``jit=0``, ``TENSORPLUG_CPU_JIT=0``, numba missing or refused)
computes with it, and the numba provider hands it what its kernels do not take (a
strided array, a batch of sequences, a gated unit it has no loop for). It compiles
nothing, so it offers none of :class:`.provider.CompiledKernels`' kernels
(``compiled`` is None) and the builders take the paths that need none.

Its results are the ones the numba kernels are tested against: where both compute an
operation, they give the same bits (the rope and the gated units' float32 arithmetic,
the softmax's order of operations), or the documented difference of a vectorised loop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.opcodes import GluOp
from tensorplug.quants import dequantize_blocks
from tensorplug.types import Type

from ..repack import GROUP_ROWS, LAYOUTS
from .activations import Q8_1, q8_1_offset_correction, round_rows, vec_dot_type
from .unary import GLU_ACTIVATIONS

if TYPE_CHECKING:
    from .steps import Scratch, Step

__all__ = ["NUMPY_KERNELS", "NumpyKernels", "hadamard_rows", "scaled_softmax"]

F32 = np.dtype(np.float32)


def scaled_softmax(
    s: np.ndarray, term: np.ndarray | None, row: np.ndarray, scale: np.float32,
    softcap: np.float32,
) -> None:  # fmt: skip
    """Attention weights in place, as ggml: ``s ← e^(s·scale (softcapped) + term − max)``
    per row and ``row ← 1/Σ`` (keepdims); a row masked everywhere (its maximum -inf)
    gets weights and ``row`` 0, as ggml's kernel skips every entry of it."""
    s *= scale
    if softcap != 0:
        np.tanh(s, out=s)
        s *= softcap
    if term is not None:
        s += term
    np.max(s, axis=-1, keepdims=True, out=row)
    np.copyto(row, 0, where=np.isneginf(row))
    s -= row
    np.exp(s, out=s)
    np.sum(s, axis=-1, keepdims=True, out=row)
    np.divide(1, row, out=row, where=row != 0)


def _as_halves(raw: np.ndarray) -> np.ndarray:
    """f16 values given as float16, or as their raw ``uint16`` bits (as the numba
    kernels read them), seen as float16."""
    return raw.view(np.float16) if raw.dtype == np.uint16 else raw


class NumpyKernels:
    """numpy's ways of the operations every provider computes (see the module)."""

    #: numpy compiles nothing: no fused products, exact attention or row programs
    compiled: None = None

    def supports(self, t: Type) -> bool:
        """Whether :meth:`bind_dequantize` decodes ``t`` blocks: every quantized type."""
        return t.is_quantized

    # -- products' operands -------------------------------------------------------------

    def bind_round_rows(
        self, t: Type, x: np.ndarray, out: np.ndarray, corr: np.ndarray | None
    ) -> Step:
        """``out[...] = round_rows(x, t)`` (:mod:`.activations`: the activations as
        ggml's rounding for ``t`` weights leaves them) and, for Q4_1/Q5_1, ``corr``
        = :func:`~.activations.q8_1_offset_correction` of ``x`` (None for the others)."""

        def rounded() -> None:
            round_rows(x, t, out)
            if corr is not None:
                np.copyto(corr, q8_1_offset_correction(x))

        return rounded

    def bind_hadamard(self, x: np.ndarray, out: np.ndarray, n: int) -> Step:
        """:func:`hadamard_rows` of 2-d float32 ``x`` into ``out`` as a step."""
        return partial(hadamard_rows, x, out, n)

    def bind_widen_f16(self, src: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """``widen(out)``: float16 ``src`` into float32 ``out``, returned."""

        def widen(out: np.ndarray) -> np.ndarray:
            np.copyto(out, src)
            return out

        return widen

    def bind_dequantize(
        self, t: Type, blocks: np.ndarray, out: np.ndarray | None = None
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``decode(out)``: ``(…, rows, nblocks, type_size)`` blocks as float32 ``(…,
        rows, n)``. numpy's codec makes its own array: that array is returned, and
        ``out`` left as it is (a caller that needs the values in ``out`` copies them
        when the result is not ``out``), rather than copied once more for nothing."""
        return lambda into: dequantize_blocks(blocks, t)

    def bind_packed(
        self, t: Type, packed: np.ndarray, x: np.ndarray, out: np.ndarray,
        scratch: Scratch = np.empty, ggml_order: bool = False, alone: bool = True,
    ) -> Step:  # fmt: skip
        """``out[t, o] = W[o]·x[t]`` for weights stored repacked (:mod:`..repack`), rows
        of eight as ``packed`` ``(groups, bytes)``, by every activation row ``x``: the
        matrix unpacked into ggml's blocks, decoded and multiplied by BLAS at each
        compute, with the activations ggml's rounding leaves (and Q8_1's offsets for
        Q4_1/Q5_1, as :func:`.matmul` corrects them). Slow, the same products; only a
        backend without compiled kernels beside weights repacked for another runs it."""
        lay = LAYOUTS[t]
        n_out = packed.shape[0] * GROUP_ROWS
        nb = packed.shape[1] // lay.block
        grouped = packed.reshape(packed.shape[0], nb, lay.block)
        blocks = scratch((n_out, nb, t.type_size), np.uint8)

        def unpacked() -> None:
            lay.unpack(grouped, blocks)
            w = dequantize_blocks(blocks, t).reshape(n_out, -1)
            np.matmul(round_rows(x, t), w.T, out=out)
            if vec_dot_type(t) == Q8_1:  # Q8_1's f16-rounded sums times the offsets
                m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
                np.add(out, q8_1_offset_correction(x) @ m.T, out=out)

        return unpacked

    # -- attention ----------------------------------------------------------------------

    def bind_widen_f16_rows(self, raw: np.ndarray, out: np.ndarray) -> Callable[[int], None]:
        """``widen(used)``: rows ``j < used`` (axis 2) of 4-d f16 ``raw`` into float32
        ``out`` of the same shape."""
        halves = _as_halves(raw)

        def widen(used: int) -> None:
            np.copyto(out[:, :, :used], halves[:, :, :used])

        return widen

    def visible_columns(self, mask: np.ndarray) -> int:
        """1 + the last column of a 4-d mask (float32, or f16 as float16 or raw bits)
        that is not -inf for some query; at least 1, as a row masked everywhere still
        needs a column to come out as zeros."""
        seen = np.asarray(~np.isneginf(_as_halves(mask)).all(axis=(0, 1, 2)))
        return seen.size - int(np.argmax(seen[::-1])) if seen.any() else 1

    def softmax_rows(
        self, s: np.ndarray, mask: np.ndarray, used: int, scale: float, row: np.ndarray
    ) -> None:
        """A prompt's attention weights in place: :func:`scaled_softmax` of the first
        ``used`` columns of scores ``s`` ``(G, N, ≥used)`` with a float32 ``mask`` ``(1
        or G, ≥N, ≥used)`` (shape ``(0, 0, 0)`` for none); ``row`` ``(G, N)`` gets each
        row's reciprocal sum."""
        n = s.shape[1]
        term = mask[:, :n, :used] if mask.shape[0] else None
        scaled_softmax(s[:, :, :used], term, row[..., None], np.float32(scale), np.float32(0))

    # -- rows ---------------------------------------------------------------------------

    def bind_rms_norm(self, x: np.ndarray, out: np.ndarray, eps: np.float32,
                      scratch: Scratch) -> Step:  # fmt: skip
        """``out = x / sqrt(mean(x²) + eps)`` per row: the sum of squares in float64,
        the rest in float32, as ggml."""
        n = x.shape[-1]
        rows = (*x.shape[:-1], 1)
        acc, stat, sq = scratch(rows, np.float64), scratch(rows), scratch(x.shape)

        def run() -> None:
            np.multiply(x, x, out=sq)
            np.sum(sq, axis=-1, keepdims=True, dtype=np.float64, out=acc)
            np.divide(acc, n, out=acc)
            np.copyto(stat, acc, casting="same_kind")
            np.add(stat, eps, out=stat)
            np.sqrt(stat, out=stat)
            np.divide(1, stat, out=stat)
            np.multiply(x, stat, out=out)

        return run

    def bind_glu(self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray,
                 scratch: Scratch) -> Step:  # fmt: skip
        """``out = act(x)·g`` for the gated unit ``fn``; geglu is 0 wherever x <= -10,
        whatever g is, as ggml's loop sets it."""
        act, tmp = GLU_ACTIVATIONS[fn], scratch(out.shape)

        def run() -> None:
            act(x, tmp, tmp)
            with np.errstate(invalid="ignore"):
                np.multiply(tmp, g, out=out)
            if fn is GluOp.GEGLU:
                out[x <= -10] = 0

        return run

    def bind_rope(
        self, x: np.ndarray, out: np.ndarray, pos: np.ndarray, ff: np.ndarray | None,
        ramp: np.ndarray | None, keep: np.ndarray | None, neox: bool, n_dims: int,
        scales: tuple[np.float32, np.float32, np.float32], scratch: Scratch,
    ) -> Step:  # fmt: skip
        """Rotary embedding of float32 ``x`` ``(…, n_tokens, n_head, head_dim)`` into
        ``out`` (which may alias it), as ggml's ``rope_f32``: ``theta[t, i] =
        pos[t]·theta_scale^i`` by repeated float32 multiplication (as
        ``ggml_rope_cache_init``), divided by the frequency factors ``ff``, with YaRN's
        ``ramp`` mix (and ``keep`` = 1 − ramp) where it is on; ``scales`` are
        ``(theta_scale, freq_scale, mscale)``. The dimensions past ``n_dims`` are
        copied."""
        theta_scale, freq_scale, mscale = scales
        half, n_tok = n_dims // 2, x.shape[-3]
        factors = np.full((n_tok, half), theta_scale, F32)
        theta, extrap = scratch((n_tok, half)), scratch((n_tok, half))
        cos, sin = scratch((n_tok, 1, half)), scratch((n_tok, 1, half))
        if neox:
            x0, x1 = x[..., :half], x[..., half:n_dims]
            o0, o1 = out[..., :half], out[..., half:n_dims]
        else:
            x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
            o0, o1 = out[..., 0:n_dims:2], out[..., 1:n_dims:2]
        t0, t1, t2 = scratch(x0.shape), scratch(x0.shape), scratch(x0.shape)
        rest = (x[..., n_dims:], out[..., n_dims:]) if n_dims < x.shape[-1] else None

        def run() -> None:
            factors[:, 0] = pos
            np.multiply.accumulate(factors, axis=1, out=theta)
            if ff is not None:
                np.divide(theta, ff, out=theta)
            if ramp is not None and keep is not None:
                # theta_interp·(1 - ramp) + theta_extrap·ramp
                np.multiply(theta, ramp, out=extrap)
                np.multiply(theta, freq_scale, out=theta)
                np.multiply(theta, keep, out=theta)
                np.add(theta, extrap, out=theta)
            else:
                np.multiply(theta, freq_scale, out=theta)
            c, s = cos[:, 0, :], sin[:, 0, :]
            np.cos(theta, out=c)
            np.sin(theta, out=s)
            c *= mscale
            s *= mscale
            # (x0·cos - x1·sin, x0·sin + x1·cos); staged so that out may alias x
            np.multiply(x0, cos, out=t0)
            np.multiply(x1, sin, out=t2)
            np.subtract(t0, t2, out=t0)
            np.multiply(x0, sin, out=t1)
            np.multiply(x1, cos, out=t2)
            np.add(t1, t2, out=t1)
            np.copyto(o0, t0)
            np.copyto(o1, t1)
            if rest is not None:
                np.copyto(rest[1], rest[0])

        return run


#: the one numpy provider (it keeps no state)
NUMPY_KERNELS = NumpyKernels()


def hadamard_rows(x: np.ndarray, out: np.ndarray, n: int) -> None:
    """numpy's :func:`._numba_rows.hadamard_rows`: the same additions, a round of
    butterflies at a time over every row."""
    scale = np.float32(1) / np.float32(np.sqrt(np.float32(n)))
    np.multiply(x, scale, out=out)
    runs = out.reshape(-1, n)
    span = 1
    while span < n:
        pairs = runs.reshape(runs.shape[0], n // (2 * span), 2, span)
        first, second = pairs[:, :, 0, :], pairs[:, :, 1, :]
        kept = first.copy()
        first += second
        np.subtract(kept, second, out=second)
        span *= 2

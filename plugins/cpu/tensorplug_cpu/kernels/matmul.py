"""mul_mat: ``out[…, t, o] = Σᵢ b[…, t, i]·a[…, o, i]`` with ggml's batch broadcasting.

Which way a product runs is the table of :mod:`.dispatch`, asked once per node when
the plan is built; this module carries its answer out. Prompt-sized products end in
BLAS through ``numpy.matmul`` on float32, on one thread per call:

* A 2-d product is cut into chunks of output rows (weight rows) fixed by its shape,
  which the worker pool's threads claim one at a time (:mod:`..workers`). F32 weights
  are read in place; F16, BF16 and quantized ones are decoded a chunk at a time into
  the claiming thread's scratch, right before the BLAS call that reads them (a chunk is
  about :data:`CHUNK_ELEMS` weights, so it is still in that core's cache, unless that
  would make it narrower than :data:`MIN_CHUNK_ROWS` rows). Nothing is
  cached across computes, so weights that change are always read fresh. The chunks do
  not depend on the thread count, so neither do the numbers.
* Quantized weights times a few vectors (``n_tokens <=``
  :func:`.dispatch.matvec_max_tokens`) use the fused numba kernels when available:
  decoding the matrix just to read it a few times would cost more than the product.
* Batched products (3-d and 4-d weights) decode whole (or in tiles of
  :data:`TILE_ELEMS`) and run one BLAS call per batch entry on the pool.
* Weights stored repacked (``CPU_REPACK``, :mod:`..repack`) take the integer kernels of
  :mod:`._numba_repack` for any number of activation rows, prompts too: eight rows at a
  time against up to four activation rows, faster than decoding and BLAS even for a
  prompt's products.

Batch broadcasting: ``b``'s batch extents are multiples of ``a``'s and batch ``j`` of
``b`` uses batch ``j // ratio`` of ``a``. Splitting each of ``b``'s batch axes into
``(a_extent, ratio)`` (always a view) turns that into numpy broadcasting.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.errors import OutOfBoundsError
from tensorplug.types import Type

from ..repack_buffer import RepackBuffer, packed_rows
from ..workers import POOL
from .activations import Q8_1, vec_dot_type
from .common import BuildContext, Step, padded4, reshape_view, sequence
from .dispatch import (
    BF16_SHIFT,
    BLAS,
    DECODE_NUMPY,
    DECODE_SCALAR,
    DECODE_VECTOR,
    F16_NUMPY,
    F16_WIDEN,
    FLOAT_FUSED,
    FLOAT_MATVEC,
    INT8,
    MANY,
    PLAIN,
    REPACKED,
    REPACKED_DECODE,
    select,
)
from .numpy_kernels import NUMPY_KERNELS

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .provider import CompiledKernels, Kernels

__all__ = [
    "CHUNK_ELEMS",
    "MIN_CHUNK_ROWS",
    "TILE_ELEMS",
    "build_mul_mat",
    "build_mul_mat_id",
    "build_sibling_products",
    "chunk_rows",
]

#: Largest decoded weight tile of a batched product, in float32 elements (16 MiB).
TILE_ELEMS = 1 << 22
#: Weights a chunk of a 2-d product decodes (about: rows are rounded up to 16), in float32
#: elements (512 KiB: a core's L2, so the BLAS call after the decoding reads from cache).
CHUNK_ELEMS = 1 << 17
#: ... but no fewer weight rows than this while each thread still gets two chunks: BLAS
#: runs a narrow product slowly. Decoding and multiplying a prompt by a Q4_0 or Q4_K
#: matrix in chunks of the 32 rows that the element count alone gives runs markedly
#: slower than in chunks of 64 or 128 (a chunk then outgrows L2; L3 still holds it).
MIN_CHUNK_ROWS = 128
#: Below this many multiply-adds (plus decoded weights) a 2-d product is one chunk: the
#: pool's hand-off (tens of microseconds) would cost more than it saves.
PARALLEL_MIN_WORK = 1 << 20


def chunk_rows(n_out: int, n_in: int, n_tok: int, decoded: bool) -> int:
    """Weight rows per chunk of a 2-d product, from its shape alone.

    Enough chunks for every usable core twice over (a multiple of 4, so 1, 2 and 4
    threads get equal shares), more where decoded chunks would outgrow
    :data:`CHUNK_ELEMS` as long as they stay :data:`MIN_CHUNK_ROWS` rows wide; rows in
    multiples of 16. The thread count is not an input: BLAS rounds differently for a
    different split, and a product must give the same numbers at any count.
    """
    if n_out * n_in * (n_tok + (4 if decoded else 0)) < PARALLEL_MIN_WORK:
        return n_out
    least = 2 * POOL.max_threads
    n = max(-(-n_out * n_in // CHUNK_ELEMS) if decoded else 1, least)
    n = min(n, max(least, n_out // MIN_CHUNK_ROWS))
    n = -(-n // 4) * 4
    per_chunk = -(-n_out // n)
    return min(n_out, max(16, -(-per_chunk // 16) * 16))


def _split_batches(x: np.ndarray, a_batch: tuple[int, int]) -> np.ndarray:
    """``(B0, B1, r, c)`` → ``(A0, B0/A0, A1, B1/A1, r, c)``; splitting axes never copies."""
    (b0, b1, r, c), (a0, a1) = x.shape, a_batch
    return x.reshape(a0, b0 // a0, a1, b1 // a1, r, c)


#: ``bind(src)`` → ``decode(scratch)``: the float32 weights of raw ``src``, in ``scratch``
#: or a new array; what depends on ``src`` alone is chosen by ``bind``, once per plan
Binder = Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _widen_bf16(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.left_shift(src, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


#: the decoding paths of the table (:mod:`.dispatch`) → ``(t, kernels)`` → their binder:
#: the provider's, except numpy's own decoding, which the table names for whole batched
#: weights with numba too, and bf16's shift (a view and one ufunc)
_DECODERS: dict[str, Callable[[Type, Kernels], Binder]] = {
    F16_WIDEN: lambda t, kernels: kernels.bind_widen_f16,
    F16_NUMPY: lambda t, kernels: NUMPY_KERNELS.bind_widen_f16,
    BF16_SHIFT: lambda t, kernels: lambda src: partial(_widen_bf16, src),
    DECODE_VECTOR: lambda t, kernels: partial(kernels.bind_dequantize, t),
    DECODE_SCALAR: lambda t, kernels: partial(kernels.bind_dequantize, t),
    DECODE_NUMPY: lambda t, kernels: partial(NUMPY_KERNELS.bind_dequantize, t),
}


def _binder(t: Type, kernels: Kernels) -> Binder | None:
    """How weights of type ``t`` decode for BLAS, as the table's decoding paths say
    (None: F32, read in place). ``src`` is ``(…, rows, n)`` (raw blocks
    ``(…, rows, nblocks, type_size)`` if quantized), the scratch float32 ``(…, rows, n)``;
    a 2-d ``src`` (a chunk, or a tile) may take a kernel that whole batched weights do
    not."""
    numba = kernels.compiled is not None
    by_shape = {}
    for matrix in (True, False):
        name = select(t, PLAIN, MANY, numba=numba, matrix=matrix).name
        if name == BLAS:
            return None
        by_shape[matrix] = _DECODERS[name](t, kernels)
    return lambda src: by_shape[src.ndim == 2](src)


def build_mul_mat(node: Tensor, ctx: BuildContext) -> Step:
    a_t, b_t = node.src
    if isinstance(a_t.buffer, RepackBuffer):
        return _repacked(node, ctx)
    t = a_t.type
    b32, load_b = ctx.f32_in(b_t)
    b4, out4 = padded4(b32), padded4(ctx.view(node))
    a4 = padded4(ctx.view(a_t), core=1 if t.is_quantized else 0)
    a_batch = (a4.shape[0], a4.shape[1])
    n_tok = b4.shape[2]
    plain = a_batch == b4.shape[:2] == (1, 1)  # the common 2-d case
    # the facts the table's paths may need (each entry of a4 has its strides)
    contiguous = not t.is_quantized or (a4.strides[-1] == 1 and a4.strides[-2] == t.type_size)
    unit = plain and all(v.strides[-1] == v.itemsize for v in (a4[0, 0], b4[0, 0], out4[0, 0]))
    compiled = ctx.compiled
    path = select(t, PLAIN, n_tok, numba=compiled is not None, blocks_contiguous=contiguous,
                  matrix=plain, unit_stride=unit).name  # fmt: skip

    if path in (INT8, FLOAT_FUSED):  # their kernels round the activations themselves
        assert compiled is not None
        return sequence(load_b, _fused_matvec(ctx, t, a4, b4, out4, compiled))
    # the other paths multiply by the activations ggml's rounding leaves, as float32
    ctx.uses_blas = True
    load_b, rounded, corr = _rounded(ctx, t, load_b, b4)
    product = _unrounded_product(ctx, t, path, a4, rounded, out4, plain)
    offsets = _offset_correction(a4, corr, out4) if corr is not None else None
    return sequence(load_b, product, offsets)


def _rounded(
    ctx: BuildContext, t: Type, load_b: Step | None, b4: np.ndarray
) -> tuple[Step | None, np.ndarray, np.ndarray | None]:
    """``b4`` rounded as ggml rounds activations for ``t`` weights (:mod:`.activations`)
    into a scratch array after ``load_b``: that step, the array (``b4`` itself for F32
    weights, which take the activations as they are), and for Q4_1/Q5_1 the array that
    holds Q8_1's :func:`~.activations.q8_1_offset_correction` once the step has run
    (None for the other types)."""
    kind = vec_dot_type(t)
    if kind == vec_dot_type(Type.F32):
        return load_b, b4, None
    rounded = ctx.scratch(b4.shape)
    corr = ctx.scratch((*b4.shape[:-1], b4.shape[-1] // 32)) if kind == Q8_1 else None
    return sequence(load_b, ctx.kernels.bind_round_rows(t, b4, rounded, corr)), rounded, corr


def _offset_correction(a4: np.ndarray, corr: np.ndarray, out4: np.ndarray) -> Step:
    """The step that completes a product of Q4_1/Q5_1 weights computed from decoded
    weights and rounded activations: ``Σ_b m_w·corr`` with ``corr = s_x − d_x·Σcode``
    per block (:func:`_rounded`), what Q8_1's f16-rounded ``s`` changes in the offsets'
    share (ggml multiplies ``m`` by ``s``). A product 1/32 the size of the main one."""
    r0, r1 = corr.shape[0] // a4.shape[0], corr.shape[1] // a4.shape[1]

    def correct() -> None:
        m = a4[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        for j0, j1 in itertools.product(range(corr.shape[0]), range(corr.shape[1])):
            out4[j0, j1] += corr[j0, j1] @ m[j0 // r0, j1 // r1].T

    return correct


def _unrounded_product(
    ctx: BuildContext,
    t: Type,
    path: str,
    a4: np.ndarray,
    b4: np.ndarray,
    out4: np.ndarray,
    plain: bool,
) -> Step:
    """``out4 = b4 @ a4ᵀ`` by ``path`` for activations ``b4`` already rounded."""
    a_batch = (a4.shape[0], a4.shape[1])
    n_out, n_in = out4.shape[3], b4.shape[3]
    if path == FLOAT_MATVEC:
        assert ctx.compiled is not None
        return ctx.compiled.bind_matvec_float(a4[0, 0], b4[0, 0], out4[0, 0], t)

    bind = _binder(t, ctx.kernels)  # the decoding paths, which may differ chunk by chunk
    if plain:
        return _by_rows(ctx, b4[0, 0], a4[0, 0], out4[0, 0], bind)
    if bind is None:
        return partial(_by_batch(b4, out4, a_batch), a4)

    n_weights = a4.shape[0] * a4.shape[1] * n_out * n_in
    if n_weights <= TILE_ELEMS:
        # small enough to decode whole, then one BLAS call per batch entry
        w32 = ctx.scratch((*a_batch, n_out, n_in))
        gemm, decode = _by_batch(b4, out4, a_batch), bind(a4)
        return lambda: gemm(decode(w32))

    rows = max(1, min(n_out, TILE_ELEMS // n_in))
    tile = ctx.scratch((rows, n_in))
    b6, out6 = _split_batches(b4, a_batch), _split_batches(out4, a_batch)
    work = []
    for i0, i1 in itertools.product(range(a_batch[0]), range(a_batch[1])):
        for o0 in range(0, n_out, rows):
            o1 = min(n_out, o0 + rows)
            w = tile[: o1 - o0]
            work.append((bind(a4[i0, i1, o0:o1]), w, b6[i0, :, i1], out6[i0, :, i1, :, :, o0:o1]))

    def tiled() -> None:
        for decode, w, bb, oo in work:
            np.matmul(bb, decode(w).swapaxes(-1, -2), out=oo)

    return tiled


def _repacked(node: Tensor, ctx: BuildContext) -> Step:
    """A product of weights stored repacked, by every activation row of ``b`` (its batch
    axes are rows too: the weights are one matrix). The provider's product: without
    compiled kernels the matrix is unpacked and decoded at each compute (a backend made
    with ``jit=0`` beside weights repacked for another; slow, but the same products)."""
    a_t, b_t = node.src
    n_out, n_in = a_t.shape
    compiled = ctx.compiled
    path = select(a_t.type, REPACKED, b_t.nelements // n_in, numba=compiled is not None).name
    b32, load_b = ctx.f32_in(b_t)
    x = reshape_view(b32, (-1, n_in)) if b32.flags.c_contiguous else None
    if x is None:  # a strided activation: its rows staged, unit-stride, at each compute
        x = ctx.scratch((b32.size // n_in, n_in))
        load_b = sequence(load_b, partial(np.copyto, x.reshape(b32.shape), b32))
    out_view = ctx.view(node)
    out = reshape_view(out_view, (-1, n_out)) if out_view.flags.c_contiguous else None
    store = None
    if out is None:
        out = ctx.scratch((x.shape[0], n_out))
        store = partial(np.copyto, out_view, out.reshape(out_view.shape))
    if path == REPACKED_DECODE:  # numpy's provider: unpacked, decoded and BLAS's
        ctx.uses_blas = True
    product = ctx.kernels.bind_packed(a_t.type, packed_rows(a_t), x, out, ctx.scratch,
                                      ctx.ggml_order)  # fmt: skip
    return sequence(load_b, product, store)


def _by_rows(
    ctx: BuildContext, b2: np.ndarray, a2: np.ndarray, o2: np.ndarray, bind: Binder | None
) -> Step:
    """``o2 = b2 @ a2ᵀ`` in chunks of :func:`chunk_rows` weight rows on the pool; ``a2``
    is float32 (``bind`` None) or raw weights whose chunks decode as ``bind`` says."""
    n_tok, n_in = b2.shape
    n_out = o2.shape[1]
    rows = chunk_rows(n_out, n_in, n_tok, bind is not None)
    bounds = [(o0, min(n_out, o0 + rows)) for o0 in range(0, n_out, rows)]
    if bind is None:
        parts = [(a2[o0:o1].T, o2[:, o0:o1]) for o0, o1 in bounds]

        def task(i: int, slot: int) -> None:
            w, out = parts[i]
            np.matmul(b2, w, out=out)

    else:
        slots = POOL.max_threads if len(bounds) > 1 else 1
        tiles = ctx.scratch((slots, rows, n_in))
        coded = [(bind(a2[o0:o1]), o1 - o0, o2[:, o0:o1]) for o0, o1 in bounds]

        def task(i: int, slot: int) -> None:
            decode, n, out = coded[i]
            np.matmul(b2, decode(tiles[slot, :n]).T, out=out)

    if len(bounds) == 1:
        return partial(task, 0, 0)
    return partial(POOL.run, len(bounds), task)


def _by_batch(
    b4: np.ndarray, out4: np.ndarray, a_batch: tuple[int, int]
) -> Callable[[np.ndarray], object]:
    """``gemm(w)``: ``out = b @ wᵀ`` for float32 weights ``w`` with a's batch shape, one
    BLAS call per batch entry of ``b`` on the pool (numpy's batched matmul would run
    them all on one thread)."""
    r0, r1 = b4.shape[0] // a_batch[0], b4.shape[1] // a_batch[1]
    entries = list(itertools.product(range(b4.shape[0]), range(b4.shape[1])))
    n_out, n_tok, n_in = out4.shape[3], b4.shape[2], b4.shape[3]
    if len(entries) == 1 or len(entries) * n_out * n_in * n_tok < PARALLEL_MIN_WORK:
        # few or small products: numpy's own loop over the batch costs less than a hand-off
        if a_batch == b4.shape[:2]:
            return lambda w: np.matmul(b4, w.swapaxes(-1, -2), out=out4)
        b6, o6 = _split_batches(b4, a_batch), _split_batches(out4, a_batch)
        return lambda w: np.matmul(b6, w.swapaxes(-1, -2)[:, None, :, None], out=o6)

    def gemm(w: np.ndarray) -> None:
        def task(i: int, slot: int) -> None:
            j0, j1 = entries[i]
            np.matmul(b4[j0, j1], w[j0 // r0, j1 // r1].T, out=out4[j0, j1])

        POOL.run(len(entries), task)

    return gemm


def _fused_matvec(
    ctx: BuildContext,
    t: Type,
    a4: np.ndarray,
    b4: np.ndarray,
    out4: np.ndarray,
    compiled: CompiledKernels,
) -> Step:
    """Quantized weights × a few rows: the fused numba kernel, per batch of ``b``."""
    r0, r1 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    work = []
    for j0, j1 in itertools.product(range(b4.shape[0]), range(b4.shape[1])):
        x = b4[j0, j1]
        staged = ctx.scratch(x.shape) if x.strides[-1] != 4 else None  # unit-stride rows
        product = compiled.bind_matvec(t, a4[j0 // r0, j1 // r1],
                                       x if staged is None else staged, out4[j0, j1])  # fmt: skip
        work.append((x, staged, product))

    def run() -> None:
        for x, staged, product in work:
            if staged is not None:
                np.copyto(staged, x)
            product()

    return run


def build_sibling_products(
    nodes: Sequence[Tensor], staged: Sequence[bool], ctx: BuildContext, compiled: CompiledKernels
) -> tuple[Step, list[Step | None]] | None:
    """Products of one activation by several quantized matrices as one step (the
    groups of :func:`.siblings.sibling_groups`), and for each product the step its own
    place in the graph keeps: None, or the copy of a staged result into place. None
    when the kernels cannot take the products together."""
    ctx.begin_node()
    x = ctx.view(nodes[0].src[1])
    repacked = [isinstance(n.src[0].buffer, RepackBuffer) for n in nodes]
    if any(repacked) and not all(repacked):  # two kinds of kernel: one by one
        return None
    products = []
    places: list[Step | None] = []
    for node, stage in zip(nodes, staged, strict=True):
        out = ctx.view(node)
        if stage:  # its own array: scratch slots are reused by the nodes in between
            into = np.empty(out.shape, np.float32)
            places.append(partial(np.copyto, out, into))
            out = into
        else:
            places.append(None)
        a = node.src[0]
        products.append((a.type, packed_rows(a) if repacked[0] else ctx.view(a), out))
    if repacked[0]:
        step = compiled.bind_packed_siblings(x, products, ctx.scratch, ctx.ggml_order)
    else:
        step = compiled.bind_matvec_siblings(x, products)
    return None if step is None else (step, places)


def build_mul_mat_id(node: Tensor, ctx: BuildContext) -> Step:
    """Mixture of experts (``ggml_mul_mat_id``): the (token, slot) pairs are grouped by
    the expert they selected, and each used expert's weights are decoded once and
    multiplied with all its rows in one BLAS call; decoding is mul_mat's (numba where
    it has the type), into one expert-sized scratch."""
    ctx.uses_blas = True
    as_t, b_t, ids_t = node.src
    b32, load_b = ctx.f32_in(b_t)
    raw, ids, out = ctx.view(as_t), ctx.view(ids_t), ctx.view(node)
    n_expert, n_out, n_in = as_t.shape
    n_b = b_t.shape[1]
    bind = _binder(as_t.type, ctx.kernels)  # decoded as a prompt's product decodes
    w32 = ctx.scratch((1, n_out, n_in)) if bind is not None else None
    # each expert's decoder bound once, with the plan (binding chooses kernels and views)
    decoders = [bind(raw[ex : ex + 1]) for ex in range(n_expert)] if bind is not None else []
    load_b, rounded, corr = _rounded(ctx, as_t.type, load_b, b32)  # as ggml rounds them

    def run() -> None:
        bad = (ids < 0) | (ids >= n_expert)
        if bad.any():
            t, e = (int(i[0]) for i in np.nonzero(bad))
            raise OutOfBoundsError(
                f"mul_mat_id {node.describe()}: ids[{t}, {e}] = {int(ids[t, e])} is not an "
                f"expert of a (0..{n_expert - 1}); nothing was computed"
            )
        for ex in np.unique(ids):
            tok, slot = np.nonzero(ids == ex)
            w = raw[ex] if w32 is None else decoders[ex](w32)[0]
            out[tok, slot] = rounded[tok, slot % n_b] @ w.T
            if corr is not None:  # see _offset_correction
                m = raw[ex, ..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
                out[tok, slot] += corr[tok, slot % n_b] @ m.T

    return sequence(load_b, run)

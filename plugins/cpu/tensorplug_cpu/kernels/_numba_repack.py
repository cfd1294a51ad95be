"""Integer products of repacked weights: eight rows interleaved, as llama.cpp's CPU_REPACK.

In a weight matrix's own layout each row's blocks lie one after another, so a kernel that
takes several rows at once sums each row's products across the lanes of a vector and
folds the rows together with horizontal adds, block after block: that fold holds the
four-row Q4_0 kernel to about half the speed in cache that its multiply-adds allow.
Repacked, eight rows share each block (:mod:`tensorplug_cpu.repack` writes the layout):
their scales side by side, then their codes in 4-byte chunks, row after row. A 32-byte
load then holds four codes of each of the eight rows, and one multiply-add against the
same four activation codes broadcast to every lane (``vpdpbusd`` with AVX512-VNNI, else
``vpmaddubsw`` then ``vpmaddwd``) leaves each row's sum in its own 32-bit lane: no fold
at all. Q4_0 so runs about twice as fast in cache as the four-row kernel, with
VNNI or AVX2, and faster from memory too.

A tile is one group of eight rows times 1–4 activation rows (:func:`tile_kernel`): the
weight block is unpacked once and multiplied into every activation row of the tile, so
a prompt reads each group's codes from cache for all its tokens. Each row's block sum
is an exact integer (``Σ(q − offset)·x``, the offset taken back out as ``offset·Σx``),
scaled by ``d_w·d_x`` and added to the row's float sum block by block: for Q4_0 the
arithmetic of llama.cpp's ``ggml_gemv_q4_0_8x8_q8_0`` and of the four-row kernel of
:mod:`._numba_introw`, to the bit. Q4_K sums each super-block as two integers (its
scaled sums and its minimums' share) and scales each once, as llama.cpp's repacked
``ggml_gemv_q4_K_8x8_q8_K`` (its four-row ``gemm`` scales each pair of sub-blocks:
followed only with ggml's order, ``ggml_order``, since a row's bits then depend on the
rows beside it); Q5_K scales each sub-block of 32; Q6_K scales each 16 values' exact
sum, less 32 times their activations' sum (with ``ggml_order``: ggml's ``vec_dot`` or,
from 8 rows, its tiled product's order, :func:`_q6_k_lane_body`,
:func:`_q6_k_tiled_body`). Q4_1 and Q5_1 keep ggml's ``vec_dot`` order, and Q5_0 and
Q8_0 with ``ggml_order``: eight float sums a row (and for Q4_1 and Q5_1 the minimums'
``m_w·s_x`` beside them), llama.cpp's bits (:func:`_vec_dot_order_body`,
:func:`_lane_order_body`).
The activations are rounded as ggml does for the type
(:func:`._numba_quant.quantize_activations`: Q8_0, Q8_1, Q8_K).

A repacked product is one sequential stream of bytes, which a Zen core's hardware
prefetchers follow: asking for the blocks ahead makes Q4_K slower from memory there and
Q4_0 and Q8_0 no faster. An Intel Xeon's core does not keep up with the stream alone:
off Zen cores each tile asks for the bytes 4 KiB ahead (:func:`prefetches`), and a
product by one row runs markedly faster from memory for it.
The stream must also be read in order *within* a block: Q6_K's ``vec_dot``-order tile
(:func:`_q6_k_lane_body`) taking its 1,680-byte block chunk by chunk across both halves
(two streams 768 bytes apart, one step each) reads memory at well under half Q4_K's
rate, even asking for the blocks ahead. Taking each half's chunks in turn (the same
integers, so the same bits) and asking for nothing ahead, it reads at Q4_K's rate or
better, and a small Q6_K model's generated token takes less than half the time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.extending import intrinsic

from tensorplug.types import Type

from ..repack import GROUP_ROWS, LAYOUTS, PackedLayout
from . import _numba_ir as _ir
from ._numba_cache import kernel
from ._numba_ir import (
    I8,
    I16,
    I32,
    I64,
    carried_loop,
    f16x,
    f32_bits,
    llvm_fn,
    splat,
    splat_scalar,
    vec_of,
)
from ._numba_pool import address
from ._numba_quant import DOT_FASTMATH, ROW_CHUNKS, chunk_span, quantize_activations
from .job_blocks import (
    MAT_BYTES,
    MAT_GROUPS,
    MAT_KIND,
    MAT_OUT,
    MAT_OUT_COLS,
    MAT_PACKED,
    MAT_START,
    PACKED_CHUNKS,
    PACKED_COLS,
    PACKED_HEAD,
    PACKED_KIND,
    PACKED_MAT_FIELDS,
    PACKED_MATS,
    PACKED_ROWS,
    PACKED_TABLE,
    PACKED_TOTAL,
    PACKED_X,
    PACKED_XD,
    PACKED_XQ,
    PACKED_XS,
    PACKED_XS_COLS,
)
from .job_function import job_function

__all__ = [
    "GGML_ORDER_BIT",
    "NARROW_TILE",
    "TILE",
    "WIDE_TILE",
    "PackedKernels",
    "PREFETCH_AHEAD",
    "kinds_mask",
    "packed_driver",
    "packed_job",
    "packed_job_of",
    "packed_kernels",
    "prefetches",
    "quantize_rows",
    "tile_kernel",
    "tile_rows",
]

_F32 = ir.FloatType()
_V8F = ir.VectorType(_F32, 8)
_V8I = vec_of(I32, 8)
_V32B = vec_of(I8, 32)


#: activation rows of most layouts' tiles (:func:`tile_rows`)
TILE = 4
#: ... and of a wide tile, for the layouts whose rows carry one accumulator where there
#: are registers for them
WIDE_TILE = 8
#: ... and of a narrow one, for Q4_K with 32 registers (:func:`tile_rows`)
NARROW_TILE = 2
#: the activation rows of ggml's repacked four-row gemm: llama.cpp multiplies a
#: product's rows in groups of four from the first (``forward_mul_mat_one_chunk``) and
#: the last ``n % 4`` by its gemv. With ggml's order (``ggml_order``), a driver's Q4_K
#: tiles sum the first ``4·⌊n/4⌋`` rows in the gemm's order (:data:`GEMM_FORM`) and the
#: rest in the gemv's. Each row's gemm order is its own (the gemm keeps no sum across
#: its four rows), so the tiles keep Q4_K's height on the host (:func:`tile_rows`)
GGML_GEMM_ROWS = 4
#: the fewest activation rows for which llama.cpp 0.3.36 multiplies Q6_K weights (never
#: repacked on x86) by its tiled K-quant product rather than ``vec_dot`` row by row
#: (``ggml_tiled_min_batch``): with ggml's order a driver's Q6_K tiles take the tiled
#: product's order (:func:`_q6_k_tiled_body`) when it has this many rows or more
GGML_TILED_MIN_ROWS = 8
#: what Q6_K's stored codes exceed their values by: its products' ``xs`` hold each
#: 16-value group's activation sum times ``−Q6_K_OFFSET`` (:func:`_sums_of_16`)
Q6_K_OFFSET = 32
#: the tile forms of :func:`_tile_of`: a layout's own, ggml's tiled product's (Q6_K)
#: and its four-row gemm's (Q4_K)
OWN_FORM, TILED_FORM, GEMM_FORM = 0, 1, 2
#: added to a form: its tile for two groups at once, sixteen weight rows in each 512-bit
#: vector (:func:`pairs_groups`)
PAIRED = 8
# the type ids the drivers branch on (Q2_K's and Q6_K's code sums are over 16 values)
Q2_K, Q4_K, Q5_K, Q6_K = int(Type.Q2_K), int(Type.Q4_K), int(Type.Q5_K), int(Type.Q6_K)


def _fixed_mul(builder: ir.IRBuilder, a: Any, b: Any) -> Any:
    """``a·b`` that the kernels' fast math may not regroup. numba gives every float
    instruction without flags the kernel's ``reassoc``, and LLVM would then regroup
    Q4_K's and Q6_K's three-factor scales (``d·sc·d_x``) one way in a tile of one
    activation row and another in a tile of two: a row's bits would depend on how many
    rows were multiplied beside it. ``contract`` alone allows no regrouping."""
    product = builder.fmul(a, b)
    product.flags.append("contract")
    return product


def _word(builder: ir.IRBuilder, ptr: Any) -> Any:
    """The 4 bytes at ``ptr`` as an ``i32``."""
    return builder.load(builder.bitcast(ptr, I32.as_pointer()), align=1)


def _broadcast_i32(builder: ir.IRBuilder, ptr: Any, lanes: int = 8) -> Any:
    """The 4 bytes at ``ptr`` in each of ``lanes`` 32-bit lanes, as ``<4·lanes x i8>``."""
    words = splat_scalar(builder, _word(builder, ptr), lanes)
    return builder.bitcast(words, vec_of(I8, 4 * lanes))


def _splat_f(builder: ir.IRBuilder, v: Any) -> Any:
    """The float ``v`` in each of eight lanes."""
    return splat_scalar(builder, v, 8)


def _quads(builder: ir.IRBuilder, prod: Any) -> Any:
    """``<32 x i32>`` products summed in fours of neighbours: eight lanes."""
    quads = [builder.shuffle_vector(prod, prod, ir.Constant(_V8I, [4 * k + i for k in range(8)]))
             for i in range(4)]  # fmt: skip
    return builder.add(builder.add(quads[0], quads[1]), builder.add(quads[2], quads[3]))


class _RowSums:
    """Eight 32-bit sums ``Σ u·s`` over 4-byte groups, one activation row's for each of
    eight weight rows, ``u`` unsigned codes, ``s`` signed activation codes.

    VNNI adds each product into the sums in one ``vpdpbusd``. AVX2 multiplies pairs into
    16-bit lanes (``vpmaddubsw``) and keeps adding those while no lane can overflow,
    then widens them into the sums with one ``vpmaddwd``. Elsewhere, portable widening
    arithmetic that LLVM lowers for the host."""

    def __init__(self, builder: ir.IRBuilder, start: Any) -> None:
        self.builder, self.sums = builder, start
        self.pairs: Any = None  # AVX2's 16-bit lanes not yet widened
        self.bound = 0  # the largest magnitude a lane of ``pairs`` can hold

    def add(self, u: Any, s: Any, u_max: int) -> None:
        """``u`` and ``s`` of 32 bytes (eight weight rows), or of 64 with AVX512-VNNI
        (sixteen: two groups', :data:`PAIRED`)."""
        b = self.builder
        if _ir.HAS_VNNI:
            bits = 8 * u.type.count
            lanes = vec_of(I32, bits // 32)
            dp = llvm_fn(b, f"llvm.x86.avx512.vpdpbusd.{bits}", lanes, lanes, lanes, lanes)
            self.sums = b.call(dp, [self.sums, b.bitcast(u, lanes), b.bitcast(s, lanes)])
        elif _ir.HAS_AVX2:
            bound = 2 * u_max * 128  # two products of a u8 by an s8 of at most 128
            if self.pairs is not None and self.bound + bound > 32767:
                self.flush()
            madd = llvm_fn(b, "llvm.x86.avx2.pmadd.ub.sw", vec_of(I16, 16), _V32B, _V32B)
            pairs = b.call(madd, [u, s])
            self.pairs = pairs if self.pairs is None else b.add(self.pairs, pairs)
            self.bound += bound
        else:
            self.sums = b.add(
                self.sums, _quads(b, b.mul(b.zext(u, vec_of(I32, 32)), b.sext(s, vec_of(I32, 32))))
            )

    def add_signed(self, q: Any, x: Any) -> None:
        """:meth:`add` for signed weight codes ``q``: fed to VNNI as ``q + 128`` (the
        caller starts the sums at ``−128·Σx``, :func:`_offset`), to AVX2 as ``|q|``
        against ``x`` with ``q``'s sign (``vpsignb``, as ggml), else widened signed."""
        if _ir.HAS_VNNI:
            self.add(self.builder.xor(q, splat(I8, 32, 128)), x, 255)
        else:
            self.add_sign_folded(q, x)

    def add_sign_folded(self, q: Any, x: Any) -> None:
        """:meth:`add` for signed weight codes ``q`` with no offset to take back out:
        ``|q|`` against ``x`` with ``q``'s sign (``vpsignb``, as ggml) with AVX2 (VNNI
        included), else widened signed. Each sum is exact, group by group."""
        b = self.builder
        if _ir.HAS_AVX2:
            sign = llvm_fn(b, "llvm.x86.avx2.psign.b", _V32B, _V32B, _V32B)
            self.add(b.call(sign, [q, q]), b.call(sign, [x, q]), 128)
        else:
            self.sums = b.add(
                self.sums, _quads(b, b.mul(b.sext(q, vec_of(I32, 32)), b.sext(x, vec_of(I32, 32))))
            )

    def scaled(self, scale: Any) -> Any:
        """The sums times ``scale``, each weight row's own (``<8 x i32>`` of values that
        fit 8 bits), exactly. AVX2 multiplies its 16-bit lanes by the scale as it widens
        them (one ``vpmaddwd``, as ggml's ``vec_dot_q6_K_q8_K``), rather than widening
        them by ones and multiplying 32-bit lanes after (``vpmulld``: ten cycles of
        latency and two operations on Intel's AVX2 cores)."""
        b = self.builder
        if self.pairs is None:
            return b.mul(self.flush(), scale)
        wd = llvm_fn(b, "llvm.x86.avx2.pmadd.wd", _V8I, vec_of(I16, 16), vec_of(I16, 16))
        halves = b.bitcast(scale, vec_of(I16, 16))  # each row's scale in both of its halves
        low_halves = ir.Constant(vec_of(I32, 16), [i & ~1 for i in range(16)])
        both = b.shuffle_vector(halves, halves, low_halves)
        widened = b.call(wd, [self.pairs, both])
        self.pairs, self.bound = None, 0
        return b.add(b.mul(self.sums, scale), widened)

    def flush(self) -> Any:
        """The sums, with AVX2's 16-bit lanes widened into them."""
        if self.pairs is not None:
            b = self.builder
            wd = llvm_fn(b, "llvm.x86.avx2.pmadd.wd", _V8I, vec_of(I16, 16), vec_of(I16, 16))
            self.sums = b.add(self.sums, b.call(wd, [self.pairs, splat(I16, 16, 1)]))
            self.pairs, self.bound = None, 0
        return self.sums


def _concat(builder: ir.IRBuilder, low: Any, high: Any) -> Any:
    """Two vectors of one type as one of twice the lanes, ``low`` first."""
    n = low.type.count
    return builder.shuffle_vector(low, high, ir.Constant(vec_of(I32, 2 * n), list(range(2 * n))))


def _half(builder: ir.IRBuilder, v: Any, which: int) -> Any:
    """Lanes ``0…n/2−1`` (``which`` 0) or ``n/2…n−1`` (1) of ``v``."""
    h = v.type.count // 2
    return builder.shuffle_vector(
        v, v, ir.Constant(vec_of(I32, h), list(range(which * h, (which + 1) * h)))
    )


def _pair_sums(builder: ir.IRBuilder, u: Any, x0: Any, x1: Any, u_max: int) -> Any:
    """:class:`_RowSums` of one 4-byte group for two activation rows at once: the eight
    weight rows' ``Σ u·s`` against the word at ``x0`` (an ``i8*``) in lanes 0–7 and
    against the word at ``x1`` in lanes 8–15 of an ``<16 x i32>``. With AVX512-VNNI
    (VNNI with 32 registers: every CPU with AVX-512 and VNNI has AVX512-VNNI) one
    512-bit ``vpdpbusd`` whose activation operand is two broadcast loads (the second
    merged into the upper half by a mask); elsewhere the two rows' sums as
    :class:`_RowSums` makes them, side by side. Either way each lane is the same exact
    integer."""
    if _ir.HAS_VNNI and _ir.HAS_32_REGS:
        v16i = vec_of(I32, 16)
        words = [splat_scalar(builder, _word(builder, x), 16) for x in (x0, x1)]
        upper = ir.Constant(ir.VectorType(ir.IntType(1), 16), [i >= 8 for i in range(16)])
        both_x = builder.select(upper, words[1], words[0])
        dp = llvm_fn(builder, "llvm.x86.avx512.vpdpbusd.512", v16i, v16i, v16i, v16i)
        both_u = builder.bitcast(_concat(builder, u, u), v16i)
        return builder.call(dp, [ir.Constant(v16i, [0] * 16), both_u, both_x])
    halves = []
    for x in (x0, x1):
        sums = _RowSums(builder, ir.Constant(_V8I, [0] * 8))
        sums.add(u, _broadcast_i32(builder, x), u_max)
        halves.append(sums.flush())
    return _concat(builder, *halves)


def _fmuladd(builder: ir.IRBuilder, a: Any, b: Any, c: Any) -> Any:
    """``a·b + c`` fused, for float vectors of any width."""
    ty = a.type
    return builder.call(llvm_fn(builder, f"llvm.fmuladd.v{ty.count}f32", ty, ty, ty, ty), [a, b, c])


def _offset(lay: PackedLayout) -> int:
    """What each stored code exceeds its value by, as the kernel feeds it: Q8_0's and
    IQ4_NL's signed values go into VNNI's unsigned operand as ``q + 128``
    (:meth:`_RowSums.add_signed`)."""
    if lay.nibbles and not lay.levels:
        return lay.offset
    return 128 if _ir.HAS_VNNI else 0


def _levels(builder: ir.IRBuilder, codes: Any, levels: tuple[int, ...]) -> Any:
    """``levels[code]`` for each of 32 nibble codes (``<32 x i8>``), as ``<32 x i8>``:
    one ``vpshufb`` with AVX2 (the 16 levels in both 128-bit halves), else a select per
    level, portable IR LLVM lowers for the host."""
    if _ir.HAS_AVX2:
        table = ir.Constant(_V32B, [v & 0xFF for v in levels] * 2)
        shuffle = llvm_fn(builder, "llvm.x86.avx2.pshuf.b", _V32B, _V32B, _V32B)
        return builder.call(shuffle, [table, codes])
    out = splat(I8, 32, levels[0] & 0xFF)
    for i, v in enumerate(levels[1:], start=1):
        hit = builder.icmp_unsigned("==", codes, splat(I8, 32, i))
        out = builder.select(hit, splat(I8, 32, v & 0xFF), out)
    return out


def _scales(builder: ir.IRBuilder, at: Any, table: Any) -> Any:
    """The eight f16 values at ``at`` as ``<8 x float>``: one ``vcvtph2ps`` with F16C,
    else eight lookups in the f16 → f32 table."""
    if _ir.HAS_F16C:
        halves = ir.VectorType(ir.HalfType(), 8)
        return builder.fpext(builder.load(builder.bitcast(at, halves.as_pointer()), align=1), _V8F)
    return f16x(builder, [builder.gep(at, [I64(2 * r)]) for r in range(8)], I64(0), table)


def _bytes_i(builder: ir.IRBuilder, at: Any) -> Any:
    """The eight unsigned bytes at ``at`` as ``<8 x i32>``."""
    v8 = builder.load(builder.bitcast(at, vec_of(I8, 8).as_pointer()), align=1)
    return builder.zext(v8, _V8I)


def _bytes_f(builder: ir.IRBuilder, at: Any) -> Any:
    """The eight unsigned bytes at ``at`` as ``<8 x float>``."""
    v8 = builder.load(builder.bitcast(at, vec_of(I8, 8).as_pointer()), align=1)
    return builder.uitofp(v8, _V8F)


@dataclass
class _Block:
    """What a tile's body sees at one repacked block: its bytes, and per activation row
    of the tile the row's Q8_0 codes, scales and code sums."""

    builder: ir.IRBuilder
    lay: PackedLayout
    base: Any  # i8* of the block
    b: Any  # i64 index of the block
    x: list[Any]  # i8* of each activation row's codes
    xd: list[Any]  # float* of each row's block scales
    xs: list[Any]  # i32* of each row's block code sums
    table: Any  # float* of the f16 → f32 table
    #: the activation rows whose sums each accumulator holds (:func:`_units`)
    units: list[tuple[int, ...]]
    #: ``<8 x float>*`` room for a vector per block and unit that a tile of passes keeps
    #: from its first pass for the later ones (:func:`_tile`), else None
    kept: Any = None
    #: i8* of the next group's block in a tile of two groups (:data:`PAIRED`), else None
    base2: Any = None

    @property
    def lanes(self) -> int:
        """The weight rows whose sums a vector of this tile holds side by side."""
        return 8 if self.base2 is None else 16

    def rows(self, offset: int, load: Callable[[ir.IRBuilder, Any], Any]) -> Any:
        """``load(builder, at)`` of the block's eight rows' values at byte ``offset``
        (``<8 x T>``, or the code bytes of a run), or in a tile of two groups both
        groups', the first's in the low lanes."""
        b = self.builder
        bases = [self.base] if self.base2 is None else [self.base, self.base2]
        loaded = [load(b, b.gep(base, [I64(offset)])) for base in bases]
        return loaded[0] if len(loaded) == 1 else _concat(b, *loaded)

    def scales(self, offset: int) -> Any:
        """The rows' f16 values at byte ``offset`` as floats (:func:`_scales`, :meth:`rows`)."""
        return self.rows(offset, lambda b, at: _scales(b, at, self.table))

    def kept_at(self, unit: int) -> Any:
        """The ``<8 x float>*`` that unit ``unit`` keeps for this block."""
        b = self.builder
        return b.gep(self.kept, [b.add(b.mul(self.b, I64(len(self.units))), I64(unit))])

    def code_run(self, at: int) -> Any:
        """The 32 code bytes at ``at`` of the block (in a tile of two groups, 64: both
        groups' runs, as :meth:`rows`)."""
        return self.rows(at, lambda b, p: b.load(b.bitcast(p, _V32B.as_pointer()), align=1))

    def x_at(self, t: int, k: Any, at: int) -> Any:
        """The ``i8*`` of activation row ``t``'s code ``at`` of block ``k``."""
        b = self.builder
        return b.gep(self.x[t], [b.add(b.mul(k, I64(32)), I64(at))])

    def x_word(self, t: int, k: Any, at: int) -> Any:
        """Four codes of activation row ``t``, block ``k``, from value ``at``, in every lane."""
        return _broadcast_i32(self.builder, self.x_at(t, k, at), self.lanes)

    def load(self, ptrs: list[Any], t: int, k: Any) -> Any:
        return self.builder.load(self.builder.gep(ptrs[t], [k]))


#: a tile's body: (block, the accumulators of each unit of activation rows, see
#: :func:`_units`) -> their new values
Body = Callable[[_Block, list[list[Any]]], list[list[Any]]]
#: its ending: (builder, one activation row's final accumulators) -> its eight sums
Finish = Callable[[ir.IRBuilder, list[Any]], Any]


#: emits a tile's IR at the builder's place: (context, builder, signature, arguments)
Emit = Callable[[Any, ir.IRBuilder, Any, Any], None]


def _units(n_tok: int, paired: bool) -> list[tuple[int, ...]]:
    """The activation rows of a tile whose sums share one accumulator vector: with
    ``paired``, rows two by two (``<16 x float>``, the last of an odd count alone), else
    each row alone (``<8 x float>``)."""
    if not paired:
        return [(t,) for t in range(n_tok)]
    return [tuple(range(t, min(t + 2, n_tok))) for t in range(0, n_tok, 2)]


#: a pass of a tile over its blocks: the body, and which of a unit's accumulators it updates
Pass = tuple[Body, list[int]]


#: how far ahead of the block it multiplies a tile asks for bytes (:func:`prefetches`):
#: any distance from 2 to 16 KiB gains alike on an Intel Xeon, 1 KiB half as much, 512 B
#: little
PREFETCH_AHEAD = 4096


def prefetches() -> bool:
    """Whether a tile asks for the bytes :data:`PREFETCH_AHEAD` ahead of each block it
    reads (one ``prefetcht0`` a cache line of the block): everywhere but Zen cores.

    One core of an Intel Xeon follows a repacked matrix's one stream from memory
    slower alone than the file's layout, whose four-row kernels prefetch, and faster
    than it with the prefetches: products by one or two rows of every repacked type,
    Gemma 3's large output matrix among them, take markedly less time
    (``bench_repack.py --from-memory``; docs/performance.md has the figures). A
    prompt's products from cache take as long either way. On a Zen core asking for the
    blocks ahead makes Q4_K slower from memory and Q4_0 and Q8_0 no faster (the hardware
    prefetchers there keep up with one stream), so Zen cores do not ask. The values are
    the same either way: a prefetch reads nothing into a register."""
    return not _ir.ON_ZEN


def _tile(lay: PackedLayout, n_tok: int, body: Body | list[Pass], finish: Finish, n_accs: int,
          paired: bool = False, lanes: int = 8, groups: int = 1) -> Emit:  # fmt: skip
    """The IR of a tile, for arguments ``(packed, g, xq, xd, xs, table, t0, out, …)``:
    rows ``8g..8g+7`` of the repacked matrix ``packed`` (``(n_groups, blocks·block)``
    bytes) times activation rows ``t0..t0+n_tok-1`` of the Q8_0 codes ``xq``, scales
    ``xd`` and code sums ``xs``, into ``out[t0 + t, 8g:8g+8]`` (``out``'s rows
    unit-stride), as one loop over the blocks whose inside ``body`` emits, ``n_accs``
    vectors of floats carried from block to block per unit of activation rows
    (:func:`_units`; ``paired`` for bodies that sum two rows in one vector; ``lanes``
    floats in an accumulator of one row, 16 for bodies whose vector holds two of its
    sums for each of the eight weight rows). ``groups`` 2: groups ``g`` and ``g + 1`` at
    once, their sixteen rows side by side in 512-bit vectors (:data:`PAIRED`), into
    ``out[t0 + t, 8g:8g+16]``.

    ``body`` may instead be a list of passes, each a loop over all the blocks that
    carries only the accumulators it names (:func:`_lane_order_passes`): a tile whose
    rows' accumulators outnumber the registers then keeps a pass's in them, the others
    waiting outside the loop, rather than moving all of them through memory at every
    block. What the first pass keeps for the others (a ``<8 x float>`` per block and
    unit: 128 KiB for four rows of 32,768 values) lives on the stack for the tile's
    call only (``llvm.stacksave``/``stackrestore``)."""
    units = _units(n_tok, paired)
    passes = body if isinstance(body, list) else [(body, list(range(n_accs)))]
    prefetch = prefetches()

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> None:
        _ir.align_stack(builder)  # the rows' sums spill
        arrays = [context.make_array(sig.args[i])(context, builder, args[i])
                  for i in (0, 2, 3, 4, 7)]  # fmt: skip
        pk, xqa, xda, xsa, outa = arrays
        table = context.make_array(sig.args[5])(context, builder, args[5]).data
        stride = [builder.extract_value(a.strides, 0) for a in arrays]
        group = builder.gep(pk.data, [builder.mul(args[1], stride[0])])
        group2 = builder.gep(group, [stride[0]]) if groups == 2 else None
        n = builder.sdiv(builder.extract_value(pk.shape, 1), I64(lay.block))
        rows = [builder.add(args[6], I64(t)) for t in range(n_tok)]

        def row_of(a: Any, s: Any, r: Any, ty: ir.Type) -> Any:
            byte = builder.bitcast(a.data, I8.as_pointer())
            return builder.bitcast(builder.gep(byte, [builder.mul(r, s)]), ty.as_pointer())

        x_rows = [row_of(xqa, stride[1], r, I8) for r in rows]
        xd_rows = [row_of(xda, stride[2], r, _F32) for r in rows]
        xs_rows = [row_of(xsa, stride[3], r, I32) for r in rows]
        widths = [groups * (lanes if len(u) == 1 else 8 * len(u)) for u in units]
        zeros = [ir.Constant(ir.VectorType(_F32, w), [0.0] * w) for w in widths]

        kept, saved = None, None
        if len(passes) > 1:  # room for what the first pass keeps, given back after the tile
            i8p = I8.as_pointer()
            saved = builder.call(llvm_fn(builder, "llvm.stacksave", i8p), [])
            kept = builder.alloca(_V8F, size=builder.mul(n, I64(len(units))))
        flat = [z for z in zeros for _ in range(n_accs)]
        for k, (pass_body, which) in enumerate(passes):
            ask = prefetch and k == 0  # a later pass reads the bytes the first brought in
            carried = [n_accs * i + a for i in range(len(units)) for a in which]
            before = flat

            def block(
                b: Any,
                values: list[Any],
                pass_body: Body = pass_body,
                carried: list[int] = carried,
                before: list[Any] = before,
                ask: bool = ask,
            ) -> list[Any]:
                full = list(before)
                for at, v in zip(carried, values, strict=True):
                    full[at] = v
                accs = [full[n_accs * i : n_accs * (i + 1)] for i in range(len(units))]
                at = builder.mul(b, I64(lay.block))
                base = builder.gep(group, [at])
                base2 = None if group2 is None else builder.gep(group2, [at])
                for read in ([base] if base2 is None else [base, base2]) if ask else []:
                    ahead = builder.gep(read, [I64(PREFETCH_AHEAD)])
                    _ir.prefetch_lines(builder, ahead, lay.block)
                new = pass_body(_Block(builder, lay, base, b, x_rows, xd_rows, xs_rows, table,
                                       units, kept, base2), accs)  # fmt: skip
                new_flat = [v for vals in new for v in vals]
                return [new_flat[at] for at in carried]

            ends = carried_loop(builder, "tile", I64(0), n, 1, [before[at] for at in carried],
                                block)  # fmt: skip
            flat = list(before)
            for at, v in zip(carried, ends, strict=True):
                flat[at] = v
        if saved is not None:
            builder.call(llvm_fn(builder, "llvm.stackrestore", ir.VoidType(), I8.as_pointer()),
                         [saved])  # fmt: skip
        finals: list[list[Any]] = []
        for i, unit in enumerate(units):
            accs = flat[n_accs * i : n_accs * (i + 1)]
            if len(unit) == 1:
                finals.append(accs)
            else:
                finals.extend([_half(builder, a, h) for a in accs] for h in range(2))
        col = builder.mul(args[1], I64(GROUP_ROWS * 4))  # byte offset of column 8g
        for t in range(n_tok):
            row = builder.gep(
                builder.bitcast(outa.data, I8.as_pointer()),
                [builder.add(builder.mul(rows[t], stride[4]), col)],
            )
            sums = finish(builder, finals[t])
            builder.store(sums, builder.bitcast(row, sums.type.as_pointer()), align=4)

    return codegen


def _fifth_word(blk: _Block, run: int) -> Any:
    """The ``i32`` of a Q5_0 or Q5_1 block's fifth bits for its code run ``run``."""
    b = blk.builder
    return _word(b, b.gep(blk.base, [I64(blk.lay.bits_at + 4 * run)]))


def _fifth_bits(blk: _Block, run: int) -> Any:
    """Word ``run`` of a Q5_0 or Q5_1 block's fifth bits as ``<32 x i8>`` of 0 or 16: bit ``i`` to
    byte ``i`` (LLVM lowers the ``<32 x i1>`` to one ``vpmovm2b`` with AVX512-BW)."""
    b = blk.builder
    bits = b.bitcast(_fifth_word(blk, run), ir.VectorType(ir.IntType(1), 32))
    return b.shl(b.zext(bits, _V32B), splat(I8, 32, 4))


def _block32_body(lay: PackedLayout) -> Body:
    """Q4_0, Q5_0, Q8_0 and IQ4_NL (its nibbles looked up as signed levels, then
    multiplied as Q8_0's codes): each row's block sum ``Σ(q − offset)·x`` exact, then
    one multiply-add of it by ``d_w·d_x`` into the row's sum."""

    def body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
        builder, b = blk.builder, blk.b
        n_tok = len(accs)
        sums = []
        for t in range(n_tok):
            if _offset(lay) == 0:  # nothing to take back out
                sums.append(_RowSums(builder, ir.Constant(_V8I, [0] * 8)))
                continue
            back = builder.mul(blk.load(blk.xs, t, b), I32(-_offset(lay)))
            start = builder.insert_element(ir.Constant(_V8I, None), back, I32(0))
            sums.append(_RowSums(builder, builder.shuffle_vector(
                start, start, ir.Constant(_V8I, [0] * 8))))  # fmt: skip
        for c in range(lay.chunks):
            q = blk.code_run(lay.codes_at + 32 * c)
            if lay.nibbles:  # low nibbles: values 4c..4c+3, high: 16+4c..
                runs = [builder.and_(q, splat(I8, 32, 15)), builder.lshr(q, splat(I8, 32, 4))]
                if lay.regroup == "fifth bits":  # each code's fifth bit from its run's word
                    runs = [builder.or_(codes, _fifth_bits(blk, 2 * c + h))
                            for h, codes in enumerate(runs)]  # fmt: skip
                u_max = 31 if lay.regroup == "fifth bits" else 15
                for codes, at in zip(runs, (4 * c, 16 + 4 * c), strict=True):
                    if lay.levels:  # IQ4_NL: the nibble indexes a signed level
                        values = _levels(builder, codes, lay.levels)
                        for t in range(n_tok):
                            sums[t].add_signed(values, blk.x_word(t, b, at))
                        continue
                    for t in range(n_tok):
                        sums[t].add(codes, blk.x_word(t, b, at), u_max)
            else:
                for t in range(n_tok):
                    sums[t].add_signed(q, blk.x_word(t, b, 4 * c))
        d_w = _scales(builder, blk.base, blk.table)
        fma = llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
        new = []
        for t in range(n_tok):
            scale = _fixed_mul(builder, d_w, _splat_f(builder, blk.load(blk.xd, t, b)))
            isum = builder.sitofp(sums[t].flush(), _V8F)
            new.append([builder.call(fma, [scale, isum, accs[t][0]])])
        return new

    return body


def _vec_dot_order_body(lay: PackedLayout) -> Body:
    """Q4_1 and Q5_1 in the order of ggml's ``vec_dot_q4_1_q8_1`` (and ``q5_1``), which
    llama.cpp runs for every row count (it has no repacked kernel for them): each row
    keeps eight float sums, sum ``k`` taking ``d_w·d_x·Σ q·x`` over values ``4k..4k+3``
    of every block, and beside them ``Σ m_w·s_x`` (``s_x`` the Q8_1 activations'
    f16-rounded ``d·Σcode``, whose float32 bits ``xs`` holds), joined once per row by
    :func:`_vec_dot_finish`. The products are then llama.cpp's to the bit, and those of
    the unrepacked four-row kernel (tested). Summing each block's eight partial sums as
    one exact integer first (the other layouts' order) is about a third of the
    arithmetic, but moves SmolLM2's logits by up to 0.45 from llama.cpp's at the first
    positions, where this order keeps them equal to the bit. Run ``c`` of codes holds
    values ``4c..4c+3`` (low nibbles) and ``16 + 4c..`` (high): sums ``c`` and ``4 + c``.

    Each 4-value group costs a row an integer sum, a conversion and a fused multiply-add
    of its own, so the tile takes its activation rows in pairs (:func:`_units`): one
    512-bit ``vpdpbusd``, conversion and multiply-add for both rows' eight lanes
    (:func:`_pair_sums`), where 256-bit vectors take two of each. Every lane computes
    what it did alone, so the bits are the same."""

    def body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
        builder, b = blk.builder, blk.b
        d_w = _scales(builder, blk.base, blk.table)
        m_w = _scales(builder, builder.gep(blk.base, [I64(lay.minimum_at)]), blk.table)

        def joined(vectors: list[Any]) -> Any:
            return vectors[0] if len(vectors) == 1 else _concat(builder, *vectors)

        scales = [joined([_fixed_mul(builder, d_w, _splat_f(builder, blk.load(blk.xd, t, b)))
                          for t in unit]) for unit in blk.units]  # fmt: skip
        new = [list(a) for a in accs]
        u_max = 31 if lay.regroup == "fifth bits" else 15
        for c in range(lay.chunks):
            q = blk.code_run(lay.codes_at + 32 * c)
            runs = [builder.and_(q, splat(I8, 32, 15)), builder.lshr(q, splat(I8, 32, 4))]
            if lay.regroup == "fifth bits":
                runs = [builder.or_(codes, _fifth_bits(blk, 2 * c + h))
                        for h, codes in enumerate(runs)]  # fmt: skip
            for h, codes in enumerate(runs):
                k, at = c + 4 * h, 4 * c + 16 * h
                for i, unit in enumerate(blk.units):
                    if len(unit) == 2:
                        x0, x1 = (blk.x_at(t, b, at) for t in unit)
                        part = _pair_sums(builder, codes, x0, x1, u_max)
                    else:
                        lane = _RowSums(builder, ir.Constant(_V8I, [0] * 8))
                        lane.add(codes, blk.x_word(unit[0], b, at), u_max)
                        part = lane.flush()
                    part = builder.sitofp(part, ir.VectorType(_F32, part.type.count))
                    new[i][k] = _fmuladd(builder, scales[i], part, new[i][k])
        for i, unit in enumerate(blk.units):
            s_x = joined([_splat_f(builder, builder.bitcast(blk.load(blk.xs, t, b), _F32))
                          for t in unit])  # fmt: skip
            new[i][8] = _fmuladd(builder, joined([m_w] * len(unit)), s_x, new[i][8])
        return new

    return body


def _lane_order_body(lay: PackedLayout, chunks: Iterable[int] | None = None,
                     keep: bool = False) -> Body:  # fmt: skip
    """Q5_0 and Q8_0 in the order of ggml's ``vec_dot_q5_0_q8_0`` and
    ``vec_dot_q8_0_q8_0`` (x86; llamafile's tinyBLAS, which takes llama.cpp's prompts,
    keeps the same order): each row keeps eight float sums, sum ``k`` taking
    ``d_w·d_x·Σ q·x`` over values ``4k..4k+3`` of every block by a fused multiply-add,
    joined once per row as ``hsum_float_8`` (:func:`_hsum_8`). Each block's sum as one
    exact integer first (Q4_0's order, whose repacked ggml kernel has it) differs from
    llama.cpp's Q5_0 and Q8_0 products in the last bits of most values, and Gemma 3
    270M's 8-bit activation roundings grow that into logit differences of ~1.
    The codes are signed values (Q5_0's less 16) fed to the sums as ``|q|`` against
    ``x`` with ``q``'s sign, so no offset is taken back out per block. ``chunks``: only
    those runs of codes (:func:`_lane_order_passes`), else all."""
    runs_of_codes = list(range(lay.chunks) if chunks is None else chunks)

    def body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
        builder, b = blk.builder, blk.b
        n_tok = len(accs)
        fma = llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
        if blk.kept is not None and not keep:  # a later pass: the first one's scales
            scales = [builder.load(blk.kept_at(t)) for t in range(n_tok)]
        else:
            d_w = _scales(builder, blk.base, blk.table)
            scales = [_fixed_mul(builder, d_w, _splat_f(builder, blk.load(blk.xd, t, b)))
                      for t in range(n_tok)]  # fmt: skip
        if blk.kept is not None and keep:
            for t, scale in enumerate(scales):
                builder.store(scale, blk.kept_at(t))
        new = [list(a) for a in accs]
        for c in runs_of_codes:
            q = blk.code_run(lay.codes_at + 32 * c)
            if lay.nibbles:  # Q5_0: low nibbles values 4c..4c+3, high 16+4c..
                runs = [builder.and_(q, splat(I8, 32, 15)), builder.lshr(q, splat(I8, 32, 4))]
                runs = [builder.sub(builder.or_(codes, _fifth_bits(blk, 2 * c + h)),
                                    splat(I8, 32, lay.offset))
                        for h, codes in enumerate(runs)]  # fmt: skip
                parts = [(runs[0], 4 * c, c), (runs[1], 16 + 4 * c, 4 + c)]
            else:  # Q8_0: values 4c..4c+3
                parts = [(q, 4 * c, c)]
            for values, at, k in parts:
                for t in range(n_tok):
                    lane = _RowSums(builder, ir.Constant(_V8I, [0] * 8))
                    lane.add_sign_folded(values, blk.x_word(t, b, at))
                    part = builder.sitofp(lane.flush(), _V8F)
                    new[t][k] = builder.call(fma, [scales[t], part, new[t][k]])
        return new

    return body


def _less_16_unless_fifth(blk: _Block, runs: tuple[int, int]) -> Any:
    """What Q5_0's nibbles of two runs at once (``<64 x i8>``) add to become values:
    0 where the code's fifth bit is set, −16 where it is not, from words ``runs[0]``
    (bytes 0–31) and ``runs[1]`` (32–63) of the block's fifth bits (as
    :func:`_fifth_bits`, with the offset of 16 folded in: one masked move)."""
    b = blk.builder
    words = [b.zext(_fifth_word(blk, run), I64) for run in runs]
    bits = b.bitcast(b.or_(words[0], b.shl(words[1], I64(32))), ir.VectorType(ir.IntType(1), 64))
    return b.select(bits, splat(I8, 64, 0), splat(I8, 64, -blk.lay.offset & 0xFF))


def _lane_order_passes(lay: PackedLayout) -> list[Pass]:
    """:func:`_lane_order_body` as one pass over the blocks per run of codes, each
    carrying the sums that run adds to (Q8_0: sum ``c``; Q5_0: ``c`` and ``4 + c``), the
    first pass keeping each block's scales ``d_w·d_x`` for the others. For tiles of
    more than one row on hosts with 16 vector registers (AVX2): a tile of four rows
    carries 32 sums, and one loop over the blocks would move most of them through
    memory at every block (more instructions a run and row than in passes, and a
    prompt's Q8_0 products markedly slower). Each sum takes the same steps in the same
    order, so the bits are the same. A tile of one row (a generated token's) keeps its
    eight sums in registers in one pass: passes would read the weights, which then come
    from memory, in 32-byte pieces 272 bytes apart, and a small Q8_0 model would
    generate at less than half the speed."""
    return [(_lane_order_body(lay, [c], keep=c == 0), [c, 4 + c] if lay.nibbles else [c])
            for c in range(lay.chunks)]  # fmt: skip


def _lane_pairs_body(lay: PackedLayout) -> Body:
    """Q5_0 and Q8_0 in :func:`_lane_order_body`'s order with AVX512-VNNI and 32
    registers, two of a row's eight sums in each 512-bit accumulator: accumulator ``m``
    holds sum ``2m`` of the eight weight rows in lanes 0–7 and ``2m + 1`` in lanes 8–15.
    Runs ``2j`` and ``2j + 1`` of codes lie side by side, so one 64-byte load gives the
    weight operand of a ``vpdpbusd`` (Q8_0: sums ``2j``, ``2j + 1``; Q5_0: its low
    nibbles those, its high ones ``4 + 2j``, ``5 + 2j``), and the activation operand is
    the row's whole 32-byte block, loaded once, its two words spread over the halves by
    one ``vpermd``. The activations go in as ``x + 128`` and the sums start at
    ``−128·Σq`` (computed once a block for every row of the tile). A row then costs a
    block one load and four ``vpdpbusd``, ``vpermd``, conversions and fused
    multiply-adds, the count of Q8_0's own order (:func:`_block32_body`), where
    :func:`_lane_order_body` takes eight of each. A prompt's Q8_0 and Q5_0 products so
    take little more than half the time of :func:`_lane_order_body`'s rows one by one,
    not far behind Q8_0's own order (Q5_0's codes' fifth bits cost it the rest). Every sum
    takes the same integers and fused multiply-adds in the same order as ggml's, so the
    bits are the same."""
    v16i, v16f = vec_of(I32, 16), ir.VectorType(_F32, 16)

    def operands(blk: _Block) -> list[tuple[Any, int, int]]:
        """(signed codes, the first of their two activation words, accumulator)"""
        builder = blk.builder
        out = []
        for j in range(lay.chunks // 2):
            at = builder.gep(blk.base, [I64(lay.codes_at + 64 * j)])
            q = builder.load(builder.bitcast(at, vec_of(I8, 64).as_pointer()), align=1)
            if not lay.nibbles:  # Q8_0: values 8j ..
                out.append((q, 2 * j, j))
                continue
            for h, codes in enumerate((builder.and_(q, splat(I8, 64, 15)),
                                       builder.lshr(q, splat(I8, 64, 4)))):  # fmt: skip
                values = builder.add(codes, _less_16_unless_fifth(blk, (4 * j + h, 4 * j + 2 + h)))
                out.append((values, 2 * j + 4 * h, j + 2 * h))
        return out

    def body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
        builder, b = blk.builder, blk.b
        dp = llvm_fn(builder, "llvm.x86.avx512.vpdpbusd.512", v16i, v16i, v16i, v16i)
        zero = ir.Constant(v16i, [0] * 16)
        d_w = _scales(builder, blk.base, blk.table)
        d_w2 = builder.shuffle_vector(d_w, d_w, ir.Constant(v16i, list(range(8)) * 2))
        if len(accs) == 1:
            return [one_row(blk, accs[0], d_w2)]
        parts = []
        for values, word, m in operands(blk):
            q = builder.bitcast(values, v16i)
            ones = builder.bitcast(splat(I8, 64, 128), v16i)
            bias = builder.sub(zero, builder.call(dp, [zero, ones, q]))
            parts.append((q, bias, word, m))
        new = []
        for t, acc in enumerate(accs):
            at = builder.bitcast(blk.x_at(t, b, 0), _V8I.as_pointer())
            x8 = builder.xor(builder.load(at, align=1), splat(I32, 8, -0x7F7F7F80))  # x+128
            scale = _fixed_mul(builder, d_w2, splat_scalar(builder, blk.load(blk.xd, t, b), 16))
            sums = list(acc)
            for q, bias, word, m in parts:
                words = builder.shuffle_vector(
                    x8, x8, ir.Constant(v16i, [word] * 8 + [word + 1] * 8)
                )
                part = builder.sitofp(builder.call(dp, [bias, words, q]), v16f)
                sums[m] = _fmuladd(builder, scale, part, sums[m])
            new.append(sums)
        return new

    def one_row(blk: _Block, acc: list[Any], d_w2: Any) -> list[Any]:
        """A tile of one activation row (a generated token's): the other way round, the
        codes as ``q + 128`` and the activations as they are, the sums starting at
        ``−128·Σx`` over each of the row's words (one 256-bit ``vpdpbusd`` a block,
        spread by the ``vpermd`` that spreads the words), where a taller tile shares
        ``−128·Σq`` among its rows: one ``vpdpbusd`` a 64-byte load instead of two."""
        builder, b = blk.builder, blk.b
        dp = llvm_fn(builder, "llvm.x86.avx512.vpdpbusd.512", v16i, v16i, v16i, v16i)
        dp8 = llvm_fn(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I, _V8I, _V8I, _V8I)
        x8 = builder.load(builder.bitcast(blk.x_at(0, b, 0), _V8I.as_pointer()), align=1)
        ones = builder.bitcast(splat(I8, 32, 128), _V8I)
        sums_x = builder.call(dp8, [ir.Constant(_V8I, [0] * 8), ones, x8])  # 128·Σx a word
        back = builder.sub(ir.Constant(_V8I, [0] * 8), sums_x)
        scale = _fixed_mul(builder, d_w2, splat_scalar(builder, blk.load(blk.xd, 0, b), 16))
        sums = list(acc)
        for values, word, m in operands(blk):
            spread = ir.Constant(v16i, [word] * 8 + [word + 1] * 8)
            u = builder.bitcast(builder.xor(values, splat(I8, 64, 128)), v16i)  # q + 128
            start = builder.shuffle_vector(back, back, spread)
            words = builder.shuffle_vector(x8, x8, spread)
            part = builder.sitofp(builder.call(dp, [start, u, words]), v16f)
            sums[m] = _fmuladd(builder, scale, part, sums[m])
        return sums

    return body


def _hsum_8_of_pairs(builder: ir.IRBuilder, a: list[Any]) -> Any:
    """:func:`_hsum_8` of :func:`_lane_pairs_body`'s four accumulators (sums ``2j``
    in the lower halves, ``2j + 1`` in the upper)."""
    return _hsum_8(builder, [_half(builder, a[k // 2], k % 2) for k in range(8)])


def _fixed_add(builder: ir.IRBuilder, a: Any, b: Any) -> Any:
    """``a + b`` that fast math may not regroup (see :func:`_fixed_mul`)."""
    total = builder.fadd(a, b)
    total.flags.append("contract")
    return total


def _vec_dot_finish(builder: ir.IRBuilder, a: list[Any]) -> Any:
    """ggml's ``hsum_float_8`` of the eight sums, then ``+ summs``:
    ``((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) + mins``, for eight rows at once."""
    add = functools.partial(_fixed_add, builder)
    low = add(add(a[0], a[4]), add(a[2], a[6]))
    high = add(add(a[1], a[5]), add(a[3], a[7]))
    return add(add(low, high), a[8])


def _hsum_8(builder: ir.IRBuilder, a: list[Any]) -> Any:
    """ggml's ``hsum_float_8`` of the eight sums, for eight rows at once:
    ``((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))``."""
    add = functools.partial(_fixed_add, builder)
    return add(add(add(a[0], a[4]), add(a[2], a[6])), add(add(a[1], a[5]), add(a[3], a[7])))


def _q45_k_body(lay: PackedLayout, by_pairs: bool = False) -> Body:
    """Q4_K (:func:`_q4_k_body`; ``by_pairs``: in the order of ggml's four-row gemm) and
    Q5_K (:func:`_q5_k_body`), the layout's codes at ``lay.codes_at``."""

    def body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
        if lay.type == Type.Q5_K:
            return _q5_k_body(blk, accs, lay.codes_at)
        return _q4_k_body(blk, accs, lay.codes_at, by_pairs)

    return body


def _q5_k_fifth_bits(blk: _Block, c: int, s: int, codes_at: int) -> Any:
    """Bit ``s`` of each byte of Q5_K's ``qh`` run ``c`` (its bytes ``4c..4c+3`` of each
    row: values ``4c..`` of every sub-block) as bytes of 0 or 16: the fifth bits of
    sub-block ``s``'s four values of run ``c``."""
    b = blk.builder
    qh = blk.code_run(codes_at - 256 + 32 * c)
    n = qh.type.count
    moved = b.shl(qh, splat(I8, n, 4 - s)) if s <= 4 else b.lshr(qh, splat(I8, n, s - 4))
    return b.and_(moved, splat(I8, n, 16))


def _q5_k_body(blk: _Block, accs: list[list[Any]], codes_at: int) -> list[list[Any]]:
    """Q5_K: each sub-block ``s`` (values ``32s..32s+31``, activation block ``8b + s``)
    adds ``d·sc_s·d_x·Σq·x`` to the row's sum and ``dmin·m_s·d_x·Σx`` to its minimums',
    ``Σq·x`` an exact integer, ``d_x·Σx`` made once a row by the quantizer
    (:func:`_scaled_sums`: the tiles of eight rows computed it for every weight group),
    ``d_x`` Q8_K's one scale. Each 32-byte run of codes holds four values of sub-blocks
    ``2p`` (low nibbles) and ``2p + 1`` (high) for each row, each code's fifth bit in the
    eight ``qh`` runs before the codes (bit ``s`` of a byte: sub-block ``s``'s).

    The sub-blocks are summed one after another, each run's nibbles taken twice, rather
    than a pair's two at once: a tile of eight rows then keeps one integer sum a row
    live, not two, and spills less (a prompt's products run slightly faster on an
    Intel Xeon). In a tile of two groups (:data:`PAIRED`) every
    vector holds both groups' sixteen rows, the same arithmetic lane by lane."""
    builder, b, lanes = blk.builder, blk.b, blk.lanes
    floats = ir.VectorType(_F32, lanes)
    d, dmin = blk.scales(0), blk.scales(16)
    first = builder.mul(b, I64(8))  # the block's first activation block
    d_x = [splat_scalar(builder, blk.load(blk.xd, t, first), lanes) for t in range(len(accs))]
    new = [list(a) for a in accs]
    for s in range(8):
        p, h = divmod(s, 2)
        k = builder.add(first, I64(s))
        sums = [_RowSums(builder, ir.Constant(vec_of(I32, lanes), [0] * lanes)) for _ in accs]
        for c in range(8):
            q = blk.code_run(codes_at + 32 * (8 * p + c))
            n = q.type.count
            shift, mask = splat(I8, n, 4), splat(I8, n, 15)
            nibbles = builder.lshr(q, shift) if h else builder.and_(q, mask)
            codes = builder.or_(nibbles, _q5_k_fifth_bits(blk, c, s, codes_at))
            for t, row_sums in enumerate(sums):
                row_sums.add(codes, blk.x_word(t, k, 4 * c), 31)
        sc = _fixed_mul(builder, d, blk.rows(32 + 8 * s, _bytes_f))
        mn = _fixed_mul(builder, dmin, blk.rows(96 + 8 * s, _bytes_f))
        for t, row_sums in enumerate(sums):
            isum = builder.sitofp(row_sums.flush(), floats)
            new[t][0] = _fmuladd(builder, _fixed_mul(builder, sc, d_x[t]), isum, new[t][0])
            x_sum = builder.bitcast(blk.load(blk.xs, t, k), _F32)  # d_x·Σx, made ahead
            new[t][1] = _fmuladd(builder, mn, splat_scalar(builder, x_sum, lanes), new[t][1])
    return new


def _q4_k_body(
    blk: _Block, accs: list[list[Any]], codes_at: int = 160, by_pairs: bool = False
) -> list[list[Any]]:
    """Q4_K: a super-block adds ``(Σ_s sc_s·Σq·x)·(d·d_x)`` to the row's sum and
    ``(Σ_s m_s·Σx)·(dmin·d_x)`` to its minimums', each sum an exact integer over the
    sub-blocks ``s`` (values ``32s..32s+31``, activation block ``8b + s``), as ggml's
    repacked gemv (``d_x`` Q8_K's one scale); ``by_pairs``: one such multiply-add per
    pair of sub-blocks ``2p, 2p + 1`` instead, four a super-block, as ggml's repacked
    four-row ``ggml_gemm_q4_K_8x8_q8_K`` (x86, AVX2 and AVX-512 alike). Each 32-byte run
    of codes holds four values of pair ``p``'s two sub-blocks for each row: low nibbles
    sub-block ``2p``, high ones ``2p + 1``. In a tile of two groups (:data:`PAIRED`)
    every vector holds both groups' sixteen rows."""
    builder, b, lanes = blk.builder, blk.b, blk.lanes
    n_tok = len(accs)
    floats, zero = ir.VectorType(_F32, lanes), ir.Constant(vec_of(I32, lanes), [0] * lanes)
    d, dmin = blk.scales(0), blk.scales(16)
    first = builder.mul(b, I64(8))  # the block's first activation block
    new = [list(a) for a in accs]
    isums, imins = [zero] * n_tok, [zero] * n_tok
    d_x = [splat_scalar(builder, blk.load(blk.xd, t, first), lanes) for t in range(n_tok)]
    scales = [(_fixed_mul(builder, d, d_x[t]), _fixed_mul(builder, dmin, d_x[t]))
              for t in range(n_tok)]  # fmt: skip
    for p in range(4):
        pair = [[_RowSums(builder, zero) for _ in range(2)] for _ in range(n_tok)]
        ks = [builder.add(first, I64(2 * p + h)) for h in range(2)]
        for c in range(8):
            q = blk.code_run(codes_at + 32 * (8 * p + c))
            width = q.type.count
            halves = [builder.and_(q, splat(I8, width, 15)),
                      builder.lshr(q, splat(I8, width, 4))]  # fmt: skip
            for h, codes in enumerate(halves):
                for t in range(n_tok):
                    pair[t][h].add(codes, blk.x_word(t, ks[h], 4 * c), 15)
        for h in range(2):
            s = 2 * p + h
            sc, mn = blk.rows(32 + 8 * s, _bytes_i), blk.rows(96 + 8 * s, _bytes_i)
            for t in range(n_tok):
                isums[t] = builder.add(isums[t], pair[t][h].scaled(sc))
                x_sum = blk.load(blk.xs, t, ks[h])
                minimums = builder.mul(mn, splat_scalar(builder, x_sum, lanes))
                imins[t] = builder.add(imins[t], minimums)
        if by_pairs:  # the pair's two integers scaled now, and started afresh
            for t in range(n_tok):
                isum, imin = (builder.sitofp(v, floats) for v in (isums[t], imins[t]))
                new[t][0] = _fmuladd(builder, isum, scales[t][0], new[t][0])
                new[t][1] = _fmuladd(builder, imin, scales[t][1], new[t][1])
            isums, imins = [zero] * n_tok, [zero] * n_tok
    if not by_pairs:
        for t in range(n_tok):
            isum, imin = (builder.sitofp(v, floats) for v in (isums[t], imins[t]))
            new[t][0] = _fmuladd(builder, isum, scales[t][0], new[t][0])
            new[t][1] = _fmuladd(builder, imin, scales[t][1], new[t][1])
    return new


def _iq4_xs_body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
    """IQ4_XS: sub-block ``s`` (values ``32s..32s+31``, activation block ``8b + s``) sums
    its levels times the Q8_K codes exactly, times its signed scale ``ls − 32``, into
    one integer per super-block, scaled once by ``d·d_x``: ggml's
    ``vec_dot_iq4_xs_q8_K``, whose integer sums are the same (its float order is by
    lanes, not by rows)."""
    builder, b = blk.builder, blk.b
    n_tok = len(accs)
    fma = llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
    d = _scales(builder, blk.base, blk.table)
    first = builder.mul(b, I64(8))  # the block's first activation block
    totals = [ir.Constant(_V8I, [0] * 8) for _ in range(n_tok)]
    for s in range(8):
        k = builder.add(first, I64(s))
        at = builder.gep(blk.base, [I64(16 + 8 * s)])
        v8 = builder.load(builder.bitcast(at, vec_of(I8, 8).as_pointer()), align=1)
        scale = builder.sext(v8, _V8I)
        sums = []
        for t in range(n_tok):
            start = ir.Constant(_V8I, [0] * 8)
            if _offset(blk.lay):  # VNNI's ``q + 128``: take 128·Σx back out
                back = builder.mul(blk.load(blk.xs, t, k), I32(-_offset(blk.lay)))
                one = builder.insert_element(ir.Constant(_V8I, None), back, I32(0))
                start = builder.shuffle_vector(one, one, ir.Constant(_V8I, [0] * 8))
            sums.append(_RowSums(builder, start))
        for c in range(4):
            q = blk.code_run(80 + 32 * (4 * s + c))
            halves = (builder.and_(q, splat(I8, 32, 15)), builder.lshr(q, splat(I8, 32, 4)))
            for h, codes in enumerate(halves):
                values = _levels(builder, codes, blk.lay.levels)
                for t in range(n_tok):
                    sums[t].add_signed(values, blk.x_word(t, k, 4 * c + 16 * h))
        for t in range(n_tok):
            totals[t] = builder.add(totals[t], builder.mul(sums[t].flush(), scale))
    new = []
    for t in range(n_tok):
        factor = _fixed_mul(builder, d, _splat_f(builder, blk.load(blk.xd, t, first)))
        new.append([builder.call(fma, [factor, builder.sitofp(totals[t], _V8F), accs[t][0]])])
    return new


def _q2_k_body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
    """Q2_K: code run ``w`` holds bytes ``4w..4w+3`` of each row's ``qs``; its bits
    ``2j, 2j+1`` are values ``128n + 32j + l`` (``n = w // 8``, ``l = 4·(w % 8) ..``) of
    16-value group ``8n + 2j + (w % 8) // 4``. Each group's exact ``Σq·x`` is scaled by
    ``d·sc·d_x`` into the row's sum, and ``dmin·m·d_x·Σx`` (``xs``: sums of 16 codes)
    into its minimums'; ``sc`` and ``m`` are the low and high nibbles of the group's
    scale byte, kept as stored."""
    builder, b = blk.builder, blk.b
    n_tok = len(accs)
    fma = llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
    d = _scales(builder, blk.base, blk.table)
    dmin = _scales(builder, builder.gep(blk.base, [I64(16)]), blk.table)
    first = builder.mul(b, I64(8))  # the block's first activation block
    new = [list(a) for a in accs]
    for n in range(2):
        runs = [blk.code_run(160 + 32 * (8 * n + w)) for w in range(8)]
        for j in range(4):
            k = builder.add(first, I64(4 * n + j))
            for half in range(2):
                g = 8 * n + 2 * j + half
                sums = [_RowSums(builder, ir.Constant(_V8I, [0] * 8)) for _ in range(n_tok)]
                for w in range(4 * half, 4 * half + 4):
                    shifted = builder.lshr(runs[w], splat(I8, 32, 2 * j))
                    codes = builder.and_(shifted, splat(I8, 32, 3))
                    for t in range(n_tok):
                        sums[t].add(codes, blk.x_word(t, k, 4 * w), 3)
                at = builder.gep(blk.base, [I64(32 + 8 * g)])
                packed = builder.load(builder.bitcast(at, vec_of(I8, 8).as_pointer()), align=1)
                sc = builder.uitofp(builder.and_(packed, splat(I8, 8, 15)), _V8F)
                mn = builder.uitofp(builder.lshr(packed, splat(I8, 8, 4)), _V8F)
                d_sc, dmin_m = _fixed_mul(builder, d, sc), _fixed_mul(builder, dmin, mn)
                for t in range(n_tok):
                    d_x = blk.load(blk.xd, t, k)
                    scale = _fixed_mul(builder, d_sc, _splat_f(builder, d_x))
                    isum = builder.sitofp(sums[t].flush(), _V8F)
                    new[t][0] = builder.call(fma, [scale, isum, new[t][0]])
                    x16 = blk.load(blk.xs, t, builder.add(builder.mul(k, I64(2)), I64(half)))
                    x_sum = _fixed_mul(builder, d_x, builder.sitofp(x16, _F32))
                    new[t][1] = builder.call(fma, [dmin_m, _splat_f(builder, x_sum), new[t][1]])
    return new


def _signed_byte_scales(builder: ir.IRBuilder, at: Any) -> Any:
    """The eight signed bytes at ``at`` as ``<8 x float>``."""
    v8 = builder.load(builder.bitcast(at, vec_of(I8, 8).as_pointer()), align=1)
    return builder.sitofp(v8, _V8F)


def _q6_k_codes(blk: _Block, n: int, c: int) -> list[Any]:
    """The unsigned 6-bit codes (0-63) of Q6_K's chunk ``c`` of half ``n``, four
    ``<32 x i8>``: ``k``-th the values ``128n + 32k + 4c ..`` of each of the eight rows,
    low four bits from the low (``k`` < 2) or high nibbles of ``ql`` run ``2n + k % 2``,
    top two from bits ``2k`` of ``qh`` run ``n`` (three 32-byte runs a chunk,
    ``repack.py``)."""
    builder = blk.builder
    at = 144 + 96 * (8 * n + c)  # ql's low runs, its high runs, qh
    qa, qb, hh = (blk.code_run(at + 32 * i) for i in range(3))
    width = qa.type.count  # 64 in a tile of two groups
    low, high = splat(I8, width, 15), splat(I8, width, 0x30)
    tops = [
        builder.shl(hh, splat(I8, width, 4)),
        builder.shl(hh, splat(I8, width, 2)),
        hh,
        builder.lshr(hh, splat(I8, width, 2)),
    ]  # bits 2k, 2k+1 at 4, 5
    lows = [
        builder.and_(qa, low),
        builder.and_(qb, low),
        builder.lshr(qa, splat(I8, width, 4)),
        builder.lshr(qb, splat(I8, width, 4)),
    ]
    return [builder.or_(lo, builder.and_(top, high)) for lo, top in zip(lows, tops, strict=True)]


def _q6_k_half_sums(blk: _Block, n: int, half: int, n_tok: int) -> list[list[Any]]:
    """``[t][k]``: the exact ``Σ(q − 32)·x`` of values ``16·half ..`` of run ``k`` of
    Q6_K's half ``n`` (one 16-value group ``g = 8n + 2k + half``, its own scale) for
    activation row ``t``, eight rows' as ``<8 x i32>`` (activation block ``8b + 4n + k``):
    each sum starts at the group's ``−32·Σx`` (``xs``, :data:`Q6_K_OFFSET`) and the code
    products add onto it, no instruction of their own for the offset."""
    builder = blk.builder
    first = builder.mul(blk.b, I64(8))  # the block's first activation block
    ks = [builder.add(first, I64(4 * n + k)) for k in range(4)]
    sums = [[_RowSums(builder, _q6_k_offset_share(blk, t, 8 * n + 2 * k + half))
             for k in range(4)] for t in range(n_tok)]  # fmt: skip
    for c in range(4 * half, 4 * half + 4):
        codes = _q6_k_codes(blk, n, c)
        for k in range(4):
            for t in range(n_tok):
                sums[t][k].add(codes[k], blk.x_word(t, ks[k], 4 * c), 63)
    return [[row[k].flush() for k in range(4)] for row in sums]


def _q6_k_body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
    """Q6_K: run ``k`` of half ``n`` (values ``128n + 32k ..``, activation block
    ``8b + 4n + k``) takes its low four bits from the low (``k`` < 2) or high nibbles of
    ``ql`` run ``2n + k % 2`` and its top two from bits ``2k`` of ``qh`` run ``n``, and
    a scale per 16 values: each half run's exact sum ``Σq·x − 32·Σx``
    (:func:`_q6_k_half_sums`) is scaled by ``d·sc·d_x`` into the row's sum."""
    builder, b = blk.builder, blk.b
    n_tok = len(accs)
    fma = llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
    d = _scales(builder, blk.base, blk.table)
    first = builder.mul(b, I64(8))  # the block's first activation block
    new = [list(a) for a in accs]
    for n in range(2):
        ks = [builder.add(first, I64(4 * n + k)) for k in range(4)]
        for half in range(2):  # values 0-15 of each run, then 16-31: a scale each
            sums = _q6_k_half_sums(blk, n, half, n_tok)
            for k in range(4):
                at = builder.gep(blk.base, [I64(16 + 8 * (8 * n + 2 * k + half))])
                sc = _fixed_mul(builder, d, _signed_byte_scales(builder, at))
                for t in range(n_tok):
                    isum = builder.sitofp(sums[t][k], _V8F)
                    factor = _fixed_mul(builder, sc, _splat_f(builder, blk.load(blk.xd, t, ks[k])))
                    new[t][0] = builder.call(fma, [factor, isum, new[t][0]])
    return new


def _q6_k_group_scales(blk: _Block, g: int) -> Any:
    """The eight rows' signed scales of Q6_K's 16-value group ``g`` as ``<8 x i32>``
    (both groups' sixteen in a tile of two, :meth:`_Block.rows`)."""

    def load(b: ir.IRBuilder, at: Any) -> Any:
        return b.sext(b.load(b.bitcast(at, vec_of(I8, 8).as_pointer()), align=1), _V8I)

    return blk.rows(16 + 8 * g, load)


def _q6_k_offset_share(blk: _Block, t: int, g: int) -> Any:
    """``−32·Σx`` over Q6_K's 16-value group ``g`` of this block for activation row ``t``
    (what ``xs`` holds for Q6_K, :func:`_sums_of_16`), in each of the tile's lanes."""
    b = blk.builder
    share = blk.load(blk.xs, t, b.add(b.mul(blk.b, I64(16)), I64(g)))
    return splat_scalar(b, share, blk.lanes)


def _q6_k_offsets(blk: _Block, t: int, groups: Iterable[int]) -> Any:
    """``−32·Σ_g sc_g·bsum_g`` over Q6_K's 16-value ``groups`` for activation row ``t``,
    eight rows' as ``<8 x i32>``: the codes' offset of 32, taken out in integers as
    ggml does."""
    b = blk.builder
    total = ir.Constant(_V8I, [0] * 8)
    for g in groups:
        total = b.add(total, b.mul(_q6_k_group_scales(blk, g), _q6_k_offset_share(blk, t, g)))
    return total


def _q6_k_tiled_body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
    """Q6_K in the order of ggml's tiled K-quant product (``tiled/tiled-kernel.cpp``,
    AVX-512 VNNI and AVX2 alike), which llama.cpp 0.3.36 runs for products of
    :data:`GGML_TILED_MIN_ROWS` activation rows or more: a super-block's
    ``Σ_g sc_g·(Σq·x − 32·bsum_g)`` over its sixteen 16-value groups as one exact integer,
    times ``d_w`` (rounded), then fused with ``d_x`` into the row's one sum."""
    builder, b, lanes = blk.builder, blk.b, blk.lanes
    n_tok = len(accs)
    d = blk.scales(0)
    first = builder.mul(b, I64(8))  # the block's first activation block
    totals = [ir.Constant(vec_of(I32, lanes), [0] * lanes) for _ in range(n_tok)]
    for n in range(2):
        for half in range(2):  # values 0-15 of each run, then 16-31: a scale each
            sums = _q6_k_half_sums(blk, n, half, n_tok)
            for k in range(4):
                sc = _q6_k_group_scales(blk, 8 * n + 2 * k + half)
                for t in range(n_tok):
                    totals[t] = builder.add(totals[t], builder.mul(sc, sums[t][k]))
    new = []
    for t in range(n_tok):
        scaled = _fixed_mul(builder, builder.sitofp(totals[t], ir.VectorType(_F32, lanes)), d)
        d_x = splat_scalar(builder, blk.load(blk.xd, t, first), lanes)  # Q8_K's one scale
        new.append([_fmuladd(builder, scaled, d_x, accs[t][0])])
    return new


def _q6_k_lane_body(blk: _Block, accs: list[list[Any]]) -> list[list[Any]]:
    """Q6_K in the order of ggml's x86 ``vec_dot_q6_K_q8_K`` (AVX2; llama.cpp 0.3.36
    repacks Q6_K only for ARM, so x86 runs this for every row count): each row keeps
    eight float sums, sum ``c`` taking once per super-block ``d_w·d_x`` times one exact
    integer, the codes ``4c..4c+3`` of every 32-value run times the activations, each
    run's four scaled by the scale of its 16 values (the first of the two for ``c`` < 4),
    less ``32·(sc_2c·bsum_2c + sc_2c+1·bsum_2c+1)`` (ggml's ``q8sclsub``: the sums of 16
    activation codes of groups ``2c``, ``2c + 1``; ``xs`` holds them times −32); joined once per row
    by :func:`_hsum_8`. Its arithmetic per super-block: eight integer scalings a run
    where :func:`_q6_k_body` scales each 16 values in floats. The eight integers are
    built half by half, each half's chunks in turn, so the block is read in order (the
    module's docstring: from memory, several times faster than chunk by chunk across
    the halves)."""
    builder, b = blk.builder, blk.b
    n_tok = len(accs)
    fma = llvm_fn(builder, "llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
    d = _scales(builder, blk.base, blk.table)
    first = builder.mul(b, I64(8))  # the block's first activation block
    factors = [_fixed_mul(builder, d, _splat_f(builder, blk.load(blk.xd, t, first)))
               for t in range(n_tok)]  # fmt: skip

    new = [list(a) for a in accs]
    totals = [[_q6_k_offsets(blk, t, (2 * c, 2 * c + 1)) for t in range(n_tok)] for c in range(8)]
    for n in range(2):
        for c in range(8):
            half = c // 4  # values 0-15 of each run, or 16-31
            codes = _q6_k_codes(blk, n, c)
            for k in range(4):
                sc = _q6_k_group_scales(blk, 8 * n + 2 * k + half)
                x_block = builder.add(first, I64(4 * n + k))
                for t in range(n_tok):
                    run = _RowSums(builder, ir.Constant(_V8I, [0] * 8))
                    run.add(codes[k], blk.x_word(t, x_block, 4 * c), 63)
                    totals[c][t] = builder.add(totals[c][t], run.scaled(sc))
    for c in range(8):
        for t in range(n_tok):
            isum = builder.sitofp(totals[c][t], _V8F)
            new[t][c] = builder.call(fma, [factors[t], isum, new[t][c]])
    return new


def _accumulators(lay: PackedLayout, ggml_order: bool = False) -> int:
    """The float vectors a tile of layout ``lay`` carries per activation row (see
    :func:`_emitter`)."""
    if lay.type in (Type.Q4_K, Type.Q5_K, Type.Q2_K):
        return 2
    if lay.minimum_at >= 0:  # Q4_1, Q5_1: eight sums a row and the minimums' share
        return 9
    if ggml_order and lay.type in (Type.Q5_0, Type.Q8_0, Type.Q6_K):  # eight sums a row,
        return 8  # as vec_dot
    return 1


def _emitter(lay: PackedLayout, n_tok: int, ggml_order: bool = False,
             form: int = OWN_FORM) -> Emit:  # fmt: skip
    """The IR of layout ``lay``'s tile for ``n_tok`` activation rows (see :func:`_tile`);
    ``ggml_order``: Q5_0 and Q8_0 in ggml's eight float sums (:func:`_lane_pairs_body`,
    :func:`_lane_order_body`) rather than Q4_0's order, Q6_K in its ``vec_dot``'s
    (:func:`_q6_k_lane_body`); ``form`` :data:`TILED_FORM`: Q6_K in ggml's tiled
    product's order (:func:`_q6_k_tiled_body`), :data:`GEMM_FORM`: Q4_K in its four-row
    gemm's (else its gemv's, as always); any of them plus :data:`PAIRED`: two groups at
    once, where :func:`pairs_groups` has them."""
    groups = 2 if form & PAIRED else 1
    form &= ~PAIRED
    if groups == 2 and not pairs_groups(lay, form):
        raise ValueError(f"{lay.type.name} has no such tile of two groups on this host")
    if form == TILED_FORM and lay.type == Type.Q6_K:
        return _tile(lay, n_tok, _q6_k_tiled_body, lambda b, a: a[0], 1, groups=groups)
    if form not in (OWN_FORM, GEMM_FORM) or (form == GEMM_FORM and lay.type != Type.Q4_K):
        kind = "tiled product's" if form == TILED_FORM else "gemm's"
        raise ValueError(f"ggml's {kind} order is not implemented for {lay.type.name}")
    n_accs = _accumulators(lay, ggml_order)
    if lay.type in (Type.Q4_K, Type.Q5_K):
        return _tile(lay, n_tok, _q45_k_body(lay, form == GEMM_FORM),
                     lambda b, a: b.fsub(a[0], a[1]), n_accs, groups=groups)  # fmt: skip
    if lay.type == Type.Q2_K:
        return _tile(lay, n_tok, _q2_k_body, lambda b, a: b.fsub(a[0], a[1]), n_accs)
    if lay.type == Type.Q6_K and n_accs == 8:
        return _tile(lay, n_tok, _q6_k_lane_body, _hsum_8, n_accs)
    if lay.type == Type.Q6_K:
        return _tile(lay, n_tok, _q6_k_body, lambda b, a: a[0], n_accs)
    if lay.type == Type.IQ4_XS:
        return _tile(lay, n_tok, _iq4_xs_body, lambda b, a: a[0], n_accs)
    if lay.minimum_at >= 0:
        return _tile(lay, n_tok, _vec_dot_order_body(lay), _vec_dot_finish, n_accs,
                     paired=True)  # fmt: skip
    if n_accs == 8 and _ir.HAS_VNNI and _ir.HAS_32_REGS:  # Q5_0, Q8_0 (Q6_K's came above)
        return _tile(lay, n_tok, _lane_pairs_body(lay), _hsum_8_of_pairs, 4, lanes=16)
    if n_accs == 8 and not _ir.HAS_32_REGS and n_tok > 1:
        return _tile(lay, n_tok, _lane_order_passes(lay), _hsum_8, n_accs)
    if n_accs == 8:
        return _tile(lay, n_tok, _lane_order_body(lay), _hsum_8, n_accs)
    return _tile(lay, n_tok, _block32_body(lay), lambda b, a: a[0], n_accs)


def tile_kernel(lay: PackedLayout, n_tok: int, ggml_order: bool = False,
                form: int = OWN_FORM) -> Any:  # fmt: skip
    """An intrinsic ``(packed, g, xq, xd, xs, table, t0, out) -> None``: one tile of
    layout ``lay`` for ``n_tok`` activation rows (:func:`_tile`; ``ggml_order`` and
    ``form`` as :func:`_emitter` takes them)."""
    emit = _emitter(lay, n_tok, ggml_order, form)

    @intrinsic
    def tile(typingctx: Any, packed: Any, g: Any, xq: Any, xd: Any, xs: Any, table: Any,
             t0: Any, out: Any) -> Any:  # fmt: skip
        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            emit(context, builder, sig, args)
            return context.get_dummy_value()

        return types.none(packed, g, xq, xd, xs, table, t0, out), codegen

    return tile


#: the bit of a driver's mask that asks for ggml's order of Q5_0 and Q8_0 sums
#: (:func:`_emitter`; ``TENSORPLUG_CPU_GGML_PRODUCT_ORDER``), above every type's bit
GGML_ORDER_BIT = 1 << 62


def kinds_mask(kinds: Iterable[Type]) -> int:
    """The bit set of repacked types ``kinds`` (bit ``int(t)``) that a driver of
    :func:`packed_kernels` compiles tiles for."""
    mask = 0
    for t in kinds:
        if t not in LAYOUTS:
            raise ValueError(f"{t.name} weights have no repacked layout (repack.LAYOUTS)")
        mask |= 1 << int(t)
    return mask


def tile_rows(lay: PackedLayout, ggml_order: bool = False) -> int:
    """The most activation rows a tile of layout ``lay`` takes on this host. With 32
    vector registers (AVX-512), eight rows of the layouts that carry one accumulator a
    row (Q4_0, Q5_0, Q8_0, IQ4_NL, Q6_K, IQ4_XS) and of Q5_K: each weight block is then
    unpacked once for eight rows, not twice, and a prompt's products take less time
    than in fours. Q4_K, there, two: a tile of four rows keeps each row's two pair
    sums, two super-block integers and two float sums live through a super-block's 64
    ``vpdpbusd`` per row, and LLVM, hoisting the super-block's code loads, spills
    hundreds of values a super-block; tiles of two run markedly faster than fours or
    eights (tiles of three: as four). The others keep four, as fast or faster there:
    Q2_K (eights: the same), Q4_1 and Q5_1 (eights: much slower; their nine sums a row
    take two rows at once in 512-bit vectors, :func:`_vec_dot_order_body`). With 16
    registers (AVX2) every layout keeps four: eight rows' sums would not fit. (With
    only the AVX2 forms, Q8_0 in ggml's order, one pass a run, tiles of two and eight
    are slower than fours too.) Q6_K's eights are the Zen cores' (``_ir.ON_ZEN``): on an
    Intel Xeon (LLVM's ``emeraldrapids``) its products of 64 and 128 rows take longer in
    eights than in fours, and as long when compiled for a Zen core
    (``NUMBA_CPU_NAME=znver4``): the core's doing, not LLVM's schedule. Q4_0's eights,
    Q4_K's twos and Q5_K's and Q8_0's eights (as fast as fours) hold there too."""
    if not _ir.HAS_32_REGS:
        return TILE
    if lay.type == Type.Q6_K and not _ir.ON_ZEN:
        return TILE
    if _accumulators(lay, ggml_order) == 1 or lay.type == Type.Q5_K:
        return WIDE_TILE
    if lay.type == Type.Q4_K:
        return NARROW_TILE
    return TILE


def pairs_groups(lay: PackedLayout, form: int = OWN_FORM) -> bool:
    """Whether a driver multiplies two groups of layout ``lay`` at once in its full-height
    tiles of ``form`` (that form plus :data:`PAIRED`): the K-quants whose products a
    prompt spends its time in — Q4_K (its own form and ggml's four-row gemm's), Q5_K,
    and Q6_K in ggml's tiled order (prompts with ``ggml_order``) — with AVX512-VNNI and
    32 registers, off Zen cores. An AVX-512 Xeon's cores run a 512-bit ``vpdpbusd`` as
    fast as a 256-bit one (independent chains of either issue at the same rate), and a
    group's eight rows fill 256 bits only: two groups' rows side by side in one vector
    do twice the work per instruction, the codes of each run unpacked once for both,
    and a prompt's Q5_K and Q6_K products take markedly less time than in one group's
    tiles. Zen cores keep one group a tile: the first of them with AVX-512 run a 512-bit
    instruction as two 256-bit halves, where pairing would only add the joining of both
    groups' codes, and pairing has not been measured on the others. The same integers
    and float steps lane by lane, so the same bits as a group alone."""
    if not (_ir.HAS_VNNI and _ir.HAS_32_REGS) or _ir.ON_ZEN:
        return False
    return (lay.type, form) in {(Type.Q4_K, OWN_FORM), (Type.Q4_K, GEMM_FORM),
                                (Type.Q5_K, OWN_FORM), (Type.Q6_K, TILED_FORM)}  # fmt: skip


def _sizes(top: int) -> list[int]:
    """The tile heights compiled for a layout whose tiles take ``top`` rows at most:
    every height up to :data:`TILE` (the remainders), and ``top``."""
    return sorted({*range(1, min(top, TILE) + 1), top})


@intrinsic(prefer_literal=True)
def _kinds_of_height(typingctx: Any, mask: Any, height: Any) -> Any:
    """The bit set (as :func:`kinds_mask`) of the layouts in the constant ``mask`` whose
    tiles take the constant ``height`` rows on this host (:func:`tile_rows`), decided
    when the driver is compiled, as :func:`_tile_of` decides which tiles it has."""
    if not isinstance(mask, types.IntegerLiteral) or not isinstance(height, types.IntegerLiteral):
        return None
    ggml_order = bool(mask.literal_value & GGML_ORDER_BIT)
    kinds = sum(1 << int(t) for t, lay in _chosen(mask.literal_value)
                if tile_rows(lay, ggml_order) == height.literal_value)  # fmt: skip

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return I64(kinds)

    return types.int64(mask, height), codegen


@intrinsic(prefer_literal=True)
def _paired_kinds(typingctx: Any, mask: Any, form: Any) -> Any:
    """The bit set (as :func:`kinds_mask`) of the layouts in the constant ``mask`` whose
    drivers have tiles of two groups in the constant ``form`` (:func:`pairs_groups`,
    :func:`_forms`)."""
    if not isinstance(mask, types.IntegerLiteral) or not isinstance(form, types.IntegerLiteral):
        return None
    ggml_order = bool(mask.literal_value & GGML_ORDER_BIT)
    kinds = sum(1 << int(t) for t, _ in _chosen(mask.literal_value)
                if form.literal_value | PAIRED in _forms(t, ggml_order))  # fmt: skip

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return I64(kinds)

    return types.int64(mask, form), codegen


@njit(inline="always")
def _chunk_unit(mask: int) -> int:
    """The groups a parallel driver's chunks hold a multiple of: two where a kind in
    ``mask`` pairs groups (:func:`pairs_groups`), else one. 64 chunks of a 96-group
    product hold one or two groups each, and a chunk's odd group is multiplied alone:
    with a unit of one, a third of a 768-row product's groups would be (which chunk a
    group is in changes no bit)."""
    paired: int = _paired_kinds(mask, OWN_FORM) | _paired_kinds(mask, TILED_FORM)  # type: ignore[call-arg]
    paired |= _paired_kinds(mask, GEMM_FORM)  # type: ignore[call-arg]
    return 2 if paired else 1


@njit(inline="always")
def _top(mask: int, kind: int) -> int:
    """The rows of the tiles of type id ``kind`` in a driver for ``mask`` (:func:`tile_rows`)."""
    if (_kinds_of_height(mask, WIDE_TILE) >> kind) & 1:  # type: ignore[call-arg]
        return WIDE_TILE
    if (_kinds_of_height(mask, NARROW_TILE) >> kind) & 1:  # type: ignore[call-arg]
        return NARROW_TILE
    return TILE


def _chosen(mask: int) -> list[tuple[Type, PackedLayout]]:
    return [(t, lay) for t, lay in LAYOUTS.items() if mask >> int(t) & 1]


def _forms(t: Type, ggml_order: bool) -> tuple[int, ...]:
    """The tile forms a driver compiles for ``t`` weights: its own, and with ggml's order
    for Q6_K ggml's tiled product's too (:data:`GGML_TILED_MIN_ROWS`), for Q4_K its
    four-row gemm's (:data:`GGML_GEMM_ROWS`); and each for two groups at once where
    :func:`pairs_groups`."""
    forms: tuple[int, ...] = (OWN_FORM,)
    if ggml_order and t == Type.Q6_K:
        forms = (OWN_FORM, TILED_FORM)
    if ggml_order and t == Type.Q4_K:
        forms = (OWN_FORM, GEMM_FORM)
    return forms + tuple(f | PAIRED for f in forms if pairs_groups(LAYOUTS[t], f))


def _tile_key(form: int, kind: int, n: int) -> int:
    """The ``switch`` case of :func:`_tile_of` for a tile of ``n`` rows of type id
    ``kind`` in tile form ``form`` (type ids are below 64, heights below 16)."""
    return (64 * form + kind) * 16 + n


@intrinsic(prefer_literal=True)
def _tile_of(typingctx: Any, packed: Any, g: Any, xq: Any, xd: Any, xs: Any, table: Any,
             t0: Any, out: Any, kind: Any, n: Any, form: Any, mask: Any) -> Any:  # fmt: skip
    """Group ``g`` times activation rows ``t0..t0+n-1`` (``n`` one of :func:`_sizes` of
    the layout's :func:`tile_rows`) of weights of ggml type ``kind`` in tile form
    ``form`` (:data:`OWN_FORM`, or :data:`TILED_FORM` where :func:`_forms` has it): one
    ``switch`` over the tiles of each size of the layouts in ``mask``
    (:func:`kinds_mask`, a compile-time constant) only. Every layout's tiles in one
    switch would make each driver ~20 layout × 4 size bodies, a long first-run compile
    for a model that uses one of them."""
    if not isinstance(mask, types.IntegerLiteral):  # numba then says no match was found
        return None
    chosen = _chosen(mask.literal_value)
    ggml_order = bool(mask.literal_value & GGML_ORDER_BIT)

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        kind_key = builder.add(builder.mul(builder.sext(args[10], I64), I64(64)),
                               builder.sext(args[8], I64))  # fmt: skip
        key = builder.add(builder.mul(kind_key, I64(16)), builder.sext(args[9], I64))
        done = builder.append_basic_block("tile_of.done")
        switch = builder.switch(key, done)
        for t, lay in chosen:
            for form in _forms(t, ggml_order):
                top = tile_rows(lay, ggml_order)
                for size in [top] if form & PAIRED else _sizes(top):
                    case = builder.append_basic_block(f"tile_of.{t.name}.{form}.{size}")
                    switch.add_case(I64(_tile_key(form, int(t), size)), case)
                    builder.position_at_end(case)
                    emit = _emitter(lay, size, ggml_order, form)
                    emit(context, builder, sig, args)
                    builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return types.none(packed, g, xq, xd, xs, table, t0, out, kind, n, form, mask), codegen


@njit(inline="always")
def _groups(packed: Any, g0: int, g1: int, xq: Any, xd: Any, xs: Any, table: Any, out: Any,
            kind: int, mask: int) -> None:  # fmt: skip
    """Groups ``g0..g1-1`` times every activation row, in tiles of the layout's
    :func:`tile_rows`, the remainder in tiles of up to four. With ggml's order, Q4_K's
    first ``4·⌊n/4⌋`` rows (ggml's gemm's groups, :data:`GGML_GEMM_ROWS`) and the rest
    are tiled apart, in their two forms. Where :func:`pairs_groups`, two groups at a
    time take their full-height tiles together (:data:`PAIRED`), the rest of the
    rows and a last odd group alone.
    (Inlined before typing, so the caller's constant ``mask`` reaches :func:`_tile_of`
    as one.)"""
    n_tok = xq.shape[0]
    top = _top(mask, kind)
    # whether this kind's tiles of each form take two groups (a bit per form)
    pairs = ((_paired_kinds(mask, OWN_FORM) >> kind) & 1) << OWN_FORM  # type: ignore[call-arg]
    pairs |= ((_paired_kinds(mask, TILED_FORM) >> kind) & 1) << TILED_FORM  # type: ignore[call-arg]
    pairs |= ((_paired_kinds(mask, GEMM_FORM) >> kind) & 1) << GEMM_FORM  # type: ignore[call-arg]
    rest = min(top, TILE)  # the heights below ``top`` that the switch has
    form = OWN_FORM  # ggml's tiled product where llama.cpp takes it (GGML_TILED_MIN_ROWS)
    if mask & GGML_ORDER_BIT and kind == Q6_K and n_tok >= GGML_TILED_MIN_ROWS:
        form = TILED_FORM
    gemm_rows = 0  # rows in ggml's four-row gemm (Q4_K with ggml's order)
    if mask & GGML_ORDER_BIT and kind == Q4_K:
        gemm_rows = n_tok // GGML_GEMM_ROWS * GGML_GEMM_ROWS
    g = g0
    while g < g1:
        two = pairs != 0 and g + 1 < g1
        t = 0
        while t < n_tok:
            end, f = (gemm_rows, GEMM_FORM) if t < gemm_rows else (n_tok, form)
            n = top if end - t >= top else min(rest, end - t)
            if two and n == top and (pairs >> f) & 1:
                _tile_of(packed, g, xq, xd, xs, table, t, out, kind, n, f | PAIRED, mask)  # type: ignore[call-arg]
            else:
                _tile_of(packed, g, xq, xd, xs, table, t, out, kind, n, f, mask)  # type: ignore[call-arg]
                if two:
                    _tile_of(packed, g + 1, xq, xd, xs, table, t, out, kind, n, f, mask)  # type: ignore[call-arg]
            t += n
        g += 2 if two else 1


@njit(inline="always")
def _sums_of_16(xq: Any, xs: Any, factor: int) -> None:
    """``xs[t, j] = factor·Σ xq[t, 16j : 16j + 16]``: Q2_K's and Q6_K's scales cover 16
    values, so their products take the activation codes' sums over 16. Q6_K's take
    them times ``−32`` (:data:`Q6_K_OFFSET`): each group's integer sum starts from that
    share of the codes' offset, and the code products add onto it
    (:func:`_q6_k_half_sums`), where multiplying it in would take every activation row
    16 multiplications a block in ggml's tiled order."""
    for t in range(xq.shape[0]):
        for j in range(xq.shape[1] // 16):
            total = 0
            for i in range(16):
                total += np.int32(xq[t, 16 * j + i])
            xs[t, j] = total * factor


@njit(inline="always")
def _scaled_sums(xd: Any, xs: Any) -> None:
    """``xs[t, j]`` becomes the float32 bits of ``xd[t, j]·xs[t, j]``: each 32-value
    block's activation sum times its scale, the factor of Q5_K's minimums (its tiles
    read it as a float, :func:`_q4_k_body`)."""
    for t in range(xs.shape[0]):
        for j in range(xs.shape[1]):
            xs[t, j] = f32_bits(xd[t, j] * np.float32(xs[t, j]))  # type: ignore[call-arg]


@njit(inline="always")
def _quantize(x: Any, xq: Any, xd: Any, xs: Any, table: Any, kind: int) -> None:
    """The activations as ggml rounds them for ``kind`` weights (Q8_0, Q8_1, or Q8_K for
    the K-quants), then the sums the :data:`OWN_SUMS` types read in place of
    ``quantize_activations``'s sums over 32 values."""
    quantize_activations(x, xq, xd, xs, table, kind)
    if kind == Q5_K:
        _scaled_sums(xd, xs)
    elif kind == Q2_K:
        _sums_of_16(xq, xs, 1)
    elif kind == Q6_K:
        _sums_of_16(xq, xs, -Q6_K_OFFSET)


@kernel(parallel=True)
def quantize_rows(x: Any, xq: Any, xd: Any, xs: Any, table: Any, kind: int) -> None:
    """:func:`_quantize` of the rows of ``x``, row by row on numba's threads: a long
    prompt's activations for the repacked products (:data:`QUANTIZE_APART_ROWS`). One kernel for
    every driver, called before one, not a parallel loop inside each: every sibling
    driver would compile its own, seconds of a first run's CPU each (a large share of
    SmolLM2's first run)."""
    for t in prange(x.shape[0]):
        _quantize(x[t : t + 1], xq[t : t + 1], xd[t : t + 1], xs[t : t + 1], table, kind)


class PackedKernels(NamedTuple):
    """The drivers of repacked products for a set of weight types (:func:`packed_kernels`)."""

    #: ``(x, packed, xq, xd, xs, out, table, kind)``: one matrix, on the calling thread
    serial: Any
    #: ``(x, packs, outs, kinds, starts, xq, xd, xs, table, quantized)``: up to
    #: ``MAX_SIBLINGS`` (three) matrices of the same ``x``, the rest padded with empty
    #: ones, on numba's threads; one matrix is this with two empty ones
    siblings: Any


def packed_kernels(kinds: frozenset[Type], ggml_order: bool = False) -> PackedKernels:
    """:func:`_packed_kernels`, made once per set of types and order however it is asked
    for (``functools.cache`` alone keys ``f(k)`` and ``f(k, False)`` apart: two sets of
    the same drivers, each compiled or loaded on its own)."""
    return _packed_kernels(frozenset(kinds), bool(ggml_order))


@functools.cache
def _packed_kernels(kinds: frozenset[Type], ggml_order: bool) -> PackedKernels:
    """The drivers that multiply repacked weights of the types ``kinds`` (any others
    fall through their tiles' switch, computing nothing): each compiles the tiles of
    those layouts only, so a first run compiles what its model uses (a Q4_1 model: 4
    tile bodies, not ~44). They are closures over the constant mask, which numba's
    disk cache keys them on (the closure's cell contents are in its index key), each
    set under a name of its own. ``ggml_order``: Q5_0 and Q8_0 tiles sum in ggml's
    order (:func:`_emitter`).

    Two drivers, not three: a parallel driver for one matrix would be one more compile
    of every tile, seconds of a first run's CPU, for what the sibling driver does with
    the other two matrices empty, at most a microsecond slower a call."""
    mask = kinds_mask(kinds) | (GGML_ORDER_BIT if ggml_order else 0)
    suffix = "_".join(sorted(t.name.lower() for t in kinds)) + ("_ggml" if ggml_order else "")

    def matmul_packed_serial(
        x: Any, packed: Any, xq: Any, xd: Any, xs: Any, out: Any, table: Any, kind: int
    ) -> None:
        """``out[t, o] = W[o]·x[t]`` for repacked weights of ggml type ``kind``, on the
        calling thread (no parallel region): the rows of ``x`` quantized into ``xq, xd,
        xs``, then every eight-row group."""
        _quantize(x, xq, xd, xs, table, kind)
        _groups(packed, 0, packed.shape[0], xq, xd, xs, table, out, kind, mask)

    def matmul_packed_siblings(
        x: Any, packs: Any, outs: Any, kinds: Any, starts: Any, xq: Any, xd: Any, xs: Any,
        table: Any, quantized: bool,
    ) -> None:  # fmt: skip
        """``matmul_packed_serial`` for one or several repacked matrices that multiply
        the same ``x`` (a layer's Q, K and V; its gate and up), on numba's threads: ``x``
        quantized once, here, unless ``quantized`` (by :func:`quantize_rows`, the
        caller's choice for many rows), then one parallel region for all. ``packs``,
        ``outs`` and ``kinds`` are tuples, matrix ``m``'s groups sitting at
        ``starts[m]..`` of one concatenated range of groups, shared out in chunks. Each
        group is computed as ``matmul_packed_serial`` computes it, to the bit. The
        kinds all have one :func:`activation_form`."""
        kind = kinds[0]
        if not quantized:
            _quantize(x, xq, xd, xs, table, kind)
        total = starts[len(packs)]
        unit = _chunk_unit(mask)
        for c in prange(ROW_CHUNKS):
            lo, hi = chunk_span(c, total, unit)
            for m in range(len(packs)):
                g0, g1 = max(lo, starts[m]) - starts[m], min(hi, starts[m + 1]) - starts[m]
                if g0 < g1:
                    _groups(packs[m], g0, g1, xq, xd, xs, table, outs[m], kinds[m], mask)

    for fn in (matmul_packed_serial, matmul_packed_siblings):
        fn.__qualname__ = f"{fn.__name__}_{suffix}"  # the name of its cache files
    drivers = PackedKernels(
        kernel(nogil=True, fastmath=DOT_FASTMATH)(matmul_packed_serial),
        kernel(parallel=True, fastmath=DOT_FASTMATH)(matmul_packed_siblings),
    )
    ids = tuple(sorted(int(t) for t in kinds))
    for name, driver in zip(PackedKernels._fields, drivers, strict=True):
        # how another process makes this driver again (.ahead: compiled ahead there)
        driver.tensorplug_origin = ("made", __name__, "packed_driver", ids, ggml_order, name)
    return drivers


def packed_driver(ids: tuple[int, ...], ggml_order: bool, field: str) -> Any:
    """The driver ``field`` of :func:`packed_kernels` for the types of ids ``ids`` (what
    its origin names)."""
    return getattr(packed_kernels(frozenset(Type(t) for t in ids), ggml_order), field)


def packed_job_of(ids: tuple[int, ...], ggml_order: bool) -> Any:
    """:func:`packed_job` for the types of ids ``ids`` (what its origin names)."""
    return packed_job(frozenset(Type(t) for t in ids), ggml_order)


def packed_job(kinds: frozenset[Type], ggml_order: bool = False) -> Any:
    """:func:`_packed_job`, made once per set of types and order (as
    :func:`packed_kernels`)."""
    return _packed_job(frozenset(kinds), bool(ggml_order))


@functools.cache
def _packed_job(kinds: frozenset[Type], ggml_order: bool) -> Any:
    """``matmul_packed_siblings`` as a job of :mod:`.pool`: a C function ``(job, lo,
    hi)`` over a :func:`packed_job_block`, whose chunk ``c`` computes the ``c``-th run of
    the matrices' groups as the driver computes each group (so the same bits: a group
    is computed alone, whoever computes it, in whatever run), and whose prologue (``lo``
    = -1) quantizes ``x`` (a step of fewer than :data:`.job_blocks.QUANTIZE_APART_ROWS`
    rows: a longer prompt's products stay numba regions). Not compiled yet
    (:func:`.job_function`); a closure over the constant mask, as the drivers are."""
    mask = kinds_mask(kinds) | (GGML_ORDER_BIT if ggml_order else 0)
    suffix = "_".join(sorted(t.name.lower() for t in kinds)) + ("_ggml" if ggml_order else "")

    def packed_job(job: Any, lo: Any, hi: Any) -> None:
        head = carray(address(job), PACKED_HEAD, np.int64)
        rows, cols = head[PACKED_ROWS], head[PACKED_COLS]
        table = carray(address(head[PACKED_TABLE]), 1 << 16, np.float32)
        xq = carray(address(head[PACKED_XQ]), (rows, cols), np.int8)
        xd = carray(address(head[PACKED_XD]), (rows, cols // 32), np.float32)
        xs = carray(address(head[PACKED_XS]), (rows, head[PACKED_XS_COLS]), np.int32)
        if lo < 0:
            x = carray(address(head[PACKED_X]), (rows, cols), np.float32)
            _quantize(x, xq, xd, xs, table, head[PACKED_KIND])
            return
        n_mats, total, chunks = head[PACKED_MATS], head[PACKED_TOTAL], head[PACKED_CHUNKS]
        mats = carray(address(job + 8 * PACKED_HEAD), (n_mats, PACKED_MAT_FIELDS), np.int64)
        for c in range(lo, hi):
            g_lo, g_hi = c * total // chunks, (c + 1) * total // chunks
            for m in range(n_mats):
                start, groups = mats[m, MAT_START], mats[m, MAT_GROUPS]
                g0, g1 = max(g_lo, start) - start, min(g_hi, start + groups) - start
                if g0 < g1:
                    packed = carray(address(mats[m, MAT_PACKED]), (groups, mats[m, MAT_BYTES]),
                                    np.uint8)  # fmt: skip
                    out = carray(address(mats[m, MAT_OUT]), (rows, mats[m, MAT_OUT_COLS]),
                                 np.float32)  # fmt: skip
                    _groups(packed, g0, g1, xq, xd, xs, table, out, mats[m, MAT_KIND], mask)

    job = job_function(packed_job, f"packed_job_{suffix}", DOT_FASTMATH)
    # how the compile-ahead process makes it again (.ahead)
    ids = tuple(sorted(int(t) for t in kinds))
    job.tensorplug_origin = ("made_job", __name__, "packed_job_of", ids, ggml_order)
    return job

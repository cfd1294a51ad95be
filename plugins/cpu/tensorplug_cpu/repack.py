"""Weights stored for the CPU's integer kernels: eight rows interleaved (``CPU_REPACK``).

ggml's CPU backend offers an extra buffer type, ``CPU_REPACK``, that stores the weights
of matrix products in the order its kernels read them, and llama.cpp loads every
Q4_0 and Q4_K matrix there. This is ours, for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
IQ4_XS, Q2_K, Q4_K, Q5_K and Q6_K. In a matrix's
own layout each row's blocks follow one another, and a kernel that takes several rows
at once must sum each row across the lanes of a vector; stored repacked, block ``b`` of
eight rows is one run of bytes: the eight rows' scales side by side, then their codes
in 4-byte chunks, chunk ``c`` of row 0, of row 1, … of row 7, then chunk ``c + 1``.
A 32-byte load then holds four codes of every row, and one integer multiply-add leaves
each row's sum in a lane of its own (:mod:`.kernels._numba_repack`). A repacked Q4_0 or
Q8_0 block holds the bytes of the eight blocks it came from in another order; Q5_0 also
regroups its fifth bits, and a Q4_K block unpacks each row's 6-bit sub-block scales and
minimums into bytes (1184 bytes for 1152).

The buffer that holds them is :mod:`.repack_buffer`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from tensorplug.iquants import KVALUES_IQ4NL
from tensorplug.types import Type

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

__all__ = [
    "GROUP_ROWS",
    "LAYOUTS",
    "Move",
    "PackedLayout",
    "layout_of",
    "move_table",
    "packed_size",
]

#: rows interleaved in one group
GROUP_ROWS = 8


class Move(NamedTuple):
    """``words`` words of ``dtype`` from byte ``at`` of each of eight rows' blocks to byte
    ``to`` of the repacked block: the eight rows' first words side by side, then their
    second words, each such run of eight words ``every`` runs after the last."""

    dtype: type
    at: int
    to: int
    words: int
    every: int = 1


@dataclass(frozen=True)
class PackedLayout:
    """How eight rows' blocks of one type become one repacked block: ``moves`` say where
    each row's words go (16-bit scales, 32-bit runs of codes), ``regroup`` names what
    else changes shape.

    32-value types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, whose block is Q4_0's with
    nibbles that index ``levels``): the eight f16 scales (Q4_1 and Q5_1:
    then the eight f16 minimums), then ``chunks`` runs of 32 bytes of codes. Q5_0 and
    Q5_1 keep their fifth bits between them as eight 32-bit words, one per run of 32
    codes (low nibbles of chunk ``c``: word ``2c``, high: ``2c + 1``), bit ``4r + i`` of
    a word the fifth bit of the code in byte ``4r + i`` of its run. Q4_K:
    the eight ``d``, the eight ``dmin``, each sub-block's eight 6-bit scales as bytes,
    then its eight minimums, then the codes as for the 32-value types (sub-blocks ``2p``
    and ``2p + 1`` share the bytes of pair ``p``: low and high nibbles). Q5_K: Q4_K's,
    with its ``qh`` as eight runs of 32 bytes (bytes ``4c..4c+3`` of each row) between
    the minimums and the codes (1440 bytes a block for 1408). Q2_K: the eight ``d``,
    the eight ``dmin``, each 16-value group's eight scale bytes (scale and minimum
    nibbles, as stored), then its 2-bit ``qs`` as sixteen runs of 32 bytes, the
    natural size. Q6_K: the eight ``d``, the sixteen int8 scales of each row
    (scale-major), then the 4-bit ``ql`` and the 2-bit ``qh`` as runs of 32 bytes in the
    order its kernel reads them (read in the rows' own order, three streams at once,
    they come from memory much slower). IQ4_XS: the eight ``d``, each sub-block's eight
    scales as signed bytes (``ls − 32``, 1104 bytes a block for 1088), then the codes
    as Q4_K's (sub-block ``s``: chunks ``4s..4s+3``, low nibbles its values 0-15, high
    16-31), nibbles that index ``levels``."""

    type: Type
    moves: tuple[Move, ...]
    codes_at: int  # where the codes begin in a repacked block
    chunks: int = 0  # 4-byte chunks of codes in one row's block (32-value types, Q4_K)
    nibbles: bool = True  # two 4-bit codes a byte
    offset: int = 0  # subtracted from each code: Q4_0 8, Q5_0 16, Q6_K 32 (Q8_0: signed)
    regroup: str = ""  # "fifth bits" (Q5_0, Q5_1), "scales" (Q4_K's 6-bit ones),
    # "signed scales" (IQ4_XS's 6-bit ones, less 32, as int8)
    minimum_at: int = -1  # where the eight f16 minimums ``m`` are (Q4_1, Q5_1), -1: none
    qh_at: int = 2  # "fifth bits": where a row's 32-bit ``qh`` is in its block (Q5_1: 4)
    levels: tuple[int, ...] = ()  # non-linear codes (IQ4_NL): the int8 value of each nibble

    @property
    def block(self) -> int:
        """Bytes of one repacked block (eight rows' blocks)."""
        natural = GROUP_ROWS * self.type.type_size
        extra = {"scales": 16 - 12, "signed scales": 8 - 6}.get(self.regroup, 0)
        return natural + extra * GROUP_ROWS

    @property
    def bits_at(self) -> int:
        """Fifth bits: where the runs' words begin in a repacked block (after the
        scales and, for Q5_1, the minimums)."""
        return self.codes_at - 8 * self.chunks

    def pack(self, blocks: np.ndarray, out: np.ndarray, *, moved: bool = False) -> None:
        """Rows of ggml blocks ``(8·G, nb, type_size)`` into ``out``, ``(G, nb, block)``
        (both C-contiguous). Scales and codes move as 16- and 32-bit words: numpy pays
        its per-element cost once a word rather than once a byte, so this packs several
        times faster than moving bytes. ``moved``: the :attr:`moves` are
        done already (:func:`pack_blocks` has them compiled); only what else changes
        shape is done here."""
        self._move(blocks, out, packing=True, moved=moved)

    def unpack(self, packed: np.ndarray, out: np.ndarray) -> None:
        """:meth:`pack` undone: ``(G, nb, block)`` into ggml blocks ``(8·G, nb, type_size)``."""
        self._move(out, packed, packing=False)

    def _move(
        self, natural: np.ndarray, packed: np.ndarray, packing: bool, moved: bool = False
    ) -> None:
        groups, nb = packed.shape[:2]
        size, block = self.type.type_size, self.block
        if not (natural.flags.c_contiguous and packed.flags.c_contiguous):
            raise ValueError("repack: both arrays must be C-contiguous")
        row, group = nb * size, GROUP_ROWS * nb * size

        def rows(dtype: type, at: int, count: int) -> np.ndarray:  # (G, nb, count, 8 rows)
            item = np.dtype(dtype).itemsize
            return np.ndarray((groups, nb, count, GROUP_ROWS), dtype, natural, at,
                              (group, size, item, row))  # fmt: skip

        def lanes(dtype: type, at: int, count: int, every: int = 1) -> np.ndarray:
            item = np.dtype(dtype).itemsize  # (G, nb, count, 8 rows)
            return np.ndarray((groups, nb, count, GROUP_ROWS), dtype, packed, at,
                              (nb * block, block, every * GROUP_ROWS * item, item))  # fmt: skip

        for move in () if moved else self.moves:
            if packing:
                lanes(move.dtype, move.to, move.words, move.every)[...] = rows(
                    move.dtype, move.at, move.words)  # fmt: skip
            else:
                rows(move.dtype, move.at, move.words)[...] = lanes(
                    move.dtype, move.to, move.words, move.every)  # fmt: skip
        if self.regroup == "fifth bits":
            qh = rows(np.uint32, self.qh_at, 1)[:, :, 0]  # (G, nb, 8 rows)
            bits = np.ndarray((groups, nb, 2 * self.chunks), np.uint32, packed, self.bits_at,
                              (nb * block, block, 4))  # fmt: skip
            _move_fifth_bits(qh, bits, packing)
        elif self.regroup == "signed scales":
            packed_scales = rows(np.uint8, 2, 6)  # scales_h (2 bytes), scales_l (4)
            signed = lanes(np.int8, 16, 8)  # sub-block-major, as the kernel reads them
            if packing:
                signed[...] = _iq4_xs_scales(packed_scales.transpose(0, 1, 3, 2)).transpose(
                    0, 1, 3, 2
                )
            else:
                both = _iq4_xs_pack_scales(signed.transpose(0, 1, 3, 2))
                packed_scales[...] = both.transpose(0, 1, 3, 2)
        elif self.regroup == "scales":
            scale_bytes = rows(np.uint8, 4, 12)
            as_bytes = lanes(np.uint8, 32, 16)  # 8 scales, then 8 minimums
            if packing:
                lanes64 = np.ndarray((groups, nb, 16), _LANES, packed, 32, (nb * block, block, 8))
                if moved:  # the compiled moves put the 12 bytes in place (:func:`move_table`)
                    words = lanes64[..., :12]
                else:
                    words = np.ascontiguousarray(scale_bytes).view(_LANES)[..., 0]
                _q4_k_scales_in_lanes(words, lanes64)
            else:
                sc, mn = as_bytes[:, :, :8], as_bytes[:, :, 8:]
                both = _q4_k_pack_scales(sc.transpose(0, 1, 3, 2), mn.transpose(0, 1, 3, 2))
                scale_bytes[...] = both.transpose(0, 1, 3, 2)


def _move_fifth_bits(qh: np.ndarray, words: np.ndarray, packing: bool) -> None:
    """Eight rows' fifth bits ``qh`` (``G, nb, 8``: a 32-bit word a row, bit ``j`` value
    ``j``'s) into the runs' ``words`` (``G, nb, 8``; see :class:`PackedLayout`), or back.
    Run ``2c + h`` holds values ``16h + 4c .. +3`` of each row, four bits at ``4r``."""
    at = 4 * np.arange(GROUP_ROWS, dtype=np.uint32)
    if packing:
        for run in range(words.shape[-1]):
            first = 16 * (run % 2) + 4 * (run // 2)
            four = (qh >> np.uint32(first)) & np.uint32(15)
            words[..., run] = np.bitwise_or.reduce(four << at, axis=-1)
        return
    out = np.zeros(qh.shape, np.uint32)
    for run in range(words.shape[-1]):
        first = 16 * (run % 2) + 4 * (run // 2)
        out |= ((words[..., run, None] >> at) & np.uint32(15)) << np.uint32(first)
    qh[...] = out


def _iq4_xs_scales(q: np.ndarray) -> np.ndarray:
    """An IQ4_XS block's ``scales_h`` and ``scales_l`` (``…, 6`` bytes) as its eight
    sub-blocks' signed scales ``ls − 32`` (``…, 8`` int8), ggml's
    ``((scales_l[ib/2] >> 4·(ib%2)) & 15) | (((scales_h >> 2·ib) & 3) << 4)``."""
    high = q[..., 0].astype(np.int32) | (q[..., 1].astype(np.int32) << 8)
    out = np.empty((*q.shape[:-1], 8), np.int8)
    for ib in range(8):
        low = (q[..., 2 + ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 15
        out[..., ib] = (low | (((high >> (2 * ib)) & 3) << 4)) - 32
    return out


def _iq4_xs_pack_scales(signed: np.ndarray) -> np.ndarray:
    """:func:`_iq4_xs_scales` undone (each of the 48 bits comes from one place)."""
    ls = signed.astype(np.int32) + 32
    high = np.zeros(ls.shape[:-1], np.int32)
    out = np.empty((*ls.shape[:-1], 6), np.uint8)
    for ib in range(8):
        high |= ((ls[..., ib] >> 4) & 3) << (2 * ib)
    out[..., 0], out[..., 1] = high & 255, high >> 8
    for j in range(4):
        out[..., 2 + j] = (ls[..., 2 * j] & 15) | ((ls[..., 2 * j + 1] & 15) << 4)
    return out


#: eight rows' bytes at one place of their blocks as one word, row ``r`` byte ``r``
_LANES = np.dtype("<u8")


def _bytes_each(value: int) -> np.uint64:
    """``value`` (a byte) in each byte of a 64-bit word."""
    return np.uint64(value * 0x0101010101010101)


def _q4_k_scales_in_lanes(words: np.ndarray, out: np.ndarray) -> None:
    """Q4_K's 12 scale bytes of eight rows (``words``: ``G, nb, 12`` words of
    :data:`_LANES`, byte ``j`` of the eight rows in word ``j``) as the repacked block's 16
    bytes (``out``: ``G, nb, 16``, laid out the same): the eight 6-bit scales, then the
    eight minimums (ggml's ``get_scale_min_k4``). A word holds one byte of each of the
    eight rows, so the bit arithmetic runs on all eight at once: numpy's byte-wise
    version, transposed into place, would be most of Q5_K's repacking. ``words`` may
    be the first 12 words of ``out`` (each is read before it is written)."""
    lo, hi, mix = words[..., 0:4], words[..., 4:8], words[..., 8:12]
    six, four, two = _bytes_each(63), _bytes_each(15), _bytes_each(3)
    shift4, shift6 = np.uint64(4), np.uint64(6)
    high_scales = (mix & four) | (((lo >> shift6) & two) << shift4)
    high_mins = ((mix >> shift4) & four) | (((hi >> shift6) & two) << shift4)
    low_mins = hi & six
    np.bitwise_and(lo, six, out=out[..., 0:4])
    out[..., 4:8] = high_scales
    out[..., 8:12] = low_mins
    out[..., 12:16] = high_mins


def _q4_k_pack_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """A Q4_K block's eight 6-bit scales and eight minimums (``…, 8`` each) as its 12
    scale bytes (``…, 12``): :func:`_q4_k_scales_in_lanes` undone (each of the 96 bits
    comes from one place)."""
    sc = scales.astype(np.uint8)
    mn = mins.astype(np.uint8)
    lo = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    hi = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    mix = (sc[..., 4:8] & 15) | ((mn[..., 4:8] & 15) << 4)
    return np.concatenate([lo, hi, mix], axis=-1)


_U8, _U16, _U32 = np.uint8, np.uint16, np.uint32
#: Q6_K's codes as its kernel reads them: for each half ``n`` and chunk ``c``, the
#: chunk of ``ql``'s low runs, of its high runs, and of ``qh`` (one stream of bytes)
_Q6_K_CODES = tuple(
    Move(_U32, at + 64 * n, 144 + 32 * (24 * n + slot), 8, every=3)
    for n in range(2)
    for slot, at in enumerate((0, 32, 128 - 32 * n))
)

# fmt: off
#: the types the CPU stores repacked, and how
LAYOUTS: dict[Type, PackedLayout] = {
    Type.Q4_0: PackedLayout(Type.Q4_0, (Move(_U16, 0, 0, 1), Move(_U32, 2, 16, 4)), 16,
                            chunks=4, offset=8),
    Type.Q4_1: PackedLayout(Type.Q4_1, (Move(_U16, 0, 0, 1), Move(_U16, 2, 16, 1),
                                        Move(_U32, 4, 32, 4)), 32,
                            chunks=4, minimum_at=16),
    Type.Q5_0: PackedLayout(Type.Q5_0, (Move(_U16, 0, 0, 1), Move(_U32, 6, 48, 4)), 48,
                            chunks=4, offset=16, regroup="fifth bits"),
    Type.Q5_1: PackedLayout(Type.Q5_1, (Move(_U16, 0, 0, 1), Move(_U16, 2, 16, 1),
                                        Move(_U32, 8, 64, 4)), 64,
                            chunks=4, regroup="fifth bits", minimum_at=16, qh_at=4),
    Type.Q8_0: PackedLayout(Type.Q8_0, (Move(_U16, 0, 0, 1), Move(_U32, 2, 16, 8)), 16,
                            chunks=8, nibbles=False),
    Type.IQ4_NL: PackedLayout(Type.IQ4_NL, (Move(_U16, 0, 0, 1), Move(_U32, 2, 16, 4)), 16,
                              chunks=4, levels=tuple(int(v) for v in KVALUES_IQ4NL)),
    Type.IQ4_XS: PackedLayout(Type.IQ4_XS, (Move(_U16, 0, 0, 1), Move(_U32, 8, 80, 32)), 80,
                              chunks=32, regroup="signed scales",
                              levels=tuple(int(v) for v in KVALUES_IQ4NL)),
    Type.Q2_K: PackedLayout(Type.Q2_K, (Move(_U16, 80, 0, 1), Move(_U16, 82, 16, 1),
                                        Move(_U8, 0, 32, 16), Move(_U32, 16, 160, 16)),
                            160, chunks=16),
    Type.Q4_K: PackedLayout(Type.Q4_K, (Move(_U16, 0, 0, 1), Move(_U16, 2, 16, 1),
                                        Move(_U32, 16, 160, 32)),
                            160, chunks=32, regroup="scales"),
    Type.Q5_K: PackedLayout(Type.Q5_K, (Move(_U16, 0, 0, 1), Move(_U16, 2, 16, 1),
                                        Move(_U32, 16, 160, 8), Move(_U32, 48, 416, 32)),
                            416, chunks=32, regroup="scales"),
    Type.Q6_K: PackedLayout(Type.Q6_K, (Move(_U16, 208, 0, 1), Move(_U8, 192, 16, 16),
                                        *_Q6_K_CODES),
                            144, offset=32),
}
# fmt: on


@functools.cache
def move_table(lay: PackedLayout) -> np.ndarray | None:
    """``lay``'s moves as the compiled repack reads them: a row ``(item, at, to, words,
    every)`` a move, ``item`` the bytes of its words (:mod:`.kernels._numba_pack`); None
    for a layout whose words would not be aligned as that kernel reads them (a block or
    a move at an odd byte, a 32-bit word of the repacked block off a multiple of 4)."""
    rows = [(np.dtype(m.dtype).itemsize, m.at, m.to, m.words, m.every) for m in lay.moves]
    if lay.regroup == "scales":  # Q4_K's 12 scale bytes, side by side where their 16 go
        rows.append((1, 4, 32, 12, 1))
    aligned = (
        lay.type.type_size % 2 == 0
        and lay.block % 4 == 0
        and all(item == 1 or (at % 2 == 0 and to % item == 0) for item, at, to, _, _ in rows)
    )
    if not aligned:
        return None
    table = np.array(rows, dtype=np.int64)
    table.flags.writeable = False
    return table


def layout_of(tensor: Tensor) -> PackedLayout | None:
    """How ``tensor`` is stored repacked, or None when it cannot be: a 2-d, contiguous
    matrix of a type in :data:`LAYOUTS` whose rows come in whole groups of eight."""
    lay = LAYOUTS.get(tensor.type)
    if lay is None or len(tensor.shape) != 2 or not tensor.is_contiguous:
        return None
    n_out, n_in = tensor.shape
    return lay if n_out % GROUP_ROWS == 0 and n_out > 0 and n_in > 0 else None


def packed_size(tensor: Tensor, lay: PackedLayout) -> int:
    """Bytes the repacked tensor takes."""
    return tensor.shape[0] // GROUP_ROWS * (tensor.shape[1] // lay.type.block_size) * lay.block

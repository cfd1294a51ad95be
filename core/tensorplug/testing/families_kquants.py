"""Conformance cases for the K-quant weight types (Q2_K … Q6_K).

A K-quant row is made of 256-element super-blocks, so these cases use rows of 256 and
512 where the 32-block families use 64. They cover what a downloaded ``Q4_K_M`` model
asks of a backend: quantized ``mul_mat`` at decode (1 token) and prompt batch sizes,
``mul_mat_id`` for mixture-of-experts files, ``get_rows`` for the embedding table
(Gemma 3 stores it in Q6_K or Q8_0), and ``cpy``/``set_rows`` into a K-quant cache or
tensor (ggml quantizes f32 rows with its reference quantizer).

Q4_K and Q6_K — the two types of a ``Q4_K_M`` file — are in the quick subset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from ..opcodes import Op
from ..types import Type
from .cases import Case
from .families_copy import cpy_build, get_rows_build, set_rows_build
from .families_moe import mmid_build
from .families_nn import MUL_MAT_BATCHES, mm_build
from .operands import leaf, make, strided

__all__ = ["FAMILIES", "K_QUANT_TYPES"]

K_QUANT_TYPES = (Type.Q2_K, Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K)
_QUICK = (Type.Q4_K, Type.Q6_K)


def _mul_mat() -> Iterator[Case]:
    f32 = Type.F32
    for (m, k), first in (((17, 256), True), ((33, 512), False)):
        for t in K_QUANT_TYPES:
            for n in MUL_MAT_BATCHES:
                build = partial(mm_build, leaf, t, (m, k), leaf, f32, (n, k))
                quick = first and t in _QUICK and n in (1, 7)
                yield make(Op.MUL_MAT, build, quick, type_a=t, type_b=f32, a=(m, k), b=(n, k))
    for t in _QUICK:  # batched heads and a strided activation
        build = partial(mm_build, leaf, t, (2, 8, 256), leaf, f32, (2, 5, 256))
        yield make(Op.MUL_MAT, build, False, type_a=t, type_b=f32, a=(2, 8, 256), b=(2, 5, 256))
        build = partial(mm_build, leaf, t, (8, 256), strided, f32, (3, 256))
        yield make(Op.MUL_MAT, build, False, type_a=t, type_b=f32, a=(8, 256), b=(3, 256),
                   b_layout="strided")  # fmt: skip


def _mul_mat_id() -> Iterator[Case]:
    for t in K_QUANT_TYPES:
        build = partial(mmid_build, t, Type.F32, 4, 16, 256, 5, 2, 1, leaf)
        yield make(Op.MUL_MAT_ID, build, t in _QUICK, type_a=t, type_b=Type.F32, n_expert=4,
                   a=[16, 256], tokens=5, used=2, b_rows=1)  # fmt: skip


def _rows_and_copies() -> Iterator[Case]:
    for t in K_QUANT_TYPES:
        quick = t in _QUICK
        build = partial(get_rows_build, leaf, t, (6, 256), (5,))
        yield make(Op.GET_ROWS, build, quick, type=t, shape=[6, 256], rows=[5])
        build = partial(set_rows_build, t, (6, 256), leaf, (2, 256), Type.I32, (2,))
        yield make(Op.SET_ROWS, build, quick, type=t, idx=Type.I32, shape=[6, 256], rows=[2])
        for src, dst in ((Type.F32, t), (t, Type.F32), (t, t)):
            build = partial(cpy_build, leaf, src, (2, 512), leaf, dst, (4, 256))
            yield make(Op.CPY, build, quick and src == Type.F32, type_src=src, type_dst=dst,
                       shape=[2, 512], dst=[4, 256])  # fmt: skip


FAMILIES: list[Callable[[], Iterator[Case]]] = [_mul_mat, _mul_mat_id, _rows_and_copies]

"""Conformance cases for the 4-bit non-linear weight types IQ4_NL and IQ4_XS.

After the K-quants these are the types people download most (``IQ4_XS`` files; IQ4_NL
tensors inside other mixes). A backend claiming them meets what such a model asks of
it: quantized ``mul_mat`` at decode (1 token) and prompt batch sizes, ``mul_mat_id``
for mixture-of-experts files, ``get_rows`` for an embedding table stored in the type,
and copies to float (dequantization alone). Rows are 256 and 512 wide, whole IQ4_XS
super-blocks; IQ4_NL's 32-value blocks also get a row of 96, which no super-block fits.

Copies *into* these types are left out on purpose: ggml's CPU backend quantizes copied
rows into IQ4_NL with a quicker encoder (``quantize_row_iq4_nl_ref``, no scale search)
than the one model files are written with, so two correct backends may differ there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from ..iquants import IQ4_TYPES
from ..opcodes import Op
from ..types import Type
from .cases import Case
from .families_copy import cpy_build, get_rows_build
from .families_moe import mmid_build
from .families_nn import MUL_MAT_BATCHES, mm_build
from .operands import leaf, make, strided

__all__ = ["FAMILIES"]


def _mul_mat() -> Iterator[Case]:
    f32 = Type.F32
    for (m, k), first in (((17, 256), True), ((33, 512), False)):
        for t in IQ4_TYPES:
            for n in MUL_MAT_BATCHES:
                build = partial(mm_build, leaf, t, (m, k), leaf, f32, (n, k))
                quick = first and n in (1, 7)
                yield make(Op.MUL_MAT, build, quick, type_a=t, type_b=f32, a=(m, k), b=(n, k))
    build = partial(mm_build, leaf, Type.IQ4_NL, (9, 96), leaf, f32, (3, 96))
    yield make(Op.MUL_MAT, build, True, type_a=Type.IQ4_NL, type_b=f32, a=(9, 96), b=(3, 96))
    for t in IQ4_TYPES:  # batched heads and a strided activation
        build = partial(mm_build, leaf, t, (2, 8, 256), leaf, f32, (2, 5, 256))
        yield make(Op.MUL_MAT, build, False, type_a=t, type_b=f32, a=(2, 8, 256), b=(2, 5, 256))
        build = partial(mm_build, leaf, t, (8, 256), strided, f32, (3, 256))
        yield make(Op.MUL_MAT, build, False, type_a=t, type_b=f32, a=(8, 256), b=(3, 256),
                   b_layout="strided")  # fmt: skip


def _mul_mat_id() -> Iterator[Case]:
    for t in IQ4_TYPES:
        build = partial(mmid_build, t, Type.F32, 4, 16, 256, 5, 2, 1, leaf)
        yield make(Op.MUL_MAT_ID, build, False, type_a=t, type_b=Type.F32, n_expert=4,
                   a=[16, 256], tokens=5, used=2, b_rows=1)  # fmt: skip


def _rows_and_copies() -> Iterator[Case]:
    for t in IQ4_TYPES:
        build = partial(get_rows_build, leaf, t, (6, 256), (5,))
        yield make(Op.GET_ROWS, build, True, type=t, shape=[6, 256], rows=[5])
        build = partial(cpy_build, leaf, t, (2, 512), leaf, Type.F32, (4, 256))
        yield make(Op.CPY, build, False, type_src=t, type_dst=Type.F32, shape=[2, 512],
                   dst=[4, 256])  # fmt: skip


FAMILIES: list[Callable[[], Iterator[Case]]] = [_mul_mat, _mul_mat_id, _rows_and_copies]

"""Catalogue families for copies, conversions, views, gathers, scatters and joins.

Includes the in-place writes: ``cpy`` into rows in the middle of a KV-cache-like tensor
and ``set_rows``, both checked for writes outside their destination by the comparison.
View ops compute nothing themselves, so they are checked through the copy that reads them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from functools import partial

from .. import ops
from ..opcodes import Op
from ..tensor import Tensor
from ..types import Type
from .cases import Case, Inputs, indices
from .operands import FLOAT_TYPES, QUANT_TYPES, Layout, Shape, leaf, make, strided, transposed

__all__ = ["FAMILIES"]


# -- copies and conversions ------------------------------------------------------------------------


def cpy_build(
    a: Layout, ta: Type, shape: Shape, b: Layout, tb: Type, bshape: Shape, ins: Inputs
) -> Tensor:
    return ops.cpy(a(ins, ta, shape), b(ins, tb, bshape))


def _cpy_into_rows(t: Type, ins: Inputs) -> Tensor:
    """In place: write 3 rows into the middle of a KV-cache-like tensor."""
    cache = ins.new(t, (8, 64))
    rows = ops.view(cache, (3, 64), cache.strides, 2 * cache.strides[0])
    return ops.cpy(ins.new(Type.F32, (3, 64)), rows)


def _cpy() -> Iterator[Case]:
    for src in (*FLOAT_TYPES, *QUANT_TYPES):
        for dst in (*FLOAT_TYPES, *QUANT_TYPES):
            # conversions ops.cpy accepts: float <-> float, float -> quant, quant -> f32, same
            if src != dst and src.is_quantized and dst != Type.F32:
                continue
            quick = Type.F32 in (src, dst) or src == dst
            build = partial(cpy_build, leaf, src, (4, 64), leaf, dst, (2, 128))
            yield make(
                Op.CPY, build, quick, type_src=src, type_dst=dst, shape=[4, 64], dst=[2, 128]
            )
    for dst in (Type.F32, Type.F16, Type.Q8_0, Type.Q4_0):
        # a transposed source: element k in C order of the view, not of memory
        build = partial(cpy_build, transposed, Type.F32, (3, 64), leaf, dst, (3, 64))
        yield make(
            Op.CPY, build, True, type_src=Type.F32, type_dst=dst, shape=[3, 64], a="transposed"
        )
    for t in (Type.I8, Type.I16, Type.I32, Type.I64):
        build = partial(cpy_build, transposed, t, (4, 9), leaf, t, (36,))
        yield make(
            Op.CPY,
            build,
            t == Type.I32,
            type_src=t,
            type_dst=t,
            shape=[4, 9],
            a="transposed",
            dst=[36],
        )
    for t in FLOAT_TYPES:
        build = partial(cpy_build, leaf, Type.F32, (5, 6), transposed, t, (5, 6))
        yield make(
            Op.CPY,
            build,
            t == Type.F32,
            type_src=Type.F32,
            type_dst=t,
            shape=[5, 6],
            b="transposed",
        )
    for t in (Type.F32, Type.F16, Type.Q8_0, Type.Q4_0):
        yield make(
            Op.CPY,
            partial(_cpy_into_rows, t),
            True,
            type_src=Type.F32,
            type_dst=t,
            shape=[3, 64],
            dst="rows[2:5]_of_[8,64]",
        )


def _dup_build(a: Layout, t: Type, shape: Shape, ins: Inputs) -> Tensor:
    return ops.dup(a(ins, t, shape))


def _cont_build(a: Layout, t: Type, shape: Shape, to: Shape | None, ins: Inputs) -> Tensor:
    return ops.cont(a(ins, t, shape), to)


def _dup_cont() -> Iterator[Case]:
    for t in (*FLOAT_TYPES, Type.Q8_0, Type.I8, Type.I16, Type.I32, Type.I64):
        yield make(
            Op.DUP,
            partial(_dup_build, leaf, t, (3, 4, 64)),
            not t.is_integer or t == Type.I32,
            type=t,
            shape=[3, 4, 64],
        )
        if not t.is_quantized:
            yield make(
                Op.DUP,
                partial(_dup_build, transposed, t, (7, 9)),
                t == Type.F32,
                type=t,
                shape=[7, 9],
                a="transposed",
            )
    for t in (*FLOAT_TYPES, Type.Q4_0):
        yield make(
            Op.CONT,
            partial(_cont_build, leaf, t, (2, 3, 64), (6, 64)),
            True,
            type=t,
            shape=[2, 3, 64],
            to=[6, 64],
        )
        yield make(
            Op.CONT,
            partial(_cont_build, strided, t, (5, 32), None),
            t == Type.F32,
            type=t,
            shape=[5, 32],
            a="strided",
        )


# -- views: checked through the copy that reads them -----------------------------------------------


def _permute_build(t: Type, shape: Shape, axes: Shape, ins: Inputs) -> Tensor:
    return ops.cont(ops.permute(ins.new(t, shape), axes))


def _transpose_build(t: Type, shape: Shape, ins: Inputs) -> Tensor:
    return ops.cont(ops.transpose(ins.new(t, shape)))


def _reshape_build(t: Type, shape: Shape, to: Shape, ins: Inputs) -> Tensor:
    return ops.add(ops.reshape(ins.new(t, shape), to), ins.new(t, to[-2:]))


def _view_build(t: Type, ins: Inputs) -> Tensor:
    """Every other row of planes 1..3 of a (6, 8, 10) tensor: offset and strides."""
    base = ins.new(t, (6, 8, 10))
    sz = t.type_size
    return ops.cont(ops.view(base, (3, 4, 10), (80 * sz, 20 * sz, sz), 80 * sz))


def _views() -> Iterator[Case]:
    shape = (2, 3, 4, 5)
    for t in (*FLOAT_TYPES, Type.I32):
        for k, axes in enumerate(itertools.permutations(range(4))):
            quick = k in (5, 17, 23) and t in (Type.F32, Type.F16)
            yield make(
                Op.PERMUTE,
                partial(_permute_build, t, shape, axes),
                quick,
                type=t,
                shape=shape,
                axes=axes,
            )
    yield make(
        Op.PERMUTE,
        partial(_permute_build, Type.Q8_0, (2, 3, 64), (1, 0, 2)),
        True,
        type=Type.Q8_0,
        shape=[2, 3, 64],
        axes=[1, 0, 2],
    )
    for t in FLOAT_TYPES:
        quick = t != Type.BF16
        yield make(
            Op.TRANSPOSE, partial(_transpose_build, t, (3, 7, 9)), quick, type=t, shape=[3, 7, 9]
        )
        yield make(
            Op.RESHAPE,
            partial(_reshape_build, t, (6, 10), (3, 4, 5)),
            quick,
            type=t,
            shape=[6, 10],
            to=[3, 4, 5],
        )
        yield make(
            Op.VIEW,
            partial(_view_build, t),
            quick,
            type=t,
            shape=[3, 4, 10],
            base=[6, 8, 10],
            offset="plane_1",
            rows="every_other",
        )


# -- gathers, scatters, joins -------------------------------------------------------------------


def get_rows_build(a: Layout, t: Type, shape: Shape, rows: Shape, ins: Inputs) -> Tensor:
    idx = ins.new(Type.I32, rows, indices(shape[-2]))  # repeats allowed
    return ops.get_rows(a(ins, t, shape), idx)


def _get_rows() -> Iterator[Case]:
    for t in (*FLOAT_TYPES, *QUANT_TYPES, Type.I32):
        yield make(
            Op.GET_ROWS,
            partial(get_rows_build, leaf, t, (10, 64), (7,)),
            True,
            type=t,
            shape=[10, 64],
            rows=[7],
        )
        yield make(
            Op.GET_ROWS,
            partial(get_rows_build, leaf, t, (2, 3, 10, 32), (2, 3, 4)),
            t in (Type.F32, Type.Q4_0),
            type=t,
            shape=[2, 3, 10, 32],
            rows=[2, 3, 4],
        )
    yield make(
        Op.GET_ROWS,
        partial(get_rows_build, strided, Type.F32, (9, 33), (5,)),
        True,
        type=Type.F32,
        shape=[9, 33],
        a="strided",
        rows=[5],
    )


def set_rows_build(
    t: Type, shape: Shape, b: Layout, bshape: Shape, it: Type, rows: Shape, ins: Inputs
) -> Tensor:
    # unique per destination: with a repeated row the result would depend on write order
    idx = ins.new(it, rows, indices(shape[-2], unique=True))
    return ops.set_rows(ins.new(t, shape), b(ins, Type.F32, bshape), idx)


def _set_rows() -> Iterator[Case]:
    for t in (*FLOAT_TYPES, *QUANT_TYPES):
        for it in (Type.I32, Type.I64):
            build = partial(set_rows_build, t, (10, 64), leaf, (3, 64), it, (3,))
            yield make(
                Op.SET_ROWS,
                build,
                it == Type.I32 or t == Type.F32,
                type=t,
                idx=it,
                shape=[10, 64],
                rows=[3],
            )
        build = partial(set_rows_build, t, (2, 3, 9, 32), leaf, (2, 3, 4, 32), Type.I64, (3, 4))
        yield make(
            Op.SET_ROWS,
            build,
            t in (Type.F16, Type.Q8_0),
            type=t,
            idx=Type.I64,
            shape=[2, 3, 9, 32],
            rows=[3, 4],
        )
    build = partial(set_rows_build, Type.F32, (8, 33), strided, (4, 33), Type.I32, (4,))
    yield make(Op.SET_ROWS, build, True, type=Type.F32, shape=[8, 33], b="strided", rows=[4])


def _concat_build(
    a: Layout, t: Type, shape: Shape, bshape: Shape, axis: int, ins: Inputs
) -> Tensor:
    return ops.concat(a(ins, t, shape), ins.new(t, bshape), axis)


def _concat() -> Iterator[Case]:
    shape = (2, 3, 4, 5)
    for t in (*FLOAT_TYPES, Type.I32):
        for axis in range(4):
            bshape = tuple(d + 2 if i == axis else d for i, d in enumerate(shape))
            yield make(
                Op.CONCAT,
                partial(_concat_build, leaf, t, shape, bshape, axis),
                t == Type.F32 or axis == 3,
                type=t,
                shape=shape,
                b=bshape,
                axis=axis,
            )
        yield make(
            Op.CONCAT,
            partial(_concat_build, transposed, t, (3, 6, 5), (3, 2, 5), 1),
            t == Type.F16,
            type=t,
            shape=[3, 6, 5],
            a="transposed",
            axis=1,
        )


FAMILIES: list[Callable[[], Iterator[Case]]] = [
    _cpy,
    _dup_cont,
    _views,
    _get_rows,
    _set_rows,
    _concat,
]

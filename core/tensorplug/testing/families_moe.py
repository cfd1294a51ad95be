"""Conformance cases for the shape-changing and mixture-of-experts ops: repeat, pad and
mul_mat_id (the expert-routed matrix product), each with a non-contiguous operand.

mul_mat_id's ids are drawn at random per token from ``[0, n_expert)`` without repeats
within a token (as a router's top-k gives them), so some experts are chosen by several
tokens and some by none: a kernel that groups rows by expert is exercised both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from .. import ops
from ..opcodes import Op
from ..tensor import Tensor
from ..types import Type
from .cases import Case, Inputs, indices
from .operands import FLOAT_TYPES, QUANT_TYPES, Layout, Shape, leaf, make, permuted, strided

__all__ = ["FAMILIES"]


def _repeat_build(a: Layout, t: Type, shape: Shape, to: Shape, ins: Inputs) -> Tensor:
    return ops.repeat(a(ins, t, shape), to)


def _repeat() -> Iterator[Case]:
    for t in (*FLOAT_TYPES, Type.I32):
        for shape, to in (((3, 5), (2, 6, 10)), ((1, 4), (3, 4)), ((2, 1, 3), (2, 4, 3, 9))):
            yield make(
                Op.REPEAT,
                partial(_repeat_build, leaf, t, shape, to),
                t == Type.F32 or shape == (3, 5),
                type=t,
                shape=shape,
                to=to,
            )
        yield make(
            Op.REPEAT,
            partial(_repeat_build, permuted, t, (4, 2, 3), (2, 4, 4, 6)),
            t == Type.F32,
            type=t,
            shape=[4, 2, 3],
            to=[2, 4, 4, 6],
            a="permuted",
        )


def _pad_build(a: Layout, t: Type, shape: Shape, after: Shape, ins: Inputs) -> Tensor:
    return ops.pad(a(ins, t, shape), after)


def _pad() -> Iterator[Case]:
    for t in FLOAT_TYPES:
        for shape, after in (((3, 5, 7), (1, 0, 3)), ((33,), (31,)), ((2, 3, 4, 5), (1, 1, 1, 1))):
            yield make(
                Op.PAD,
                partial(_pad_build, leaf, t, shape, after),
                t == Type.F32 or shape == (3, 5, 7),
                type=t,
                shape=shape,
                after=after,
            )
        yield make(
            Op.PAD,
            partial(_pad_build, strided, t, (4, 9), (2, 5)),
            t == Type.F32,
            type=t,
            shape=[4, 9],
            after=[2, 5],
            a="strided",
        )


def mmid_build(
    ta: Type,
    tb: Type,
    n_expert: int,
    n_out: int,
    n_in: int,
    n_tokens: int,
    n_used: int,
    n_b: int,
    b_layout: Layout,
    ins: Inputs,
) -> Tensor:
    a = ins.new(ta, (n_expert, n_out, n_in))
    b = b_layout(ins, tb, (n_tokens, n_b, n_in))
    ids = ins.new(Type.I32, (n_tokens, n_used), indices(n_expert, unique=True))
    return ops.mul_mat_id(a, b, ids)


def _mul_mat_id() -> Iterator[Case]:
    # (n_expert, n_out, n_in, n_tokens, n_used, n_b): mixtral's shape of routing, small
    geometries = ((8, 16, 64, 5, 2, 1), (4, 33, 32, 7, 2, 2), (6, 24, 96, 1, 3, 1))
    for ta in (*FLOAT_TYPES, *QUANT_TYPES):
        for i, (ne, no, ni, nt, nu, nb) in enumerate(geometries):
            yield make(
                Op.MUL_MAT_ID,
                partial(mmid_build, ta, Type.F32, ne, no, ni, nt, nu, nb, leaf),
                ta in (Type.F32, Type.F16, Type.Q4_0, Type.Q8_0) and i < 2,
                type_a=ta,
                type_b=Type.F32,
                n_expert=ne,
                a=[no, ni],
                tokens=nt,
                used=nu,
                b_rows=nb,
            )
    # every expert chosen by every token, odd sizes (n_in 40 allows float weights only)
    yield make(Op.MUL_MAT_ID, partial(mmid_build, Type.F32, Type.F32, 4, 33, 40, 5, 4, 4, leaf),
               True, type_a=Type.F32, type_b=Type.F32, n_expert=4, a=[33, 40], tokens=5,
               used=4, b_rows=4)  # fmt: skip
    build = partial(mmid_build, Type.Q8_0, Type.F32, 4, 16, 64, 6, 2, 2, strided)
    yield make(Op.MUL_MAT_ID, build, True, type_a=Type.Q8_0, type_b=Type.F32, n_expert=4,
               a=[16, 64], tokens=6, used=2, b_rows=2, b="strided")  # fmt: skip
    for tb in (Type.F16, Type.F32):
        yield make(
            Op.MUL_MAT_ID,
            partial(mmid_build, Type.F32, tb, 4, 8, 32, 6, 2, 2, strided),
            tb == Type.F32,
            type_a=Type.F32,
            type_b=tb,
            n_expert=4,
            a=[8, 32],
            tokens=6,
            used=2,
            b_rows=2,
            b="strided",
        )


FAMILIES: list[Callable[[], Iterator[Case]]] = [_repeat, _pad, _mul_mat_id]

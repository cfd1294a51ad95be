"""Catalogue families for elementwise math: binary ops with broadcasting, scale, unary
and gated (GLU) functions with ggml's special-value rules, norms, reductions, top-k and
clamp, each on contiguous and non-contiguous operands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from .. import ops
from ..opcodes import GluOp, Op, SortOrder, UnaryOp
from ..tensor import Tensor
from ..types import Type
from .cases import Case, InitFn, Inputs, distinct, indices, special, uniform
from .operands import (
    FLOAT_TYPES,
    LAYOUTS,
    Layout,
    Shape,
    leaf,
    make,
    permuted,
    strided,
    transposed,
)

__all__ = ["FAMILIES"]

# -- elementwise ---------------------------------------------------------------------------------

_BINARY = {Op.ADD: ops.add, Op.SUB: ops.sub, Op.MUL: ops.mul, Op.DIV: ops.div}
_BROADCASTS: list[tuple[Shape, Shape]] = [
    ((2, 3, 5, 10), (2, 3, 5, 10)),
    ((2, 3, 5, 10), (1, 3, 1, 10)),
    ((2, 3, 5, 10), (10,)),
    ((7, 33), (7, 1)),
    ((4, 3, 17), (1, 1, 17)),
    ((1,), (1,)),
    # ggml's can_repeat: b tiles onto a (ggml a[4,6] + b[2,6] is numpy (6, 4) + (6, 2))
    ((6, 4), (6, 2)),
    ((2, 3, 4, 6), (1, 3, 2, 3)),
]


def _binary_build(
    fn: Callable[[Tensor, Tensor], Tensor],
    a: Layout,
    ta: Type,
    shape: Shape,
    b: Layout,
    tb: Type,
    bshape: Shape,
    b_init: InitFn | None,
    ins: Inputs,
) -> Tensor:
    return fn(a(ins, ta, shape), b(ins, tb, bshape, b_init))


def _binary() -> Iterator[Case]:
    for op, fn in _BINARY.items():
        # a divisor bounded away from 0 keeps quotients (and their rounding) tame
        b_init = uniform(0.5, 2.0) if op is Op.DIV else None
        for t in FLOAT_TYPES:
            for i, (shape, bshape) in enumerate(_BROADCASTS):
                build = partial(_binary_build, fn, leaf, t, shape, leaf, t, bshape, b_init)
                quick = t == Type.F32 or i < 2
                yield make(op, build, quick, type=t, shape=shape, b=bshape)
            build = partial(_binary_build, fn, transposed, t, (5, 33), strided, t, (5, 33), b_init)
            yield make(op, build, t == Type.F32, type=t, shape=[5, 33], a="transposed", b="strided")
        # b repeated onto a (ggml's can_repeat): extents that divide a's, not only 1s
        for shape, bshape in (((4, 6), (2, 6)), ((6, 4, 9), (3, 2, 9)), ((2, 3, 8), (3, 4))):
            build = partial(_binary_build, fn, leaf, Type.F32, shape, leaf, Type.F32, bshape,
                            b_init)  # fmt: skip
            yield make(op, build, True, type=Type.F32, shape=shape, b=bshape, b_is="tiled")
        build = partial(
            _binary_build, fn, leaf, Type.F32, (3, 5, 16), leaf, Type.F16, (5, 16), b_init
        )
        yield make(op, build, False, type_a=Type.F32, type_b=Type.F16, shape=[3, 5, 16])


def _scale_build(a: Layout, t: Type, shape: Shape, s: float, bias: float, ins: Inputs) -> Tensor:
    return ops.scale(a(ins, t, shape), s, bias)


def _scale() -> Iterator[Case]:
    for t in FLOAT_TYPES:
        for s, bias in ((0.25, 0.0), (-1.5, 0.5)):
            yield make(
                Op.SCALE,
                partial(_scale_build, leaf, t, (3, 5, 33), s, bias),
                t == Type.F32 or bias == 0.0,
                type=t,
                shape=[3, 5, 33],
                s=s,
                bias=bias,
            )
        yield make(
            Op.SCALE,
            partial(_scale_build, transposed, t, (6, 17), 2.0, -1.0),
            t == Type.F32,
            type=t,
            shape=[6, 17],
            a="transposed",
            s=2.0,
            bias=-1.0,
        )


def _unary_build(
    fn: UnaryOp, a: Layout, t: Type, shape: Shape, ins: Inputs, init: InitFn | None = None
) -> Tensor:
    # wide enough to reach the tails of tanh, sigmoid and gelu
    return ops.unary(a(ins, t, shape, init or uniform(-4.0, 4.0)), fn)


def _huge(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """Magnitudes from 1 to 1e30 of both signs: tails, ggml's gelu clamps at ±10, and
    values whose squares overflow float32 (the formulas must still give no NaN)."""
    mag = 10.0 ** rng.uniform(0, 30, size=t.shape)
    return np.asarray(mag * rng.choice([-1.0, 1.0], size=t.shape))


def _unary_special_build(fn: UnaryOp, t: Type, ins: Inputs) -> Tensor:
    return ops.unary(leaf(ins, t, (3, 19), special()), fn)


def _unary() -> Iterator[Case]:
    for fn in UnaryOp:
        label, tags = fn.value.upper(), {fn.value}
        # ±inf, NaN, huge and clamp-edge inputs: each result as ggml gives it
        yield make(
            Op.UNARY,
            partial(_unary_special_build, fn, Type.F32),
            True,
            label,
            tags={*tags, "special_values"},
            type=Type.F32,
            values="special",
        )
        for t in FLOAT_TYPES:
            yield make(
                Op.UNARY,
                partial(_unary_build, fn, leaf, t, (2, 5, 33)),
                True,
                label,
                tags=tags,
                type=t,
                shape=[2, 5, 33],
            )
            yield make(
                Op.UNARY,
                partial(_unary_build, fn, permuted, t, (7, 2, 5)),
                t == Type.F32,
                label,
                tags=tags,
                type=t,
                shape=[7, 2, 5],
                a="permuted",
            )
        if fn is not UnaryOp.EXP:  # e^1e30 is inf, which no error measure can score
            yield make(
                Op.UNARY,
                partial(_unary_build, fn, leaf, Type.F32, (4, 33), init=_huge),
                True,
                label,
                tags=tags,
                type=Type.F32,
                shape=[4, 33],
                values="huge",
            )


def _glu_build(
    fn: GluOp, t: Type, shape: Shape, split: bool, swapped: bool, a: Layout, b: Layout,
    ins: Inputs,
) -> Tensor:  # fmt: skip
    init = uniform(-4.0, 4.0)
    if split:
        return ops.glu(a(ins, t, (*shape[:-1], 2 * shape[-1]), init), fn=fn, swapped=swapped)
    return ops.glu(a(ins, t, shape, init), b(ins, t, shape), fn, swapped=swapped)


def _glu() -> Iterator[Case]:
    for fn in GluOp:
        label, tags = fn.value.upper(), {fn.value}
        main = fn is GluOp.SWIGLU  # llama's: every layout; the others a quick subset
        for t in FLOAT_TYPES:
            for swapped in (False, True):
                build = partial(_glu_build, fn, t, (3, 4, 33), True, swapped, leaf, leaf)
                yield make(
                    Op.GLU,
                    build,
                    t == Type.F32 or (main and not swapped),
                    label,
                    tags=tags,
                    type=t,
                    shape=[3, 4, 33],
                    split=True,
                    swapped=swapped,
                )
            yield make(
                Op.GLU,
                partial(_glu_build, fn, t, (5, 33), False, False, leaf, leaf),
                main or t == Type.F32,
                label,
                tags=tags,
                type=t,
                shape=[5, 33],
                split=False,
            )
            build = partial(_glu_build, fn, t, (4, 17), False, False, strided, transposed)
            yield make(
                Op.GLU,
                build,
                main and t == Type.F32,
                label,
                tags=tags,
                type=t,
                shape=[4, 17],
                split=False,
                a="strided",
                b="transposed",
            )


def _norm_build(
    fn: Callable[[Tensor, float], Tensor],
    a: Layout,
    t: Type,
    shape: Shape,
    eps: float,
    ins: Inputs,
    init: InitFn | None = None,
) -> Tensor:
    return fn(a(ins, t, shape, init), eps)


def _norms() -> Iterator[Case]:
    for op, fn in ((Op.NORM, ops.norm), (Op.RMS_NORM, ops.rms_norm)):
        for t in FLOAT_TYPES:
            for shape, eps in (((4, 64), 1e-5), ((3, 2, 33), 1e-6), ((1, 1), 1e-5)):
                yield make(
                    op,
                    partial(_norm_build, fn, leaf, t, shape, eps),
                    t == Type.F32 or shape == (4, 64),
                    type=t,
                    shape=shape,
                    eps=eps,
                )
            for layout, quick in (("strided", t == Type.F32), ("transposed", False)):
                yield make(
                    op,
                    partial(_norm_build, fn, LAYOUTS[layout], t, (6, 40), 1e-5),
                    quick,
                    type=t,
                    shape=[6, 40],
                    a=layout,
                    eps=1e-5,
                )
            # rows with a mean square near eps: a kernel that drops or misplaces eps fails
            # here (unit-variance data makes eps invisible)
            small = uniform(-0.01, 0.01)
            yield make(
                op,
                partial(_norm_build, fn, leaf, t, (4, 48), 3e-5, init=small),
                t == Type.F32,
                type=t,
                shape=[4, 48],
                eps=3e-5,
                data="small",
            )


# -- reductions ----------------------------------------------------------------------------------


def _sum_rows_build(a: Layout, t: Type, shape: Shape, ins: Inputs) -> Tensor:
    return ops.sum_rows(a(ins, t, shape))


def _argmax_build(a: Layout, shape: Shape, init: InitFn, ins: Inputs) -> Tensor:
    return ops.argmax(a(ins, Type.F32, shape, init))


def _argsort_build(a: Layout, shape: Shape, init: InitFn, order: SortOrder, ins: Inputs) -> Tensor:
    return ops.argsort(a(ins, Type.F32, shape, init), order)


def _reductions() -> Iterator[Case]:
    for t in FLOAT_TYPES:
        for shape in ((3, 33), (2, 3, 4, 1), (1,), (2, 300)):
            yield make(
                Op.SUM_ROWS,
                partial(_sum_rows_build, leaf, t, shape),
                t == Type.F32 or shape == (3, 33),
                type=t,
                shape=shape,
            )
        yield make(
            Op.SUM_ROWS,
            partial(_sum_rows_build, transposed, t, (4, 9)),
            t == Type.F32,
            type=t,
            shape=[4, 9],
            a="transposed",
        )
    for shape in ((5, 33), (17,), (3, 1000)):
        yield make(
            Op.ARGMAX,
            partial(_argmax_build, leaf, shape, distinct()),
            True,
            type=Type.F32,
            shape=shape,
        )
    yield make(
        Op.ARGMAX,
        partial(_argmax_build, transposed, (4, 21), uniform()),
        True,
        type=Type.F32,
        shape=[4, 21],
        a="transposed",
    )
    # infinities and NaNs: a NaN restarts ggml's search; an all-NaN row gives 0
    yield make(
        Op.ARGMAX,
        partial(_argmax_build, leaf, (9, 7), special()),
        True,
        type=Type.F32,
        shape=[9, 7],
        values="special",
    )
    # small integers: many tied maxima, the last one wins (ggml's CPU loop)
    yield make(
        Op.ARGMAX,
        partial(_argmax_build, leaf, (6, 40), indices(3)),
        True,
        type=Type.F32,
        shape=[6, 40],
        values="ties",
    )
    for order in SortOrder:
        for shape in ((3, 16), (2, 33), (4, 1), (2, 300)):
            yield make(
                Op.ARGSORT,
                partial(_argsort_build, leaf, shape, distinct(), order),
                shape != (2, 300),
                type=Type.F32,
                shape=shape,
                order=order,
            )
        # ties: the contract says stable, so equal values keep their order
        yield make(
            Op.ARGSORT,
            partial(_argsort_build, leaf, (5, 24), indices(4), order),
            True,
            type=Type.F32,
            shape=[5, 24],
            order=order,
            values="ties",
        )
        yield make(
            Op.ARGSORT,
            partial(_argsort_build, transposed, (3, 20), uniform(), order),
            False,
            type=Type.F32,
            shape=[3, 20],
            order=order,
            a="transposed",
        )


def _top_k_build(a: Layout, shape: Shape, k: int, init: InitFn, ins: Inputs) -> Tensor:
    return ops.top_k(a(ins, Type.F32, shape, init), k)


def _top_k() -> Iterator[Case]:
    for shape, k in (((3, 16), 4), ((2, 33), 1), ((2, 300), 300), ((5, 100), 7)):
        yield make(
            Op.TOP_K,
            partial(_top_k_build, leaf, shape, k, distinct()),
            shape != (2, 300),
            type=Type.F32,
            shape=shape,
            k=k,
        )
    # ties: largest first, equal values by lower index
    yield make(
        Op.TOP_K,
        partial(_top_k_build, leaf, (5, 24), 6, indices(4)),
        True,
        type=Type.F32,
        shape=[5, 24],
        k=6,
        values="ties",
    )
    yield make(
        Op.TOP_K,
        partial(_top_k_build, transposed, (4, 21), 3, uniform()),
        True,
        type=Type.F32,
        shape=[4, 21],
        k=3,
        a="transposed",
    )


def _clamp_build(a: Layout, t: Type, shape: Shape, lo: float, hi: float, ins: Inputs) -> Tensor:
    return ops.clamp(a(ins, t, shape, uniform(-3, 3)), lo, hi)


def _clamp() -> Iterator[Case]:
    for t in FLOAT_TYPES:
        for lo, hi in ((-1.0, 0.5), (0.0, float("inf"))):
            yield make(
                Op.CLAMP,
                partial(_clamp_build, leaf, t, (3, 5, 33), lo, hi),
                t == Type.F32 or hi == 0.5,
                type=t,
                shape=[3, 5, 33],
                min=lo,
                max=hi,
            )
        yield make(
            Op.CLAMP,
            partial(_clamp_build, permuted, t, (7, 2, 5), -0.5, 0.5),
            t == Type.F32,
            type=t,
            shape=[7, 2, 5],
            a="permuted",
            min=-0.5,
            max=0.5,
        )


FAMILIES: list[Callable[[], Iterator[Case]]] = [
    _binary,
    _scale,
    _unary,
    _glu,
    _norms,
    _reductions,
    _top_k,
    _clamp,
]

"""Ops that move or select data: copies and conversions, gathers and scatters by row,
joins, repeats, padding, row reductions, sorting and top-k."""

from __future__ import annotations

from collections.abc import Sequence

from ..opcodes import Op, SortOrder
from ..tensor import MAX_DIMS, Tensor
from ..types import Type
from ._build import (
    FLOAT_TYPES,
    INDEX_TYPES,
    WEIGHT_TYPES,
    OpParamError,
    TypeMismatchError,
    can_repeat,
    check_type,
    enum_member,
    fail,
    new_result,
    padded,
    tensor_arg,
)
from .views import view

# -- copies and conversions --------------------------------------------------------------------


def _convertible(src: Type, dst: Type) -> bool:
    if src == dst:
        return True
    both_quantized = src.is_quantized and dst.is_quantized
    return src in WEIGHT_TYPES and dst in WEIGHT_TYPES and not both_quantized


def cpy(a: Tensor, b: Tensor) -> Tensor:
    """Copy ``a``'s values into ``b``, converting to ``b``'s type; returns a view of ``b``.

    Element ``k`` of ``a`` in C order goes to element ``k`` of ``b`` in C order, so only
    the element counts must agree. Conversions: between float types, from a float type
    to a quantized one (rows are quantized as GGUF does) and back, or a type to itself.
    """
    if a.nelements != b.nelements:
        raise fail(
            "cpy", f"a {a.describe()} and b {b.describe()} must have the same number of elements"
        )
    if not _convertible(a.type, b.type):
        raise TypeMismatchError(f"cpy: cannot convert {a.describe()} to {b.type.name}")
    out = Tensor(b.type, b.shape, strides=b.strides, op=Op.CPY, src=(a, b), view_src=b)
    return out


def dup(a: Tensor) -> Tensor:
    """A contiguous copy of ``a`` with the same type and shape."""
    return new_result(a.type, a.shape, Op.DUP, (a,))


def cont(a: Tensor, shape: Sequence[int] | None = None) -> Tensor:
    """A contiguous copy of ``a`` (``ggml_cont``), optionally reshaped to ``shape``."""
    new_shape = a.shape if shape is None else tuple(shape)
    count = 1
    for d in new_shape:
        count *= d
    if count != a.nelements:
        raise fail("cont", f"cannot lay out {a.describe()} as shape {new_shape}")
    return new_result(a.type, new_shape, Op.CONT, (a,))


def get_rows(a: Tensor, rows: Tensor) -> Tensor:
    """Gather rows of ``a`` by index (``ggml_get_rows``), dequantizing them.

    ``a`` is ``(…, n_rows, n)`` of any type; ``rows`` is I32 ``(…, k)``, whose outer axes
    equal ``a``'s outer axes (those before ``n_rows``). ``out[…, j, :] = a[…, rows[…, j],
    :]``, shape ``rows.shape + (n,)``; F32 unless ``a`` is I32 (then I32).
    """
    check_type("get_rows", "rows", rows, {Type.I32})
    if a.ndim < 2:
        raise fail("get_rows", f"a {a.describe()} must be at least 2-d (…, n_rows, n)")
    if rows.ndim != a.ndim - 1 or rows.shape[:-1] != a.shape[:-2]:
        raise fail(
            "get_rows",
            f"rows {rows.describe()} must have shape (*{list(a.shape[:-2])}, k) to index "
            f"a {a.describe()}",
        )
    out_type = Type.I32 if a.type == Type.I32 else Type.F32
    return new_result(out_type, (*rows.shape, a.shape[-1]), Op.GET_ROWS, (a, rows))


def set_rows(a: Tensor, b: Tensor, rows: Tensor) -> Tensor:
    """Scatter rows of ``b`` into ``a`` (``ggml_set_rows``); returns a view of ``a``.

    ``a`` ``(…, n_rows, n)`` of a float or quantized type is written in place;
    ``b`` F32 ``(…, k, n)`` with the same outer axes as ``a``; ``rows`` I32 or I64
    ``(…, k)`` with outer axes 1 or equal to ``b``'s. ``a[…, rows[…, j], :] = b[…, j, :]``
    converted to ``a``'s type. This is how a KV cache is written.
    """
    check_type("set_rows", "b", b, {Type.F32})
    check_type("set_rows", "rows", rows, INDEX_TYPES)
    if not _convertible(Type.F32, a.type):
        raise TypeMismatchError(f"set_rows: cannot store F32 rows into {a.describe()}")
    if a.ndim < 2 or b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[-1] != a.shape[-1]:
        raise fail(
            "set_rows", f"b {b.describe()} must be (*{list(a.shape[:-2])}, k, {a.shape[-1]})"
        )
    pr, pb = padded(rows.shape, b.ndim - 1), padded(b.shape[:-1], b.ndim - 1)
    if (
        rows.ndim > b.ndim - 1
        or pr[-1] != pb[-1]
        or any(dr not in (1, db) for dr, db in zip(pr[:-1], pb[:-1], strict=True))
    ):
        raise fail(
            "set_rows", f"rows {rows.describe()} must be (…, {b.shape[-2]}) to index b's rows"
        )
    return Tensor(a.type, a.shape, strides=a.strides, op=Op.SET_ROWS, src=(a, b, rows), view_src=a)


def concat(a: Tensor, b: Tensor, axis: int) -> Tensor:
    """Join ``a`` and ``b`` (same type and rank) along ``axis``; other axes must match."""
    if a.type != b.type:
        raise TypeMismatchError(f"concat: {a.describe()} and {b.describe()} differ in type")
    if a.ndim != b.ndim:
        raise fail("concat", f"{a.describe()} and {b.describe()} differ in rank")
    if not -a.ndim <= axis < a.ndim:
        raise fail("concat", f"axis {axis} is out of range for {a.ndim}-d tensors")
    axis %= a.ndim
    if a.type.is_quantized:
        raise TypeMismatchError(f"concat: quantized tensors are not supported ({a.describe()})")
    for i, (da, db) in enumerate(zip(a.shape, b.shape, strict=True)):
        if i != axis and da != db:
            raise fail("concat", f"{a.describe()} and {b.describe()} differ outside axis {axis}")
    shape = list(a.shape)
    shape[axis] += b.shape[axis]
    return new_result(a.type, shape, Op.CONCAT, (a, b), {"axis": axis})


# -- reductions ----------------------------------------------------------------------------------


def sum_rows(a: Tensor) -> Tensor:
    """Sum of each row: shape ``(*a.shape[:-1], 1)``, same float type."""
    check_type("sum_rows", "a", a, FLOAT_TYPES)
    return new_result(a.type, (*a.shape[:-1], 1), Op.SUM_ROWS, (a,))


def argmax(a: Tensor) -> Tensor:
    """Index of the largest value of each row: I32 ``a.shape[:-1]``.

    As ggml's CPU backend (``ggml_vec_argmax_f32``): the **last** index on ties, and a NaN
    restarts the search at the next element (a trailing NaN is ignored; an all-NaN row
    gives 0). Every tensorplug backend and the conformance kit agree on this. A 1-d
    input gives shape ``(1,)``.
    """
    check_type("argmax", "a", a, {Type.F32})
    return new_result(Type.I32, a.shape[:-1] or (1,), Op.ARGMAX, (a,))


def argsort(a: Tensor, order: SortOrder | str = SortOrder.ASC) -> Tensor:
    """Per row, the indices that sort it; I32 with ``a``'s shape.

    The sort is stable in both orders: equal values keep their index order (the lower
    index first, in DESC order too). ggml leaves ties unspecified (its CPU uses
    ``std::sort``), so this is a stricter promise: results are reproducible and every
    backend must agree bit for bit, ties included.
    """
    check_type("argsort", "a", a, {Type.F32})
    return new_result(
        Type.I32,
        a.shape,
        Op.ARGSORT,
        (a,),
        {"order": enum_member("argsort", "order", SortOrder, order)},
    )


def top_k(a: Tensor, k: int) -> Tensor:
    """Per row, the indices of the ``k`` largest values: I32 ``(*a.shape[:-1], k)``
    (``ggml_top_k``).

    Ordered by value, largest first; equal values by index, lower first — exactly
    ``argsort(a, DESC)[..., :k]``. ggml's ``GGML_OP_TOP_K`` promises "no particular
    order" (its CPU even swaps the first two); this contract is stricter, so a result
    that is right here is right for ggml's users, and backends can be compared exactly.
    ``1 <= k <= a.shape[-1]``.
    """
    check_type("top_k", "a", a, {Type.F32})
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= a.shape[-1]:
        raise OpParamError(f"top_k: k must be an int in [1, {a.shape[-1]}], got {k!r}")
    return new_result(Type.I32, (*a.shape[:-1], k), Op.TOP_K, (a,), {"k": k})


def argsort_top_k(a: Tensor, k: int) -> Tensor:
    """``argsort(a, DESC)`` cut to its first ``k`` columns: a view, no new op
    (``ggml_argsort_top_k``). Same values as :func:`top_k`, at the cost of a full sort."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= a.shape[-1]:
        raise OpParamError(f"argsort_top_k: k must be an int in [1, {a.shape[-1]}], got {k!r}")
    s = argsort(a, SortOrder.DESC)
    return view(s, (*s.shape[:-1], k), s.strides, 0)


# -- shape-changing copies ------------------------------------------------------------------------


def repeat(a: Tensor, shape: Sequence[int] | Tensor) -> Tensor:
    """``a`` tiled to ``shape`` (``ggml_repeat``; ``shape`` may be a tensor to copy it from).

    Aligned from the right, each of ``a``'s dimensions must divide the target's;
    ``out[i] = a[i % a.shape]`` axis by axis. Any non-quantized type; same type as ``a``.
    """
    tensor_arg("repeat", "a", a)
    target = tuple(shape.shape) if isinstance(shape, Tensor) else tuple(int(d) for d in shape)
    if a.type.is_quantized:
        raise TypeMismatchError(f"repeat: quantized tensors are not supported ({a.describe()})")
    if not 1 <= len(target) <= MAX_DIMS or not can_repeat(a.shape, target):
        raise fail(
            "repeat",
            f"a {a.describe()} does not tile onto shape {target}: each dimension of a "
            "(aligned from the right) must divide the target's",
        )
    return new_result(a.type, target, Op.REPEAT, (a,))


def pad(a: Tensor, after: Sequence[int]) -> Tensor:
    """``a`` followed by zeros: ``after[i]`` zeros appended along axis ``i`` (``ggml_pad``).

    ``after`` has one non-negative count per axis, numpy order (ggml's ``p0`` is
    ``after[-1]``). Result ``a.shape[i] + after[i]``; ``a``'s values at the start, 0
    everywhere else. Float types; same type as ``a``.
    """
    check_type("pad", "a", a, FLOAT_TYPES)
    widths = tuple(after)
    if len(widths) != a.ndim or any(
        isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in widths
    ):
        raise OpParamError(
            f"pad: after must hold {a.ndim} ints >= 0 (one per axis of {a.describe()}), "
            f"got {after!r}"
        )
    shape = tuple(d + w for d, w in zip(a.shape, widths, strict=True))
    return new_result(a.type, shape, Op.PAD, (a,), {"after": widths})

"""What every op builder shares: operand checks that name the op and what was wrong, and
the constructors of new and view tensors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import OpParamError, ShapeError, TypeMismatchError
from ..opcodes import Op
from ..tensor import MAX_DIMS, Tensor
from ..types import Type

FLOAT_TYPES = frozenset({Type.F32, Type.F16, Type.BF16})
INDEX_TYPES = frozenset({Type.I32, Type.I64})
#: what a matrix product's weights may be (made once: a set built per call walked every
#: type for each product of a graph, a visible share of building a new prompt length's)
WEIGHT_TYPES = FLOAT_TYPES | frozenset(t for t in Type if t.is_quantized)
#: what flash attention's K and V may be stored in: the types llama.cpp keeps a KV cache
#: in (``-ctk``/``-ctv``), whose 32-value blocks fit any head
CACHE_TYPES = FLOAT_TYPES | frozenset(
    {Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.IQ4_NL}
)


# -- validation helpers ------------------------------------------------------------------


def tensor_arg(op: str, what: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeMismatchError(
            f"{op}: {what} must be a Tensor, got {type(t).__name__} {t!r}; scalars go through "
            "ops.scale, or become tensors with new_tensor + set_array"
        )
    return t


def check_type(op: str, what: str, t: Tensor, allowed: frozenset[Type] | set[Type]) -> None:
    tensor_arg(op, what, t)
    if t.type not in allowed:
        names = ", ".join(sorted(a.name for a in allowed))
        raise TypeMismatchError(f"{op}: {what} {t.describe()} must be one of {names}")


def checked_eps(op: str, eps: float) -> float:
    value = float(eps)
    if not value >= 0 or math.isinf(value):  # NaN fails too
        raise OpParamError(f"{op}: eps must be a finite number >= 0, got {eps!r}")
    return value


def enum_member(op: str, param: str, enum: Any, value: Any) -> Any:
    """``value`` as a member of ``enum``, or an OpParamError listing the choices."""
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in enum)
        raise OpParamError(f"{op}: {param} {value!r} is not one of {choices}") from None


def fail(op: str, message: str) -> ShapeError:
    return ShapeError(f"{op}: {message}")


def padded(shape: Sequence[int], ndim: int = MAX_DIMS) -> tuple[int, ...]:
    return (1,) * (ndim - len(shape)) + tuple(shape)


def can_repeat(small: Sequence[int], big: Sequence[int]) -> bool:
    """ggml's ``ggml_can_repeat``: ``small`` tiles onto ``big`` — aligned from the right,
    each dimension of ``small`` divides ``big``'s (an empty ``small`` only onto an empty
    ``big``)."""
    if len(small) > len(big):
        return False
    ps, pb = padded(small, len(big)), tuple(big)
    if 0 in ps:
        return 0 in pb
    return all(db % ds == 0 for ds, db in zip(ps, pb, strict=True))


def check_broadcast(op: str, a: Tensor, b: Tensor) -> None:
    """ggml's ``ggml_can_repeat``: every extent of ``b`` divides ``a``'s, so ``b`` is
    repeated (tiled) to ``a``'s shape — 1 broadcasts, equal matches."""
    if b.ndim > a.ndim or any(
        db != da and (db == 0 or da % db)
        for da, db in zip(padded(a.shape), padded(b.shape), strict=True)
    ):
        raise fail(
            op,
            f"b {b.describe()} does not repeat onto a {a.describe()}: each dimension of b "
            "(aligned from the right) must divide a's (1 broadcasts; a divisor is tiled)",
        )


def new_result(
    t: Type,
    shape: Sequence[int],
    op: Op,
    src: Sequence[Tensor],
    params: dict[str, Any] | None = None,
) -> Tensor:
    return Tensor(t, shape, op=op, src=src, op_params=params or {})


def view_like(
    a: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int, op: Op,
    params: dict[str, Any] | None = None,
) -> Tensor:  # fmt: skip
    tensor_arg(op.value, "a", a)
    if offset % a.type.type_size:  # an element (or quant block) never starts mid-way
        unit = "block" if a.type.block_size > 1 else "element"
        raise fail(
            op.value,
            f"byte offset {offset} does not start a {a.type.name} {unit} "
            f"({a.type.type_size} bytes each)",
        )
    out = Tensor(
        a.type, shape, strides=strides, op=op, src=(a,), op_params=params or {},
        view_src=a, view_offs=offset,
    )  # fmt: skip
    base = out.base
    if out.view_offs + out.nbytes > base.nbytes:
        raise fail(
            op.value,
            f"the view (offset {out.view_offs}, {out.nbytes} bytes) reaches past the end of "
            f"{base.describe()}, which has {base.nbytes} bytes",
        )
    return out

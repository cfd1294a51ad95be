"""The CPU kernels: one builder per op, and the precise list of what they accept.

:func:`build_step` turns an allocated node into a ready-to-call step (see
:mod:`.common`); :func:`supports` says, for any node, whether :func:`build_step` has a
kernel for its op, its types and its layout. The two are kept side by side so that
``supports_op`` cannot promise what the kernels do not do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tensorplug.contract import conforms
from tensorplug.opcodes import VIEW_OPS, GluOp, Op, RopeMode, SortOrder, UnaryOp
from tensorplug.quants import SUPPORTED_TYPES
from tensorplug.types import Type

from ..repack import layout_of
from ..repack_buffer import RepackBuffer
from . import attention, convert, elementwise, matmul, rotation
from .common import BuildContext, Step

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

__all__ = ["KERNELS", "BuildContext", "Step", "build_step", "supports"]

FLOAT = frozenset({Type.F32, Type.F16, Type.BF16})
QUANT = frozenset(t for t in SUPPORTED_TYPES if t.is_quantized)
INDEX = frozenset({Type.I32, Type.I64})

_Builder = Callable[["Tensor", BuildContext], Step]

#: op → kernel builder (each asks the context's provider for its kernels)
KERNELS: dict[Op, _Builder] = {
    Op.ADD: elementwise.build_binary,
    Op.SUB: elementwise.build_binary,
    Op.MUL: elementwise.build_binary,
    Op.DIV: elementwise.build_binary,
    Op.SCALE: elementwise.build_scale,
    Op.UNARY: elementwise.build_unary,
    Op.GLU: elementwise.build_glu,
    Op.NORM: elementwise.build_norm,
    Op.RMS_NORM: elementwise.build_rms_norm,
    Op.SUM_ROWS: elementwise.build_sum_rows,
    Op.ARGMAX: elementwise.build_argmax,
    Op.ARGSORT: elementwise.build_argsort,
    Op.TOP_K: elementwise.build_top_k,
    Op.CLAMP: elementwise.build_clamp,
    Op.REPEAT: convert.build_repeat,
    Op.PAD: convert.build_pad,
    Op.CONCAT: elementwise.build_concat,
    Op.CPY: convert.build_copy,
    Op.DUP: convert.build_copy,
    Op.CONT: convert.build_copy,
    Op.GET_ROWS: convert.build_get_rows,
    Op.SET_ROWS: convert.build_set_rows,
    Op.SOFT_MAX: attention.build_soft_max,
    Op.ROPE: attention.build_rope,
    Op.MUL_MAT: matmul.build_mul_mat,
    Op.MUL_MAT_ID: matmul.build_mul_mat_id,
    Op.FLASH_ATTN_EXT: attention.build_flash_attn_ext,
    Op.HADAMARD: rotation.build_hadamard,
}


def build_step(node: Tensor, ctx: BuildContext) -> Step | None:
    """The step computing ``node``, or None for ops that only re-describe memory."""
    if node.op in VIEW_OPS:
        return None
    ctx.begin_node()
    return KERNELS[node.op](node, ctx)


# -- what the kernels accept ------------------------------------------------------------------


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """``b`` repeats onto ``a`` (ggml's can_repeat: each extent of b divides a's)."""
    if len(b) > len(a):
        return False
    pairs = zip(a[len(a) - len(b) :], b, strict=True)
    return all(db == da or (db > 0 and da % db == 0) for da, db in pairs)


def _float_same(node: Tensor) -> bool:
    """One float source, result of the same type and shape."""
    a = node.src[0]
    return a.type in FLOAT and node.type == a.type and node.shape == a.shape


def _binary(node: Tensor) -> bool:
    a, b = node.src
    return (
        a.type in FLOAT and b.type in FLOAT and node.type == a.type
        and node.shape == a.shape and _broadcasts(a.shape, b.shape)
    )  # fmt: skip


def _unary(node: Tensor) -> bool:
    fn = node.op_params.get("fn")
    return _float_same(node) and isinstance(fn, UnaryOp) and fn in elementwise.UNARY_FNS


def _glu(node: Tensor) -> bool:
    a = node.src[0]
    if (
        not isinstance(node.op_params.get("fn"), GluOp)
        or a.type not in FLOAT
        or node.type != a.type
    ):
        return False
    if len(node.src) == 2:
        return node.src[1].type == a.type and node.src[1].shape == a.shape == node.shape
    return a.shape[-1] == 2 * node.shape[-1]


def _mul_mat(node: Tensor) -> bool:
    a, b = node.src
    if node.type != Type.F32 or b.type not in FLOAT or a.shape[-1] != b.shape[-1]:
        return False
    if a.type in QUANT:
        return a.rows_contiguous  # blocks are read whole, row by row
    return a.type in FLOAT


def _mul_mat_id(node: Tensor) -> bool:
    a, b, ids = node.src
    ok = node.type == Type.F32 and b.type in FLOAT and ids.type == Type.I32
    return ok and a.rows_contiguous and (a.type in FLOAT or a.type in QUANT)


def _soft_max(node: Tensor) -> bool:
    ok = node.src[0].type == Type.F32 and node.type == Type.F32
    return ok and (len(node.src) == 1 or node.src[1].type in (Type.F32, Type.F16))


def _rope(node: Tensor) -> bool:
    a, pos = node.src[0], node.src[1]
    ff_ok = len(node.src) < 3 or node.src[2].type == Type.F32
    mode_ok = node.op_params.get("mode") in (RopeMode.NORMAL, RopeMode.NEOX)
    return (
        a.type in (Type.F32, Type.F16)
        and node.type == a.type
        and pos.type == Type.I32
        and (ff_ok and mode_ok)
    )


def _flash_attn(node: Tensor) -> bool:
    q, k, v = node.src[:3]
    mask_ok = len(node.src) < 4 or node.src[3].type in (Type.F32, Type.F16)
    # K and V of one float type, or a quantized cache (either of them quantized, each
    # decoded on its own: llama.cpp's -ctk and -ctv differ)
    floats = k.type in FLOAT and v.type == k.type
    cache = {k.type, v.type} <= FLOAT | QUANT and bool({k.type, v.type} & QUANT)
    return q.type == Type.F32 and (floats or cache) and node.type == Type.F32 and mask_ok


def _convertible(src: Type, dst: Type) -> bool:
    """Same type (any), or float ↔ float / float → quantized / quantized → float."""
    if src == dst:
        return src in FLOAT or src in QUANT or src.is_integer
    return (src in FLOAT and dst in FLOAT | QUANT) or (src in QUANT and dst in FLOAT)


def _cpy(node: Tensor) -> bool:
    a, b = node.src
    return node.type == b.type and a.nelements == b.nelements and _convertible(a.type, b.type)


def _dup(node: Tensor) -> bool:
    a = node.src[0]
    return node.type == a.type and node.nelements == a.nelements and _convertible(a.type, a.type)


def _get_rows(node: Tensor) -> bool:
    a, rows = node.src
    out = Type.I32 if a.type == Type.I32 else Type.F32
    return rows.type == Type.I32 and node.type == out and (a.type in FLOAT | QUANT | {Type.I32})


def _set_rows(node: Tensor) -> bool:
    a, b, rows = node.src
    return a.type in FLOAT | QUANT and b.type == Type.F32 and rows.type in INDEX


def _concat(node: Tensor) -> bool:
    a, b = node.src
    return a.type == b.type == node.type and a.type not in QUANT


def _argsort(node: Tensor) -> bool:
    order = node.op_params.get("order")
    ok = node.src[0].type == Type.F32 and node.type == Type.I32
    return ok and order in (SortOrder.ASC, SortOrder.DESC)


_SUPPORT: dict[Op, Callable[[Tensor], bool]] = {
    Op.ADD: _binary, Op.SUB: _binary, Op.MUL: _binary, Op.DIV: _binary,
    Op.SCALE: _float_same, Op.UNARY: _unary, Op.GLU: _glu,
    Op.NORM: _float_same, Op.RMS_NORM: _float_same,
    Op.SUM_ROWS: lambda n: n.src[0].type in FLOAT and n.type == n.src[0].type,
    Op.ARGMAX: lambda n: n.src[0].type == Type.F32 and n.type == Type.I32,
    Op.ARGSORT: _argsort, Op.CONCAT: _concat,
    Op.CPY: _cpy, Op.DUP: _dup, Op.CONT: _dup,
    Op.GET_ROWS: _get_rows, Op.SET_ROWS: _set_rows,
    Op.MUL_MAT: _mul_mat, Op.SOFT_MAX: _soft_max, Op.ROPE: _rope,
    Op.FLASH_ATTN_EXT: _flash_attn,
    Op.MUL_MAT_ID: _mul_mat_id,
    Op.TOP_K: lambda n: n.src[0].type == Type.F32 and n.type == Type.I32,
    Op.CLAMP: _float_same,
    Op.REPEAT: lambda n: n.type == n.src[0].type and n.type not in QUANT,
    Op.PAD: lambda n: n.type == n.src[0].type and n.type in FLOAT,
    Op.HADAMARD: lambda n: n.type == n.src[0].type == Type.F32,
}  # fmt: skip


def _repacked(t: Tensor) -> bool:
    """Whether ``t``'s memory is repacked (a view's is its base's, placed or not)."""
    return isinstance(t.base.buffer, RepackBuffer)


def _repacked_product(node: Tensor) -> bool:
    """A product whose weights are stored repacked: the only op that reads such memory,
    and only a whole tensor (a view's offset would fall inside an eight-row group)."""
    if node.op is not Op.MUL_MAT or not conforms(node):
        return False
    a, b = node.src
    return (
        isinstance(a.buffer, RepackBuffer) and a.view_src is None and layout_of(a) is not None
        and not _repacked(b) and b.type in FLOAT
        and node.type == Type.F32 and a.shape[-1] == b.shape[-1]
    )  # fmt: skip


def supports(node: Tensor) -> bool:
    """True when the kernels compute ``node`` for its op, types and layout."""
    if node.op in VIEW_OPS:
        return True
    if any(_repacked(s) for s in node.src):
        return _repacked_product(node)
    check = _SUPPORT.get(node.op)
    if check is None or not conforms(node):  # a hand-made node missing sources/params
        return False
    try:
        return check(node)
    except (IndexError, KeyError, ValueError):
        return False

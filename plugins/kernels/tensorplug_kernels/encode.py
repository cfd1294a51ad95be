"""From graph nodes to kernel launches, and which nodes this backend can run.

Each op has an encoder (node -> launches) and, where types or layouts matter, a check
a backend's ``supports_op`` answers from; a node is supported exactly when its check
passes, so ``supports_op`` and the encoders cannot drift apart. Semantics are those of
the builders in :mod:`tensorplug.ops`; the kernels live in ``src/*.tpk``. Nothing here
depends on the dialect or the runtime.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tensorplug.contract import conforms
from tensorplug.errors import UnsupportedError
from tensorplug.opcodes import VIEW_OPS, GluOp, Op, RopeMode, SortOrder, UnaryOp
from tensorplug.opmath import alibi_params, rope_yarn_corr_dims
from tensorplug.tensor import Tensor
from tensorplug.types import Type

from .encode_math import encode_flash_attn, encode_mul_mat, flash_attn_fits, mul_mat_ok
from .launch import Launch, Limits, dummy_arg, nrows, row_launch, tensor_arg
from .source import QUANT, QUANTIZE

__all__ = ["encode", "supports"]

FLOAT = frozenset({Type.F32, Type.F16, Type.BF16})
INTEGER = frozenset({Type.I8, Type.I16, Type.I32, Type.I64})

_BINARY = {Op.ADD: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}
_UNARY = {
    UnaryOp.ABS: 0,
    UnaryOp.NEG: 1,
    UnaryOp.RELU: 2,
    UnaryOp.GELU: 3,
    UnaryOp.SILU: 4,
    UnaryOp.EXP: 5,
    UnaryOp.TANH: 6,
    UnaryOp.SIGMOID: 7,
    UnaryOp.GELU_QUICK: 9,
    UnaryOp.GELU_ERF: 10,
}
_GLU = {GluOp.SWIGLU: 0, GluOp.REGLU: 1, GluOp.GEGLU: 2, GluOp.GEGLU_ERF: 3, GluOp.GEGLU_QUICK: 4}
_UN_SCALE = 8
_UN_CLAMP = 11

Encoder = Callable[[Tensor, Limits], list[Launch]]
Check = Callable[[Tensor, Limits], bool]


def _dense_blocks(t: Tensor) -> bool:
    """Quantized tensors are addressed block by block: their rows must be dense."""
    return not t.type.is_quantized or t.rows_contiguous


# -- elementwise ---------------------------------------------------------------------------


def _binary(node: Tensor, lim: Limits) -> list[Launch]:
    a, b = node.src
    return row_launch(
        "k_binary", nrows(node), lim,
        a=tensor_arg(a), b=tensor_arg(b), d=tensor_arg(node), op=_BINARY[node.op],
    )  # fmt: skip


def _unary(node: Tensor, lim: Limits) -> list[Launch]:
    if node.op is Op.SCALE:
        fn, p0, p1 = _UN_SCALE, node.op_params["scale"], node.op_params["bias"]
    elif node.op is Op.CLAMP:
        fn, p0, p1 = _UN_CLAMP, node.op_params["min"], node.op_params["max"]
    else:
        fn, p0, p1 = _UNARY[UnaryOp(node.op_params["fn"])], 0.0, 0.0
    (a,) = node.src
    return row_launch(
        "k_unary", nrows(node), lim, a=tensor_arg(a), d=tensor_arg(node), fn=fn, p0=p0, p1=p1
    )


def _glu(node: Tensor, lim: Limits) -> list[Launch]:
    a = node.src[0]
    if len(node.src) == 2:
        x, g = tensor_arg(a), tensor_arg(node.src[1])
    else:  # split halves of a's rows: two views of a with the result's extents
        n = node.ne()[0]
        ne = (n, *a.ne()[1:])
        half = n * a.nb()[0]
        first, second = (half, 0) if node.op_params.get("swapped") else (0, half)
        x = tensor_arg(a, ne=ne, offset=first)
        g = tensor_arg(a, ne=ne, offset=second)
    fn = _GLU[GluOp(node.op_params["fn"])]
    return row_launch("k_glu", nrows(node), lim, x=x, g=g, d=tensor_arg(node), fn=fn)


def _glu_ok(node: Tensor, lim: Limits) -> bool:
    return GluOp(node.op_params["fn"]) in _GLU and all(s.type in FLOAT for s in node.src)


def _floats(node: Tensor, lim: Limits) -> bool:
    return node.type in FLOAT and all(s.type in FLOAT for s in node.src)


# -- copies and conversions -----------------------------------------------------------------


def _copy_kind(src: Type, dst: Type) -> str | None:
    if src == dst:
        return "raw"
    if dst in FLOAT and (src in FLOAT or src in QUANT):
        return "convert"
    if src in FLOAT and dst in QUANTIZE:
        return "quantize"
    return None


def _copy_ok(node: Tensor, lim: Limits) -> bool:
    src = node.src[0]
    return (
        _copy_kind(src.type, node.type) is not None and _dense_blocks(src) and _dense_blocks(node)
    )


def _units(t: Tensor) -> tuple[int, int, int, int]:
    """``ne`` counting storage units: blocks along the rows of a quantized tensor."""
    ne = t.ne()
    return (ne[0] // t.type.block_size, ne[1], ne[2], ne[3])


def _copy(node: Tensor, lim: Limits) -> list[Launch]:
    src = node.src[0]
    kind = _copy_kind(src.type, node.type)
    reshape = int(src.shape != node.shape)
    rows = nrows(node)
    if kind == "raw":
        s, d = tensor_arg(src, ne=_units(src)), tensor_arg(node, ne=_units(node))
        return row_launch("k_cpy_raw", rows, lim, s=s, d=d, reshape=reshape, ts=node.type.type_size)
    kernel = "k_cpy" if kind == "convert" else "k_cpy_quantize"
    return row_launch(kernel, rows, lim, s=tensor_arg(src), d=tensor_arg(node), reshape=reshape)


def _get_rows_ok(node: Tensor, lim: Limits) -> bool:
    a, rows = node.src
    return (
        rows.type == Type.I32
        and _dense_blocks(a)
        and (a.type in FLOAT | QUANT | INTEGER)
        and node.type == (Type.I32 if a.type == Type.I32 else Type.F32)
    )


def _get_rows(node: Tensor, lim: Limits) -> list[Launch]:
    a, rows = node.src
    return row_launch(
        "k_get_rows", nrows(node), lim, a=tensor_arg(a), r=tensor_arg(rows), d=tensor_arg(node)
    )


def _set_rows_ok(node: Tensor, lim: Limits) -> bool:
    _, b, rows = node.src
    return (
        b.type == Type.F32
        and rows.type in (Type.I32, Type.I64)
        and (node.type in FLOAT or node.type in QUANTIZE)
        and _dense_blocks(node)
    )


def _set_rows(node: Tensor, lim: Limits) -> list[Launch]:
    """A check of every index, then the scatter, which writes nothing when the check
    found a bad index (the error word is read at synchronize)."""
    _, b, rows = node.src
    args = {"b": tensor_arg(b), "r": tensor_arg(rows), "d": tensor_arg(node)}
    n = nrows(b)
    return row_launch("k_set_rows_check", n, lim, **args) + row_launch("k_set_rows", n, lim, **args)


def _concat_ok(node: Tensor, lim: Limits) -> bool:
    return node.type not in QUANT and all(s.type == node.type for s in node.src)


def _concat(node: Tensor, lim: Limits) -> list[Launch]:
    a, b = node.src
    return row_launch(
        "k_concat", nrows(node), lim,
        a=tensor_arg(a), b=tensor_arg(b), d=tensor_arg(node),
        axis=node.ndim - 1 - int(node.op_params["axis"]), ts=node.type.type_size,
    )  # fmt: skip


# -- rows: normalisation, softmax, reductions, sorting, rope --------------------------------


def _norm(node: Tensor, lim: Limits) -> list[Launch]:
    (a,) = node.src
    return row_launch(
        "k_norm", nrows(node), lim,
        a=tensor_arg(a), d=tensor_arg(node),
        rms=int(node.op is Op.RMS_NORM), eps=float(node.op_params["eps"]),
    )  # fmt: skip


def _soft_max_ok(node: Tensor, lim: Limits) -> bool:
    return node.src[0].type == Type.F32 and all(
        m.type in (Type.F32, Type.F16) for m in node.src[1:]
    )


def _top_k(node: Tensor, lim: Limits) -> list[Launch]:
    (a,) = node.src
    k = int(node.op_params["k"])
    return row_launch("k_top_k", nrows(a), lim, a=tensor_arg(a), d=tensor_arg(node), k=k)


def _repeat_ok(node: Tensor, lim: Limits) -> bool:
    return node.type == node.src[0].type and node.type not in QUANT


def _repeat(node: Tensor, lim: Limits) -> list[Launch]:
    (a,) = node.src
    return row_launch(
        "k_repeat", nrows(node), lim, a=tensor_arg(a), d=tensor_arg(node), ts=a.type.type_size
    )


def _pad_ok(node: Tensor, lim: Limits) -> bool:
    return node.type == node.src[0].type and node.type in FLOAT


def _pad(node: Tensor, lim: Limits) -> list[Launch]:
    (a,) = node.src
    return row_launch(
        "k_pad", nrows(node), lim, a=tensor_arg(a), d=tensor_arg(node), ts=a.type.type_size
    )


def _soft_max(node: Tensor, lim: Limits) -> list[Launch]:
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    p = node.op_params
    m0, m1, nhl2 = alibi_params(a.ne()[2], p["max_bias"])
    return row_launch(
        "k_soft_max", nrows(node), lim,
        a=tensor_arg(a),
        m=tensor_arg(mask) if mask is not None else dummy_arg(node),
        d=tensor_arg(node),
        scale=float(p["scale"]), max_bias=float(p["max_bias"]), m0=float(m0), m1=float(m1),
        n_head_log2=int(nhl2), has_mask=int(mask is not None),
    )  # fmt: skip


def _sum_rows(node: Tensor, lim: Limits) -> list[Launch]:
    (a,) = node.src
    return row_launch("k_sum_rows", nrows(a), lim, a=tensor_arg(a), d=tensor_arg(node))


def _f32_rows_ok(node: Tensor, lim: Limits) -> bool:
    return node.src[0].type == Type.F32


def _argmax(node: Tensor, lim: Limits) -> list[Launch]:
    (a,) = node.src
    return row_launch("k_argmax", nrows(a), lim, a=tensor_arg(a), d=tensor_arg(node))


#: Longest row ``k_argsort_local`` sorts in local memory (ARGSORT_LOCAL_MAX of rows.tpk).
ARGSORT_LOCAL_MAX = 4096


def _argsort(node: Tensor, lim: Limits) -> list[Launch]:
    (a,) = node.src
    n = a.ne()[0]
    npad = 1 << max(n - 1, 0).bit_length()
    args = {"a": tensor_arg(a), "d": tensor_arg(node), "npad": npad, "k": 0, "j": 0,
            "desc": int(SortOrder(node.op_params["order"]) is SortOrder.DESC)}  # fmt: skip
    rows = nrows(a)
    if npad <= ARGSORT_LOCAL_MAX and lim.local_mem >= 4 * ARGSORT_LOCAL_MAX:
        return row_launch("k_argsort_local", rows, lim, **args)
    # long rows: the same network, one launch per stage, sorting the indices in place
    launches = row_launch("k_argsort_init", rows, lim, **args)
    k = 2
    while k <= npad:
        j = k // 2
        while j > 0:
            launches += row_launch("k_argsort_step", rows, lim, **{**args, "k": k, "j": j})
            j //= 2
        k *= 2
    return launches


def _rope_ok(node: Tensor, lim: Limits) -> bool:
    a, pos = node.src[:2]
    return (
        a.type in (Type.F32, Type.F16)
        and pos.type == Type.I32
        and all(f.type == Type.F32 for f in node.src[2:])
        and int(node.op_params["mode"]) in (RopeMode.NORMAL, RopeMode.NEOX)
    )


def _rope(node: Tensor, lim: Limits) -> list[Launch]:
    a, pos = node.src[:2]
    ff = node.src[2] if len(node.src) > 2 else None
    p = node.op_params
    n_dims = int(p["n_dims"])
    theta_scale = np.float32(p["freq_base"]) ** np.float32(-2.0 / n_dims)
    corr0, corr1 = rope_yarn_corr_dims(
        n_dims, int(p["n_ctx_orig"]), p["freq_base"], p["beta_fast"], p["beta_slow"]
    )
    return row_launch(
        "k_rope", nrows(node), lim,
        a=tensor_arg(a), pos=tensor_arg(pos),
        ff=tensor_arg(ff) if ff is not None else dummy_arg(node),
        d=tensor_arg(node),
        n_dims=n_dims, neox=int(int(p["mode"]) == RopeMode.NEOX),
        theta_scale=float(theta_scale), freq_scale=float(p["freq_scale"]),
        ext_factor=float(p["ext_factor"]), attn_factor=float(p["attn_factor"]),
        corr0=float(corr0), corr1=float(corr1), has_ff=int(ff is not None),
    )  # fmt: skip


def _mul_mat_id_ok(node: Tensor, lim: Limits) -> bool:
    as_, b, ids = node.src
    known = as_.type in FLOAT or (as_.type in QUANT and as_.rows_contiguous)
    return known and b.type in FLOAT and ids.type == Type.I32


def _mul_mat_id(node: Tensor, lim: Limits) -> list[Launch]:
    as_, b, ids = node.src
    return row_launch(
        "k_mul_mat_id", nrows(node), lim,
        w=tensor_arg(as_), b=tensor_arg(b), ids=tensor_arg(ids), d=tensor_arg(node),
    )  # fmt: skip


# -- the table ---------------------------------------------------------------------------------

_ENCODERS: dict[Op, tuple[Encoder, Check | None]] = {
    Op.ADD: (_binary, _floats),
    Op.SUB: (_binary, _floats),
    Op.MUL: (_binary, _floats),
    Op.DIV: (_binary, _floats),
    Op.SCALE: (_unary, _floats),
    Op.CLAMP: (_unary, _floats),
    Op.REPEAT: (_repeat, _repeat_ok),
    Op.PAD: (_pad, _pad_ok),
    Op.TOP_K: (_top_k, _f32_rows_ok),
    Op.UNARY: (_unary, lambda n, lim: _floats(n, lim) and UnaryOp(n.op_params["fn"]) in _UNARY),
    Op.GLU: (_glu, _glu_ok),
    Op.NORM: (_norm, _floats),
    Op.RMS_NORM: (_norm, _floats),
    Op.MUL_MAT: (encode_mul_mat, mul_mat_ok),
    Op.MUL_MAT_ID: (_mul_mat_id, _mul_mat_id_ok),
    Op.SOFT_MAX: (_soft_max, _soft_max_ok),
    Op.ROPE: (_rope, _rope_ok),
    Op.FLASH_ATTN_EXT: (encode_flash_attn, flash_attn_fits),
    Op.CPY: (_copy, _copy_ok),
    Op.DUP: (_copy, _copy_ok),
    Op.CONT: (_copy, _copy_ok),
    Op.GET_ROWS: (_get_rows, _get_rows_ok),
    Op.SET_ROWS: (_set_rows, _set_rows_ok),
    Op.CONCAT: (_concat, _concat_ok),
    Op.SUM_ROWS: (_sum_rows, _floats),
    Op.ARGMAX: (_argmax, _f32_rows_ok),
    Op.ARGSORT: (_argsort, _f32_rows_ok),
}


def supports(node: Tensor, lim: Limits) -> bool:
    """True when :func:`encode` can run ``node`` here: its operands and op_params are as
    the op contract says, and types, layouts and device limits suit the kernels."""
    return node.op in VIEW_OPS or (conforms(node) and _kernels_take(node, lim))


def _kernels_take(node: Tensor, lim: Limits) -> bool:
    """The per-op check alone. :func:`encode` runs it on every compute; the contract
    check (several µs a node) is ``supports_op``'s, asked once when a graph is placed."""
    entry = _ENCODERS.get(node.op)
    if entry is None:
        return False
    check = entry[1]
    try:
        return check is None or bool(check(node, lim))
    except (KeyError, ValueError, TypeError):  # malformed op_params: not something we run
        return False


def encode(node: Tensor, lim: Limits) -> list[Launch]:
    """The launches computing ``node``; none for views and empty tensors."""
    if node.op in VIEW_OPS or node.nelements == 0:
        return []
    if not _kernels_take(node, lim):
        raise UnsupportedError(
            f"{node.op.value} node {node.describe()} with sources "
            f"{', '.join(s.describe() for s in node.src)} is not supported by the GPU "
            "kernels on this device; "
            "check backend.supports_op() first or let the scheduler place it elsewhere"
        )
    return _ENCODERS[node.op][0](node, lim)

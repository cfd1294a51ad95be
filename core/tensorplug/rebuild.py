"""Rebuild a node from new sources: the same op with the same params, through its builder.

Whoever re-creates a graph elsewhere — a remote actor from a plain-data description, the
meta device for each of its members' slices — builds every node again with the op's own
builder in :mod:`tensorplug.ops`, so the rebuilt node passes the same shape and type
checks as the original and nothing about its layout is taken on trust. The view-like
ops take their new shape (and a view its strides) as arguments, since those are what
such an op is made of.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import ops
from .errors import UnsupportedError
from .opcodes import GluOp, Op
from .tensor import Tensor

__all__ = ["BUILDERS", "Builder", "rebuild"]

Params = dict[str, Any]
Builder = Callable[[Sequence[Tensor], Params, tuple[int, ...], tuple[int, ...]], Tensor]


def _opt(src: Sequence[Tensor], i: int) -> Tensor | None:
    return src[i] if len(src) > i else None


def _glu(src: Sequence[Tensor], p: Params) -> Tensor:
    return ops.glu(src[0], _opt(src, 1), GluOp(p["fn"]), swapped=p["swapped"])


#: Each builder gets the new sources, the params and the node's shape and
#: strides (only the view-like ops need those: they are the op's arguments).
BUILDERS: dict[Op, Builder] = {
    Op.ADD: lambda s, p, sh, st: ops.add(s[0], s[1]),
    Op.SUB: lambda s, p, sh, st: ops.sub(s[0], s[1]),
    Op.MUL: lambda s, p, sh, st: ops.mul(s[0], s[1]),
    Op.DIV: lambda s, p, sh, st: ops.div(s[0], s[1]),
    Op.SCALE: lambda s, p, sh, st: ops.scale(s[0], p["scale"], p["bias"]),
    Op.UNARY: lambda s, p, sh, st: ops.unary(s[0], p["fn"]),
    Op.GLU: lambda s, p, sh, st: _glu(s, p),
    Op.NORM: lambda s, p, sh, st: ops.norm(s[0], p["eps"]),
    Op.RMS_NORM: lambda s, p, sh, st: ops.rms_norm(s[0], p["eps"]),
    Op.MUL_MAT: lambda s, p, sh, st: ops.mul_mat(s[0], s[1]),
    Op.MUL_MAT_ID: lambda s, p, sh, st: ops.mul_mat_id(s[0], s[1], s[2]),
    Op.SOFT_MAX: lambda s, p, sh, st: ops.soft_max(s[0], _opt(s, 1), p["scale"], p["max_bias"]),
    Op.ROPE: lambda s, p, sh, st: ops.rope(
        s[0],
        s[1],
        p["n_dims"],
        p["mode"],
        freq_base=p["freq_base"],
        freq_scale=p["freq_scale"],
        ext_factor=p["ext_factor"],
        attn_factor=p["attn_factor"],
        beta_fast=p["beta_fast"],
        beta_slow=p["beta_slow"],
        n_ctx_orig=p["n_ctx_orig"],
        freq_factors=_opt(s, 2),
    ),
    Op.FLASH_ATTN_EXT: lambda s, p, sh, st: ops.flash_attn_ext(
        s[0],
        s[1],
        s[2],
        _opt(s, 3),
        p["scale"],
        p["max_bias"],
        p["logit_softcap"],
        _opt(s, 4),
        p.get("online", False),
    ),
    Op.CPY: lambda s, p, sh, st: ops.cpy(s[0], s[1]),
    Op.DUP: lambda s, p, sh, st: ops.dup(s[0]),
    Op.CONT: lambda s, p, sh, st: ops.cont(s[0], sh),
    Op.GET_ROWS: lambda s, p, sh, st: ops.get_rows(s[0], s[1]),
    Op.SET_ROWS: lambda s, p, sh, st: ops.set_rows(s[0], s[1], s[2]),
    Op.CONCAT: lambda s, p, sh, st: ops.concat(s[0], s[1], p["axis"]),
    Op.SUM_ROWS: lambda s, p, sh, st: ops.sum_rows(s[0]),
    Op.ARGMAX: lambda s, p, sh, st: ops.argmax(s[0]),
    Op.ARGSORT: lambda s, p, sh, st: ops.argsort(s[0], p["order"]),
    Op.TOP_K: lambda s, p, sh, st: ops.top_k(s[0], p["k"]),
    Op.REPEAT: lambda s, p, sh, st: ops.repeat(s[0], sh),
    Op.CLAMP: lambda s, p, sh, st: ops.clamp(s[0], p["min"], p["max"]),
    Op.PAD: lambda s, p, sh, st: ops.pad(s[0], p["after"]),
    Op.HADAMARD: lambda s, p, sh, st: ops.hadamard(s[0], p["n"]),
    Op.VIEW: lambda s, p, sh, st: ops.view(s[0], sh, st, p["offset"]),
    Op.RESHAPE: lambda s, p, sh, st: ops.reshape(s[0], sh),
    Op.PERMUTE: lambda s, p, sh, st: ops.permute(s[0], p["axes"]),
    Op.TRANSPOSE: lambda s, p, sh, st: ops.transpose(s[0]),
}


def rebuild(
    op: Op,
    src: Sequence[Tensor],
    params: Params,
    shape: Sequence[int],
    strides: Sequence[int],
) -> Tensor:
    """``op`` built again from ``src`` with ``params``; ``shape``/``strides`` feed the
    view-like ops. Raises :class:`UnsupportedError` for an op without a builder, and
    whatever the builder raises when the sources do not fit."""
    builder = BUILDERS.get(op)
    if builder is None:
        raise UnsupportedError(f"op {op.value} cannot be rebuilt from new sources yet")
    return builder(src, params, tuple(shape), tuple(strides))

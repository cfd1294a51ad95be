"""The op contract, machine-readable: per op, its operands, its parameters and its result.

A backend reads a node's ``src`` and ``op_params``; this module says, for every op, what
it will find there — which operands are required or optional and at which position,
which parameters with which types, and what the result is — so that a plugin author
never has to read the builders in :mod:`tensorplug.ops` to learn that rope's frequency
factors are ``src[2]`` when given, or that soft_max's parameters are ``scale`` and
``max_bias``. The reference page ``docs/ops.md`` is generated from it
(``python -m tensorplug.contract > docs/ops.md``); the conformance kit checks every
node of every case against it, and the CPU and GPU backends refuse nodes that do not
conform instead of failing inside a kernel.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .opcodes import GluOp, Op, RopeMode, SortOrder, UnaryOp
from .tensor import Tensor

__all__ = ["CONTRACT", "OpSpec", "Operand", "Param", "conforms", "problems", "render_markdown"]


@dataclass(frozen=True)
class Operand:
    """``src[i]`` of a node: its name, what it is, and whether it may be absent (an
    optional operand is present exactly when the builder was given it; optional ones
    come last)."""

    name: str
    meaning: str
    optional: bool = False


@dataclass(frozen=True)
class Param:
    """``op_params[name]``: its Python type (an enum class for modes) and meaning."""

    name: str
    type: type
    meaning: str


@dataclass(frozen=True)
class OpSpec:
    op: Op
    builders: str
    operands: tuple[Operand, ...]
    params: tuple[Param, ...]
    result: str

    @property
    def n_required(self) -> int:
        return sum(not o.optional for o in self.operands)


def _spec(
    op: Op, builders: str, operands: tuple[Operand, ...], params: tuple[Param, ...], result: str
) -> OpSpec:
    return OpSpec(op, builders, operands, params, result)


_A = Operand("a", "the input")
_ELEMENTWISE_B = Operand(
    "b", "the second operand, repeated onto a: each extent divides a's (1 broadcasts)"
)
_EPS = Param("eps", float, "added to the variance before the square root; > 0")
_SCALE = Param("scale", float, "multiplies the scores before the softmax")
_MAX_BIAS = Param("max_bias", float, "ALiBi maximum bias; 0 disables ALiBi (then the slope is 1)")

CONTRACT: dict[Op, OpSpec] = {
    s.op: s
    for s in (
        _spec(Op.DUP, "dup", (_A,), (), "a copy of a: same type and shape"),
        *(
            _spec(op, op.value, (_A, _ELEMENTWISE_B), (), f"a {sym} b: a's type and shape")
            for op, sym in ((Op.ADD, "+"), (Op.SUB, "-"), (Op.MUL, "*"), (Op.DIV, "/"))
        ),
        _spec(
            Op.SCALE,
            "scale",
            (_A,),
            (
                Param("scale", float, "the factor"),
                Param("bias", float, "added after scaling"),
            ),
            "a * scale + bias: a's type and shape",
        ),
        _spec(
            Op.UNARY,
            "unary, abs, neg, relu, gelu, silu, exp, tanh, sigmoid, gelu_quick, gelu_erf",
            (_A,),
            (Param("fn", UnaryOp, "the elementwise function (see tensorplug.ops.unary)"),),
            "fn(a): a's type and shape",
        ),
        _spec(
            Op.GLU,
            "swiglu",
            (
                Operand(
                    "a", "the input; without b, each row holds the value half then the gate half"
                ),
                Operand("b", "the gate, a's shape (split form when absent)", optional=True),
            ),
            (
                Param(
                    "fn",
                    GluOp,
                    "the activation of the gated unit act(x) * g (see tensorplug.ops.glu)",
                ),
                Param("swapped", bool, "the gate comes first (split form) / b is the value"),
            ),
            "fn(x) * g: a's type; rows half as long in the split form",
        ),
        _spec(Op.NORM, "norm", (_A,), (_EPS,), "(a - mean) / sqrt(var + eps) per row"),
        _spec(Op.RMS_NORM, "rms_norm", (_A,), (_EPS,), "a / sqrt(mean(a^2) + eps) per row"),
        _spec(
            Op.MUL_MAT,
            "mul_mat",
            (
                Operand("a", "weights (..., n_out, K), any float or quantized type"),
                Operand("b", "activations (..., n_tok, K), float; outer axes a multiple of a's"),
            ),
            (),
            "b · aᵀ: F32 (..., n_tok, n_out)",
        ),
        _spec(
            Op.MUL_MAT_ID,
            "mul_mat_id",
            (
                Operand("a", "the experts' weights (n_expert, n_out, K), any float or quantized"),
                Operand("b", "float (n_tokens, n_b, K), n_b dividing n_used"),
                Operand("ids", "I32 (n_tokens, n_used): each token's experts, in [0, n_expert)"),
            ),
            (),
            "F32 (n_tokens, n_used, n_out): out[t, e] = a[ids[t, e]] · b[t, e % n_b]",
        ),
        _spec(
            Op.SOFT_MAX,
            "soft_max",
            (
                Operand("a", "F32 scores, softmax along the last axis"),
                Operand(
                    "mask",
                    "F32/F16 added (times the ALiBi slope) before the softmax; "
                    "(..., >= rows, n); outer axes 1 or a's",
                    optional=True,
                ),
            ),
            (_SCALE, _MAX_BIAS),
            "F32, a's shape",
        ),
        _spec(
            Op.ROPE,
            "rope",
            (
                Operand("a", "F32/F16 (..., n_tokens, n_head, head_dim)"),
                Operand("pos", "I32 positions, one per token"),
                Operand(
                    "freq_factors",
                    "F32 (n_dims/2,) divisors of each pair's frequency",
                    optional=True,
                ),
            ),
            (
                Param(
                    "n_dims", int, "leading dims of each head that rotate; the rest pass through"
                ),
                Param(
                    "mode", RopeMode, "NORMAL: adjacent pairs; NEOX: first half with second half"
                ),
                Param("freq_base", float, "theta base (10000 in llama)"),
                Param("freq_scale", float, "position interpolation factor (1: none)"),
                Param("ext_factor", float, "YaRN extrapolation mix (0: off)"),
                Param("attn_factor", float, "magnitude scale of the rotated values"),
                Param("beta_fast", float, "YaRN correction range, fast end"),
                Param("beta_slow", float, "YaRN correction range, slow end"),
                Param("n_ctx_orig", int, "the context length the model was trained with"),
            ),
            "a rotated: a's type and shape",
        ),
        _spec(
            Op.FLASH_ATTN_EXT,
            "flash_attn_ext",
            (
                Operand("q", "F32 (..., n_head, n_q, D)"),
                Operand(
                    "k", "F32/F16/BF16 (..., n_head_kv, n_kv, D); n_head a multiple of n_head_kv"
                ),
                Operand("v", "k's type, (..., n_head_kv, n_kv, Dv)"),
                Operand("mask", "F32/F16 (..., >= n_q, n_kv) added to the scores", optional=True),
            ),
            (
                _SCALE,
                _MAX_BIAS,
                Param("logit_softcap", float, "softcap * tanh(s / softcap) on the scores; 0: off"),
            ),
            "softmax(q·kᵀ·scale + mask)·v: F32 (..., n_q, n_head, Dv)",
        ),
        _spec(
            Op.CPY,
            "cpy",
            (
                Operand("a", "the values"),
                Operand("b", "the destination (same element count); the result is a view of it"),
            ),
            (),
            "b holding a's values converted to b's type, element k to element k in C order",
        ),
        _spec(Op.CONT, "cont", (_A,), (), "a copied into contiguous memory (optionally reshaped)"),
        _spec(
            Op.SET_ROWS,
            "set_rows",
            (
                Operand("a", "the destination table (a KV cache); the result is a view of it"),
                Operand("b", "F32 rows to write, (..., n, row)"),
                Operand("rows", "I32/I64 row indices, (..., n); every one within a's rows"),
            ),
            (),
            "a with a[..., rows[j], :] = b[..., j, :] converted; a bad index is an error",
        ),
        _spec(
            Op.GET_ROWS,
            "get_rows",
            (
                Operand("a", "the table, any type"),
                Operand("rows", "I32 row indices; every one within a's rows"),
            ),
            (),
            "F32 (I32 for an I32 table) (*rows.shape, row)",
        ),
        _spec(
            Op.CONCAT,
            "concat",
            (_A, Operand("b", "a's type; equal extents off the axis")),
            (Param("axis", int, "numpy axis (0 = outermost) to join along"),),
            "a and b joined: a's type",
        ),
        _spec(Op.SUM_ROWS, "sum_rows", (_A,), (), "a's type (..., 1): each row's sum"),
        _spec(
            Op.ARGMAX,
            "argmax",
            (Operand("a", "F32"),),
            (),
            "I32 (...,): index of each row's largest value; the last on ties, and a NaN "
            "restarts the search (ggml's CPU loop)",
        ),
        _spec(
            Op.ARGSORT,
            "argsort",
            (Operand("a", "F32"),),
            (Param("order", SortOrder, "ascending or descending"),),
            "I32 a's shape: indices that sort each row; stable (ties keep their order)",
        ),
        _spec(
            Op.TOP_K,
            "top_k (argsort_top_k is argsort plus a view)",
            (Operand("a", "F32"),),
            (Param("k", int, "how many indices per row, 1 <= k <= the row length"),),
            "I32 (..., k): indices of each row's k largest, largest first, ties by index",
        ),
        _spec(
            Op.REPEAT,
            "repeat",
            (Operand("a", "any non-quantized type; each extent divides the result's"),),
            (),
            "a tiled to the result's shape (ggml_repeat): a's type",
        ),
        _spec(
            Op.CLAMP,
            "clamp",
            (_A,),
            (
                Param("min", float, "the lower bound (not NaN)"),
                Param("max", float, "the upper bound (not NaN)"),
            ),
            "MAX(MIN(x, max), min) as ggml writes it (NaN gives max): a's type and shape",
        ),
        _spec(
            Op.PAD,
            "pad",
            (Operand("a", "a float type"),),
            (Param("after", tuple, "zeros appended at the end of each axis, numpy order"),),
            "a followed by zeros along each axis: a's type",
        ),
        _spec(
            Op.VIEW,
            "view",
            (_A,),
            (Param("offset", int, "byte offset into a"),),
            "no computation: a's memory with another shape and byte strides",
        ),
        _spec(Op.RESHAPE, "reshape", (_A,), (), "no computation: contiguous a, another shape"),
        _spec(
            Op.PERMUTE,
            "permute",
            (_A,),
            (Param("axes", tuple, "out.shape[i] == a.shape[axes[i]]"),),
            "no computation: a's memory with axes reordered",
        ),
        _spec(
            Op.TRANSPOSE,
            "transpose",
            (_A,),
            (Param("axes", tuple, "the permutation swapping the last two axes"),),
            "no computation: a's last two axes swapped",
        ),
    )
}


def problems(node: Tensor) -> list[str]:
    """Where ``node`` departs from the contract (empty when it conforms)."""
    return list(_problems(node))


def conforms(node: Tensor) -> bool:
    """True when ``node`` has the operands and parameters its op's contract lists: the
    first of :func:`problems` is not even written (a scheduler asks this of every node
    whenever it splits a graph, e.g. at each prompt/token switch)."""
    return next(_problems(node), None) is None


def _problems(node: Tensor) -> Iterator[str]:
    """:func:`problems`, one at a time; the cheap checks decide a conforming node."""
    if node.op is Op.NONE:
        return
    spec = CONTRACT.get(node.op)
    if spec is None:
        yield f"op {node.op.value!r} is not in the contract"
        return
    n = len(node.src)
    if not spec.n_required <= n <= len(spec.operands):
        want = (
            str(spec.n_required)
            if spec.n_required == len(spec.operands)
            else f"{spec.n_required} to {len(spec.operands)}"
        )
        yield f"{node.op.value} takes {want} operands, the node has {n}"
    if any(not isinstance(s, Tensor) for s in node.src):
        yield f"{node.op.value}: an operand is not a Tensor"
    params = node.op_params
    if len(params) != len(spec.params) or any(p.name not in params for p in spec.params):
        names = {p.name for p in spec.params}
        if missing := sorted(names - set(params)):
            yield f"{node.op.value}: op_params lack {missing}"
        if extra := sorted(set(params) - names):
            yield f"{node.op.value}: op_params {extra} are not in the contract"
    for p in spec.params:
        if p.name in params and not _is(params[p.name], p.type):
            got = type(params[p.name]).__name__
            yield f"{node.op.value}: op_params[{p.name!r}] is {got}, not {p.type.__name__}"


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (float, int)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is tuple:
        return isinstance(value, (tuple, list))
    return isinstance(value, kind)


def _type_name(kind: type) -> str:
    if issubclass(kind, enum.Enum):
        return f"{kind.__name__} ({', '.join(repr(m.value) for m in kind)})"
    return "tuple of int" if kind is tuple else kind.__name__


def render_markdown() -> str:
    """docs/ops.md: the contract as a reference page."""
    lines = [
        "# Op reference",
        "",
        "Generated from `tensorplug.contract` (`python -m tensorplug.contract > docs/ops.md`;",
        "a test fails when this page is out of date). For every op: the operands a backend",
        "finds in `node.src`, in order (an optional operand is present only when it was given,",
        "and optional ones come last), the parameters in `node.op_params`, and the result.",
        "Shapes are numpy order (outermost first); `node.ne()` gives ggml's order. The",
        "builders' docstrings in `tensorplug.ops` give the exact formulas.",
        "",
    ]
    for spec in CONTRACT.values():
        lines += [
            f"## `{spec.op.value}`",
            "",
            f"Built by: `{spec.builders}`. Result: {spec.result}.",
            "",
        ]
        lines += ["| src | operand | meaning |", "| --- | --- | --- |"]
        for i, o in enumerate(spec.operands):
            opt = " (optional)" if o.optional else ""
            lines.append(f"| {i} | `{o.name}`{opt} | {o.meaning} |")
        lines.append("")
        if spec.params:
            lines += ["| op_params key | type | meaning |", "| --- | --- | --- |"]
            lines += [f"| `{p.name}` | {_type_name(p.type)} | {p.meaning} |" for p in spec.params]
        else:
            lines.append("No parameters.")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())

"""The op contract, machine-readable and versioned: per op, its operands, its parameters,
its result, and what it gained in which contract version.

A backend reads a node's ``src`` and ``op_params``; this module says, for every op, what
it will find there — which operands are required or optional and at which position,
which parameters with which types, and what the result is — so that a plugin author
never has to read the builders in :mod:`tensorplug.ops` to learn that rope's frequency
factors are ``src[2]`` when given, or that soft_max's parameters are ``scale`` and
``max_bias``. The reference page ``docs/ops.md`` is generated from it
(``python -m tensorplug.contract > docs/ops.md``); the conformance kit checks every
node of every case against it, and the CPU and GPU backends refuse nodes that do not
conform instead of failing inside a kernel.

The contract is versioned because plugins outside this repository cannot follow every
change of op semantics (JAX's PJRT versions its structs for the same reason). Each
semantic an op gained after 1.0 is a :class:`Feature`: the contract version that
introduced it, the ops it concerns, and a predicate saying whether a node *needs* it.
A plugin declares the version it implements as the minor of its registration's
``api_version`` (plugin API 1.x implements op contract 1.x); :meth:`Device.supports_op
<tensorplug.Device.supports_op>` refuses a node needing a later feature before the
plugin is asked (:func:`missing_feature`), so the scheduler runs it elsewhere, and the
conformance kit reports such cases as unsupported rather than failed.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .opcodes import GluOp, Op, RopeMode, SortOrder, UnaryOp
from .tensor import Tensor

__all__ = [
    "BASE_VERSION",
    "CONTRACT",
    "FEATURES",
    "LATEST_VERSION",
    "VERSIONS",
    "Feature",
    "OpSpec",
    "Operand",
    "Param",
    "conforms",
    "features_after",
    "missing_feature",
    "needed_features",
    "problems",
    "render_markdown",
    "required_version",
    "version_label",
]


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
                    "(..., >= rows, n); outer axes divide a's (head h uses mask head h % n)",
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
                    "k",
                    "F32/F16/BF16, or a cache type (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL) "
                    "(..., n_head_kv, n_kv, D); n_head a multiple of n_head_kv",
                ),
                Operand(
                    "v",
                    "k's type, or any of k's when k or v is quantized, (..., n_head_kv, n_kv, Dv)",
                ),
                Operand("mask", "F32/F16 (..., >= n_q, n_kv) added to the scores", optional=True),
                Operand(
                    "order",
                    "I32 (n_kv,) permutation of the k rows: the order their terms are summed in "
                    "(rounding only; needs the mask)",
                    optional=True,
                ),
            ),
            (
                _SCALE,
                _MAX_BIAS,
                Param("logit_softcap", float, "softcap * tanh(s / softcap) on the scores; 0: off"),
                Param(
                    "online",
                    bool,
                    "round as ggml's flash attention kernel (online softmax) rather than as "
                    "llama.cpp's graph without it; rounding only",
                ),
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
            Op.HADAMARD,
            "hadamard",
            (Operand("a", "F32, any layout"),),
            (Param("n", int, "the rotation's size: a power of two from 2 dividing a's rows"),),
            "each run of n values of a's rows times H_n/√n (Walsh–Hadamard, Sylvester's "
            "order): F32 of a's shape, contiguous",
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


# -- versions ------------------------------------------------------------------------------

#: The contract of the first release: the ops, operands and parameters above as they were
#: then (no tiled operands, IEEE results on special values, no ops added since).
BASE_VERSION: tuple[int, int] = (1, 0)


@dataclass(frozen=True)
class Feature:
    """A semantic an op gained after contract 1.0, and the version that introduced it.

    ``needs(node)`` says whether this node cannot be computed right without the feature:
    a plugin declaring an older contract is never handed such a node. It looks only at
    the node (shapes, ``op_params``), never at data, so a rule about values (NaN, ties)
    makes every node whose op it governs need it. ``summary`` is the sentence that
    ``docs/ops.md``, ``tensorplug doctor`` and the kit show.
    """

    name: str
    version: tuple[int, int]
    ops: tuple[Op, ...]
    needs: Callable[[Tensor], bool]
    summary: str

    @property
    def label(self) -> str:
        return f"{version_label(self.version)} {self.name}"


def version_label(version: Sequence[int]) -> str:
    return f"{version[0]}.{version[1]}"


def _tiles(small: Sequence[int], big: Sequence[int]) -> bool:
    """Whether ``small``, aligned from the right, has an extent that is neither 1 nor
    ``big``'s: repeated (ggml_can_repeat), which numpy broadcasting does not do."""
    return any(s not in (1, b) for s, b in zip(reversed(small), reversed(big), strict=False))


def _tiled_b(node: Tensor) -> bool:
    return len(node.src) >= 2 and _tiles(node.src[1].shape, node.src[0].shape)


def _tiled_mask(node: Tensor) -> bool:
    if len(node.src) < 2:  # no mask
        return False
    a, mask = node.src[0].shape, node.src[1].shape
    return _tiles(mask[:-2], a[:-2])


def _unary_fn(*fns: UnaryOp) -> Callable[[Tensor], bool]:
    return lambda node: node.op_params.get("fn") in fns


def _special(node: Tensor) -> bool:
    return node.op is Op.ARGMAX or node.op_params.get("fn") in (UnaryOp.RELU, UnaryOp.GELU)


def _is_op(op: Op) -> Callable[[Tensor], bool]:
    return lambda node: node.op is op


def _new_op(op: Op, summary: str) -> Feature:
    return Feature(op.value, (1, 3), (op,), _is_op(op), f"new op: {summary}")


#: Every feature since 1.0, oldest first. Versions group what an old plugin is hurt by:
#: 1.1 changed which shapes an op it already accepted takes (it raises or tiles wrong),
#: 1.2 fixed results a 1.0 plugin computes differently only on special values, 1.3 added
#: ops and enum values that a plugin accepting "every UNARY" would compute wrongly, 1.4
#: added the rotation llama.cpp applies to a quantized KV cache. (flash_attn_ext's
#: quantized K and V are new storage types, which raise no version: a plugin's
#: ``_supports_op`` checks the types it reads.)
FEATURES: tuple[Feature, ...] = (
    Feature(
        "tiled_broadcast",
        (1, 1),
        (Op.ADD, Op.SUB, Op.MUL, Op.DIV),
        _tiled_b,
        "b is repeated onto a when each of its extents divides a's (ggml_can_repeat: "
        "b (6, 2) onto a (6, 4) is b twice along the row), not only when it is 1 or equal",
    ),
    Feature(
        "mask_tiling",
        (1, 1),
        (Op.SOFT_MAX,),
        _tiled_mask,
        "the mask's head and batch counts may divide a's: head h uses mask head h % n "
        "(ggml's i02 % ne12), not only 1 or equal",
    ),
    Feature(
        "special_values",
        (1, 2),
        (Op.UNARY, Op.ARGMAX),
        _special,
        "ggml's results on special values and ties: relu(NaN) is 0; gelu is 0 at and below "
        "-10 (so gelu(-inf) is 0) and x at and above 10; argmax gives the last of tied "
        "maxima and a NaN restarts its search. Values cannot be seen on a node, so every "
        "relu, gelu and argmax node needs it",
    ),
    Feature(
        "unary_gelu_variants",
        (1, 3),
        (Op.UNARY,),
        _unary_fn(UnaryOp.GELU_QUICK, UnaryOp.GELU_ERF),
        "new unary functions gelu_quick and gelu_erf",
    ),
    Feature(
        "glu_variants",
        (1, 3),
        (Op.GLU,),
        lambda node: node.op_params.get("fn", GluOp.SWIGLU) is not GluOp.SWIGLU,
        "new gated units reglu, geglu, geglu_erf and geglu_quick beside swiglu",
    ),
    _new_op(Op.MUL_MAT_ID, "mixture-of-experts products (ggml_mul_mat_id)"),
    _new_op(Op.TOP_K, "the indices of each row's k largest values"),
    _new_op(Op.REPEAT, "tiling to a larger shape (ggml_repeat)"),
    _new_op(Op.CLAMP, "clamping to [min, max] as ggml writes it"),
    _new_op(Op.PAD, "zeros appended at the end of each axis"),
    Feature(
        "hadamard",
        (1, 4),
        (Op.HADAMARD,),
        _is_op(Op.HADAMARD),
        "new op: a Walsh–Hadamard rotation of each run of n values, what llama.cpp applies "
        "to the queries, keys and values of a quantized KV cache",
    ),
)

#: Every contract version, oldest first, and the newest: what ``API_VERSION`` provides.
VERSIONS: tuple[tuple[int, int], ...] = (BASE_VERSION, *sorted({f.version for f in FEATURES}))
LATEST_VERSION: tuple[int, int] = VERSIONS[-1]

_BY_OP: dict[Op, tuple[Feature, ...]] = {
    op: tuple(f for f in FEATURES if op in f.ops) for op in {op for f in FEATURES for op in f.ops}
}


def needed_features(node: Tensor) -> list[Feature]:
    """Every post-1.0 feature ``node`` needs, oldest first."""
    return [f for f in _BY_OP.get(node.op, ()) if f.needs(node)]


def required_version(node: Tensor) -> tuple[int, int]:
    """The oldest contract version a plugin must declare to be handed ``node``."""
    return max((f.version for f in needed_features(node)), default=BASE_VERSION)


def missing_feature(node: Tensor, declared: tuple[int, int]) -> Feature | None:
    """The first feature ``node`` needs that is newer than ``declared``, or None.

    Asked by :meth:`Device.supports_op <tensorplug.Device.supports_op>` for every node
    before the plugin's own answer, so it costs one comparison for a plugin declaring
    the newest contract, and a dict lookup for the others.
    """
    if declared >= LATEST_VERSION:
        return None
    for f in _BY_OP.get(node.op, ()):
        if f.version > declared and f.needs(node):
            return f
    return None


def features_after(declared: tuple[int, int]) -> list[Feature]:
    """The features a plugin declaring ``declared`` does not implement, oldest first."""
    return [f for f in FEATURES if f.version > declared]


# -- checking nodes --------------------------------------------------------------------------


def problems(node: Tensor) -> list[str]:
    """Where ``node`` departs from the contract (empty when it conforms)."""
    return list(_problems(node))


def conforms(node: Tensor) -> bool:
    """True when ``node`` has the operands and parameters its op's contract lists
    (:func:`problems` is empty), decided without writing any of them: a scheduler asks
    this of every node whenever it splits a graph and a CPU plan again when it binds
    one, twice for each node of every new step shape (a prompt of a new length). So it
    walks each op's checks prepared once (:class:`_Shape`) with plain loops, a fraction
    of what a generator over :func:`_problems` costs a node."""
    if node.op is Op.NONE:
        return True
    shape = _SHAPES.get(node.op)
    if shape is None:
        return False
    src = node.src
    if not shape.n_min <= len(src) <= shape.n_max:
        return False
    for s in src:
        if not isinstance(s, Tensor):
            return False
    params = node.op_params
    if len(params) != len(shape.params):
        return False
    for name, kind in shape.params:
        if name not in params or not _is(params[name], kind):
            return False
    return True


@dataclass(frozen=True)
class _Shape:
    """What :func:`conforms` checks of a node of one op, from its :class:`OpSpec`."""

    n_min: int
    n_max: int
    params: tuple[tuple[str, type], ...]


_SHAPES: dict[Op, _Shape] = {
    op: _Shape(spec.n_required, len(spec.operands), tuple((p.name, p.type) for p in spec.params))
    for op, spec in CONTRACT.items()
}


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


#: Why each version holds what it holds, for docs/ops.md (every version has a line).
_VERSION_NOTES: dict[tuple[int, int], str] = {
    (1, 0): "the first release: the ops below as the guide described them then",
    (1, 1): "ops a 1.0 plugin already accepted take more shapes: such a plugin raises or "
    "computes wrong values on them",
    (1, 2): "results on special values and ties pinned to ggml's: a 1.0 plugin differs "
    "only there, but nothing on a node says when",
    (1, 3): "new ops and new functions of existing ops: a plugin that accepts every "
    "UNARY or GLU node whatever its fn would compute them wrongly",
    (1, 4): "a new op, for a quantized KV cache: a plugin that accepts every op would "
    "compute it wrongly",
}


def render_markdown() -> str:
    """docs/ops.md: the contract as a reference page, with its versions and each op's
    changelog."""
    lines = [
        "# Op reference",
        "",
        "Generated from `tensorplug.contract` (`python -m tensorplug.contract > docs/ops.md`;",
        "a test fails when this page is out of date). For every op: the operands a backend",
        "finds in `node.src`, in order (an optional operand is present only when it was given,",
        "and optional ones come last), the parameters in `node.op_params`, the result, and",
        "what it gained in which contract version.",
        "Shapes are numpy order (outermost first); `node.ne()` gives ggml's order. The",
        "builders' docstrings in `tensorplug.ops` give the exact formulas.",
        "",
        "## Contract versions",
        "",
        "A plugin implements the contract version of its registration's `api_version`",
        "(plugin API 1.x is op contract 1.x) and is never handed a node that needs a later",
        "feature: `Device.supports_op` says no before asking it, so the scheduler runs the",
        "node on another backend, and `tensorplug check` reports such cases as unsupported",
        "(contract 1.x needed). A version adds features and never removes one, so declaring",
        "1.x means implementing everything up to 1.x. How to upgrade a plugin:",
        "[writing-a-backend.md](writing-a-backend.md#upgrading-a-plugin).",
        "",
        "| version | why these belong together | features |",
        "| --- | --- | --- |",
    ]
    for v in VERSIONS:
        names = ", ".join(f"`{f.name}`" for f in FEATURES if f.version == v) or "-"
        lines.append(f"| {version_label(v)} | {_VERSION_NOTES[v]} | {names} |")
    lines += ["", "| feature | version | ops | what it means |", "| --- | --- | --- | --- |"]
    for f in FEATURES:
        ops = ", ".join(f"`{op.value}`" for op in f.ops)
        lines.append(f"| `{f.name}` | {version_label(f.version)} | {ops} | {f.summary}. |")
    lines.append("")
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
        lines += ["", *_changelog(spec.op), ""]
    return "\n".join(lines)


def _changelog(op: Op) -> list[str]:
    found = _BY_OP.get(op, ())
    new = [f for f in found if f.name == op.value]
    since = version_label(new[0].version if new else BASE_VERSION)
    changes = [f for f in found if f not in new]
    if not changes:
        return [f"Changelog: in the contract since {since}, unchanged since."]
    out = [f"Changelog (in the contract since {since}):", ""]
    out += [f"- {version_label(f.version)} `{f.name}`: {f.summary}." for f in changes]
    return out


if __name__ == "__main__":
    sys.stdout.write(render_markdown())

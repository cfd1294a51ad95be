"""Graph-building functions: the op set and the exact contract each op stands for.

Every function validates its operands when it is called and raises
:class:`~tensorplug.ShapeError` or :class:`~tensorplug.TypeMismatchError` naming the
op, the operand and what was expected, so a mistake surfaces where the graph is built,
never inside a kernel. Nothing here computes or allocates; the docstrings are the
semantics every backend implements and the conformance kit checks.

Conventions (all numpy order, ``shape[-1]`` is ggml's ``ne[0]``):

* Broadcasting is ggml's ``can_repeat``: ``b`` tiles onto ``a`` when, aligned from the
  right, each of ``b``'s dimensions divides ``a``'s; element ``i`` of ``a`` meets
  element ``i % b.shape`` of ``b`` (axis by axis). numpy's rule (a dimension of 1) is
  the special case; ``a (6, 4) + b (2, 4)`` repeats ``b`` three times. The result always
  has ``a``'s shape.
* "Float types" are F32, F16 and BF16. Results are F32 unless stated otherwise.
* Ops producing a new tensor give it contiguous strides.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

from .errors import OpParamError, ShapeError, TypeMismatchError
from .opcodes import GluOp, Op, RopeMode, SortOrder, UnaryOp
from .tensor import MAX_DIMS, Tensor
from .types import Type

__all__ = [
    "abs", "add", "argmax", "argsort", "argsort_top_k", "clamp", "concat", "cont", "cpy",
    "div", "dup", "exp", "flash_attn_ext", "geglu", "geglu_erf", "geglu_quick", "gelu",
    "gelu_erf", "gelu_quick", "get_rows", "glu", "layer_norm", "mul", "mul_mat",
    "mul_mat_id", "neg", "norm", "pad", "permute", "reglu", "relu", "repeat", "reshape",
    "rms_norm", "rope", "scale", "set_rows", "sigmoid", "silu", "soft_max", "sub",
    "sum_rows", "swiglu", "tanh", "top_k", "transpose", "unary", "view",
]  # fmt: skip

FLOAT_TYPES = frozenset({Type.F32, Type.F16, Type.BF16})
INDEX_TYPES = frozenset({Type.I32, Type.I64})


# -- validation helpers ------------------------------------------------------------------


def _tensor(op: str, what: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeMismatchError(
            f"{op}: {what} must be a Tensor, got {type(t).__name__} {t!r}; scalars go through "
            "ops.scale, or become tensors with new_tensor + set_array"
        )
    return t


def _check_type(op: str, what: str, t: Tensor, allowed: frozenset[Type] | set[Type]) -> None:
    _tensor(op, what, t)
    if t.type not in allowed:
        names = ", ".join(sorted(a.name for a in allowed))
        raise TypeMismatchError(f"{op}: {what} {t.describe()} must be one of {names}")


def _eps(op: str, eps: float) -> float:
    value = float(eps)
    if not value >= 0 or math.isinf(value):  # NaN fails too
        raise OpParamError(f"{op}: eps must be a finite number >= 0, got {eps!r}")
    return value


def _member(op: str, param: str, enum: Any, value: Any) -> Any:
    """``value`` as a member of ``enum``, or an OpParamError listing the choices."""
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in enum)
        raise OpParamError(f"{op}: {param} {value!r} is not one of {choices}") from None


def _fail(op: str, message: str) -> ShapeError:
    return ShapeError(f"{op}: {message}")


def _padded(shape: Sequence[int], ndim: int = MAX_DIMS) -> tuple[int, ...]:
    return (1,) * (ndim - len(shape)) + tuple(shape)


def can_repeat(small: Sequence[int], big: Sequence[int]) -> bool:
    """ggml's ``ggml_can_repeat``: ``small`` tiles onto ``big`` — aligned from the right,
    each dimension of ``small`` divides ``big``'s (an empty ``small`` only onto an empty
    ``big``)."""
    if len(small) > len(big):
        return False
    ps, pb = _padded(small, len(big)), tuple(big)
    if 0 in ps:
        return 0 in pb
    return all(db % ds == 0 for ds, db in zip(ps, pb, strict=True))


def _check_broadcast(op: str, a: Tensor, b: Tensor) -> None:
    """ggml's ``ggml_can_repeat``: every extent of ``b`` divides ``a``'s, so ``b`` is
    repeated (tiled) to ``a``'s shape — 1 broadcasts, equal matches."""
    if b.ndim > a.ndim or any(
        db != da and (db == 0 or da % db)
        for da, db in zip(_padded(a.shape), _padded(b.shape), strict=True)
    ):
        raise _fail(
            op,
            f"b {b.describe()} does not repeat onto a {a.describe()}: each dimension of b "
            "(aligned from the right) must divide a's (1 broadcasts; a divisor is tiled)",
        )


def _new(
    t: Type,
    shape: Sequence[int],
    op: Op,
    src: Sequence[Tensor],
    params: dict[str, Any] | None = None,
) -> Tensor:
    return Tensor(t, shape, op=op, src=src, op_params=params or {})


def _view_like(
    a: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int, op: Op,
    params: dict[str, Any] | None = None,
) -> Tensor:  # fmt: skip
    _tensor(op.value, "a", a)
    if offset % a.type.type_size:  # an element (or quant block) never starts mid-way
        unit = "block" if a.type.block_size > 1 else "element"
        raise _fail(
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
        raise _fail(
            op.value,
            f"the view (offset {out.view_offs}, {out.nbytes} bytes) reaches past the end of "
            f"{base.describe()}, which has {base.nbytes} bytes",
        )
    return out


# -- elementwise arithmetic ----------------------------------------------------------------


def _binary(op: Op, a: Tensor, b: Tensor) -> Tensor:
    _check_type(op.value, "a", a, FLOAT_TYPES)
    _check_type(op.value, "b", b, FLOAT_TYPES)
    _check_broadcast(op.value, a, b)
    return _new(a.type, a.shape, op, (a, b))


def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.ADD, a, b)


def sub(a: Tensor, b: Tensor) -> Tensor:
    """``a - b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.SUB, a, b)


def mul(a: Tensor, b: Tensor) -> Tensor:
    """``a * b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.MUL, a, b)


def div(a: Tensor, b: Tensor) -> Tensor:
    """``a / b``, ``b`` repeated onto ``a`` (its extents divide a's); a's type and shape."""
    return _binary(Op.DIV, a, b)


def scale(a: Tensor, s: float, bias: float = 0.0) -> Tensor:
    """``a * s + bias`` elementwise (``ggml_scale_bias``); same type and shape as ``a``."""
    _check_type("scale", "a", a, FLOAT_TYPES)
    return _new(a.type, a.shape, Op.SCALE, (a,), {"scale": float(s), "bias": float(bias)})


def unary(a: Tensor, fn: UnaryOp | str) -> Tensor:
    """Apply an elementwise function; same type and shape as ``a``.

    abs ``|x|``; neg ``-x``; relu ``max(x, 0)``; gelu with ggml's tanh approximation
    ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, 0 for x <= -10 and x for x >= 10 as
    ggml clamps it (so gelu(-inf) = 0, gelu(inf) = inf); gelu_quick ``x·σ(1.702·x)``;
    gelu_erf ``0.5·x·(1 + erf(x/√2))``; silu ``x·σ(x)``; exp ``eˣ``;
    tanh; sigmoid ``σ(x) = 1/(1 + e⁻ˣ)``.
    """
    fn = UnaryOp(_member("unary", "fn", UnaryOp, fn))
    _check_type(f"unary({fn.value})", "a", a, FLOAT_TYPES)
    return _new(a.type, a.shape, Op.UNARY, (a,), {"fn": fn})


def abs(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.ABS)


def neg(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.NEG)


def relu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.RELU)


def gelu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.GELU)


def silu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.SILU)


def gelu_quick(a: Tensor) -> Tensor:
    """``x·σ(1.702·x)`` (``ggml_gelu_quick``)."""
    return unary(a, UnaryOp.GELU_QUICK)


def gelu_erf(a: Tensor) -> Tensor:
    """``0.5·x·(1 + erf(x/√2))``, the exact GELU (``ggml_gelu_erf``)."""
    return unary(a, UnaryOp.GELU_ERF)


def exp(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.EXP)


def tanh(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.TANH)


def sigmoid(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.SIGMOID)


def clamp(a: Tensor, min: float, max: float) -> Tensor:
    """``max(min(x, hi), lo)`` elementwise, written as ggml's ``MAX(MIN(x, hi), lo)``.

    The bounds may be infinite, not NaN. Following ggml's comparisons a NaN input gives
    ``hi``, and ``lo > hi`` gives ``lo`` everywhere. Same type and shape as ``a``
    (ggml's ``ggml_clamp`` returns a view of ``a``; the allocator's in-place reuse gives
    the same memory saving here without aliasing surprises).
    """
    _check_type("clamp", "a", a, FLOAT_TYPES)
    lo, hi = float(min), float(max)
    if math.isnan(lo) or math.isnan(hi):
        raise OpParamError(f"clamp: bounds must not be NaN, got min={min!r}, max={max!r}")
    return _new(a.type, a.shape, Op.CLAMP, (a,), {"min": lo, "max": hi})


def glu(
    a: Tensor, b: Tensor | None = None, fn: GluOp | str = GluOp.SWIGLU, *, swapped: bool = False
) -> Tensor:
    """A gated unit ``act(x) * g`` (``ggml_glu`` / ``ggml_glu_split``); ``fn`` picks the
    activation: swiglu (silu), reglu (relu), geglu (gelu, tanh form, clamped as ggml),
    geglu_erf (gelu, erf form), geglu_quick (gelu_quick).

    With ``b``: ``act(a) * b``; both have the same shape, the result too.
    Without ``b``: ``a``'s last axis (even length ``2n``) is split in halves
    ``x = a[..., :n]`` and ``g = a[..., n:]`` and the result is ``act(x) * g`` with
    last axis ``n`` (``swapped`` exchanges the roles of the halves). Same type as ``a``.
    """
    fn = GluOp(_member("glu", "fn", GluOp, fn))
    name = fn.value
    _check_type(name, "a", a, FLOAT_TYPES)
    params = {"fn": fn, "swapped": bool(swapped)}
    if b is not None:
        if swapped:
            raise _fail(name, "swapped applies to the split form only; with b, swap the operands")
        _check_type(name, "b", b, {a.type})
        if b.shape != a.shape:
            raise _fail(name, f"b {b.describe()} must have the shape of a {a.describe()}")
        return _new(a.type, a.shape, Op.GLU, (a, b), params)
    if a.shape[-1] % 2:
        raise _fail(name, f"a {a.describe()} needs an even last dimension to split in halves")
    return _new(a.type, (*a.shape[:-1], a.shape[-1] // 2), Op.GLU, (a,), params)


def swiglu(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """SwiGLU, ``silu(x) * g``, the gated MLP of llama (``ggml_swiglu``); see :func:`glu`."""
    return glu(a, b, GluOp.SWIGLU, swapped=swapped)


def reglu(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``relu(x) * g`` (``ggml_reglu``); see :func:`glu`."""
    return glu(a, b, GluOp.REGLU, swapped=swapped)


def geglu(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``gelu(x) * g``, gelu's tanh form as ggml clamps it (``ggml_geglu``); see :func:`glu`."""
    return glu(a, b, GluOp.GEGLU, swapped=swapped)


def geglu_erf(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``gelu_erf(x) * g`` (``ggml_geglu_erf``); see :func:`glu`."""
    return glu(a, b, GluOp.GEGLU_ERF, swapped=swapped)


def geglu_quick(a: Tensor, b: Tensor | None = None, *, swapped: bool = False) -> Tensor:
    """``gelu_quick(x) * g`` (``ggml_geglu_quick``); see :func:`glu`."""
    return glu(a, b, GluOp.GEGLU_QUICK, swapped=swapped)


# -- normalisation -------------------------------------------------------------------------


def norm(a: Tensor, eps: float) -> Tensor:
    """Per row: ``(x - mean(x)) / sqrt(var(x) + eps)`` (population variance)."""
    _check_type("norm", "a", a, FLOAT_TYPES)
    return _new(a.type, a.shape, Op.NORM, (a,), {"eps": _eps("norm", eps)})


def layer_norm(a: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm: ``norm(a, eps)·weight + bias``, either factor optional.

    ggml has no fused op for this (llama.cpp composes ``ggml_norm``, ``ggml_mul`` and
    ``ggml_add``); this helper does the same, so each backend sees only ops it already
    has, and ``weight``/``bias`` broadcast (or tile) as :func:`mul` and :func:`add` say.
    """
    out = norm(a, eps)
    if weight is not None:
        out = mul(out, weight)
    if bias is not None:
        out = add(out, bias)
    return out


def rms_norm(a: Tensor, eps: float) -> Tensor:
    """Per row: ``x / sqrt(mean(x²) + eps)``, as llama's RMSNorm before its weight."""
    _check_type("rms_norm", "a", a, FLOAT_TYPES)
    return _new(a.type, a.shape, Op.RMS_NORM, (a,), {"eps": _eps("rms_norm", eps)})


# -- matrix products and attention -----------------------------------------------------------


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """``b · aᵀ`` per batch (``ggml_mul_mat``): the result is F32.

    ``a`` is the weight ``(…, n_out, n_in)`` of any float or quantized type; ``b`` the
    activations ``(…, n_tokens, n_in)`` in a float type. Result ``(…, n_tokens, n_out)``
    with ``out[..., t, o] = Σᵢ b[..., t, i] · a[..., o, i]``. Batch axes (the first
    two of four) of ``a`` are repeated onto ``b``'s: each of ``b``'s batch extents must
    be a multiple of ``a``'s, and batch ``j`` of ``b`` uses batch ``j // (nb/na)`` of
    ``a`` (consecutive query heads share a KV head, as grouped-query attention needs).
    ``a`` must have dense rows (quantized rows are read block by block).
    """
    _check_type("mul_mat", "a", a, FLOAT_TYPES | {t for t in Type if t.is_quantized})
    _check_type("mul_mat", "b", b, FLOAT_TYPES)
    if a.shape[-1] != b.shape[-1]:
        raise _fail(
            "mul_mat",
            f"a {a.describe()} and b {b.describe()} must share their last (n_in) dimension",
        )
    if a.type.is_quantized and not a.rows_contiguous:
        raise _fail("mul_mat", f"quantized a {a.describe()} must have dense rows")
    ndim = max(a.ndim, b.ndim, 2)
    pa, pb = _padded(a.shape, ndim), _padded(b.shape, ndim)
    for da, db in zip(pa[:-2], pb[:-2], strict=True):
        if db % da:
            raise _fail(
                "mul_mat",
                f"batch dimensions of b {b.describe()} must be multiples of a's {a.describe()}",
            )
    return _new(Type.F32, (*pb[:-2], pb[-2], pa[-2])[-ndim:], Op.MUL_MAT, (a, b))


def mul_mat_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Mixture-of-experts product: each token's rows meet the experts it chose
    (``ggml_mul_mat_id``). The result is F32.

    ``a`` stacks the experts' weights, ``(n_expert, n_out, n_in)`` (ggml ``[n_in, n_out,
    n_expert]``), any float or quantized type with dense rows; ``b`` is the activations
    ``(n_tokens, n_b, n_in)`` in a float type, where ``n_b`` divides ``n_used`` (1: one
    row per token shared by all its experts, or ``n_used``: a row per slot); ``ids`` is
    I32 ``(n_tokens, n_used)``, expert indices in ``[0, n_expert)``. Result ``(n_tokens,
    n_used, n_out)`` with ``out[t, e, :] = a[ids[t, e]] · b[t, e % n_b, :]``. An index
    outside ``[0, n_expert)`` is an :class:`~tensorplug.OutOfBoundsError` when computed.
    """
    _check_type("mul_mat_id", "a", a, FLOAT_TYPES | {t for t in Type if t.is_quantized})
    _check_type("mul_mat_id", "b", b, FLOAT_TYPES)
    _check_type("mul_mat_id", "ids", ids, {Type.I32})
    if a.ndim != 3 or b.ndim != 3 or ids.ndim != 2:
        raise _fail(
            "mul_mat_id",
            f"expected a (n_expert, n_out, n_in), b (n_tokens, n_b, n_in) and ids (n_tokens, "
            f"n_used); got a {a.describe()}, b {b.describe()}, ids {ids.describe()}",
        )
    if a.shape[-1] != b.shape[-1]:
        raise _fail(
            "mul_mat_id", f"a {a.describe()} and b {b.describe()} must share their last (n_in) axis"
        )
    if ids.shape[0] != b.shape[0]:
        raise _fail(
            "mul_mat_id", f"ids {ids.describe()} needs one row per token of b {b.describe()}"
        )
    if ids.shape[1] % b.shape[1]:
        raise _fail(
            "mul_mat_id",
            f"b's rows per token ({b.shape[1]}) must divide the experts used per token "
            f"({ids.shape[1]})",
        )
    if not a.rows_contiguous:
        raise _fail("mul_mat_id", f"a {a.describe()} must have dense rows")
    return _new(Type.F32, (b.shape[0], ids.shape[1], a.shape[1]), Op.MUL_MAT_ID, (a, b, ids))


def soft_max(
    a: Tensor, mask: Tensor | None = None, scale: float = 1.0, max_bias: float = 0.0
) -> Tensor:
    """Row-wise softmax of ``a·scale + slope·mask`` (``ggml_soft_max_ext``).

    ``a`` is F32 ``(…, rows, n)``. ``mask`` (F32 or F16) has last axis ``n``, at least
    ``rows`` rows (row ``r`` of ``a`` uses mask row ``r``), and outer axes that divide
    ``a``'s: head ``h`` of ``a`` uses mask head ``h % n_mask_heads`` (ggml's ``i02 %
    ne12``; 2 mask heads serve 4 heads as 0, 1, 0, 1), the same for the batch axis.
    ``slope`` is 1 unless ``max_bias > 0`` (ALiBi): then for head ``h``
    (``a``'s third-from-last axis, ``n_head`` heads), with ``m = 2^⌊log2 n_head⌋``,
    ``slope = 2^(-max_bias/m)^(h+1)`` for ``h < m`` else
    ``2^(-max_bias/(2m))^(2(h-m)+1)``. ``-inf`` mask entries give weight 0.
    """
    _check_type("soft_max", "a", a, {Type.F32})
    params = {"scale": float(scale), "max_bias": float(max_bias)}
    if mask is None:
        if max_bias > 0:
            raise _fail("soft_max", "max_bias (ALiBi) needs a mask to add the bias to")
        return _new(Type.F32, a.shape, Op.SOFT_MAX, (a,), params)
    _check_type("soft_max", "mask", mask, {Type.F32, Type.F16})
    if mask.ndim < 2 or mask.shape[-1] != a.shape[-1] or mask.shape[-2] < _padded(a.shape)[-2]:
        raise _fail(
            "soft_max",
            f"mask {mask.describe()} must be (…, >= {_padded(a.shape)[-2]}, {a.shape[-1]}) "
            f"for a {a.describe()}",
        )
    if mask.ndim > max(a.ndim, 2) or any(
        da % dm for da, dm in zip(_padded(a.shape)[:-2], _padded(mask.shape)[:-2], strict=True)
    ):
        raise _fail("soft_max", f"mask {mask.describe()} outer axes must divide a's {a.describe()}")
    return _new(Type.F32, a.shape, Op.SOFT_MAX, (a, mask), params)


def rope(
    a: Tensor,
    pos: Tensor,
    n_dims: int,
    mode: RopeMode | int = RopeMode.NORMAL,
    *,
    freq_base: float = 10000.0,
    freq_scale: float = 1.0,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    n_ctx_orig: int = 0,
    freq_factors: Tensor | None = None,
) -> Tensor:
    """Rotary position embedding with YaRN scaling (``ggml_rope_ext``).

    ``a`` is ``(…, n_tokens, n_head, head_dim)`` (ggml ``[head_dim, n_head, n_tokens]``)
    in F32 or F16; ``pos`` is I32 ``(n_tokens,)``. The first ``n_dims`` (even, at most
    ``head_dim``) values of each head are rotated, the rest copied. For pair ``i`` in
    ``0 .. n_dims/2``: ``θ = pos · freq_base^(-2i/n_dims) / ff[i]`` (``ff`` =
    ``freq_factors``, F32 ``(n_dims/2,)``, or 1) and the pair is rotated by the YaRN
    angle and magnitude of ggml's ``rope_yarn(θ, freq_scale, corr_dims, i, ext_factor,
    attn_factor)``: ``θ_i = freq_scale·θ`` mixed towards ``θ`` by the ramp between the
    correction dims from ``beta_fast``/``beta_slow``/``n_ctx_orig`` when ``ext_factor``
    ≠ 0, and ``mscale = attn_factor·(1 + 0.1·ln(1/freq_scale))`` in that case, else
    ``attn_factor``. NORMAL mode pairs ``(x[2i], x[2i+1])``; NEOX mode pairs
    ``(x[i], x[i + n_dims/2])``. Rotation: ``(x0·cos - x1·sin, x0·sin + x1·cos)·mscale``.
    """
    _check_type("rope", "a", a, {Type.F32, Type.F16})
    _check_type("rope", "pos", pos, {Type.I32})
    mode = _member("rope", "mode", RopeMode, mode)
    if a.ndim < 3:
        raise _fail("rope", f"a {a.describe()} must be (…, n_tokens, n_head, head_dim)")
    if pos.ndim != 1 or pos.shape[0] != a.shape[-3]:
        raise _fail(
            "rope", f"pos {pos.describe()} must be ({a.shape[-3]},): one position per token"
        )
    if n_dims <= 0 or n_dims % 2 or n_dims > a.shape[-1]:
        raise _fail(
            "rope", f"n_dims={n_dims} must be even, positive and at most head_dim={a.shape[-1]}"
        )
    src: tuple[Tensor, ...] = (a, pos)
    if freq_factors is not None:
        _check_type("rope", "freq_factors", freq_factors, {Type.F32})
        if freq_factors.shape != (n_dims // 2,):
            raise _fail("rope", f"freq_factors {freq_factors.describe()} must be ({n_dims // 2},)")
        src = (a, pos, freq_factors)
    params = {
        "n_dims": int(n_dims), "mode": mode, "freq_base": float(freq_base),
        "freq_scale": float(freq_scale), "ext_factor": float(ext_factor),
        "attn_factor": float(attn_factor), "beta_fast": float(beta_fast),
        "beta_slow": float(beta_slow), "n_ctx_orig": int(n_ctx_orig),
    }  # fmt: skip
    return _new(a.type, a.shape, Op.ROPE, src, params)


def flash_attn_ext(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float = 1.0,
    max_bias: float = 0.0,
    logit_softcap: float = 0.0,
) -> Tensor:
    """Fused attention ``softmax(q·kᵀ·scale + mask)·v`` (``ggml_flash_attn_ext``).

    ``q`` ``(B, H, n_q, D)`` F32; ``k`` ``(B, H_kv, n_kv, D)`` and ``v``
    ``(B, H_kv, n_kv, D_v)`` in F32 or F16, ``H`` a multiple of ``H_kv`` (query head
    ``h`` uses KV head ``h // (H/H_kv)``); ``mask`` F16 or F32 ``(…, >= n_q, n_kv)``
    with outer axes 1 or matching. With ``logit_softcap`` ``c > 0`` the logits are
    ``c·tanh(logits/c)`` before the mask; ``max_bias`` applies ALiBi as in
    :func:`soft_max`. The result is F32 ``(B, n_q, H, D_v)`` — heads and tokens swapped
    relative to ``q``, as in ggml, so it reshapes directly to ``(B, n_q, H·D_v)``.
    Leading batch axes may be omitted (3-d operands).
    """
    _check_type("flash_attn_ext", "q", q, {Type.F32})
    _check_type("flash_attn_ext", "k", k, FLOAT_TYPES)
    _check_type("flash_attn_ext", "v", v, {k.type})
    if not 3 <= q.ndim == k.ndim == v.ndim:
        raise _fail(
            "flash_attn_ext",
            f"q, k and v must all be 3-d or 4-d (…, heads, tokens, dim); got {q.describe()}, "
            f"{k.describe()}, {v.describe()}",
        )
    pq, pk, pv = _padded(q.shape), _padded(k.shape), _padded(v.shape)
    if pk[-1] != pq[-1] or pk[-2] != pv[-2] or pk[:-3] != pq[:-3] or pv[:-2] != pk[:-2]:
        raise _fail(
            "flash_attn_ext",
            f"shapes do not agree: q {q.describe()}, k {k.describe()}, v {v.describe()} "
            "(q/k share head dim; k/v share batch, heads and n_kv)",
        )
    if pq[-3] % pk[-3]:
        raise _fail("flash_attn_ext", f"q heads {pq[-3]} must be a multiple of k/v heads {pk[-3]}")
    src: tuple[Tensor, ...] = (q, k, v)
    if mask is not None:
        _check_type("flash_attn_ext", "mask", mask, {Type.F32, Type.F16})
        pm = _padded(mask.shape)
        if mask.shape[-1] != pk[-2] or pm[-2] < pq[-2]:
            raise _fail(
                "flash_attn_ext",
                f"mask {mask.describe()} must be (…, >= {pq[-2]}, {pk[-2]})",
            )
        if any(dm not in (1, dq) for dq, dm in zip(pq[:-2], pm[:-2], strict=True)):
            raise _fail("flash_attn_ext", f"mask {mask.describe()} outer axes must be 1 or match q")
        src = (q, k, v, mask)
    elif max_bias > 0:
        raise _fail("flash_attn_ext", "max_bias (ALiBi) needs a mask")
    out_shape = (*pq[:-3], pq[-2], pq[-3], pv[-1])[-q.ndim :]
    params = {"scale": float(scale), "max_bias": float(max_bias),
              "logit_softcap": float(logit_softcap)}  # fmt: skip
    return _new(Type.F32, out_shape, Op.FLASH_ATTN_EXT, src, params)


# -- copies and conversions --------------------------------------------------------------------


def _convertible(src: Type, dst: Type) -> bool:
    if src == dst:
        return True
    floatish = FLOAT_TYPES | {t for t in Type if t.is_quantized}
    return src in floatish and dst in floatish and not (src.is_quantized and dst.is_quantized)


def cpy(a: Tensor, b: Tensor) -> Tensor:
    """Copy ``a``'s values into ``b``, converting to ``b``'s type; returns a view of ``b``.

    Element ``k`` of ``a`` in C order goes to element ``k`` of ``b`` in C order, so only
    the element counts must agree. Conversions: between float types, from a float type
    to a quantized one (rows are quantized as GGUF does) and back, or a type to itself.
    """
    if a.nelements != b.nelements:
        raise _fail(
            "cpy", f"a {a.describe()} and b {b.describe()} must have the same number of elements"
        )
    if not _convertible(a.type, b.type):
        raise TypeMismatchError(f"cpy: cannot convert {a.describe()} to {b.type.name}")
    out = Tensor(b.type, b.shape, strides=b.strides, op=Op.CPY, src=(a, b), view_src=b)
    return out


def dup(a: Tensor) -> Tensor:
    """A contiguous copy of ``a`` with the same type and shape."""
    return _new(a.type, a.shape, Op.DUP, (a,))


def cont(a: Tensor, shape: Sequence[int] | None = None) -> Tensor:
    """A contiguous copy of ``a`` (``ggml_cont``), optionally reshaped to ``shape``."""
    new_shape = a.shape if shape is None else tuple(shape)
    count = 1
    for d in new_shape:
        count *= d
    if count != a.nelements:
        raise _fail("cont", f"cannot lay out {a.describe()} as shape {new_shape}")
    return _new(a.type, new_shape, Op.CONT, (a,))


def get_rows(a: Tensor, rows: Tensor) -> Tensor:
    """Gather rows of ``a`` by index (``ggml_get_rows``), dequantizing them.

    ``a`` is ``(…, n_rows, n)`` of any type; ``rows`` is I32 ``(…, k)``, whose outer axes
    equal ``a``'s outer axes (those before ``n_rows``). ``out[…, j, :] = a[…, rows[…, j],
    :]``, shape ``rows.shape + (n,)``; F32 unless ``a`` is I32 (then I32).
    """
    _check_type("get_rows", "rows", rows, {Type.I32})
    if a.ndim < 2:
        raise _fail("get_rows", f"a {a.describe()} must be at least 2-d (…, n_rows, n)")
    if rows.ndim != a.ndim - 1 or rows.shape[:-1] != a.shape[:-2]:
        raise _fail(
            "get_rows",
            f"rows {rows.describe()} must have shape (*{list(a.shape[:-2])}, k) to index "
            f"a {a.describe()}",
        )
    out_type = Type.I32 if a.type == Type.I32 else Type.F32
    return _new(out_type, (*rows.shape, a.shape[-1]), Op.GET_ROWS, (a, rows))


def set_rows(a: Tensor, b: Tensor, rows: Tensor) -> Tensor:
    """Scatter rows of ``b`` into ``a`` (``ggml_set_rows``); returns a view of ``a``.

    ``a`` ``(…, n_rows, n)`` of a float or quantized type is written in place;
    ``b`` F32 ``(…, k, n)`` with the same outer axes as ``a``; ``rows`` I32 or I64
    ``(…, k)`` with outer axes 1 or equal to ``b``'s. ``a[…, rows[…, j], :] = b[…, j, :]``
    converted to ``a``'s type. This is how a KV cache is written.
    """
    _check_type("set_rows", "b", b, {Type.F32})
    _check_type("set_rows", "rows", rows, INDEX_TYPES)
    if not _convertible(Type.F32, a.type):
        raise TypeMismatchError(f"set_rows: cannot store F32 rows into {a.describe()}")
    if a.ndim < 2 or b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[-1] != a.shape[-1]:
        raise _fail(
            "set_rows", f"b {b.describe()} must be (*{list(a.shape[:-2])}, k, {a.shape[-1]})"
        )
    pr, pb = _padded(rows.shape, b.ndim - 1), _padded(b.shape[:-1], b.ndim - 1)
    if (
        rows.ndim > b.ndim - 1
        or pr[-1] != pb[-1]
        or any(dr not in (1, db) for dr, db in zip(pr[:-1], pb[:-1], strict=True))
    ):
        raise _fail(
            "set_rows", f"rows {rows.describe()} must be (…, {b.shape[-2]}) to index b's rows"
        )
    return Tensor(a.type, a.shape, strides=a.strides, op=Op.SET_ROWS, src=(a, b, rows), view_src=a)


def concat(a: Tensor, b: Tensor, axis: int) -> Tensor:
    """Join ``a`` and ``b`` (same type and rank) along ``axis``; other axes must match."""
    if a.type != b.type:
        raise TypeMismatchError(f"concat: {a.describe()} and {b.describe()} differ in type")
    if a.ndim != b.ndim:
        raise _fail("concat", f"{a.describe()} and {b.describe()} differ in rank")
    if not -a.ndim <= axis < a.ndim:
        raise _fail("concat", f"axis {axis} is out of range for {a.ndim}-d tensors")
    axis %= a.ndim
    if a.type.is_quantized:
        raise TypeMismatchError(f"concat: quantized tensors are not supported ({a.describe()})")
    for i, (da, db) in enumerate(zip(a.shape, b.shape, strict=True)):
        if i != axis and da != db:
            raise _fail("concat", f"{a.describe()} and {b.describe()} differ outside axis {axis}")
    shape = list(a.shape)
    shape[axis] += b.shape[axis]
    return _new(a.type, shape, Op.CONCAT, (a, b), {"axis": axis})


# -- reductions ----------------------------------------------------------------------------------


def sum_rows(a: Tensor) -> Tensor:
    """Sum of each row: shape ``(*a.shape[:-1], 1)``, same float type."""
    _check_type("sum_rows", "a", a, FLOAT_TYPES)
    return _new(a.type, (*a.shape[:-1], 1), Op.SUM_ROWS, (a,))


def argmax(a: Tensor) -> Tensor:
    """Index of the largest value of each row: I32 ``a.shape[:-1]``.

    As ggml's CPU backend (``ggml_vec_argmax_f32``): the **last** index on ties, and a NaN
    restarts the search at the next element (a trailing NaN is ignored; an all-NaN row
    gives 0). Every tensorplug backend and the conformance kit agree on this. A 1-d
    input gives shape ``(1,)``.
    """
    _check_type("argmax", "a", a, {Type.F32})
    return _new(Type.I32, a.shape[:-1] or (1,), Op.ARGMAX, (a,))


def argsort(a: Tensor, order: SortOrder | str = SortOrder.ASC) -> Tensor:
    """Per row, the indices that sort it; I32 with ``a``'s shape.

    The sort is stable in both orders: equal values keep their index order (the lower
    index first, in DESC order too). ggml leaves ties unspecified (its CPU uses
    ``std::sort``), so this is a stricter promise: results are reproducible and every
    backend must agree bit for bit, ties included.
    """
    _check_type("argsort", "a", a, {Type.F32})
    return _new(
        Type.I32,
        a.shape,
        Op.ARGSORT,
        (a,),
        {"order": _member("argsort", "order", SortOrder, order)},
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
    _check_type("top_k", "a", a, {Type.F32})
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= a.shape[-1]:
        raise OpParamError(f"top_k: k must be an int in [1, {a.shape[-1]}], got {k!r}")
    return _new(Type.I32, (*a.shape[:-1], k), Op.TOP_K, (a,), {"k": k})


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
    _tensor("repeat", "a", a)
    target = tuple(shape.shape) if isinstance(shape, Tensor) else tuple(int(d) for d in shape)
    if a.type.is_quantized:
        raise TypeMismatchError(f"repeat: quantized tensors are not supported ({a.describe()})")
    if not 1 <= len(target) <= MAX_DIMS or not can_repeat(a.shape, target):
        raise _fail(
            "repeat",
            f"a {a.describe()} does not tile onto shape {target}: each dimension of a "
            "(aligned from the right) must divide the target's",
        )
    return _new(a.type, target, Op.REPEAT, (a,))


def pad(a: Tensor, after: Sequence[int]) -> Tensor:
    """``a`` followed by zeros: ``after[i]`` zeros appended along axis ``i`` (``ggml_pad``).

    ``after`` has one non-negative count per axis, numpy order (ggml's ``p0`` is
    ``after[-1]``). Result ``a.shape[i] + after[i]``; ``a``'s values at the start, 0
    everywhere else. Float types; same type as ``a``.
    """
    _check_type("pad", "a", a, FLOAT_TYPES)
    widths = tuple(after)
    if len(widths) != a.ndim or any(
        isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in widths
    ):
        raise OpParamError(
            f"pad: after must hold {a.ndim} ints >= 0 (one per axis of {a.describe()}), "
            f"got {after!r}"
        )
    shape = tuple(d + w for d, w in zip(a.shape, widths, strict=True))
    return _new(a.type, shape, Op.PAD, (a,), {"after": widths})


# -- views ----------------------------------------------------------------------------------------


def view(
    a: Tensor, shape: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0
) -> Tensor:
    """A tensor over ``a``'s memory at byte ``offset`` with its own shape and strides.

    Without ``strides`` the view is contiguous. It must lie inside ``a``'s base tensor.
    """
    if offset < 0:
        raise _fail("view", f"offset {offset} is negative")
    if strides is None:
        from .tensor import contiguous_strides

        strides = contiguous_strides(a.type, shape)
    return _view_like(a, shape, strides, offset, Op.VIEW, {"offset": offset})


def reshape(a: Tensor, shape: Sequence[int]) -> Tensor:
    """The same contiguous memory seen with another shape of equal element count."""
    if not a.is_contiguous:
        raise _fail("reshape", f"{a.describe()} is not contiguous; make it so with cont() first")
    count = 1
    for d in shape:
        count *= d
    if count != a.nelements:
        raise _fail("reshape", f"cannot reshape {a.describe()} to {tuple(shape)}")
    from .tensor import contiguous_strides

    return _view_like(a, shape, contiguous_strides(a.type, shape), 0, Op.RESHAPE)


def permute(a: Tensor, axes: Sequence[int]) -> Tensor:
    """Reorder axes like ``numpy.transpose``: ``out.shape[i] == a.shape[axes[i]]``.

    This is numpy's convention, not ggml's (whose ``ggml_permute`` says where each
    axis goes). A quantized tensor must keep its last axis last.
    """
    try:
        given = [operator.index(x) for x in axes if not isinstance(x, bool)]
    except TypeError:
        given = []
    if len(given) != len(tuple(axes)):
        raise OpParamError(f"permute: axes must be whole numbers, got {tuple(axes)!r}")
    axes = tuple(x % a.ndim if -a.ndim <= x < a.ndim else -1 for x in given)
    if sorted(axes) != list(range(a.ndim)):
        raise _fail("permute", f"axes {axes} are not a permutation of range({a.ndim})")
    if a.type.is_quantized and axes[-1] != a.ndim - 1:
        raise _fail("permute", f"quantized {a.describe()} must keep its last axis last")
    shape = [a.shape[i] for i in axes]
    strides = [a.strides[i] for i in axes]
    return _view_like(a, shape, strides, 0, Op.PERMUTE, {"axes": axes})


def transpose(a: Tensor) -> Tensor:
    """Swap the last two axes (``ggml_transpose``)."""
    if a.ndim < 2:
        raise _fail("transpose", f"{a.describe()} needs at least 2 dimensions")
    axes = list(range(a.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    out = permute(a, axes)
    out.op = Op.TRANSPOSE
    return out

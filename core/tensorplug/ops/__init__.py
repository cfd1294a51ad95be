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

from ._build import FLOAT_TYPES as FLOAT_TYPES
from ._build import INDEX_TYPES as INDEX_TYPES
from ._build import can_repeat as can_repeat
from .data import (
    argmax,
    argsort,
    argsort_top_k,
    concat,
    cont,
    cpy,
    dup,
    get_rows,
    pad,
    repeat,
    set_rows,
    sum_rows,
    top_k,
)
from .elementwise import (
    abs,
    add,
    clamp,
    div,
    exp,
    geglu,
    geglu_erf,
    geglu_quick,
    gelu,
    gelu_erf,
    gelu_quick,
    glu,
    mul,
    neg,
    reglu,
    relu,
    scale,
    sigmoid,
    silu,
    sub,
    swiglu,
    tanh,
    unary,
)
from .nn import (
    flash_attn_ext,
    hadamard,
    layer_norm,
    mul_mat,
    mul_mat_id,
    norm,
    rms_norm,
    rope,
    soft_max,
)
from .views import (
    permute,
    reshape,
    transpose,
    view,
)

__all__ = [
    "abs",
    "add",
    "argmax",
    "argsort",
    "argsort_top_k",
    "clamp",
    "concat",
    "cont",
    "cpy",
    "div",
    "dup",
    "exp",
    "flash_attn_ext",
    "geglu",
    "geglu_erf",
    "geglu_quick",
    "gelu",
    "gelu_erf",
    "gelu_quick",
    "get_rows",
    "hadamard",
    "glu",
    "layer_norm",
    "mul",
    "mul_mat",
    "mul_mat_id",
    "neg",
    "norm",
    "pad",
    "permute",
    "reglu",
    "relu",
    "repeat",
    "reshape",
    "rms_norm",
    "rope",
    "scale",
    "set_rows",
    "sigmoid",
    "silu",
    "soft_max",
    "sub",
    "sum_rows",
    "swiglu",
    "tanh",
    "top_k",
    "transpose",
    "unary",
    "view",
]

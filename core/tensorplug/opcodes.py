"""The op vocabulary shared by the core, every backend and the conformance kit.

Names and meanings follow ggml's ``enum ggml_op``; the exact semantics of each op live
in the docstring of its builder in :mod:`tensorplug.ops`, which is the contract every
backend implements.
"""

from __future__ import annotations

import enum

__all__ = ["GLU_ACTIVATION", "GluOp", "Op", "RopeMode", "SortOrder", "UnaryOp", "VIEW_OPS"]


#: Hashing for the op enums: a member is its own only equal (``enum.Enum`` compares by
#: identity), so its identity hash is a valid one, in C. ``Enum.__hash__`` is Python
#: (``hash(self._name_)``), and every node's op is looked up in several tables each time
#: a graph is split and a CPU plan bound, so a Python hash would be a visible share of
#: building each new prompt length's plan.
_IDENTITY_HASH = object.__hash__


class Op(enum.Enum):
    __hash__ = _IDENTITY_HASH

    NONE = "none"
    DUP = "dup"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    SCALE = "scale"
    UNARY = "unary"
    GLU = "glu"
    NORM = "norm"
    RMS_NORM = "rms_norm"
    MUL_MAT = "mul_mat"
    MUL_MAT_ID = "mul_mat_id"
    SOFT_MAX = "soft_max"
    ROPE = "rope"
    FLASH_ATTN_EXT = "flash_attn_ext"
    CPY = "cpy"
    CONT = "cont"
    SET_ROWS = "set_rows"
    GET_ROWS = "get_rows"
    CONCAT = "concat"
    SUM_ROWS = "sum_rows"
    ARGMAX = "argmax"
    ARGSORT = "argsort"
    TOP_K = "top_k"
    REPEAT = "repeat"
    CLAMP = "clamp"
    PAD = "pad"
    HADAMARD = "hadamard"
    VIEW = "view"
    RESHAPE = "reshape"
    PERMUTE = "permute"
    TRANSPOSE = "transpose"

    def __str__(self) -> str:
        return self.value


#: Ops whose result only re-describes the memory of their source: no kernel runs.
VIEW_OPS: frozenset[Op] = frozenset({Op.NONE, Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})


class UnaryOp(enum.Enum):
    __hash__ = _IDENTITY_HASH

    ABS = "abs"
    NEG = "neg"
    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"
    EXP = "exp"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    GELU_QUICK = "gelu_quick"
    GELU_ERF = "gelu_erf"

    def __str__(self) -> str:
        return self.value


class GluOp(enum.Enum):
    """The gated units ``fn(x) * g``: which activation ``fn`` is (ggml's glu ops)."""

    __hash__ = _IDENTITY_HASH

    SWIGLU = "swiglu"  # silu
    REGLU = "reglu"  # relu
    GEGLU = "geglu"  # gelu (tanh approximation)
    GEGLU_ERF = "geglu_erf"  # gelu (erf)
    GEGLU_QUICK = "geglu_quick"  # gelu_quick

    def __str__(self) -> str:
        return self.value


#: The activation each gated linear unit applies to its gated half: ``act(x) · g``.
GLU_ACTIVATION: dict[GluOp, UnaryOp] = {
    GluOp.SWIGLU: UnaryOp.SILU,
    GluOp.GEGLU: UnaryOp.GELU,
    GluOp.GEGLU_ERF: UnaryOp.GELU_ERF,
    GluOp.GEGLU_QUICK: UnaryOp.GELU_QUICK,
    GluOp.REGLU: UnaryOp.RELU,
}


class RopeMode(enum.IntEnum):
    """ggml's rope modes: NORMAL rotates adjacent pairs, NEOX rotates halves."""

    NORMAL = 0
    NEOX = 2


class SortOrder(enum.Enum):
    __hash__ = _IDENTITY_HASH

    ASC = "asc"
    DESC = "desc"

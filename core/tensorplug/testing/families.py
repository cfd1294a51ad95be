"""The conformance catalogue: every op × type × shape family, as ggml's test-backend-ops.

Families cover contiguous and non-contiguous operands (permuted, transposed, strided
views), broadcasting, odd sizes that are not multiples of any block or tile size,
in-place writes into views of larger tensors (``cpy``, ``set_rows``), and the quantized
``mul_mat`` matrix: every weight type × token batches of 1, 7, 32 and 129.

:func:`catalogue` returns the quick subset by default — representative cases that run in
seconds — and everything with ``full=True``. The families live in modules of their own,
which this one only gathers: elementwise math, norms and reductions in
:mod:`.families_math`; the attention-shaped ops (matrix products, softmax, rope, flash
attention) in :mod:`.families_nn`; copies, views, gathers and scatters in
:mod:`.families_copy`; repeat, pad and mixtures of experts in :mod:`.families_moe`; the
K-quants in :mod:`.families_kquants`; IQ4_NL and IQ4_XS in :mod:`.families_iquants`; the
operand layouts they share in :mod:`.operands`.
Each builder is a plain function of :class:`~.cases.Inputs` and its parameters, bound
with :func:`functools.partial`, so a case's graph is rebuilt fresh for every run.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..types import Type
from .cases import Case
from .families_copy import FAMILIES as COPY
from .families_iquants import FAMILIES as IQUANTS
from .families_kquants import FAMILIES as KQUANTS
from .families_math import FAMILIES as MATH
from .families_moe import FAMILIES as MOE
from .families_nn import FAMILIES as NN

__all__ = ["all_cases", "catalogue"]


def all_cases() -> list[Case]:
    """Every case, quick and full, in catalogue order."""
    families = (*MATH, *COPY, *NN, *MOE, *KQUANTS, *IQUANTS)
    return [c for family in families for c in family()]


def catalogue(
    full: bool = False, ops: Iterable[str] = (), types: Iterable[Type | str] = ()
) -> list[Case]:
    """The cases to run: the quick subset (or all with ``full``), filtered by op and type.

    ``ops`` holds op names (``mul_mat``) or unary/glu function names (``silu``), any
    case; ``types`` holds type names (``q4_0``); empty filters match everything.
    """
    ops, types = list(ops), list(types)
    return [c for c in all_cases() if (full or c.quick) and c.matches(ops, types)]

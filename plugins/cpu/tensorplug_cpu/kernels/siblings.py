"""Which of a graph's matrix × vector products can run as one kernel call.

A language model's layer multiplies one normed activation by its Q, K and V matrices,
and another by its gate and up matrices. On one token each product is a few
microseconds of work, and on two threads each also opens a parallel region and
quantizes the same activation again. :meth:`.jit.JitKernels.bind_matvec_siblings` (and
``bind_packed_siblings``, for repacked weights) runs such products together; this
module finds them.

The graph's order puts Q's rope and K's product between Q and V, so joining them
means computing the later products early, at the first one's place. That is only
correct when no node in between writes the shared activation or a joined product's
weights. A joined product's result is written early too when no node in between
reads or writes its memory; where the allocator gave that memory to something else
in between (V's result often reuses Q's), the product is computed into scratch and
copied into place at its own turn (a row of floats per activation row). Memory is
compared as byte ranges of each tensor's owner, conservative for views.

Plain weights join only while their integer matrix × vector kernels take the rows (the
dispatch table's few). Repacked weights join for every step that runs on the spinning
helpers (fewer than :data:`.job_blocks.QUANTIZE_APART_ROWS` rows): their joint kernel
takes any row count, and a server's busy slots make generation steps of dozens of rows,
where Q, K and V as one job share one quantization of the activation and one hand-out
of work instead of three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tensorplug.opcodes import VIEW_OPS, Op
from tensorplug.types import Type

from ..repack import layout_of
from ..repack_buffer import RepackBuffer
from .activations import vec_dot_type
from .dispatch import INT8, PLAIN, select
from .job_blocks import QUANTIZE_APART_ROWS

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

__all__ = ["JOINT_MOST_ROWS", "sibling_groups"]

#: the most activation rows of a joint product (the module's last paragraph). A longer
#: prompt's products run as numba regions, each quantizing its activations first; they
#: stay apart, as they were measured
JOINT_MOST_ROWS = QUANTIZE_APART_ROWS - 1

_Span = tuple[int, int, int]  # (id of the buffer, first byte, end)


def _span(t: Tensor) -> _Span:
    owner = t.base
    return id(owner.buffer), owner.offset, owner.offset + owner.nbytes


def _overlap(a: _Span, b: _Span) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _candidate(node: Tensor) -> bool:
    """A 2-d product of quantized weights by a few dense float32 rows that the joint
    kernels take: repacked weights, or ones the dispatch table gives the integer kernels.
    The op and the row count come first: they turn away a prompt graph's nodes cheaply,
    before anything costlier is looked at."""
    if node.op is not Op.MUL_MAT or node.src[1].shape[0] > JOINT_MOST_ROWS:
        return False
    if node.nelements == 0 or node.type != Type.F32:
        return False
    a, b = node.src
    a_buf, b_buf, buf = a.buffer, b.buffer, node.buffer
    if a_buf is None or b_buf is None or buf is None:
        return False  # the plan says what is wrong with it, at the node's own place
    if isinstance(a_buf, RepackBuffer):  # repacked weights: any few rows, whole matrices
        weights_ok = a.view_src is None and layout_of(a) is not None
    else:
        weights_ok = a_buf.is_host and a.type.is_quantized and select(
            a.type, PLAIN, b.shape[0], numba=True, blocks_contiguous=a.rows_contiguous
        ).name == INT8  # fmt: skip
    return (
        weights_ok and buf.is_host and b_buf.is_host and len(a.shape) == 2
        and b.type == Type.F32 and len(b.shape) == 2 and b.is_contiguous and node.is_contiguous
    )  # fmt: skip


def _placement(nodes: Sequence[Tensor], first: int, at: int, joined: set[int]) -> str | None:
    """How ``nodes[at]`` can be computed at ``first`` instead: ``"early"`` (straight into
    its result), ``"staged"`` (its result's memory is still in use in between: into
    scratch, copied at its own place) or None (a node in between writes what it reads).
    The nodes being joined are left out: they are computed at ``first`` too."""
    node = nodes[at]
    result, reads = _span(node), [_span(s) for s in node.src]
    early = True
    for i in range(first + 1, at):
        between = nodes[i]
        if i in joined or between.op in VIEW_OPS:  # views compute nothing
            continue
        written = _span(between)
        if any(_overlap(written, r) for r in reads):
            return None
        if early and (_overlap(written, result) or
                      any(_overlap(_span(s), result) for s in between.src)):  # fmt: skip
            early = False
    return "early" if early else "staged"


def sibling_groups(nodes: Sequence[Tensor], most: int) -> dict[int, list[tuple[int, bool]]]:
    """Index of a group's first product → ``(index, staged)`` of each of its products
    (in graph order, at most ``most``), for products of the same activation that can
    run together. A staged product is computed into scratch and copied into its result
    at its own place (:func:`_placement`). The numba kernels are taken to be there: the
    backend asks only when they are."""
    # repacked weights and plain ones take different kernels, and weights whose
    # activations ggml rounds differently (Q8_0, Q8_1, Q8_K) cannot share one
    # quantization of them: they never go together
    by_activation: dict[tuple[int, bool, str], list[int]] = {}
    for i, node in enumerate(nodes):
        if _candidate(node):
            a = node.src[0]
            key = id(node.src[1]), isinstance(a.buffer, RepackBuffer), vec_dot_type(a.type)
            by_activation.setdefault(key, []).append(i)
    groups: dict[int, list[tuple[int, bool]]] = {}
    for indices in by_activation.values():
        while len(indices) >= 2:
            first = indices[0]
            group: list[tuple[int, bool]] = [(first, False)]
            rest = []
            for at in indices[1:]:
                how = None
                if len(group) < most:
                    how = _placement(nodes, first, at, {j for j, _ in group})
                # results that share memory are written in the graph's order only if staged
                if how == "early" and any(_overlap(_span(nodes[at]), _span(nodes[j]))
                                          for j, _ in group):  # fmt: skip
                    how = "staged"
                if how is None:
                    rest.append(at)
                else:
                    group.append((at, how == "staged"))
            if len(group) >= 2:
                groups[first] = group
            indices = rest
    return groups

"""Node-by-node comparison of two backends, and the error measure every op is judged by.

:func:`compare_graph_backend` follows ``ggml_backend_compare_graph_backend``: the graph
is copied onto each backend (here into a fenced :class:`~.placement.Placement`), every
node is computed on both, one node at a time, and a callback receives each pair of
results. On top of ggml it checks, after every node and on both sides, that no sentinel
byte around any tensor changed and that an in-place node (``cpy``, ``set_rows``) wrote
nothing of its destination outside its own view.

:func:`compare_arrays` is the verdict on one pair: any NaN fails, infinities must
match in position and sign, and the rest must have ``NMSE = Σ(a−b)²/Σa²`` (``a`` the
reference) at most the node's threshold, from :func:`max_nmse_for`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..backend import Backend, Status
from ..contract import Feature, missing_feature, version_label
from ..errors import NotAllocatedError, OutOfBoundsError, TensorplugError, UnsupportedError
from ..graph import Graph
from ..graph_copy import clone_graph
from ..opcodes import VIEW_OPS, Op
from ..tensor import Tensor
from ..transfer import get_array, set_array, tensor_get
from ..types import Type
from .placement import GAP, Placement, footprint

__all__ = [
    "DEFAULT_NMSE",
    "ComputeFailedError",
    "Mismatch",
    "NodeUnsupportedError",
    "OutOfBoundsWriteError",
    "compare_arrays",
    "compare_graph_backend",
    "contract_needed",
    "max_nmse_for",
    "nmse",
    "tensor_values",
]

#: DESIGN.md's default threshold, and the per-op exceptions it names.
DEFAULT_NMSE = 1e-7
OP_NMSE: dict[Op, float] = {
    Op.MUL_MAT: 5e-4, Op.MUL_MAT_ID: 5e-4, Op.FLASH_ATTN_EXT: 5e-4, Op.SOFT_MAX: 1e-6,
}  # fmt: skip
#: Floors for results stored in 16-bit floats. Two correct implementations may round a
#: result one unit in the last place apart (computing in f32 then rounding, rounding a
#: float64 value directly, or computing in half precision). One ulp relative to the
#: value is at most 2^-10 for F16 and 2^-7 for BF16, so a result off by one ulp in
#: *every* element has NMSE at most 9.5e-7 (F16) and 6.1e-5 (BF16); the floors sit just
#: above, while a wrong formula still scores 1e-3 and worse.
TYPE_FLOOR: dict[Type, float] = {Type.F16: 1e-6, Type.BF16: 1e-4}
_COPY_OPS = frozenset(
    {Op.CPY, Op.DUP, Op.CONT, Op.GET_ROWS, Op.SET_ROWS, Op.CONCAT, Op.REPEAT, Op.PAD}
)
_WIDENING = frozenset({(Type.F16, Type.F32), (Type.BF16, Type.F32)})


class OutOfBoundsWriteError(OutOfBoundsError):
    """A backend wrote outside the memory of the node it computed."""


class NodeUnsupportedError(UnsupportedError):
    """A backend's ``supports_op`` refused a node of the graph; reported, not failed.

    ``feature`` is set when the refusal was the op contract's: the node needs a feature
    newer than the backend's plugin declares (then the message says which version)."""

    def __init__(self, backend: Backend, node: Tensor) -> None:
        self.feature = missing_feature(node, backend.device.api_version)
        if self.feature is not None and not _plugin_claims(backend, node):
            self.feature = None  # it would not compute the node anyway: plain unsupported
        why = "" if self.feature is None else f": {contract_needed(self.feature, backend)}"
        super().__init__(f"{backend.name} does not support {node_label(node)}{why}")
        self.backend = backend
        self.node = node


def _plugin_claims(backend: Backend, node: Tensor) -> bool:
    """Whether the plugin itself says yes to a node its op contract keeps from it.

    Only the kit asks this, to tell "needs a newer contract" from "not implemented": the
    scheduler never hands such a node to the plugin, nor asks it. A plugin that raises
    on a node it does not understand (an unknown ``fn``) does not claim it.
    """
    try:
        return bool(backend.device._supports_op(node))
    except Exception:
        return False


def contract_needed(feature: Feature, backend: Backend) -> str:
    """``contract 1.1 needed (tiled_broadcast; X0 declares 1.0)``: why the op contract
    keeps a node from ``backend``."""
    have = version_label(backend.device.api_version)
    return (
        f"contract {version_label(feature.version)} needed ({feature.name}; "
        f"{backend.name} declares {have})"
    )


class ComputeFailedError(TensorplugError, RuntimeError):
    """A backend's ``graph_compute`` returned a status other than success."""


def node_label(node: Tensor) -> str:
    srcs = ", ".join(f"{s.type.name}{list(s.shape)}" for s in node.src)
    return f"{node.op.value.upper()} -> {node.type.name}{list(node.shape)} ({srcs})"


# -- the error measure ----------------------------------------------------------------------


def max_nmse_for(node: Tensor) -> float:
    """The NMSE threshold for ``node``: 0 means the values must be identical.

    Integer results and lossless copies (same type, or F16/BF16 widened to F32) are
    exact; otherwise DESIGN.md's per-op threshold, raised to the floor of a 16-bit
    result type (see :data:`TYPE_FLOOR`).
    """
    if node.type.is_integer:
        return 0.0
    if node.op in _COPY_OPS:
        src = node.src[1] if node.op == Op.SET_ROWS else node.src[0]
        if src.type == node.type or (src.type, node.type) in _WIDENING:
            return 0.0
    return max(OP_NMSE.get(node.op, DEFAULT_NMSE), TYPE_FLOOR.get(node.type, 0.0))


def nmse(expected: np.ndarray, actual: np.ndarray) -> float:
    """``Σ(a−b)²/Σa²`` in float64 (``a`` = expected); an all-zero ``a`` gives ``Σ(a−b)²``."""
    e = np.asarray(expected, dtype=np.float64)
    d = e - np.asarray(actual, dtype=np.float64)
    num = float(np.dot(d.ravel(), d.ravel()))
    den = float(np.dot(e.ravel(), e.ravel()))
    return num / den if den > 0 else num


@dataclass(frozen=True)
class Mismatch:
    """Why two results differ; ``error`` is the NMSE, or NaN/inf for those failures."""

    message: str
    error: float


def _at(mask: np.ndarray, expected: np.ndarray, actual: np.ndarray, names: tuple[str, str]) -> str:
    first = np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape)
    idx = list(int(i) for i in first)
    e, a = expected[first], actual[first]
    count = int(mask.sum())
    return f"{count} of {mask.size} at {idx} first ({names[0]}={e!r}, {names[1]}={a!r})"


def compare_arrays(
    expected: np.ndarray,
    actual: np.ndarray,
    max_nmse: float,
    names: tuple[str, str] = ("expected", "actual"),
    nan_ok: bool = False,
) -> tuple[float, Mismatch | None]:
    """Judge ``actual`` against ``expected``; returns ``(nmse, mismatch or None)``.

    Any NaN fails, unless ``nan_ok`` (cases fed NaN and infinities on purpose): then a
    NaN must be where the expected values have one, and only there."""
    if expected.shape != actual.shape:
        msg = f"shape {list(actual.shape)} instead of {list(expected.shape)}"
        return np.inf, Mismatch(msg, np.inf)
    if expected.dtype.kind in "iu" or actual.dtype.kind in "iu":
        bad = expected != actual
        if bad.any():
            return np.inf, Mismatch(f"values differ: {_at(bad, expected, actual, names)}", np.inf)
        return 0.0, None
    nan = np.isnan(expected) | np.isnan(actual)
    if nan_ok:
        nan = np.isnan(expected) != np.isnan(actual)
        same = np.isnan(expected) & np.isnan(actual)
        if same.any():
            expected, actual = np.where(same, 0.0, expected), np.where(same, 0.0, actual)
    if nan.any():
        return np.nan, Mismatch(f"NaN: {_at(nan, expected, actual, names)}", np.nan)
    inf_e, inf_a = np.isinf(expected), np.isinf(actual)
    bad_inf = (inf_e != inf_a) | (inf_e & (np.signbit(expected) != np.signbit(actual)))
    if bad_inf.any():
        return np.inf, Mismatch(f"inf mismatch: {_at(bad_inf, expected, actual, names)}", np.inf)
    finite = ~inf_e
    e, a = expected[finite], actual[finite]
    if max_nmse == 0:
        bad = expected != actual
        if bad.any():
            err = nmse(e, a)
            msg = f"exact copy expected, values differ: {_at(bad, expected, actual, names)}"
            return err, Mismatch(msg, err)
        return 0.0, None
    err = nmse(e, a)
    if not err <= max_nmse:
        return err, Mismatch(f"NMSE {err:.3e} > {max_nmse:.0e}", err)
    return err, None


def tensor_values(t: Tensor) -> np.ndarray:
    """A tensor's logical values wherever it lives: float64 for floats, int64 for integers."""
    raw = get_array(t)
    if t.type.is_integer:
        return raw.astype(np.int64)
    if t.type in (Type.F32, Type.F16):
        return raw.astype(np.float64)
    from .. import quants

    if t.type == Type.BF16:
        return quants.bf16_to_f32(raw).astype(np.float64)
    return quants.dequantize(raw, t.type).reshape(t.shape).astype(np.float64)


# -- one side of a comparison -------------------------------------------------------------------


class _Side:
    """A graph copy placed on one backend, computed node by node under watch."""

    def __init__(self, backend: Backend, graph: Graph, gap: int) -> None:
        self.backend = backend
        self.graph, self.copies = clone_graph(graph)
        everything = [*self.graph.leafs, *self.graph.nodes]
        owners = [t for t in everything if t.view_src is None]
        self.placement = Placement(backend.buffer_type(), owners, gap)
        try:
            Placement.init_views(everything)
        except BaseException:
            self.placement.free()
            raise

    def first_unsupported(self) -> Tensor | None:
        for t in self.graph.nodes:
            if t.op not in VIEW_OPS and not self.backend.supports_op(t):
                return t
        return None

    def load(self, original: Graph, inputs: Mapping[Tensor, np.ndarray] | None) -> None:
        self.placement.fill()
        given = {id(t): v for t, v in (inputs or {}).items()}
        for leaf in original.leafs:
            if id(leaf) in given:
                values = given[id(leaf)]
            elif leaf.buffer is not None:
                values = get_array(leaf)
            else:
                raise NotAllocatedError(
                    f"compare_graph_backend: leaf {leaf.describe()} has no data; pass its values "
                    "in inputs= or allocate and set it before comparing"
                )
            set_array(self.copies[id(leaf)], values)

    def compute(self, graph: Graph, index: int) -> None:
        """Compute ``graph`` (one node or all) and check what it may have overwritten."""
        # in-place destinations are checked per node (in a whole-graph run several nodes
        # may legitimately write to one base)
        single = len(graph.nodes) == 1
        writers = [t for t in graph.nodes if t.view_src is not None and t.op not in VIEW_OPS]
        inplace = writers if single else []
        before = {id(t): tensor_get(t.base) for t in inplace}
        status = self.backend.graph_compute(graph)
        if status is not Status.SUCCESS:
            what = f"node {index}" if single else "the graph"
            raise ComputeFailedError(
                f"{self.backend.name}: graph_compute of {what} returned {status.value}"
            )
        problems = self.placement.violations()
        for t in inplace:
            after = np.frombuffer(tensor_get(t.base), dtype=np.uint8)
            old = np.frombuffer(before[id(t)], dtype=np.uint8)
            outside = (after != old) & ~footprint(t)
            if outside.any():
                problems.append(
                    f"{node_label(t)} changed {int(outside.sum())} bytes of {t.base.describe()} "
                    "outside its destination view"
                )
        if problems:
            who = f"node {index} {node_label(graph.nodes[0])}" if single else "the graph"
            raise OutOfBoundsWriteError(f"{self.backend.name}, {who}: " + "; ".join(problems))

    def free(self) -> None:
        self.placement.free()


Callback = Callable[[int, Tensor, Tensor], bool]


def compare_graph_backend(
    backend1: Backend,
    backend2: Backend,
    graph: Graph,
    callback: Callback,
    *,
    inputs: Mapping[Tensor, np.ndarray] | None = None,
    node_by_node: bool = True,
    sentinels: bool = True,
) -> bool:
    """Run ``graph`` on both backends and call ``callback(i, t1, t2)`` for each node pair.

    ``graph`` itself is never allocated or modified: each backend gets a copy placed in
    a buffer of its own buffer type. Leaf values come from ``inputs`` (arrays in
    :func:`~tensorplug.get_array`'s format, keyed by the original leaf) or, for leafs
    that are allocated, from their current memory — so both sides start from identical
    bytes. View nodes are skipped; the callback returns False to stop early, and the
    function returns whether every node was visited.

    Raises :class:`NodeUnsupportedError` before computing anything when either backend
    refuses a node, :class:`OutOfBoundsWriteError` when a sentinel byte or a byte of an
    in-place destination outside its view changed, and :class:`ComputeFailedError` when
    a backend reports a failed compute.
    """
    gap = GAP if sentinels else 0
    sides: list[_Side] = []
    try:
        for backend in (backend1, backend2):
            sides.append(_Side(backend, graph, gap))
        for side in sides:
            node = side.first_unsupported()
            if node is not None:
                raise NodeUnsupportedError(side.backend, node)
        for side in sides:
            side.load(graph, inputs)
        s1, s2 = sides
        if not node_by_node:
            for side in sides:
                side.compute(side.graph, -1)
        for i, (t1, t2) in enumerate(zip(s1.graph.nodes, s2.graph.nodes, strict=True)):
            if t1.op in VIEW_OPS:
                continue
            if node_by_node:
                s1.compute(s1.graph.view(i, i + 1), i)
                s2.compute(s2.graph.view(i, i + 1), i)
            if not callback(i, t1, t2):
                return False
        return True
    finally:
        for side in sides:
            side.free()

"""What a conformance case is: a small graph from fresh leafs, and how to fill them.

A :class:`Case` is ggml's ``test_case``: a name such as
``ADD(type=f32,shape=[2,3,5,10],b=[1,3,1,10])``, a function that builds the graph from
leaf tensors created through :class:`Inputs`, the way each leaf is initialised (uniform
random with a seed derived from the name; valid indices for ``get_rows``/``set_rows``;
positions; masks with ``-inf``), and optionally a threshold override. The catalogue
itself is in :mod:`tensorplug.testing.families`.

Leaf values are generated as real numbers and encoded with the core codecs
(:mod:`tensorplug.quants` for quantized types and BF16), once, so every backend under
comparison receives identical bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..graph import Graph
from ..opcodes import Op
from ..tensor import Tensor
from ..types import Type

__all__ = [
    "Case",
    "InitFn",
    "Inputs",
    "causal_mask",
    "distinct",
    "encode_values",
    "indices",
    "positions",
    "random_mask",
    "uniform",
]

#: Makes a leaf's logical values (numpy order, any real or integer dtype).
InitFn = Callable[[np.random.Generator, Tensor], np.ndarray]


# -- initialisers --------------------------------------------------------------------------


def uniform(lo: float = -1.0, hi: float = 1.0) -> InitFn:
    """Independent uniform values in ``[lo, hi)`` (ggml's ``init_tensor_uniform``)."""

    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        return rng.uniform(lo, hi, size=t.shape)

    return init


def indices(high: int, *, unique: bool = False) -> InitFn:
    """Integers in ``[0, high)``; with ``unique`` no value repeats along the last axis.

    ``set_rows`` needs unique rows per destination: with a repeated row the result
    would depend on the order a backend happens to write in.
    """

    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        if not unique:
            return rng.integers(0, high, size=t.shape)
        rows = [rng.permutation(high)[: t.shape[-1]] for _ in range(int(np.prod(t.shape[:-1])))]
        return np.array(rows).reshape(t.shape)

    return init


#: The values where elementwise functions go wrong: infinities, NaN, overflow and the
#: edges of clamped ranges (gelu clamps at ±10, exp overflows past 88.7).
SPECIAL_VALUES = (
    -np.inf, np.inf, np.nan, -1e30, 1e30, -100.0, 100.0, -88.8, 88.8, -10.0, 10.0,
    -9.99, 9.99, -1e-30, 1e-30, -0.0, 0.0, 1.0, -1.0,
)  # fmt: skip


def special(with_nan: bool = True) -> InitFn:
    """:data:`SPECIAL_VALUES` (NaN left out when ``with_nan`` is False) repeated to fill
    the tensor, in a random order along each row."""

    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        vals = np.array([v for v in SPECIAL_VALUES if with_nan or not np.isnan(v)])
        flat = np.resize(vals, int(np.prod(t.shape)))
        return rng.permutation(flat).reshape(t.shape)

    return init


def positions(high: int) -> InitFn:
    """Token positions for ``rope``: random in ``[0, high)``, so no kernel can assume 0..n."""
    return indices(high)


def distinct(lo: float = -1.0, hi: float = 1.0) -> InitFn:
    """Rows of pairwise distinct values (ties would make ``argsort`` ambiguous)."""

    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        n = t.shape[-1]
        grid = np.linspace(lo, hi, n, endpoint=False)
        rows = int(np.prod(t.shape[:-1]))
        return np.stack([rng.permutation(grid) for _ in range(rows)]).reshape(t.shape)

    return init


def random_mask(p_inf: float = 0.3) -> InitFn:
    """Uniform values in ``[-1, 1)`` with about ``p_inf`` of them ``-inf``.

    Column 0 stays finite, so every row keeps one entry a softmax can weigh.
    """

    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        v = rng.uniform(-1, 1, size=t.shape)
        v[rng.random(t.shape) < p_inf] = -np.inf
        v[..., 0] = rng.uniform(-1, 1, size=t.shape[:-1])
        return v

    return init


def causal_mask(n_past: int) -> InitFn:
    """ggml's KQ mask for a batch after ``n_past`` tokens: 0 where visible, ``-inf`` after."""

    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        rows, cols = t.shape[-2], t.shape[-1]
        visible = np.arange(cols)[None, :] <= n_past + np.arange(rows)[:, None]
        return np.broadcast_to(np.where(visible, 0.0, -np.inf), t.shape).copy()

    return init


def encode_values(values: np.ndarray, t: Type) -> np.ndarray:
    """Encode logical values as the raw array :func:`~tensorplug.set_array` takes.

    Uses the core codecs: the same bytes every backend under test receives.
    """
    if t.is_integer:
        return np.asarray(values).astype(t.numpy_dtype)
    f32 = np.asarray(values, dtype=np.float32)
    if t == Type.F32:
        return f32
    if t == Type.F16:
        return np.asarray(values).astype(np.float16)
    from .. import quants

    if t == Type.BF16:
        return quants.f32_to_bf16(f32)
    return quants.quantize(f32, t)


# -- leaf collection -----------------------------------------------------------------------


class Inputs:
    """Hands out a case's leaf tensors and remembers how to initialise each one."""

    def __init__(self) -> None:
        self._inits: dict[int, tuple[Tensor, InitFn]] = {}

    def new(
        self, type: Type | str, shape: Sequence[int], init: InitFn | None = None, name: str = ""
    ) -> Tensor:
        t = Tensor(type, shape, name=name or f"src{len(self._inits)}")
        self._inits[id(t)] = (t, init or _default_init(t.type))
        return t

    def values(self, graph: Graph, rng: np.random.Generator) -> dict[Tensor, np.ndarray]:
        """Encoded values for every leaf of ``graph``, in the order the leafs were made."""
        out: dict[Tensor, np.ndarray] = {}
        for t, init in self._inits.values():
            if t in graph:
                out[t] = encode_values(init(rng, t), t.type)
        missing = [leaf.describe() for leaf in graph.leafs if leaf not in out]
        if missing:
            raise ValueError(
                f"leafs {', '.join(missing)} were not made with Inputs.new(); every leaf of a "
                "case must be, so that it gets initial values"
            )
        return out


def _default_init(t: Type) -> InitFn:
    if t.is_integer:
        return indices(8)
    return uniform()


# -- the case ------------------------------------------------------------------------------


def case_name(op: str, **params: Any) -> str:
    """``OP(k=v,...)`` with lists written without spaces and types by their ggml names."""

    def fmt(v: Any) -> str:
        if isinstance(v, Type):
            return v.name.lower()
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(fmt(x) for x in v) + "]"
        if isinstance(v, float):
            return f"{v:g}"
        if hasattr(v, "value") and not isinstance(v, int):
            return str(v.value)
        return str(v)

    return f"{op}(" + ",".join(f"{k}={fmt(v)}" for k, v in params.items()) + ")"


@dataclass(frozen=True)
class Case:
    """One conformance case (``test_case`` in ggml's ``test-backend-ops``).

    ``op`` is the op under test; ``max_nmse`` overrides the threshold of nodes with
    that op (other nodes keep theirs); ``quick`` cases make the default, fast run.
    """

    name: str
    op: Op
    build: Callable[[Inputs], Tensor | Sequence[Tensor]] = field(repr=False, compare=False)
    tags: frozenset[str] = frozenset()
    max_nmse: float | None = None
    quick: bool = True

    def instantiate(self) -> tuple[Graph, dict[Tensor, np.ndarray]]:
        """A fresh graph and the encoded values of its leafs (deterministic per name)."""
        ins = Inputs()
        out = self.build(ins)
        outputs = [out] if isinstance(out, Tensor) else list(out)
        for t in outputs:
            t.set_output()
        graph = Graph(outputs)
        return graph, ins.values(graph, np.random.default_rng(self.seed))

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    @cached_property
    def types(self) -> frozenset[Type]:
        """Every type in the case's graph (for ``--type`` filters)."""
        ins = Inputs()
        out = self.build(ins)
        graph = Graph(out if isinstance(out, Tensor) else list(out))
        return frozenset(t.type for t in [*graph.leafs, *graph.nodes])

    def matches(self, ops: Iterable[str] = (), types: Iterable[Type | str] = ()) -> bool:
        """True when the case fits both filters (an empty filter matches everything).

        ``ops`` are names of ops (``mul_mat``) or unary/glu functions (``silu``),
        any case; ``types`` are type names (``q4_0``) or :class:`Type` values.
        """
        ops = {o.lower() for o in ops}
        if ops and not ops & ({self.op.value} | self.tags):
            return False
        wanted = {Type.parse(t) for t in types}
        return not wanted or bool(wanted & self.types)

    def __str__(self) -> str:
        return self.name

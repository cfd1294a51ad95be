"""Performance mode: time each op on a backend next to a numpy baseline from the same run.

As ggml's ``test-backend-ops perf``: each case's graph is placed on the backend, run
once to warm up, then repeated until the work target — at least ``min_time`` seconds
of computing — is reached, and reported as µs per run with GFLOP/s (matrix products,
attention) or GB/s (memory-bound ops: bytes of every source read plus the result
written). The baseline evaluates the same graph with the reference formulas in plain
numpy (F32 and F16 data in their own dtype) on the same machine, in the same process,
right after; quantized weights are dequantized beforehand, so for quantized ``mul_mat``
the baseline is numpy's float32 GEMM. ``speedup`` is numpy's time over the backend's:
above 1 the backend is faster.

The sizes include those the CPU backend is tuned for (``mul_mat`` F32 2048³, Q8_0 and
Q4_0 2048×2048 at batches 512 and 1) and a graph replay case — 1000 chained tiny adds —
that measures per-node overhead in µs/node rather than arithmetic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from .. import ops
from ..alloc import alloc_tensors
from ..backend import Backend
from ..graph import Graph
from ..opcodes import VIEW_OPS, Op, RopeMode
from ..tensor import Tensor
from ..transfer import set_array
from ..types import Type
from .cases import Case, Inputs, causal_mask, encode_values, indices, positions, random_mask
from .operands import make
from .refbackend import compute_values

__all__ = [
    "BenchResult",
    "bench_case",
    "bench_cases",
    "graph_bytes",
    "graph_flops",
    "numpy_baseline",
    "run_bench",
]


# -- work per case --------------------------------------------------------------------------------


def _flops(node: Tensor) -> int:
    if node.op == Op.MUL_MAT:
        return 2 * node.nelements * node.src[0].shape[-1]
    if node.op == Op.FLASH_ATTN_EXT:
        q, k, v = node.src[:3]
        return 2 * q.nelements // q.shape[-1] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return 0


def graph_flops(graph: Graph) -> int:
    """Floating-point operations of the matrix products and attention in ``graph``."""
    return sum(_flops(n) for n in graph.nodes)


def _bytes(node: Tensor) -> int:
    if node.op == Op.GET_ROWS:  # only the gathered rows of the table are read
        a, rows = node.src
        return node.nbytes + rows.nbytes + rows.nelements * a.row_bytes
    if node.op == Op.SET_ROWS:  # only the scattered rows of the destination are written
        _, b, rows = node.src
        return b.nbytes + rows.nbytes + b.nrows * node.row_bytes
    return node.nbytes + sum(s.nbytes for s in node.src)


def graph_bytes(graph: Graph) -> int:
    """Bytes the computing nodes read and write: ggml's ``op_size`` (the result plus every
    source), except that ``get_rows``/``set_rows`` count only the rows they move."""
    return sum(_bytes(n) for n in graph.nodes if n.op not in VIEW_OPS)


# -- the numpy baseline ---------------------------------------------------------------------------


def _view_values(node: Tensor, env: dict[int, np.ndarray]) -> np.ndarray:
    src = env[id(node.src[0])]
    if node.op == Op.PERMUTE:
        return np.transpose(src, node.op_params["axes"])
    if node.op == Op.TRANSPOSE:
        return np.swapaxes(src, -1, -2)
    if node.op == Op.RESHAPE:
        return np.reshape(src, node.shape)
    # VIEW: the same element offset and strides over the base's logical values
    base = np.ascontiguousarray(env[id(node.base)])
    size = node.type.type_size
    flat = base.reshape(-1)[node.view_offs // size :]
    strides = tuple(s // size * base.itemsize for s in node.strides)
    return np.lib.stride_tricks.as_strided(flat, node.shape, strides, writeable=False)


def numpy_baseline(graph: Graph, inputs: dict[Tensor, np.ndarray]) -> Callable[[], object]:
    """A function that evaluates ``graph`` with the reference formulas as plain numpy would.

    Tensors keep their storage dtype where numpy has one (F32, F16, integers) and are
    float32 otherwise: BF16 and quantized leafs are decoded beforehand, intermediate BF16
    or quantized results stay float32, and the graph's result is encoded into its type
    with the core's numpy codecs. ``set_rows`` writes in place, as the op does.
    """
    leafs = {id(leaf): _baseline_leaf(inputs[leaf], leaf.type) for leaf in graph.leafs}
    last = graph.nodes[-1]

    def run() -> object:
        env = dict(leafs)
        for node in graph.nodes:
            if node.op in VIEW_OPS:
                env[id(node)] = _view_values(node, env)
                continue
            out = compute_values(node, [env[id(s)] for s in node.src], in_place=True)
            if node.type.is_float:
                out = out.astype(np.float16 if node.type == Type.F16 else np.float32, copy=False)
            elif node is last and not node.type.is_integer:
                out = encode_values(out, node.type)  # quantize/round the result as stored
            env[id(node)] = out
        return env[id(graph.nodes[-1])]

    return run


def _baseline_leaf(raw: np.ndarray, t: Type) -> np.ndarray:
    if t.is_integer or t in (Type.F32, Type.F16):
        return raw
    from .. import quants

    if t == Type.BF16:
        return quants.bf16_to_f32(raw)
    return quants.dequantize(raw, t)


# -- timing ---------------------------------------------------------------------------------------


def _time(fn: Callable[[], object], min_time: float) -> tuple[int, float]:
    """Run ``fn`` in growing batches until ``min_time`` seconds passed; ``(runs, seconds)``."""
    fn()  # warm-up: first-touch page faults, JIT compilation, caches
    runs, total, batch = 0, 0.0, 1
    while total < min_time:
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        total += time.perf_counter() - start
        runs += batch
        if total < min_time / 4:
            batch *= 2
    return runs, total


@dataclass(frozen=True)
class BenchResult:
    """Timings of one case; ``us`` is None when the backend does not support it."""

    case: str
    op: str
    nodes: int
    flops: int
    bytes: int
    runs: int = 0
    us: float | None = None
    numpy_us: float | None = None
    message: str = ""

    @property
    def us_per_node(self) -> float | None:
        return None if self.us is None else self.us / max(self.nodes, 1)

    @property
    def gflops(self) -> float | None:
        return None if self.us is None or not self.flops else self.flops / self.us / 1e3

    @property
    def gbps(self) -> float | None:
        return None if self.us is None or self.flops else self.bytes / self.us / 1e3

    @property
    def speedup(self) -> float | None:
        """numpy's time over the backend's: above 1 the backend is faster."""
        if self.us is None or self.numpy_us is None:
            return None
        return self.numpy_us / self.us

    def to_dict(self) -> dict[str, Any]:
        keys = ("us_per_node", "gflops", "gbps", "speedup")
        return {
            "case": self.case,
            "op": self.op,
            "nodes": self.nodes,
            "flops": self.flops,
            "bytes": self.bytes,
            "runs": self.runs,
            "us": self.us,
            "numpy_us": self.numpy_us,
            **{k: getattr(self, k) for k in keys},
            "message": self.message,
        }


def bench_case(
    case: Case, backend: Backend, min_time: float = 0.5, baseline: bool = True
) -> BenchResult:
    """Time ``case`` on ``backend`` (and its numpy baseline) for at least ``min_time`` s each."""
    graph, inputs = case.instantiate()
    computing = [n for n in graph.nodes if n.op not in VIEW_OPS]
    work = BenchResult(
        case.name, case.op.value, len(computing), graph_flops(graph), graph_bytes(graph)
    )
    refused = next((n for n in computing if not backend.supports_op(n)), None)
    if refused is not None:
        return replace(work, message=f"unsupported: {refused.op.value} {refused.describe()}")
    buffer = alloc_tensors([*graph.leafs, *graph.nodes], backend.buffer_type())
    try:
        for leaf, values in inputs.items():
            set_array(leaf, values)
        runs, seconds = _time(lambda: backend.graph_compute(graph), min_time)
        numpy_us = None
        if baseline:
            n_runs, n_seconds = _time(numpy_baseline(graph, inputs), min_time)
            numpy_us = n_seconds / n_runs * 1e6
        return replace(work, runs=runs, us=seconds / runs * 1e6, numpy_us=numpy_us)
    finally:
        if buffer is not None:
            buffer.free()


def run_bench(
    cases: Iterable[Case],
    backend: Backend,
    min_time: float = 0.5,
    progress: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    results = []
    for case in cases:
        r = bench_case(case, backend, min_time)
        results.append(r)
        if progress is not None:
            progress(r)
    return results


# -- the benchmark cases --------------------------------------------------------------------------

Shape = tuple[int, ...]


def _mm(ta: Type, a: Shape, b: Shape, ins: Inputs) -> Tensor:
    return ops.mul_mat(ins.new(ta, a), ins.new(Type.F32, b))


def _replay(n: int, ins: Inputs) -> Tensor:
    x, y = ins.new(Type.F32, (4,)), ins.new(Type.F32, (4,))
    for _ in range(n):
        x = ops.add(x, y)
    return x


def _unary(op: Callable[[Tensor], Tensor], t: Type, shape: Shape, ins: Inputs) -> Tensor:
    return op(ins.new(t, shape))


def _binary(
    op: Callable[[Tensor, Tensor], Tensor], shape: Shape, bshape: Shape, ins: Inputs
) -> Tensor:
    return op(ins.new(Type.F32, shape), ins.new(Type.F32, bshape))


def _soft_max(shape: Shape, ins: Inputs) -> Tensor:
    mask = ins.new(Type.F16, (1, 1, *shape[-2:]), random_mask(0.5))
    return ops.soft_max(ins.new(Type.F32, shape), mask, 0.125)


def _rope(shape: Shape, ins: Inputs) -> Tensor:
    pos = ins.new(Type.I32, (shape[-3],), positions(4096))
    return ops.rope(ins.new(Type.F32, shape), pos, shape[-1], RopeMode.NEOX)


def _flash(n_q: int, n_kv: int, ins: Inputs) -> Tensor:
    q = ins.new(Type.F32, (1, 32, n_q, 128))
    k = ins.new(Type.F16, (1, 8, n_kv, 128))
    v = ins.new(Type.F16, (1, 8, n_kv, 128))
    mask = ins.new(Type.F16, (1, 1, n_q, n_kv), causal_mask(n_kv - n_q))
    return ops.flash_attn_ext(q, k, v, mask, 1 / math.sqrt(128))


def _get_rows(t: Type, shape: Shape, n: int, ins: Inputs) -> Tensor:
    return ops.get_rows(ins.new(t, shape), ins.new(Type.I32, (n,), indices(shape[-2])))


def _set_rows(shape: Shape, n: int, ins: Inputs) -> Tensor:
    rows = ins.new(Type.I64, (n,), indices(shape[-2], unique=True))
    return ops.set_rows(ins.new(Type.F16, shape), ins.new(Type.F32, (n, shape[-1])), rows)


def _cpy(t: Type, shape: Shape, ins: Inputs) -> Tensor:
    return ops.cpy(ins.new(Type.F32, shape), ins.new(t, shape))


def _cont_permuted(shape: Shape, ins: Inputs) -> Tensor:
    return ops.cont(ops.permute(ins.new(Type.F32, shape), (1, 0, 2)))


def _argsort(shape: Shape, ins: Inputs) -> Tensor:
    return ops.argsort(ins.new(Type.F32, shape))


def _cases() -> Iterator[Case]:
    yield make(
        Op.MUL_MAT,
        partial(_mm, Type.F32, (2048, 2048), (2048, 2048)),
        True,
        type_a=Type.F32,
        m=2048,
        n=2048,
        k=2048,
    )
    for t in (Type.Q8_0, Type.Q4_0, Type.F16):
        for n in (512, 1):
            yield make(
                Op.MUL_MAT,
                partial(_mm, t, (2048, 2048), (n, 2048)),
                True,
                type_a=t,
                m=2048,
                n=n,
                k=2048,
            )
    yield make(
        Op.ADD,
        partial(_replay, 1000),
        True,
        "GRAPH_REPLAY",
        tags={"replay"},
        nodes=1000,
        kind="add",
        shape=[4],
    )
    yield make(
        Op.ADD,
        partial(_binary, ops.add, (2048, 4096), (2048, 4096)),
        True,
        type=Type.F32,
        shape=[2048, 4096],
    )
    yield make(
        Op.MUL,
        partial(_binary, ops.mul, (2048, 4096), (4096,)),
        True,
        type=Type.F32,
        shape=[2048, 4096],
        b=[4096],
    )
    yield make(
        Op.UNARY,
        partial(_unary, ops.silu, Type.F32, (2048, 4096)),
        True,
        "SILU",
        tags={"silu"},
        type=Type.F32,
        shape=[2048, 4096],
    )
    yield make(
        Op.GLU,
        partial(_unary, ops.swiglu, Type.F32, (512, 2 * 4096)),
        True,
        "SWIGLU",
        tags={"swiglu"},
        type=Type.F32,
        shape=[512, 8192],
    )
    yield make(
        Op.RMS_NORM,
        partial(_unary, partial(ops.rms_norm, eps=1e-6), Type.F32, (512, 4096)),
        True,
        type=Type.F32,
        shape=[512, 4096],
    )
    yield make(
        Op.SOFT_MAX,
        partial(_soft_max, (1, 32, 512, 512)),
        True,
        type=Type.F32,
        shape=[1, 32, 512, 512],
        mask=Type.F16,
    )
    yield make(
        Op.ROPE,
        partial(_rope, (512, 32, 128)),
        True,
        type=Type.F32,
        shape=[512, 32, 128],
        mode="neox",
    )
    for n_q, n_kv in ((512, 512), (1, 4096)):
        yield make(
            Op.FLASH_ATTN_EXT,
            partial(_flash, n_q, n_kv),
            True,
            q=[1, 32, n_q, 128],
            kv=[1, 8, n_kv, 128],
            type_kv=Type.F16,
        )
    for t in (Type.F16, Type.Q8_0):
        yield make(
            Op.CPY,
            partial(_cpy, t, (1024, 4096)),
            True,
            type_src=Type.F32,
            type_dst=t,
            shape=[1024, 4096],
        )
    yield make(
        Op.CONT,
        partial(_cont_permuted, (32, 512, 128)),
        True,
        type=Type.F32,
        shape=[32, 512, 128],
        axes=[1, 0, 2],
    )
    for t in (Type.F32, Type.Q4_0):
        yield make(
            Op.GET_ROWS,
            partial(_get_rows, t, (8192, 4096), 512),
            True,
            type=t,
            shape=[8192, 4096],
            rows=512,
        )
    yield make(
        Op.SET_ROWS,
        partial(_set_rows, (4096, 1024), 512),
        True,
        type=Type.F16,
        shape=[4096, 1024],
        rows=512,
    )
    yield make(
        Op.SUM_ROWS,
        partial(_unary, ops.sum_rows, Type.F32, (4096, 4096)),
        True,
        type=Type.F32,
        shape=[4096, 4096],
    )
    yield make(Op.ARGSORT, partial(_argsort, (64, 4096)), True, type=Type.F32, shape=[64, 4096])


def bench_cases(ops: Sequence[str] = (), types: Sequence[Type | str] = ()) -> list[Case]:
    """The benchmark cases, filtered by op or function name and by type."""
    return [c for c in _cases() if c.matches(ops, types)]

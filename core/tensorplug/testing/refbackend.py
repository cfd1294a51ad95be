"""The reference backend: :mod:`~tensorplug.testing.reference`'s formulas as a Backend.

It computes every node in float64 from the decoded values of its sources and stores the
result in the node's own type and layout in host memory, so the conformance kit can put
it on one side of :func:`~tensorplug.testing.compare_graph_backend` exactly like any
other backend — ``tensorplug check --backend CPU`` compares the CPU backend against it.

Storage codecs here come from the ``gguf`` package (llama.cpp's own Python port of
ggml's quantizers), never from :mod:`tensorplug.quants`, so the core codecs the CPU
backend uses are checked against an independent implementation. Copies between tensors
of one type move raw bytes: re-quantizing decoded blocks is not the identity. ``gguf``
is an optional dependency of tensorplug (``tensorplug[gguf]``): without it the float and
integer types still work, and a quantized or BF16 one raises
:class:`~tensorplug.errors.MissingDependencyError` naming the extra.

The backend is slow on purpose (float64, no fusion) and only meant for small test graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..backend import Backend, Status
from ..buffer import BufferType
from ..device import Device, DeviceType
from ..extras import require
from ..host import host_buffer_type
from ..iquants import IQ4_TYPES
from ..kquants import K_TYPES
from ..opcodes import VIEW_OPS, Op, SortOrder
from ..transfer import get_array, set_array
from ..types import Type
from . import reference as ref

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

    from ..graph import Graph
    from ..tensor import Tensor

__all__ = [
    "ReferenceBackend",
    "ReferenceDevice",
    "compute_values",
    "evaluate",
    "gguf_decode",
    "gguf_encode",
    "needs_gguf",
    "reference_backend",
]

REFERENCE_NAME = "reference"

#: What the ``gguf`` package is needed for here, for the missing-package message.
GGUF_PURPOSE = "the conformance kit's float64 reference for quantized and BF16 types"


def needs_gguf(t: Type) -> bool:
    """True when the reference encodes or decodes ``t`` with the ``gguf`` package."""
    return t.is_quantized or t == Type.BF16


def _gguf() -> None:
    require("gguf", GGUF_PURPOSE)


def _quietly(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """``fn(x)`` without numpy's warnings: special-value cases overflow on purpose."""
    with np.errstate(all="ignore"):
        return fn(x)


def _gguf_type(t: Type) -> GGMLQuantizationType:
    _gguf()
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(int(t))  # tensorplug's Type values are ggml's type ids


def gguf_decode(raw: np.ndarray, t: Type) -> np.ndarray:
    """Logical values of a raw array (as :func:`~tensorplug.get_array` returns it).

    Floats come back as float64, integers as int64.
    """
    if t.is_integer:
        return raw.astype(np.int64)
    if t in (Type.F32, Type.F16):
        return raw.astype(np.float64)
    if t == Type.BF16:
        # bf16 is the top half of an f32: widening is a shift, by definition
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    _gguf()
    from gguf import quants

    return quants.dequantize(raw, _gguf_type(t)).astype(np.float64)


def gguf_encode(values: np.ndarray, t: Type) -> np.ndarray:
    """The raw array :func:`~tensorplug.set_array` takes for ``values`` stored as ``t``.

    Quantized and BF16 rows are encoded from float32, as ggml always quantizes f32 rows.
    """
    if t.is_integer:
        return np.asarray(values).astype(t.numpy_dtype)
    if t == Type.F32:
        with np.errstate(over="ignore"):  # beyond float32's range: inf, as float32 code gives
            return values.astype(np.float32)
    if t == Type.F16:
        return values.astype(np.float16)
    rows = np.ascontiguousarray(values, dtype=np.float32)
    if t in K_TYPES or t in IQ4_TYPES:
        # gguf has no K-quant or IQ4 encoder; tensorplug's are checked byte for byte
        # against bytes ggml's quantizers wrote (tests/core/test_kquants.py, test_iquants.py)
        from ..quants import quantize

        return quantize(rows, t)
    _gguf()
    from gguf import quants

    out = quants.quantize(rows, _gguf_type(t))
    return out.view(np.uint16) if t == Type.BF16 else out


Values = list[np.ndarray]


def _opt(vals: Values, i: int) -> np.ndarray | None:
    return vals[i] if len(vals) > i else None


def _rope(node: Tensor, v: Values) -> np.ndarray:
    p = node.op_params
    return ref.rope(
        v[0],
        v[1],
        p["n_dims"],
        int(p["mode"]),
        freq_base=p["freq_base"],
        freq_scale=p["freq_scale"],
        ext_factor=p["ext_factor"],
        attn_factor=p["attn_factor"],
        beta_fast=p["beta_fast"],
        beta_slow=p["beta_slow"],
        n_ctx_orig=p["n_ctx_orig"],
        freq_factors=_opt(v, 2),
    )


def _flash_attn(node: Tensor, v: Values) -> np.ndarray:
    p = node.op_params
    return ref.flash_attn_ext(
        v[0], v[1], v[2], _opt(v, 3), p["scale"], p["max_bias"], p["logit_softcap"]
    )


Formula = Callable[["Tensor", Values], np.ndarray]


def _binary(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Formula:
    return lambda n, v: f(v[0], v[1])


_BINARY = {Op.ADD: ref.add, Op.SUB: ref.sub, Op.MUL: ref.mul, Op.DIV: ref.div}

#: Logical-value evaluators: sources' values in, the node's values out, dtype-preserving.
_FORMULAS: dict[Op, Formula] = {
    **{op: _binary(f) for op, f in _BINARY.items()},
    Op.SCALE: lambda n, v: ref.scale(v[0], n.op_params["scale"], n.op_params["bias"]),
    Op.UNARY: lambda n, v: _quietly(ref.UNARY[n.op_params["fn"].value], v[0]),
    Op.GLU: lambda n, v: _quietly(
        lambda a: ref.glu(a, _opt(v, 1), n.op_params["swapped"], n.op_params["fn"].value), v[0]
    ),
    Op.NORM: lambda n, v: ref.norm(v[0], n.op_params["eps"]),
    Op.RMS_NORM: lambda n, v: ref.rms_norm(v[0], n.op_params["eps"]),
    Op.MUL_MAT: lambda n, v: ref.mul_mat(v[0], v[1]),
    Op.MUL_MAT_ID: lambda n, v: ref.mul_mat_id(v[0], v[1], v[2]),
    Op.SOFT_MAX: lambda n, v: ref.soft_max(
        v[0], _opt(v, 1), n.op_params["scale"], n.op_params["max_bias"]
    ),
    Op.ROPE: _rope,
    Op.FLASH_ATTN_EXT: _flash_attn,
    # copies really copy (np.reshape may return a view, which would time as free)
    Op.CPY: lambda n, v: np.array(v[0], order="C").reshape(n.shape),
    Op.DUP: lambda n, v: np.array(v[0], order="C"),
    Op.CONT: lambda n, v: np.array(v[0], order="C").reshape(n.shape),
    Op.GET_ROWS: lambda n, v: ref.get_rows(v[0], v[1]),
    Op.SET_ROWS: lambda n, v: ref.set_rows(v[0], v[1], v[2]),  # see compute_values
    Op.CONCAT: lambda n, v: ref.concat(v[0], v[1], n.op_params["axis"]),
    Op.SUM_ROWS: lambda n, v: ref.sum_rows(v[0]),
    Op.ARGMAX: lambda n, v: ref.argmax(v[0]),
    Op.ARGSORT: lambda n, v: ref.argsort(v[0], n.op_params["order"] == SortOrder.DESC),
    Op.TOP_K: lambda n, v: ref.top_k(v[0], n.op_params["k"]),
    Op.CLAMP: lambda n, v: ref.clamp(v[0], n.op_params["min"], n.op_params["max"]),
    Op.REPEAT: lambda n, v: ref.repeat(v[0], n.shape),
    Op.PAD: lambda n, v: ref.pad(v[0], n.op_params["after"]),
    Op.HADAMARD: lambda n, v: ref.hadamard(v[0], n.op_params["n"]),
}


def compute_values(node: Tensor, values: Values, *, in_place: bool = False) -> np.ndarray:
    """``node``'s logical result from its sources' logical values (``values[i]`` for
    ``node.src[i]``), with the reference formulas, in the sources' float dtype.

    With ``in_place``, ``set_rows`` writes into ``values[0]`` as the op does into its
    destination (the benchmark baseline); otherwise no input is modified.
    """
    if in_place and node.op == Op.SET_ROWS:
        return ref.set_rows(values[0], values[1], values[2], in_place=True)
    return _FORMULAS[node.op](node, values)


def _quantized_copy(node: Tensor, raw: np.ndarray) -> np.ndarray:
    """A same-type copy of quantized rows in C order: blocks move, bytes unchanged."""
    blocks = raw.reshape(-1, node.type.type_size)
    return blocks.reshape((*node.shape[:-1], node.row_bytes))


def evaluate(node: Tensor) -> np.ndarray:
    """The reference result of ``node`` from its sources' current memory, as a raw array.

    Values are decoded to float64 (integers to int64), computed, and encoded into the
    node's type. Two exceptions keep bytes exact: copies between tensors of one type
    move raw elements or blocks, and ``set_rows`` encodes only the new rows, leaving
    every other row of its destination byte for byte as it was.
    """
    raws = [get_array(s) for s in node.src]
    src0 = node.src[0]
    if node.op in _RAW_COPIES and src0.type == node.type:
        if node.type.is_quantized:
            return _quantized_copy(node, raws[0])
        return compute_values(node, raws)
    if node.op == Op.GET_ROWS and node.type == Type.I32:
        return compute_values(node, raws)
    if node.op == Op.SET_ROWS:
        rows = gguf_encode(gguf_decode(raws[1], node.src[1].type), node.type)
        return ref.set_rows(raws[0], rows, raws[2])
    vals = [gguf_decode(r, s.type) for r, s in zip(raws, node.src, strict=True)]
    out = compute_values(node, vals)
    return (
        out.astype(node.type.numpy_dtype) if node.type.is_integer else gguf_encode(out, node.type)
    )


_RAW_COPIES = frozenset({Op.CPY, Op.DUP, Op.CONT, Op.CONCAT, Op.REPEAT, Op.PAD})


class ReferenceBackend(Backend):
    """Computes each node with the float64 reference formulas, one node at a time."""

    def _graph_compute(self, graph: Graph) -> Status:
        for node in graph.nodes:
            if node.op in VIEW_OPS:
                continue
            set_array(node, evaluate(node))
        return Status.SUCCESS


class ReferenceDevice(Device):
    """A host-memory device for :class:`ReferenceBackend`; it is never registered."""

    @property
    def name(self) -> str:
        return REFERENCE_NAME

    @property
    def description(self) -> str:
        return "float64 numpy formulas (tensorplug.testing.reference) and gguf codecs"

    @property
    def type(self) -> DeviceType:
        return DeviceType.CPU

    def memory(self) -> tuple[int, int]:
        return (0, 0)

    def _init_backend(self, params: str | None) -> Backend:
        return ReferenceBackend(self)

    def buffer_type(self) -> BufferType:
        return host_buffer_type()

    def _supports_op(self, op: Tensor) -> bool:
        return op.op in VIEW_OPS or op.op in _FORMULAS

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host


def reference_backend() -> ReferenceBackend:
    """A fresh reference backend (cheap: it holds no state)."""
    return ReferenceBackend(ReferenceDevice())

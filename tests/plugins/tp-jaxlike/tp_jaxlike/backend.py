"""The heavy part: numpy kernels written against op contract 1.0 (see the package doc)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

import tensorplug as tp
from tensorplug.graph import Graph
from tensorplug.host import HostBufferType, host_memory, tensor_array
from tensorplug.opcodes import VIEW_OPS, Op, UnaryOp
from tensorplug.tensor import Tensor

_C = math.sqrt(2 / math.pi)

#: The unary functions of contract 1.0, as numpy writes them (no special-value rules).
UNARY: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.ABS: np.abs,
    UnaryOp.NEG: np.negative,
    UnaryOp.RELU: lambda x: np.maximum(x, 0),  # NaN stays NaN (ggml: 0 since 1.2)
    UnaryOp.GELU: lambda x: 0.5 * x * (1 + np.tanh(_C * x * (1 + 0.044715 * x * x))),
    UnaryOp.SILU: lambda x: x / (1 + np.exp(-x)),
    UnaryOp.EXP: np.exp,
    UnaryOp.TANH: np.tanh,
    UnaryOp.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
}
BINARY = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}
OPS = {*BINARY, Op.SCALE, Op.UNARY, Op.SOFT_MAX, Op.ARGMAX, Op.SUM_ROWS}


def _soft_max(node: Tensor, a: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    x = a * np.float32(node.op_params["scale"])
    if mask is not None:
        x = x + mask[..., : a.shape[-2], :]  # numpy broadcasting: 1 or equal (contract 1.0)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _compute(node: Tensor, src: list[np.ndarray]) -> np.ndarray:
    if node.op in BINARY:
        return BINARY[node.op](src[0], src[1])  # raises on a tiled b: (6, 4) + (6, 2)
    if node.op is Op.SCALE:
        return src[0] * np.float32(node.op_params["scale"]) + np.float32(node.op_params["bias"])
    if node.op is Op.UNARY:
        return UNARY[node.op_params["fn"]](src[0])
    if node.op is Op.SOFT_MAX:
        return _soft_max(node, src[0], src[1] if len(src) > 1 else None)
    if node.op is Op.ARGMAX:
        return np.argmax(src[0], axis=-1)  # the first maximum; NaN wins (ggml: 1.2 rules)
    return src[0].sum(axis=-1, keepdims=True)  # SUM_ROWS


class JaxLikeBackend(tp.Backend):
    def _graph_compute(self, graph: Graph) -> tp.Status:
        with np.errstate(all="ignore"):  # overflow to inf is the expected result
            for node in graph.nodes:
                if node.op not in VIEW_OPS:
                    out = tensor_array(node)
                    out[...] = _compute(node, [tensor_array(s) for s in node.src])
        return tp.Status.SUCCESS


class JaxLikeDevice(tp.Device):
    def __init__(self, reg: tp.Reg) -> None:
        super().__init__(reg)
        self._buft = HostBufferType(self, name="JAXLIKE0")

    name = property(lambda self: "JAXLIKE0")
    description = property(lambda self: "numpy standing in for JAX, written for API 1.0")
    type = property(lambda self: tp.DeviceType.ACCEL)

    def memory(self) -> tuple[int, int]:
        return host_memory()

    def _init_backend(self, params: str | None) -> JaxLikeBackend:
        return JaxLikeBackend(self)

    def buffer_type(self) -> tp.BufferType:
        return self._buft

    def supports_op(self, op: Tensor) -> bool:  # the API 1.0 name of the hook
        if op.op in VIEW_OPS:
            return True
        f32 = op.type in (tp.Type.F32, tp.Type.I32) and all(s.type == tp.Type.F32 for s in op.src)
        if op.op is Op.UNARY:
            return f32 and op.op_params["fn"] in UNARY
        if op.op is Op.SOFT_MAX:
            return f32 and op.op_params["max_bias"] == 0
        return f32 and op.op in OPS

    def supports_buft(self, buft: tp.BufferType) -> bool:
        return buft.is_host


class JaxLikeReg(tp.Reg):
    name = property(lambda self: "JAXLIKE")

    def __init__(self) -> None:
        self._devices = [JaxLikeDevice(self)]

    def devices(self) -> list[tp.Device]:
        return self._devices


def create_reg() -> JaxLikeReg:
    return JaxLikeReg()

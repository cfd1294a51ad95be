"""TESTACCEL's kernels: plain float32 numpy, one function per op, on private memory.

Deliberately independent of the CPU backend and of tensorplug.testing's reference, so
that agreeing results mean something. Like a GPU launch, :func:`prepare` resolves every
tensor's memory when work is queued (a numpy view stands for a device pointer); the
math runs later, when the stream is synchronized. Results are computed into a
temporary and then stored, so a destination aliasing a source (in-place ops) is safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.opcodes import GluOp, Op, RopeMode, UnaryOp

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

_VIEWS = (Op.NONE, Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE)

Params = dict[str, Any]
Kernel = Callable[[Params, list[np.ndarray], np.ndarray], np.ndarray | None]


def array(t: Tensor) -> np.ndarray:
    """A numpy view of ``t`` in its device buffer (shape, dtype and strides as the tensor)."""
    buf = t.require_allocated()
    mem: np.ndarray = buf.mem  # type: ignore[attr-defined]
    dtype = t.type.numpy_dtype
    if t.nbytes == 0:
        return np.zeros(t.shape, dtype=dtype)
    return np.ndarray(t.shape, dtype=dtype, buffer=mem, offset=t.offset, strides=t.strides)


def _f(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


_UNARY: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.ABS: np.abs,
    UnaryOp.NEG: np.negative,
    UnaryOp.RELU: lambda x: np.maximum(x, 0),
    UnaryOp.GELU: lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))),
    UnaryOp.SILU: _silu,
    UnaryOp.EXP: np.exp,
    UnaryOp.TANH: np.tanh,
    UnaryOp.SIGMOID: lambda x: 1.0 / (1.0 + np.exp(-x)),
}


def _binary(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    return lambda p, s, out: f(_f(s[0]), _f(s[1]))


def _glu(p: Params, s: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    assert p["fn"] is GluOp.SWIGLU
    a = _f(s[0])
    if len(s) > 1:
        return _silu(a) * _f(s[1])
    half = a.shape[-1] // 2
    x, g = a[..., :half], a[..., half:]
    if p["swapped"]:
        x, g = g, x
    return _silu(x) * g


def _norm(rms: bool) -> Kernel:
    def run(p: Params, s: list[np.ndarray], out: np.ndarray) -> np.ndarray:
        x = s[0].astype(np.float64)
        if not rms:
            x = x - x.mean(axis=-1, keepdims=True)
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + p["eps"])

    return run


def _batched(x: np.ndarray) -> np.ndarray:
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _mul_mat(p: Params, s: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    a, b = _batched(_f(s[0])), _batched(_f(s[1]))
    for axis in (0, 1):  # repeat a's batches onto b's (grouped-query attention)
        a = np.repeat(a, b.shape[axis] // a.shape[axis], axis=axis)
    return np.matmul(b, np.swapaxes(a, -1, -2)).reshape(out.shape)


def _get_rows(p: Params, s: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    a, rows = s[0], s[1].astype(np.int64)
    a2 = a.reshape(-1, *a.shape[-2:])
    r2 = rows.reshape(-1, rows.shape[-1])
    return np.stack([a2[i][r2[i]] for i in range(a2.shape[0])]).reshape(out.shape)


def _set_rows(p: Params, s: list[np.ndarray], out: np.ndarray) -> None:
    b = _f(s[1])
    rows = np.broadcast_to(s[2].astype(np.int64), b.shape[:-1])
    d2 = out.reshape(-1, *out.shape[-2:])  # a view: the destination is a contiguous cache
    b2, r2 = b.reshape(-1, *b.shape[-2:]), rows.reshape(-1, rows.shape[-1])
    for i in range(d2.shape[0]):
        d2[i][r2[i]] = b2[i].astype(out.dtype)


def _soft_max(p: Params, s: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    x = _f(s[0]) * p["scale"]
    if len(s) > 1:
        rows = x.shape[-2] if x.ndim > 1 else 1
        x = x + _f(s[1])[..., :rows, :]
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum(axis=-1, keepdims=True)


def rope_supported(op: Tensor) -> bool:
    """Plain rotary embedding only: no YaRN, no frequency factors or scaling."""
    p = op.op_params
    return (
        len(op.src) == 2
        and p["ext_factor"] == 0.0
        and p["freq_scale"] == 1.0
        and p["attn_factor"] == 1.0
    )


def _rope(p: Params, s: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    x = _f(s[0]).astype(np.float64)
    n_dims = p["n_dims"]
    half = n_dims // 2
    theta = s[1].astype(np.float64)[:, None] * p["freq_base"] ** (-2.0 * np.arange(half) / n_dims)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]  # (tokens, 1, half)
    if p["mode"] == RopeMode.NEOX:
        i0, i1 = np.arange(half), np.arange(half) + half
    else:
        i0, i1 = np.arange(0, n_dims, 2), np.arange(1, n_dims, 2)
    x0, x1 = x[..., i0], x[..., i1]
    x[..., i0], x[..., i1] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return x


def _copy(p: Params, s: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    return s[0].reshape(out.shape)  # element k in C order goes to element k


KERNELS: dict[Op, Kernel] = {
    Op.ADD: _binary(np.add),
    Op.SUB: _binary(np.subtract),
    Op.MUL: _binary(np.multiply),
    Op.DIV: _binary(np.divide),
    Op.SCALE: lambda p, s, out: _f(s[0]) * p["scale"] + p["bias"],
    Op.UNARY: lambda p, s, out: _UNARY[p["fn"]](_f(s[0])),
    Op.GLU: _glu,
    Op.NORM: _norm(rms=False),
    Op.RMS_NORM: _norm(rms=True),
    Op.MUL_MAT: _mul_mat,
    Op.GET_ROWS: _get_rows,
    Op.SET_ROWS: _set_rows,
    Op.CPY: _copy,
    Op.DUP: _copy,
    Op.CONT: _copy,
    Op.CONCAT: lambda p, s, out: np.concatenate(s, axis=p["axis"]),
    Op.SUM_ROWS: lambda p, s, out: _f(s[0]).sum(axis=-1, keepdims=True),
    Op.SOFT_MAX: _soft_max,
    Op.ROPE: _rope,
}


def prepare(nodes: Sequence[Tensor]) -> Callable[[], None]:
    """Resolve the memory of every node now; the returned function does the math."""
    work: list[tuple[Kernel, Params, list[np.ndarray], np.ndarray]] = []
    for n in nodes:
        if n.op not in _VIEWS:
            work.append((KERNELS[n.op], n.op_params, [array(s) for s in n.src], array(n)))

    def run() -> None:
        for kernel, params, srcs, out in work:
            result = kernel(params, srcs, out)
            if result is not None:
                out[...] = result.astype(out.dtype, copy=False)

    return run

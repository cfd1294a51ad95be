"""What every kernel builder shares: numpy views of tensors, float32 staging, composition.

A kernel *builder* runs once, when a graph plan is made: it takes the node, gets numpy
views of the node and its sources from :class:`BuildContext`, allocates any scratch it
needs, and returns a zero-argument :data:`Step` that does the work. Replaying the plan
only calls steps, so shape logic and allocation happen once per plan, not per compute.

Precision follows ggml: F16 and BF16 values are widened to float32, computed on in
float32, and rounded once into the destination type. :meth:`BuildContext.f32_in` and
:meth:`BuildContext.f32_out` arrange that, and cost nothing for F32 tensors, which are
used in place.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.host import tensor_array
from tensorplug.quants import bf16_to_f32, f32_to_bf16
from tensorplug.types import Type

from .numpy_kernels import NUMPY_KERNELS
from .steps import (
    F32,
    ROWS_PARALLEL_MIN,
    SplitRows,
    Step,
    StepSequence,
    block_rows,
    padded4,
    reshape_view,
    sequence,
    split_rows,
)

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .provider import CompiledKernels, Kernels

__all__ = [
    "block_rows",
    "BuildContext",
    "F32",
    "ROWS_PARALLEL_MIN",
    "Step",
    "StepSequence",
    "from_f32",
    "padded4",
    "reshape_view",
    "sequence",
    "split_rows",
    "SplitRows",
    "tiled_operands",
    "to_f32",
]


def _store_bf16(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, f32_to_bf16(src))


class BuildContext:
    """Numpy views of a plan's tensors (made once each) and float32 staging buffers."""

    def __init__(self, kernels: Kernels = NUMPY_KERNELS, ggml_order: bool = False) -> None:
        #: the provider the builders ask for their steps' kernels (:mod:`.provider`)
        self.kernels = kernels
        #: its compiled kernels, for the paths only they take (None: numpy's paths)
        self.compiled: CompiledKernels | None = kernels.compiled
        #: sum in ggml's orders, whose bits depend on a step's row count, rather than
        #: each row as if alone (``CpuBackend.ggml_order``)
        self.ggml_order = ggml_order
        # keyed by id(); the tensor is kept with its view so the id stays unique
        self._views: dict[int, tuple[Tensor, np.ndarray]] = {}
        # scratch memory shared by the plan's nodes: slot k of every node reuses one
        # byte array, since nodes run one after the other and no scratch outlives its
        # node's step. Distinct slots keep one node's temporaries apart.
        self._pool: list[np.ndarray] = []
        self._slot = 0
        #: whether a step calls numpy's BLAS (a builder that binds one says so): only
        #: then does a compute pin BLAS to one thread around the plan (a cost paid at
        #: every compute, every generated token, higher with the caches cold)
        self.uses_blas = False

    def begin_node(self) -> None:
        """Start handing out scratch for a new node (earlier nodes' scratch is reusable)."""
        self._slot = 0

    def scratch(self, shape: tuple[int, ...], dtype: np.dtype | type = F32) -> np.ndarray:
        """An uninitialised array for temporaries of the current node's step."""
        dt = np.dtype(dtype)
        count = math.prod(shape)  # np.prod is far slower on a tuple, and plans make hundreds
        need = max(1, count * dt.itemsize)
        if self._slot == len(self._pool):
            self._pool.append(np.empty(0, np.uint8))
        raw = self._pool[self._slot]
        if raw.size < need:
            # a bigger array for this slot from now on; earlier views keep the old one.
            # It is kept cache-line aligned, like host tensors: its start is cut to a
            # multiple of 64 here, once (``ctypes.data`` is slow to ask, and a call would
            # ask it three times a product, of every new plan)
            spare = np.empty(need + 64, np.uint8)
            skip = -spare.ctypes.data % 64
            raw = self._pool[self._slot] = spare[skip : skip + need]
        self._slot += 1
        return raw[:need].view(dt)[:count].reshape(shape)

    def view(self, t: Tensor) -> np.ndarray:
        """The tensor's memory as numpy: its dtype and strides, or raw blocks if quantized."""
        hit = self._views.get(id(t))
        if hit is None:
            hit = (t, tensor_array(t))
            self._views[id(t)] = hit
        return hit[1]

    def f32_in(self, t: Tensor) -> tuple[np.ndarray, Step | None]:
        """A float32 array that holds ``t``'s values once the returned step has run.

        F32 tensors are their own view (no step). F16 and BF16 get a scratch array and a
        step that widens the values into it, exactly (both embed in float32).
        """
        v = self.view(t)
        if t.type == Type.F32:
            return v, None
        buf = self.scratch(t.shape)
        if t.type == Type.F16:
            return buf, partial(np.copyto, buf, v)
        if t.type == Type.BF16:
            # bf16 is the top half of an f32: shift the bits into place, no allocation
            return buf, partial(np.left_shift, v, 16, out=buf.view(np.uint32), dtype=np.uint32)
        raise AssertionError(f"f32_in: {t.describe()} is not a float tensor")

    def f32_out(self, t: Tensor) -> tuple[np.ndarray, Step | None]:
        """A float32 array to compute ``t`` into, and the step that stores it into ``t``.

        F32 results are computed straight into the tensor. F16 results are rounded to
        nearest even by numpy's cast, BF16 ones by ggml's rounding rule.
        """
        v = self.view(t)
        if t.type == Type.F32:
            return v, None
        buf = self.scratch(t.shape)
        if t.type == Type.F16:
            return buf, partial(np.copyto, v, buf, casting="same_kind")
        if t.type == Type.BF16:
            return buf, partial(_store_bf16, v, buf)
        raise AssertionError(f"f32_out: {t.describe()} is not a float tensor")


def to_f32(values: np.ndarray, t: Type) -> np.ndarray:
    """Float32 values of an array stored as float type ``t`` (allocates unless F32)."""
    if t == Type.F32:
        return values
    if t == Type.BF16:
        return bf16_to_f32(values)
    return values.astype(F32)


def from_f32(values: np.ndarray, t: Type) -> np.ndarray:
    """Float32 ``values`` converted to the storage dtype of float type ``t``."""
    if t == Type.BF16:
        return f32_to_bf16(values)
    return values.astype(t.numpy_dtype, copy=False)


def tiled_operands(
    a: np.ndarray, b: np.ndarray, out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views that turn ggml's tiling broadcast into numpy broadcasting.

    Wherever ``b``'s extent ``B`` divides ``a``'s ``A`` without being 1 or ``A``, that
    axis of ``a`` and ``out`` becomes ``(A/B, B)`` and ``b``'s becomes ``(1, B)``:
    element ``i`` then meets ``b[i % B]``. Splitting an axis never copies.
    """
    bp = b.reshape((1,) * (a.ndim - b.ndim) + b.shape)
    pairs: list[tuple[int, int]] = list(zip(a.shape, bp.shape, strict=True))
    if all(db in (1, da) for da, db in pairs):
        return a, bp, out
    ashape: list[int] = []
    bshape: list[int] = []
    for da, db in pairs:
        if db in (1, da):
            ashape.append(da)
            bshape.append(db)
        else:
            ashape += [da // db, db]
            bshape += [1, db]
    av, bv, ov = (
        reshape_view(x, tuple(sh)) for x, sh in ((a, ashape), (bp, bshape), (out, ashape))
    )
    assert av is not None and bv is not None and ov is not None  # splits are always views
    return av, bv, ov

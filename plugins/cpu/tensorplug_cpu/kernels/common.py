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
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.host import tensor_array
from tensorplug.quants import bf16_to_f32, f32_to_bf16
from tensorplug.types import Type

from ..workers import POOL

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .jit import JitKernels

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
    "to_f32",
]

#: A prepared unit of work: call it to run (part of) one node.
Step = Callable[[], object]

F32 = np.dtype(np.float32)


#: Values a row kernel must touch before its rows are split over the worker pool. A
#: sleeping helper takes tens of µs to wake on this 2-vCPU VM: a 100M model's 128-token
#: prompt ran its SwiGLU (262,144 values) in 234 µs on 2 threads against 336 on one,
#: but its rms_norm and rope (98,304 values, ~100 µs) no faster, so they stay whole.
#: Where a step's row job is ready, a numba region shares its rows out instead, from
#: fewer values (:func:`.program.rows_regions`); this is a first run's way meanwhile.
ROWS_PARALLEL_MIN = 1 << 18


def split_rows(n_rows: int, n_values: int, bind: Callable[[slice], Step]) -> Step:
    """A row kernel's step, its rows split in chunks over the worker pool when it has
    work enough and the pool more than one thread (a :class:`SplitRows`); ``bind(rows)``
    is the kernel on those rows (bound once per chunk, here). The kernel must release
    the GIL (numba's ``nogil``). Rows are independent, so a split changes no number."""
    whole = bind(slice(None))
    if n_values < ROWS_PARALLEL_MIN or n_rows < 2 or POOL.max_threads == 1:
        return whole
    n = min(n_rows, 2 * POOL.max_threads)
    per = -(-n_rows // n)
    return SplitRows(whole, [bind(slice(r, min(n_rows, r + per))) for r in range(0, n_rows, per)])


class SplitRows:
    """A row kernel's step whose rows the worker pool shares out (:func:`split_rows`);
    ``whole`` is the kernel on every row, what a job form is made of (:mod:`.program`)."""

    __slots__ = ("_parts", "whole")

    def __init__(self, whole: Step, parts: list[Step]) -> None:
        self.whole, self._parts = whole, parts

    def __call__(self) -> None:
        if POOL.n_threads == 1:  # the thread count at each run: it may change between runs
            self.whole()
        else:
            POOL.run(len(self._parts), self._task)

    def _task(self, i: int, slot: int) -> None:
        self._parts[i]()


class StepSequence:
    """Steps run in order as one (:func:`sequence`); a program lowers each of them to its
    job (:mod:`.program`)."""

    __slots__ = ("steps",)

    def __init__(self, steps: tuple[Step, ...]) -> None:
        self.steps = steps

    def __call__(self) -> None:
        for s in self.steps:
            s()


def sequence(*steps: Step | None) -> Step:
    """One step running ``steps`` in order (``None`` entries are skipped)."""
    todo = tuple(s for s in steps if s is not None)
    if len(todo) == 1:
        return todo[0]
    return StepSequence(todo)


def block_rows(blocks: np.ndarray) -> np.ndarray | None:
    """``(n_out, nblocks, type_size)`` blocks as ``(n_out, nblocks·type_size)`` byte rows
    without copying, or None when a row's blocks are not contiguous."""
    n_out, nblocks, size = blocks.shape
    if blocks.strides[2] != 1 or blocks.strides[1] != size:
        return None
    # a view, since each row's bytes are contiguous (checked above); reshape is ~10× cheaper
    # than as_strided, and a prompt's plan takes this for every chunk of every product
    return blocks.reshape(n_out, nblocks * size)


def reshape_view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` reshaped without copying, or ``None`` when only a copy could do it.

    Plans keep views into buffers; a reshape that silently copied would freeze the
    values seen when the plan was built, so callers must know which one they got.
    """
    r = a.reshape(shape)
    # a copy is fresh memory, so it cannot even lie within a's bounds
    if r.size and not np.may_share_memory(r, a):
        return None
    return r


def padded4(a: np.ndarray, core: int = 0) -> np.ndarray:
    """``a`` with leading unit axes so that it has 4 (+ ``core``) dimensions (a view)."""
    want = 4 + core
    return a.reshape((1,) * (want - a.ndim) + a.shape) if a.ndim < want else a


def _store_bf16(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, f32_to_bf16(src))


class BuildContext:
    """Numpy views of a plan's tensors (made once each) and float32 staging buffers."""

    def __init__(self, jit: JitKernels | None = None, ggml_order: bool = False) -> None:
        #: the numba kernels, for builders that have a compiled variant (None: numpy only)
        self.jit = jit
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
        #: then does a compute pin BLAS to one thread around the plan (~4 µs a compute,
        #: more with the caches cold, every generated token)
        self.uses_blas = False

    def begin_node(self) -> None:
        """Start handing out scratch for a new node (earlier nodes' scratch is reusable)."""
        self._slot = 0

    def scratch(self, shape: tuple[int, ...], dtype: np.dtype | type = F32) -> np.ndarray:
        """An uninitialised array for temporaries of the current node's step."""
        dt = np.dtype(dtype)
        count = math.prod(shape)  # np.prod costs ~10 µs a call, and plans make hundreds
        need = max(1, count * dt.itemsize)
        if self._slot == len(self._pool):
            self._pool.append(np.empty(0, np.uint8))
        raw = self._pool[self._slot]
        if raw.size < need:
            # a bigger array for this slot from now on; earlier views keep the old one.
            # It is kept cache-line aligned, like host tensors: its start is cut to a
            # multiple of 64 here, once (``ctypes.data`` per call cost ~1 µs, three
            # times a product, of every new plan)
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

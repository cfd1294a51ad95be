"""The numba row kernels of the CPU plugin: RMS norm, rope, gated activations and
set_rows on a few rows, called now or bound as a plan's steps (:meth:`RowKernels.bound`,
which :mod:`.program` reads as its jobs). The ``bind_*`` methods are the provider's
(:class:`.provider.Kernels`): each binds the row kernel, in chunks of rows the worker
pool shares (:func:`.common.split_rows`), where its loop takes the arrays, and numpy's
way (:mod:`.numpy_kernels`) where it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tensorplug.opcodes import GluOp

from .gelu_table import glu_table
from .jit_binding import Binding
from .jit_steps import RowsCall
from .job_blocks import GEGLU, SWIGLU
from .kernel_refs import module_kernel
from .numpy_kernels import NUMPY_KERNELS
from .steps import Step, reshape_view, split_rows

if TYPE_CHECKING:
    from .steps import Scratch

__all__ = ["RowKernels"]

#: one kernel call: what it is, the kernel, its arguments
_Call = tuple[str, Any, tuple[Any, ...]]
_MODULE = "_numba_rows"
#: the rope kernel's "none" for its optional float32 arrays
_NO_F32 = np.empty(0, np.float32)


class RowKernels(Binding):
    """The row kernels, by reference (:mod:`.kernel_refs`), and their calls."""

    _rms_norm_rows = module_kernel(_MODULE, "rms_norm_rows")
    _glu_rows = module_kernel(_MODULE, "glu_rows")
    _set_rows = module_kernel(_MODULE, "set_rows")
    _rope_rows = module_kernel(_MODULE, "rope_rows")
    _set_rows_blocks = module_kernel("_numba_encode", "set_rows_blocks")
    _hadamard_rows = module_kernel(_MODULE, "hadamard_rows")
    _glu_kinds: ClassVar[dict[GluOp, int]] = {GluOp.SWIGLU: SWIGLU, GluOp.GEGLU: GEGLU}

    @property
    def _resolvers(self) -> dict[Callable[..., Any], Callable[..., _Call]]:
        """Each row method's call, by the bound method (what :meth:`bound` and
        :meth:`expect` are given)."""
        return {self.rms_norm_rows: self._rms_norm_call, self.rope_rows: self._rope_call,
                self.glu_rows: self._glu_call, self.set_rows: self._set_rows_call}  # fmt: skip

    def bind_rms_norm(
        self, x: np.ndarray, out: np.ndarray, eps: np.float32, scratch: Scratch
    ) -> Step:
        """RMS norm of ``x``'s rows into ``out``: the row kernel on rows that can be
        seen 2-d without a copy, numpy's otherwise."""
        n = x.shape[-1]
        x2, out2 = reshape_view(x, (-1, n)), reshape_view(out, (-1, n))
        if x2 is None or out2 is None:
            return NUMPY_KERNELS.bind_rms_norm(x, out, eps, scratch)
        e = float(eps)
        self.expect(self.rms_norm_rows, x2, out2, e)
        return split_rows(x2.shape[0], x2.size,
                          lambda r: self.bound(self.rms_norm_rows, x2[r], out2[r], e))  # fmt: skip

    def bind_glu(
        self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray, scratch: Scratch
    ) -> Step:
        """``out = act(x)·g``: the row kernel for swiglu and geglu, any row count (SwiGLU's
        loop is vectorised, its exp a polynomial; geglu's f16-table lookup is one pass
        where numpy's is several), numpy's for the other units and for rows that cannot
        be seen 2-d without a copy."""
        n = out.shape[-1]
        x2, g2, out2 = (reshape_view(v, (-1, n)) for v in (x, g, out))
        if fn not in self._glu_kinds or x2 is None or g2 is None or out2 is None:
            return NUMPY_KERNELS.bind_glu(fn, x, g, out, scratch)
        self.expect(self.glu_rows, fn, x2, g2, out2)  # (its row chunks are arrays of x2's kind)
        glu = self.glu_rows
        return split_rows(x2.shape[0], out2.size,
                          lambda r: self.bound(glu, fn, x2[r], g2[r], out2[r]))  # fmt: skip

    def bind_rope(
        self, x: np.ndarray, out: np.ndarray, pos: np.ndarray, ff: np.ndarray | None,
        ramp: np.ndarray | None, keep: np.ndarray | None, neox: bool, n_dims: int,
        scales: tuple[np.float32, np.float32, np.float32], scratch: Scratch,
    ) -> Step:  # fmt: skip
        """Rotary embedding (:meth:`.numpy_kernels.NumpyKernels.bind_rope`): the row
        kernel for one sequence, ``(…1, n_tokens, n_head, head_dim)`` with positions a
        vector, numpy's for more. numpy's ~15 calls are a visible cost on a generation
        step's one token, twice per block, and the one loop is faster on a prompt's rows
        too."""
        shape = x.shape[-3:]
        if x.ndim < 3 or any(d != 1 for d in x.shape[:-3]) or pos.ndim != 1:
            return NUMPY_KERNELS.bind_rope(x, out, pos, ff, ramp, keep, neox, n_dims, scales,
                                           scratch)  # fmt: skip
        x3, out3 = x.reshape(shape), out.reshape(shape)  # leading 1s: views, never copies
        rest = (_NO_F32 if ff is None else ff, _NO_F32 if ramp is None else ramp,
                _NO_F32 if keep is None else keep, neox, n_dims, *scales)  # fmt: skip
        self.expect(self.rope_rows, x3, out3, pos, *rest)
        rope = self.rope_rows
        return split_rows(shape[0], x3.size,
                          lambda r: self.bound(rope, x3[r], out3[r], pos[r], *rest))  # fmt: skip

    def glu_kind(self, fn: GluOp) -> int | None:
        """:func:`._numba_rows.glu_rows`'s code for ``fn`` (None: not one of its)."""
        return self._glu_kinds.get(fn)

    def rms_norm_rows(self, x: np.ndarray, out: np.ndarray, eps: float) -> None:
        """:func:`._numba_rows.rms_norm_rows` on 2-d float32 rows."""
        self.call_resolved(self._rms_norm_call(x, out, eps))

    def _rms_norm_call(self, x: np.ndarray, out: np.ndarray, eps: float) -> _Call:
        return "rms_norm kernel", self._rms_norm_rows, (x, out, eps)

    def rope_rows(self, *args: Any) -> None:
        """:func:`._numba_rows.rope_rows` (a generation step's few tokens)."""
        self.call_resolved(self._rope_call(*args))

    def _rope_call(self, *args: Any) -> _Call:
        return "rope kernel", self._rope_rows, args

    def glu_rows(self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
        """:func:`._numba_rows.glu_rows` on 2-d float32 rows (``fn``: swiglu or geglu)."""
        self.call_resolved(self._glu_call(fn, x, g, out))

    def _glu_call(self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> _Call:
        args = (x, g, out, self._glu_kinds[fn], glu_table(fn))
        return "gated activation kernel", self._glu_rows, args

    def set_rows(self, table: np.ndarray, values: np.ndarray, idx: np.ndarray) -> int:
        """:func:`._numba_rows.set_rows`: -1 when written, else the first bad index's
        position (nothing written)."""
        return int(self.call_resolved(self._set_rows_call(table, values, idx)))

    def _set_rows_call(self, table: np.ndarray, values: np.ndarray, idx: np.ndarray) -> _Call:
        return "set_rows kernel", self._set_rows, (table, values, idx)

    def bind_hadamard(self, x: np.ndarray, out: np.ndarray, n: int) -> Callable[[], Any]:
        """:func:`._numba_rows.hadamard_rows` of 2-d float32 ``x`` into ``out`` as a step."""
        self.expect_call("Hadamard rotation kernel", self._hadamard_rows, x, out, n)
        return self.bind_call("Hadamard rotation kernel", self._hadamard_rows, x, out, n)

    def bind_set_rows_blocks(
        self, table: np.ndarray, values: np.ndarray, idx: np.ndarray, kind: int
    ) -> Callable[[], Any]:
        """:func:`._numba_encode.set_rows_blocks` of raw rows ``table`` (rows, bytes) of
        ggml type id ``kind`` as a step: -1 when written, else the first bad index's
        position (nothing written)."""
        args = (table, values, idx, kind)
        self.expect_call("quantized set_rows kernel", self._set_rows_blocks, *args)
        return self.bind_call("quantized set_rows kernel", self._set_rows_blocks, *args)

    def bound(self, method: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        """``method(*args)`` (:meth:`rms_norm_rows`, :meth:`rope_rows`, :meth:`glu_rows`
        or :meth:`set_rows`) as a plan's step calls it every compute, with these
        arguments: a partial of ``method`` (:mod:`.program` reads a step as its job by
        that), whose calls after the first go straight to the kernel's code for these
        arguments' types (:class:`KernelCall`)."""
        return RowsCall(method, *args, resolve=self._resolvers[method], run=self.call)

    def expect(self, method: Callable[..., Any], *args: Any) -> None:
        """A step of the plan being bound calls ``method`` (:meth:`rms_norm_rows`,
        :meth:`rope_rows`, :meth:`glu_rows` or :meth:`set_rows`) with arguments of the
        types of ``args`` when it runs: noted, so that :meth:`load_expected` loads its
        kernel when the plan is prepared rather than run."""
        resolve = self._resolvers.get(method)
        if resolve is not None:  # (another callable: its first call loads what it needs)
            what, kernel, kernel_args = resolve(*args)
            self.expect_call(what, kernel, *kernel_args)

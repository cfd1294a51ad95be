"""The numba row kernels of the CPU plugin: RMS norm, rope, gated activations and
set_rows on a few rows, called now or bound as a plan's steps (:meth:`RowKernels.bound`,
which :mod:`.program` reads as its jobs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from tensorplug.opcodes import GluOp

from .gelu_table import glu_table
from .jit_binding import Binding
from .jit_steps import RowsCall
from .job_blocks import GEGLU, SWIGLU
from .kernel_refs import module_kernel

__all__ = ["RowKernels"]

#: one kernel call: what it is, the kernel, its arguments
_Call = tuple[str, Any, tuple[Any, ...]]
_MODULE = "_numba_rows"


class RowKernels(Binding):
    """The row kernels, by reference (:mod:`.kernel_refs`), and their calls."""

    _rms_norm_rows = module_kernel(_MODULE, "rms_norm_rows")
    _glu_rows = module_kernel(_MODULE, "glu_rows")
    _set_rows = module_kernel(_MODULE, "set_rows")
    _rope_rows = module_kernel(_MODULE, "rope_rows")
    _glu_kinds: ClassVar[dict[GluOp, int]] = {GluOp.SWIGLU: SWIGLU, GluOp.GEGLU: GEGLU}

    @property
    def _resolvers(self) -> dict[Callable[..., Any], Callable[..., _Call]]:
        """Each row method's call, by the bound method (what :meth:`bound` and
        :meth:`expect` are given)."""
        return {self.rms_norm_rows: self._rms_norm_call, self.rope_rows: self._rope_call,
                self.glu_rows: self._glu_call, self.set_rows: self._set_rows_call}  # fmt: skip

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

    def has_glu(self, fn: GluOp) -> bool:
        return fn in self._glu_kinds

    def glu_rows(self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
        """:func:`._numba_rows.glu_rows` on 2-d float32 rows (``fn``: :meth:`has_glu`)."""
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

"""The steps the numba kernels bind (:mod:`.jit`): a kernel call with fixed arguments,
a row kernel's call, a product that picks its kernel by the thread count, a job on the
spinning helpers, a prompt's row job shared out as a region, and a job function's step.

A step is what a plan calls every compute, so each does its choosing once, when it is
bound, and keeps the arrays the compiled code reads by address alive as long as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np

from .job_calls import JobCall
from .steps import Step

__all__ = ["JobStep", "KernelCall", "PooledJob", "ProductStep", "RowsCall", "RowsRegion",
           "StepRunner", "settle"]  # fmt: skip


def settle(step: Any, called: Collection[str]) -> None:
    """Make ``step``'s calls go straight to their code now, as its first compute would
    (:meth:`KernelCall.settle`), for the kernels in ``called`` (loaded: a prepared plan's
    kernels are). A plan that ``graph_prepare`` settled runs its first compute as fast as
    its later ones: a server prepares every step shape before it serves, and a shape's
    first compute otherwise keyed each of its calls by type twice (several milliseconds
    on the request that first met it). Steps that resolve nothing are left as they are."""
    own = getattr(step, "settle", None)
    if own is not None:
        own(called)


def _direct(kernel: Any, arguments: Sequence[Any]) -> Any:
    """What calls with ``arguments``'s types, and only those, call: the kept code for
    them (:meth:`.kernel_refs.KernelRef.for_types`), or ``kernel`` itself."""
    return kernel.for_types(*arguments) if hasattr(kernel, "for_types") else kernel


class StepRunner(Protocol):
    """What the steps ask of the kernels that bound them (:class:`.jit_calls.KernelCalls`)."""

    #: threads a step's kernels run on now
    n_threads: int
    #: :func:`._numba_pool.run_alone` and :func:`._numba_pool.run_region`, by reference
    runner_alone: Any
    runner_in_region: Any

    def call(self, what: str, kernel: Callable[..., Any], *args: Any) -> Any: ...

    def expect_call(self, what: str, kernel: Any, *args: Any) -> None: ...

    def run_region(self, fn: int, block: int, chunks: int) -> None: ...

    def job_address(self, job: Any, what: str) -> int: ...


class KernelCall(partial[Any]):
    """``run(what, kernel, *arguments)`` (:meth:`.jit_calls.KernelCalls.call`) for a step whose
    arguments are fixed, ``before`` called first where given: its first call is
    ``_call``'s (the kernel loaded from kept code, or by numba, and kept), and later
    ones call what runs these arguments' types at once (the kept code itself,
    :meth:`.kernel_refs.KernelRef.for_types`), not the kernel's reference, which keys
    every call by its arguments' types (a few microseconds, several times numba's
    dispatcher, and a small model's token on one thread makes ~80 such calls, a
    noticeable share of its time). A partial,
    whose ``args`` are ``(what, kernel, *arguments)``, for the binder to read."""

    _run: Callable[..., Any] | None
    _before: Callable[[], Any] | None
    _arguments: tuple[Any, ...]

    def __new__(
        cls, run: Callable[..., Any], what: str, kernel: Any, *arguments: Any,
        before: Callable[[], Any] | None = None,
    ) -> KernelCall:  # fmt: skip
        self = super().__new__(cls, run, what, kernel, *arguments)
        self._run, self._before, self._arguments = None, before, arguments
        return self

    def __call__(self, /, *more: Any, **keywords: Any) -> Any:
        if self._before is not None:
            self._before()
        run = self._run
        if run is not None:
            return run(*self._arguments)
        result = self.func(*self.args)
        kernel = self.args[1]
        self._run = _direct(kernel, self._arguments)
        return result

    def settle(self, called: Collection[str]) -> None:
        """What later calls call, resolved now where the kernel was called (or made
        ready) already: the first call would then go straight there too."""
        what, kernel = self.args[0], self.args[1]
        if self._run is None and what in called:
            self._run = _direct(kernel, self._arguments)


class RowsCall(partial[Any]):
    """A row kernel's method (:meth:`.jit_rows.RowKernels.rms_norm_rows`...)
    with fixed arguments, as :meth:`.jit_rows.RowKernels.bound` makes it: a partial of the method
    (:mod:`.program` lowers it to its job by that), whose first call resolves the
    method's kernel call (``resolve``: ``(what, kernel, arguments)``) and makes it
    through ``run`` (:meth:`.jit_calls.KernelCalls.call`), and whose later calls go straight to the
    code for these arguments' types, as :class:`KernelCall`'s do."""

    _call: tuple[Callable[..., Any], tuple[Any, ...]] | None
    _resolve: Callable[..., Any]
    _first: Callable[..., Any]

    def __new__(
        cls, method: Callable[..., Any], *args: Any, resolve: Callable[..., Any],
        run: Callable[..., Any],
    ) -> RowsCall:  # fmt: skip
        self = super().__new__(cls, method, *args)
        self._call, self._resolve, self._first = None, resolve, run
        return self

    def __call__(self, /, *more: Any, **keywords: Any) -> Any:
        call = self._call
        if call is not None:
            return call[0](*call[1])
        what, kernel, arguments = self._resolve(*self.args)
        result = self._first(what, kernel, *arguments)
        direct = _direct(kernel, arguments)
        self._call = (direct, tuple(arguments))
        return result

    def settle(self, called: Collection[str]) -> None:
        """As :meth:`KernelCall.settle`."""
        if self._call is None:
            what, kernel, arguments = self._resolve(*self.args)
            if what in called:
                direct = _direct(kernel, arguments)
                self._call = (direct, tuple(arguments))


class PooledJob:
    """A step that runs a job on the spinning helpers (a repacked product of
    :class:`.jit_products.ProductKernels`), or its numba ``region`` on one thread (set
    after binding) and while another thread's job holds the pool. Holds the job's argument
    block and the arrays it names by address, which must live as long as the step."""

    def __init__(
        self, jit: StepRunner, pool: Any, fn: int, block: np.ndarray, chunks: int,
        region: Callable[[], None], arrays: tuple[np.ndarray, ...],
    ) -> None:  # fmt: skip
        self._jit, self._pool, self._fn = jit, pool, fn
        self._block, self._at, self._chunks = block, block.ctypes.data, chunks
        self._region, self._arrays = region, arrays

    def __call__(self) -> None:
        n = self._jit.n_threads
        if n == 1 or not self._pool.run(n, self._fn, self._at, self._chunks):
            self._region()

    def job_call(self) -> JobCall:
        """This step in a program: its chunks shared, or all run by the caller on one
        thread (each group computed as the driver computes it: the region's bits)."""
        block = (self._block, self._chunks)
        return JobCall(self._fn, block, block, shared=True, arrays=(self._block, *self._arrays))


class ProductStep:
    """A product's step (:meth:`.jit_calls.KernelCalls.serial_or_parallel`,
    :meth:`.jit_calls.KernelCalls.one_by_one_or_together`): ``run``, which picks its kernel at each
    call; a program's job (:mod:`.program`) where it has one on the helpers."""

    def __init__(
        self, run: Callable[[], None], pooled: Callable[[], None] | None,
        calls: Sequence[Callable[[], None]] = (),
    ) -> None:  # fmt: skip
        self._run, self._pooled, self._calls = run, pooled, tuple(calls)

    def __call__(self) -> None:
        self._run()

    def settle(self, called: Collection[str]) -> None:
        """Its kernels' calls (``calls``: those ``run`` picks from), settled."""
        for call in self._calls:
            settle(call, called)

    def job_call(self) -> JobCall | None:
        return self._pooled.job_call() if isinstance(self._pooled, PooledJob) else None


class RowsRegion:
    """A prompt's row step (:meth:`.jit_calls.KernelCalls.rows_region`): ``step`` on one thread, its
    job's ``chunks`` as a numba region on more. Holds the job's argument block and the
    arrays it names by address, which must live as long as the step."""

    def __init__(
        self, jit: StepRunner, step: Step, fn: int, block: np.ndarray, chunks: int,
        arrays: tuple[np.ndarray, ...],
    ) -> None:  # fmt: skip
        self._jit, self._step, self._fn = jit, step, fn
        self._block, self._at, self._chunks, self._arrays = block, block.ctypes.data, chunks, arrays

    def __call__(self) -> None:
        if self._jit.n_threads == 1:
            self._step()
        else:
            self._jit.run_region(self._fn, self._at, self._chunks)

    def settle(self, called: Collection[str]) -> None:
        settle(self._step, called)


class JobStep:
    """A step that runs one job function (flash attention,
    :meth:`.jit_attention.AttentionKernels.bind_attend`): on one thread alone
    (:func:`._numba_pool.run_alone`), on more shared with the spinning helpers
    (``pool``), or as a numba region where there are none for the step (None) or
    another thread's job holds them. ``blocks``:
    the job's argument block and chunk count for one thread and for numba's most
    (a plan is bound at the count of its first compute and kept for others); the job
    is loaded, or waited for, at the first call. Holds the arrays the blocks name by
    address, which must live as long as the step."""

    def __init__(
        self, jit: StepRunner, job: Any, what: str,
        blocks: Sequence[tuple[np.ndarray, int]], arrays: tuple[np.ndarray | None, ...],
        pool: Any,
    ) -> None:  # fmt: skip
        self._jit, self._job, self._what, self._fn = jit, job, what, 0
        (self._one, self._one_chunks), (self._many, self._many_chunks) = blocks
        self._one_at, self._many_at = self._one.ctypes.data, self._many.ctypes.data
        self._pool = pool
        self._alone, self._region = jit.runner_alone, jit.runner_in_region
        self._arrays = arrays
        if jit.n_threads == 1:  # (the numbers of its calls' kinds: addresses and a count)
            jit.expect_call("job runner", self._alone, 0, 0, 0)
        elif pool is None:
            jit.expect_call("parallel job runner", self._region, 0, 0, 0)

    def __call__(self) -> None:
        fn = self._fn or self._load()
        jit = self._jit
        n = jit.n_threads
        if n == 1:
            jit.call("job runner", self._alone, fn, self._one_at, self._one_chunks)
        elif self._pool is None or not self._pool.run(n, fn, self._many_at, self._many_chunks):
            jit.run_region(fn, self._many_at, self._many_chunks)

    def _load(self) -> int:
        self._fn = self._jit.job_address(self._job, self._what)
        return self._fn

    def job_call(self) -> JobCall | None:
        """This step in a program, once its job is loaded (None before: its first call
        loads it, or waits for the compile-ahead process)."""
        if not self._fn:
            if not self._job.ready():
                return None
            self._fn = int(self._job.address)
        arrays = (self._one, self._many, *(a for a in self._arrays if a is not None))
        return JobCall(self._fn, (self._one, self._one_chunks), (self._many, self._many_chunks),
                       shared=self._pool is not None, arrays=arrays)  # fmt: skip

"""What the numba kernels' families bind their steps through.

The numba provider (:class:`.jit.JitKernels`) is one object made of a family per kind
of kernel: products (:mod:`.jit_products`), attention (:mod:`.jit_attention`) and row
kernels (:mod:`.jit_rows`), each binding steps of its kernels, and the calls they all
share (:mod:`.jit_calls`): a kernel's first call loaded or compiled, the kernels a plan
will call noted for the compile-ahead process, the thread counts. :class:`Binding` is
that shared part as the families see it, so that a family depends on what it asks, not
on how the calls are made.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from .jit_steps import KernelCall

__all__ = ["F16_TO_F32", "Binding", "CompileAhead"]

#: every f16 bit pattern's float32 value, exact: the kernels decode half floats by one
#: lookup a block, cheaper than by hand
F16_TO_F32 = (
    np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
)


class CompileAhead(Protocol):
    """The compile-ahead process as the kernels ask it (:class:`.ahead.Ahead`)."""

    jobs: dict[Any, None]

    def want(self, kernel: Any, *args: Any, rank: int = 0) -> None: ...

    def want_job(self, job: Any, rank: int) -> None: ...

    def will_call(self, kernel: Any, *args: Any) -> None: ...

    def keep(self, kernel: Any) -> None: ...

    def has(self, kernel: Any) -> bool: ...

    def wait_for(self, kernel: Any) -> None: ...

    def start(self) -> None: ...

    def finish(self) -> None: ...

    def hand_over(self) -> None: ...


class Binding(ABC):
    """The calls every kernel family binds through (:class:`.jit_calls.KernelCalls`
    implements them; see the module)."""

    #: threads a step's kernels run on now
    n_threads: int
    #: the compile-ahead process, where there is one
    ahead: CompileAhead | None
    #: the kernels (by what they are called in messages) that have run in this process
    called: set[str]
    #: one-thread kernels now free to run (:meth:`serial_ready`)
    serial_ok: set[Any]
    #: whether a step of the plan being bound runs attention yet
    attention_bound: bool
    #: :func:`._numba_pool.run_alone` and :func:`._numba_pool.run_region`, by reference
    runner_alone: Any
    runner_in_region: Any

    @property
    @abstractmethod
    def max_threads(self) -> int:
        """The most threads the kernels may use in this process."""

    @abstractmethod
    def call(self, what: str, kernel: Callable[..., Any], *args: Any) -> Any:
        """``kernel(*args)``, its first call loading or compiling it (``what`` names it)."""

    @abstractmethod
    def bind_call(
        self, what: str, kernel: Any, *args: Any, before: Callable[[], Any] | None = None
    ) -> KernelCall:
        """:meth:`call` with fixed arguments, as a step."""

    @abstractmethod
    def call_resolved(self, call: tuple[str, Any, tuple[Any, ...]]) -> Any:
        """:meth:`call` of a ``(what, kernel, arguments)`` triple."""

    @abstractmethod
    def expect_call(self, what: str, kernel: Any, *args: Any) -> None:
        """The plan being bound calls ``kernel(*args)`` when it runs: readied when the
        plan is prepared."""

    @abstractmethod
    def serial_or_parallel(
        self, serial: KernelCall, parallel: KernelCall,
        pooled: Callable[[], None] | None = None, alone: bool = True,
    ) -> Callable[[], None]:  # fmt: skip
        """A product's step: its serial kernel on one thread, else the parallel one."""

    @abstractmethod
    def one_by_one_or_together(
        self, one_by_one: Sequence[Callable[[], None]], together: Callable[[], None],
        pooled: Callable[[], None] | None = None,
    ) -> Callable[[], None]:  # fmt: skip
        """A joint product's step: each product alone on one thread, else together."""

    @abstractmethod
    def want_ahead(self, kernel: Callable[..., Any], *args: Any, rank: int = 1) -> None:
        """Have ``kernel(*args)`` compiled by the compile-ahead process."""

    @abstractmethod
    def run_region(self, fn: int, block: int, chunks: int) -> None:
        """A job's chunks as a numba region."""

    @abstractmethod
    def job_address(self, job: Any, what: str) -> int:
        """The address of a job function, loaded or compiled now."""

    @abstractmethod
    def job_ready(self, job: Any) -> bool:
        """Whether a step may run a job function now."""

    @abstractmethod
    def pool_for(self, rows: int) -> Any:
        """The spinning helpers for a step of ``rows`` rows, or None."""

    @abstractmethod
    def serial_ready(self, serial: Any, parallel: str) -> bool:
        """Whether one thread runs the one-thread kernel ``serial`` now."""

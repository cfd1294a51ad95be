"""The seam between the CPU plan's builders and the kernels that compute their steps.

The builders (:mod:`.matmul`, :mod:`.attention`, :mod:`.convert`, :mod:`.elementwise`)
and the job programs (:mod:`.program`) turn a graph's nodes into steps. What they ask
of kernels goes through a provider (``BuildContext.kernels``), by what a kernel computes
and its arguments: ``bind_round_rows(t, x, out, corr)`` returns the step that computes
it for these arrays. :class:`Kernels` is what every provider computes; numpy's
(:class:`.numpy_kernels.NumpyKernels`) is always there, numba's
(:class:`.jit.JitKernels`) computes the same faster where its kernels take the arrays
and hands numpy's the rest. :class:`CompiledKernels` adds what only compiled code does
well enough to be worth a path of its own (fused products of a few rows, llama.cpp's
exact attention, row programs on a spinning pool): a provider offers it as
``compiled``, and the builders take those paths (through :mod:`.dispatch`'s table for
the products) only where it is there. Another provider (a compiled library, a future
JIT) provides the same protocols without a builder changing. The builders import these
protocols, never a provider, so the kernels' modules import downward only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from tensorplug.opcodes import GluOp
    from tensorplug.types import Type

    from .job_calls import JobSpec
    from .steps import Scratch, Step

__all__ = ["CompiledKernels", "Kernels"]


class Kernels(Protocol):
    """What every provider computes (see the module). A ``bind_*`` does everything but
    the arithmetic once, when the plan is built, and returns the step."""

    #: the provider's compiled kernels, where it has them (None: numpy's paths only)
    @property
    def compiled(self) -> CompiledKernels | None: ...

    def supports(self, t: Type) -> bool:
        """Whether the provider's decoding (and, compiled, its fused products) takes
        ``t`` blocks."""
        ...

    def bind_round_rows(
        self, t: Type, x: np.ndarray, out: np.ndarray, corr: np.ndarray | None
    ) -> Step: ...

    def bind_widen_f16(self, src: np.ndarray) -> Callable[[np.ndarray], np.ndarray]: ...

    def bind_hadamard(self, x: np.ndarray, out: np.ndarray, n: int) -> Step: ...

    def bind_dequantize(
        self, t: Type, blocks: np.ndarray, out: np.ndarray | None = ...
    ) -> Callable[[np.ndarray], np.ndarray]: ...

    def bind_packed(
        self, t: Type, packed: np.ndarray, x: np.ndarray, out: np.ndarray,
        scratch: Scratch = ..., ggml_order: bool = ..., alone: bool = ...,
    ) -> Step: ...  # fmt: skip

    def bind_widen_f16_rows(self, raw: np.ndarray, out: np.ndarray) -> Callable[[int], None]: ...

    def visible_columns(self, mask: np.ndarray) -> int: ...

    def softmax_rows(
        self, s: np.ndarray, mask: np.ndarray, used: int, scale: float, row: np.ndarray
    ) -> None: ...

    def bind_rms_norm(
        self, x: np.ndarray, out: np.ndarray, eps: np.float32, scratch: Scratch
    ) -> Step: ...

    def bind_glu(
        self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray, scratch: Scratch
    ) -> Step: ...

    def bind_rope(
        self, x: np.ndarray, out: np.ndarray, pos: np.ndarray, ff: np.ndarray | None,
        ramp: np.ndarray | None, keep: np.ndarray | None, neox: bool, n_dims: int,
        scales: tuple[np.float32, np.float32, np.float32], scratch: Scratch,
    ) -> Step: ...  # fmt: skip


class CompiledKernels(Kernels, Protocol):
    """What compiled kernels add to :class:`Kernels` (see the module): the paths of their
    own, and what the backend and its row programs (:mod:`.program`) ask of them. A row
    method runs now; :meth:`expect` and :meth:`bound` let a plan name the row kernels it
    will call so that they are made ready before its first step."""

    #: threads a step's kernels run on now, and the most they may
    n_threads: int
    #: most products of one activation :meth:`bind_matvec_siblings` runs as one
    max_siblings: int
    #: what runs a program of row jobs (a kernel reference)
    program_runner: Any
    #: every f16 bit pattern's float32 value (the row jobs' decoding table)
    f16_to_f32: np.ndarray

    @property
    def max_threads(self) -> int: ...

    def bind_matvec(
        self, t: Type, blocks: np.ndarray, x: np.ndarray, out: np.ndarray
    ) -> Callable[[], None]: ...

    def bind_matvec_siblings(
        self, x: np.ndarray, products: Sequence[tuple[Type, np.ndarray, np.ndarray]]
    ) -> Callable[[], None] | None: ...

    def bind_matvec_float(
        self, w: np.ndarray, x: np.ndarray, out: np.ndarray, t: Type = ...
    ) -> Callable[[], None]: ...

    def bind_packed_siblings(
        self, x: np.ndarray, products: Sequence[tuple[Type, np.ndarray, np.ndarray]],
        scratch: Callable[..., np.ndarray] = ..., ggml_order: bool = ...,
    ) -> Callable[[], None] | None: ...  # fmt: skip

    def bind_attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None,
        mask: np.ndarray, order: np.ndarray, scale: float, softcap: float, lanes: int,
        out: np.ndarray,
    ) -> Callable[[], None]: ...  # fmt: skip

    def online_attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
        order: np.ndarray, used: int, scale: float, softcap: float, tiled: bool,
        out: np.ndarray, half: bool = ...,
    ) -> None: ...  # fmt: skip

    def blocks_attend(
        self, q: np.ndarray, quantized: tuple[np.ndarray, np.ndarray, np.ndarray],
        k: np.ndarray, v: np.ndarray, mask: np.ndarray, order: np.ndarray, used: int,
        scale: float, softcap: float, kind: int, half_v: bool, out: np.ndarray,
    ) -> None: ...  # fmt: skip

    def bind_online_attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray,
        mask: np.ndarray, order: np.ndarray, scale: float, softcap: float, tiled: bool,
        out: np.ndarray,
    ) -> Callable[[], None]: ...  # fmt: skip

    def glu_kind(self, fn: GluOp) -> int | None: ...

    def set_rows(self, table: np.ndarray, values: np.ndarray, idx: np.ndarray) -> int: ...

    def bind_set_rows_blocks(
        self, table: np.ndarray, values: np.ndarray, idx: np.ndarray, kind: int
    ) -> Callable[[], Any]: ...

    def row_decoder(self, t: Type) -> tuple[int, int] | None: ...

    def expect(self, method: Callable[..., Any], *args: Any) -> None: ...

    def compile_ahead(self) -> None:
        """A plan is bound: start readying the kernels its later steps call."""
        ...

    def take_expected(self) -> list[Any]:
        """What :meth:`expect` noted since it was last taken (a plan keeps what its
        binding noted)."""
        ...

    def load_expected(self, expected: Sequence[Any]) -> None:
        """Make the kernels of ``expected`` (:meth:`take_expected`) ready to run."""
        ...

    #: the names of the kernel calls made (or made ready) in this process: a step's
    #: call of one of them goes straight to its code (:func:`.jit_steps.settle`)
    called: set[str]

    def settle(self) -> None:
        """After a compute: give back what readying kernels during it took."""
        ...

    def set_num_threads(self, n: int) -> None: ...

    def bound(self, method: Callable[..., Any], *args: Any) -> Callable[[], Any]: ...

    def spin_pool(self) -> Any: ...

    def program_ready(self) -> bool: ...

    def ready_step_job(self, name: str) -> int | None: ...

    def rows_region(self, step: Step, spec: JobSpec) -> Step | None: ...

"""The numba attention of the CPU plugin: flash attention for a few query rows (a job
function on the spinning helpers where it can, else the one-thread or parallel
kernel), a prompt's softmax rows, and an F16 cache's rows widened.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .jit_binding import F16_TO_F32, Binding
from .jit_steps import JobStep
from .job_blocks import attend_job_block, flash_job_block
from .kernel_refs import made_job, module_kernel
from .kernel_shapes import DOT_LANES

__all__ = ["AttentionKernels"]

#: what the parallel flash attention kernel is called in messages
ATTENTION = "flash attention kernel"
_MODULE = "_numba_attention"


class AttentionKernels(Binding):
    """The attention kernels, by reference (:mod:`.kernel_refs`), and their steps."""

    _attend = module_kernel(_MODULE, "attend")
    _attend_serial = module_kernel(_MODULE, "attend_serial")
    _attend_job = made_job(_MODULE, "attend_job")
    _visible_columns = module_kernel(_MODULE, "visible_columns")
    _softmax_rows = module_kernel(_MODULE, "softmax_rows")
    _widen_f16_rows = module_kernel(_MODULE, "widen_f16_rows")
    _online_attend = module_kernel("_numba_flash", "flash_attend")
    _online_job = made_job("_numba_flash", "flash_job")
    _blocks_attend = module_kernel("_numba_flash_blocks", "flash_attend_blocks")

    def online_attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
        order: np.ndarray, used: int, scale: float, softcap: float, tiled: bool,
        out: np.ndarray, half: bool = True,
    ) -> None:  # fmt: skip
        """Attention in the arithmetic of ggml's own flash attention kernel
        (:func:`._numba_flash.flash_attend`: raw f16 ``k`` and ``v`` where ``half``, else
        float32 ones, a quantized cache decoded; ``tiled``: its way for many query rows),
        what llama.cpp computes with flash attention on."""
        self.call("ggml's flash attention kernel", self._online_attend, q, k, v, mask, order,
                  used, scale, softcap, half, tiled, out, F16_TO_F32)  # fmt: skip

    def blocks_attend(
        self, q: np.ndarray, quantized: tuple[np.ndarray, np.ndarray, np.ndarray],
        k: np.ndarray, v: np.ndarray, mask: np.ndarray, order: np.ndarray, used: int,
        scale: float, softcap: float, kind: int, half_v: bool, out: np.ndarray,
    ) -> None:  # fmt: skip
        """:meth:`online_attend` over a quantized K cache (ggml type id ``kind``; ``k``
        each head's raw blocks of a cell), scores by K's own ``vec_dot``
        (:func:`._numba_flash_blocks.flash_attend_blocks`); ``quantized`` the room for
        the query's Q8 codes, scales and sums."""
        xq, xd, xs = quantized
        self.call("ggml's flash attention kernel over quantized keys", self._blocks_attend, q,
                  xq, xd, xs, k, v, mask, order, used, scale, softcap, kind, half_v, out,
                  F16_TO_F32)  # fmt: skip

    def bind_online_attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray,
        mask: np.ndarray, order: np.ndarray, scale: float, softcap: float, tiled: bool,
        out: np.ndarray,
    ) -> JobStep:  # fmt: skip
        """:meth:`online_attend` over an F16 cache and mask (raw ``uint16`` ``k``, ``v``,
        ``visible`` and ``mask``, as :meth:`bind_attend` takes them) as a step of the
        compiled program: the job :func:`._numba_flash.flash_job`, on the spinning
        helpers for a step of fewer than ``QUANTIZE_APART_ROWS`` rows (:meth:`pool_for`),
        else alone on one thread or as a numba region. A call of the parallel kernel
        from Python between two parts of the program left the helpers spinning beside
        numba's own workers, two threads fighting for each core while attention ran.
        The same rows with the same arithmetic, so the same bits as
        :meth:`online_attend`."""
        job = self._online_job
        if not job.load_kept() and self.ahead is not None and not job.ready():
            self.ahead.want_job(job, rank=-1)  # before any kernel: a layer's first need
        block = flash_job_block(q, k, v, visible, mask, order, scale, softcap, tiled, out,
                                F16_TO_F32, self.n_threads)  # fmt: skip
        arrays = (q, k, v, visible, mask, order, out)
        return JobStep(self, job, "ggml's flash attention job", [block, block], arrays,
                       self.pool_for(q.shape[2]))  # fmt: skip

    def want_attend_ahead(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
        order: np.ndarray, out: np.ndarray,
    ) -> None:  # fmt: skip
        """:meth:`want_ahead` for both attention kernels with :meth:`attend`'s arguments:
        a layer reaches attention after its first products, and those compile here
        meanwhile. The one-thread kernel goes first at any thread count: it compiles
        sooner than the parallel one, and :meth:`attend` runs it on more threads too until
        the parallel one is done (the same bits), so a first two-thread run waits for the
        shorter."""
        args = (q, k, v, mask, order, 0, 1.0, 0.0, DOT_LANES, out, F16_TO_F32)
        self.want_ahead(self._attend_serial, *args, rank=-1)
        self.want_ahead(self._attend, *args, self.n_threads, rank=0)

    def attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
        order: np.ndarray, used: int, scale: float, softcap: float, lanes: int,
        out: np.ndarray,
    ) -> None:  # fmt: skip
        """Flash attention for a few query rows (:func:`._numba_attention.attend`); on
        one thread the serial kernel, which opens no parallel region. (Serial on two
        threads as well, a small model's short-context attention is slower in the
        model, not faster: as fast as shared in isolation, but far slower in a step,
        its cache rows often evicted by the products.)"""
        serial = self._attend_serial
        if (self.n_threads == 1 and (
            serial in self.serial_ok or self.serial_ready(serial, ATTENTION)
        )) or (self.n_threads > 1 and self._parallel_attention_pending()):  # fmt: skip
            self.call("one-thread flash attention kernel", serial, q, k, v, mask,
                       order, used, scale, softcap, lanes, out, F16_TO_F32)  # fmt: skip
        else:
            self.call(ATTENTION, self._attend, q, k, v, mask, order, used,
                       scale, softcap, lanes, out, F16_TO_F32, self.n_threads)  # fmt: skip

    def _parallel_attention_pending(self) -> bool:
        """Whether the second process (:mod:`.ahead`) has the parallel attention kernel
        still to finish and this process has not called it: a first run on several
        threads then runs the one-thread kernel, which comes first
        (:meth:`want_attend_ahead`), rather than wait for the parallel one."""
        return (self.ahead is not None and ATTENTION not in self.called
                and self.ahead.has(self._attend))  # fmt: skip

    def bind_attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None,
        mask: np.ndarray, order: np.ndarray, scale: float, softcap: float, lanes: int,
        out: np.ndarray,
    ) -> Callable[[], None]:  # fmt: skip
        """A flash attention step (:meth:`attend`'s arguments; ``visible``: the mask whose
        last visible column bounds the cache rows read, None for none).

        For an F16 cache and mask (what the runner keeps), C-contiguous ``q`` and
        ``out``: the job function :func:`._numba_attention.attend_job` at every thread
        count, alone on one thread, else shared with the spinning helpers (:mod:`.pool`),
        else as a numba region. One compiled body for all three: numba links a callee's
        code into each caller and optimizes it again, so separate one-thread and
        parallel kernels would each compile the whole body once more, each about as long
        as the job itself, and each be a disk-cache load at every launch. Anything else
        (an F32 cache, no mask): :meth:`attend`. The same tasks and arithmetic either
        way, so the same bits."""
        self.attention_bound = True
        halves = (k, v, visible, mask)
        if (any(a is None or a.dtype != np.uint16 or a.ndim != 4 for a in halves)
                or not (q.flags.c_contiguous and out.flags.c_contiguous)
                or order.dtype != np.int32 or q.dtype != np.float32):  # fmt: skip
            return self._bind_attend_kernels(q, k, v, visible, mask, order, scale, softcap,
                                             lanes, out)  # fmt: skip
        assert visible is not None  # checked above; mypy does not follow any()
        job = self._attend_job
        if not job.load_kept() and self.ahead is not None and not job.ready():
            self.ahead.want_job(job, rank=-1)  # before any kernel: a layer's first need
        blocks = [attend_job_block(q, k, v, visible, mask, order, scale, softcap, lanes, out,
                                   F16_TO_F32, threads)
                  for threads in (1, self.max_threads)]  # fmt: skip
        return JobStep(self, job, "flash attention job", blocks, (q, *halves, order, out),
                        self.pool_for(q.shape[2]))  # fmt: skip

    def _bind_attend_kernels(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray | None,
        mask: np.ndarray, order: np.ndarray, scale: float, softcap: float, lanes: int,
        out: np.ndarray,
    ) -> Callable[[], None]:  # fmt: skip
        """:meth:`bind_attend` through :meth:`attend`'s kernels."""
        self.want_attend_ahead(q, k, v, mask, order, out)
        n_kv = k.shape[2]

        def run() -> None:
            used = n_kv if visible is None else self.visible_columns(visible)
            self.attend(q, k, v, mask, order, used, scale, softcap, lanes, out)

        return run

    def softmax_rows(
        self, s: np.ndarray, mask: np.ndarray, used: int, scale: float, row: np.ndarray
    ) -> None:
        """:func:`._numba_attention.softmax_rows` (a prompt's attention weights)."""
        self.call("attention softmax kernel", self._softmax_rows, s, mask, used, scale, row)

    def bind_widen_f16_rows(self, raw: np.ndarray, out: np.ndarray) -> Callable[[int], None]:
        """``widen(used)``: :func:`._numba_attention.widen_f16_rows`, rows ``j < used`` of
        4-d float16 ``raw`` into float32 ``out`` of the same shape, whose last axis is
        unit-stride (checked here, once a plan, with the view of the raw halves made)."""
        if out.strides[-1] != out.itemsize:
            raise ValueError(f"widen_f16_rows: out's rows must be unit-stride, not {out.strides}")
        halves = raw.view(np.uint16)
        self.expect_call("f16 widening kernel", self._widen_f16_rows, halves, out, 0, F16_TO_F32)

        def widen(used: int) -> None:
            self.call("f16 widening kernel", self._widen_f16_rows, halves, out, used,
                       F16_TO_F32)  # fmt: skip

        return widen

    def visible_columns(self, mask: np.ndarray) -> int:
        """:func:`._numba_attention.visible_columns` (raw f16 or float32 masks)."""
        return int(self._visible_columns(mask, F16_TO_F32))

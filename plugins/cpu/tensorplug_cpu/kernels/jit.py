"""Optional numba kernels for quantized weights: fused dequantize-and-dot, and decoding.

numpy cannot multiply quantized blocks by a vector without first writing the decoded
float32 matrix to memory, which makes matrix × vector (one token of a language model)
several times slower than reading the weights once. These kernels read each block,
decode it in registers and accumulate the dot product directly, with the output rows
split into chunks across threads. They are used only where numba is installed (and
imports, where it must: below); everything has a numpy fallback, and
``TENSORPLUG_CPU_JIT=0`` turns them off (:mod:`..settings`). Which kernel takes which
type is the table of :mod:`.dispatch`: this module binds what it chooses.

The kernels are held by reference (:mod:`.kernel_refs`), and run from their kept
machine code (:mod:`.kept_code`) where an earlier process kept it: where numba has run
in this cache folder before with these versions (:func:`.kernel_refs.kept_code_ready`), numba's
Python package is not imported at all until a kernel is not kept (its import is a
large share of a small model's launch to its first token); elsewhere (a first run) it
is imported at once, and a numba that fails to import leaves
the numpy kernels, saying why.

Decoding matches :mod:`tensorplug.quants` bit for bit (same float32 operations in the
same order, no fast-math), so the batched path gives the same weights either way; the
dot products use float32 with reassociation allowed, like ggml's SIMD reductions.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from tensorplug import installed
from tensorplug.iquants import IQ4_TYPES
from tensorplug.kquants import K_TYPES
from tensorplug.opcodes import GluOp
from tensorplug.types import Type

from ..repack import PackedLayout, move_table
from ..settings import JIT, MAX_NUMBA_THREADS, NUMBA_THREADS, SPIN, THREADING_LAYER
from . import compiled, numba_internals
from .activations import round_rows, vec_dot_type
from .arg_types import arg_key
from .dispatch import DECODE_VECTOR, FLOAT_FUSED, INT8, MANY, PLAIN, fused_path, path, select
from .gelu_table import glu_table
from .job_blocks import (
    GEGLU,
    MAILBOX_SIZE,
    PROGRAM_FIELDS,
    QUANTIZE_APART_ROWS,
    ROW_DECODER_CODES,
    ROWS_F16,
    ROWS_F32,
    SWIGLU,
    TYPES32,
    activation_form,
    attend_job_block,
    job_block,
    packed_job_block,
    sums_span,
)
from .job_calls import JobCall, JobSpec
from .kernel_refs import (
    JobRef,
    KernelRef,
    kept_code_ready,
    made_job,
    made_kernel,
    module_kernel,
    resolve,
)
from .kernel_shapes import DOT_LANES
from .numba_import import numba_module, on_import
from .numba_internals import numba_jit_disabled
from .pool import PoolKernels, spin_pool
from .steps import Step, block_rows
from .threading_layer import Threads, preload_tbb, start_threads

__all__ = ["MAX_SIBLINGS", "JitKernels", "KernelCall", "RowsCall", "jit_status", "load_jit"]

_log = logging.getLogger("tensorplug_cpu")

#: most products :meth:`JitKernels.bind_matvec_siblings` runs as one (a layer's Q, K, V)
MAX_SIBLINGS = 3
#: chunks a thread of a prompt's row step shared out as a region (:meth:`JitKernels.rows_region`):
#: a few, so that a thread that finishes first takes another
REGION_CHUNKS_PER_THREAD = 4
#: the second process's ranks of the products' kernels of another thread count
#: (:meth:`JitKernels._want_other_count`): the one-thread kernels a run on more threads
#: reaches in its governor's trial steps; and those a later run on more threads than
#: this one calls, after every kernel and job of this run's (whose ranks go up to 4)
ONE_THREAD_RANK, MORE_THREADS_RANK = 1, 5
#: what the parallel flash attention kernel is called in messages
_ATTENTION = "flash attention kernel"
#: A first kernel call still running after this many seconds is compiling: say so.
COMPILE_NOTICE_S = 0.5
_lock = threading.Lock()
_state: dict[str, Any] = {}

# f16 bits -> float32, exact: one table lookup per 32-element block is cheaper than
# decoding the half-float by hand inside the kernels
_F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
_F16_TO_F32 = _F16_TABLE.astype(np.float32)
#: one kernel call as :meth:`JitKernels._call` takes it: what it is, the kernel, its arguments
_Call = tuple[str, Any, tuple[Any, ...]]
#: the widening kernel's name for F16 weights (the attention's F16 cache has another
#: signature, and a name of its own: :meth:`JitKernels.load_expected` goes by name)
_WIDEN_WEIGHTS = "f16 weight widening kernel"


class JitKernels:
    """The compiled kernels: each one's first call loads its kept code, or has numba load
    or compile it (and keeps that code for later processes)."""

    max_siblings = MAX_SIBLINGS

    def __init__(self, threads: Threads) -> None:
        """The kernels by reference (:mod:`.kernel_refs`): their kept code where it is
        kept, numba's dispatchers otherwise (numba imported at the first need of one),
        on the threading layer ``threads``."""
        quant, kquant, iquant = "_numba_quant", "_numba_kquant", "_numba_iquant"
        self.version: str = _numba_version()
        self._threads = threads
        # the float kernels of every type the table's fused float path takes: a matrix ×
        # a few rows, and decoding (one pair of drivers for every K-quant, told the type
        # by id; the IQ4 types' pairs in a module of their own)
        self._kernels: dict[Type, tuple[Callable[..., None], Callable[..., None]]] = {
            t: (functools.partial(module_kernel(kquant, "matvec_k"), kind=int(t)),
                functools.partial(module_kernel(kquant, "dequantize_k"), kind=int(t)))
               if t in K_TYPES else
               (module_kernel(iquant if t in IQ4_TYPES else quant, f"matvec_{t.name.lower()}"),
                module_kernel(iquant if t in IQ4_TYPES else quant,
                              f"dequantize_{t.name.lower()}"))
            for t in path(FLOAT_FUSED).types
        }  # fmt: skip
        # ggml's way (the table's INT8 path): activations quantized to the weight type's
        # vec_dot_type, integer dots; and those activations as floats for the other paths
        self._round = module_kernel(quant, "round_activations")
        self._int8 = module_kernel("_numba_kint8", "matvec_int8")
        self._int8_serial = module_kernel("_numba_kint8", "matvec_int8_serial")
        self._int8_siblings = module_kernel("_numba_kint8", "matvec_int8_siblings")
        # weights stored repacked (CPU_REPACK): eight rows at a time, any activation rows;
        # drivers per set of types, which compile those types' tiles only; many rows'
        # activations quantized apart, on every thread, for any driver
        self._quantize_rows = module_kernel("_numba_repack", "quantize_rows")
        self._repack_moves = module_kernel("_numba_pack", "repack_moves")
        # F32, F16 and BF16 weights times a few rows, each weight read once
        self._fmatvec = module_kernel("_numba_fmatvec", "matvec_float")
        self._fmatvec_serial = module_kernel("_numba_fmatvec", "matvec_float_serial")
        rows = "_numba_rows"
        self._rms_norm_rows = module_kernel(rows, "rms_norm_rows")
        self._glu_rows = module_kernel(rows, "glu_rows")
        self._set_rows = module_kernel(rows, "set_rows")
        self._rope_rows = module_kernel(rows, "rope_rows")
        self._glu_kinds = {GluOp.SWIGLU: SWIGLU, GluOp.GEGLU: GEGLU}
        attention = "_numba_attention"
        self._attend = module_kernel(attention, "attend")
        self._attend_serial = module_kernel(attention, "attend_serial")
        self._attend_job = made_job(attention, "attend_job")
        self._visible_columns = module_kernel(attention, "visible_columns")
        self._softmax_rows = module_kernel(attention, "softmax_rows")
        self._widen_f16_rows = module_kernel(attention, "widen_f16_rows")
        #: what runs a program (:mod:`.program`): :func:`._numba_pool.run_program`
        self.program_runner = module_kernel("_numba_pool", "run_program")
        self._run_alone = module_kernel("_numba_pool", "run_alone")
        self._run_in_region = module_kernel("_numba_pool", "run_region")
        # the vector decoders of whole byte rows (the table's DECODE_VECTOR path), and the
        # arguments after (rows, out, table)
        decode = "_numba_decode"
        self._row_decoders: dict[Type, tuple[KernelRef, tuple[int, ...]]] = {
            t: (module_kernel(decode, "dequantize_rows32"), (int(t),)) if t in TYPES32 else
               (module_kernel(decode, f"dequantize_{t.name.lower()}_rows"), ())
            for t in path(DECODE_VECTOR).types
        }  # fmt: skip
        #: the half-float → float32 table the decoders take (every 16-bit pattern's value)
        self.f16_to_f32 = _F16_TO_F32
        #: the kernels (by what they are called in messages) that have run in this process
        self._called: set[str] = set()
        #: first calls the plan being bound makes only when it runs (:meth:`expect`)
        self._expected: list[_Call] = []
        self._resolvers: dict[Callable[..., Any], Callable[..., _Call]] = {
            self.rms_norm_rows: self._rms_norm_call, self.rope_rows: self._rope_call,
            self.glu_rows: self._glu_call, self.set_rows: self._set_rows_call,
        }  # fmt: skip
        #: whether LLVM ran (a kernel loaded or compiled) since :meth:`settle` last looked:
        #: set by a kernel's first call, and by any compile (a known kernel typed anew)
        self._llvm_ran = False
        on_import(lambda numba: numba.core.event.register(
            "numba:compile", _on_compile(numba, self._note_llvm_ran)))  # fmt: skip
        #: one-thread kernels now free to run (:meth:`_serial_ready`)
        self._serial_ok: set[Any] = set()
        from . import ahead

        #: the kernels a second process compiles meanwhile on a first run (:mod:`.ahead`)
        self._ahead = ahead.Ahead(resolve) if ahead.enabled() else None
        if self._ahead is not None:
            atexit.register(self._ahead.hand_over)
        #: threads of the parallel kernels (:meth:`set_num_threads`); at one, the
        #: products that have a serial kernel call it instead
        self.n_threads: int = threads.get_num_threads()
        #: the plan being bound (:meth:`compile_ahead` ends it): whether a step of it
        #: runs attention yet, and the kernels its steps call so far
        self._attention_bound = False
        self._plan_kernels: set[Any] = set()

    def supports(self, t: Type) -> bool:
        """Whether ``t`` weights have kernels here (a product by a few rows, decoding)."""
        return t in self._kernels

    def matvec(self, t: Type, blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        """``out[t, o] = Σᵢ x[t, i]·W[o, i]`` for raw blocks ``(n_out, nblocks, type_size)``."""
        self.bind_matvec(t, blocks, x, out)()

    def bind_matvec(
        self, t: Type, blocks: np.ndarray, x: np.ndarray, out: np.ndarray
    ) -> Callable[[], None]:
        """:meth:`matvec` with everything but the arithmetic done once: a graph plan
        calls the result every compute (unbound, each call's Python would take small
        matrices longer than their kernel). The kernel is the table's
        fused path for ``t`` (the caller keeps ``x``'s rows within its limit)."""
        rows = block_rows(blocks)
        if rows is None or fused_path(t, blocks_contiguous=True) == FLOAT_FUSED:
            # float dot products with the activations ggml's rounding leaves
            kernel, what = self._kernels[t][0], f"matrix-vector kernel for {t.name}"
            rounded = np.empty_like(x)
            product = self._bind_call(what, kernel, blocks, rounded, out, _F16_TO_F32)

            def rounded_product() -> None:
                round_rows(x, t, rounded)
                product()

            return rounded_product
        xq, xd, xs = _q8_scratch(x)
        # a parallel kernel may call a serial one (not the reverse: numba's disk cache of
        # a function that calls a parallel one crashed the process that loaded it)
        what = f"integer matrix-vector kernel for {t.name}"
        args = (x, rows, xq, xd, xs, out, _F16_TO_F32, int(t))
        serial = self._bind_call(f"one-thread {what}", self._int8_serial, *args)
        parallel = self._bind_call(what, self._int8, *args)

        if rows.shape[0] < 4:  # the one-row loops: one kernel, so the same bits at any -t
            return serial

        return self._serial_or_parallel(serial, parallel)

    def bind_round_rows(
        self, t: Type, x: np.ndarray, out: np.ndarray, corr: np.ndarray
    ) -> Callable[[], None]:
        """``out[...] = round_rows(x, t)`` (:mod:`.activations`) for 2-d float32 ``x`` of
        a quantized type's product, in numba; for Q4_1/Q5_1 also ``corr`` ``(T, n/32)``
        = :func:`~.activations.q8_1_offset_correction`. The values are numpy's, bit for
        bit (tested)."""
        xq, xd, xs = _q8_scratch(x)
        args = (x, out, corr, xq, xd, xs, _F16_TO_F32, int(t))
        return self._bind_call("activation rounding kernel", self._round, *args)

    def bind_packed(
        self,
        t: Type,
        packed: np.ndarray,
        x: np.ndarray,
        out: np.ndarray,
        scratch: Callable[..., np.ndarray] = np.empty,
        ggml_order: bool = False,
        alone: bool = True,
    ) -> Callable[[], None]:
        """``out[t, o] = W[o]·x[t]`` for weights stored repacked (:mod:`..repack`), rows
        of eight as ``packed`` ``(groups, bytes)``, any number of activation rows ``x``
        (unit-stride float32); ``scratch(shape, dtype)`` gives the Q8_0 activations'
        room; ``ggml_order``: sum in ggml's orders (``CpuBackend.ggml_order``); ``alone``:
        False for a product of a joint step (:meth:`bind_packed_siblings`), which runs
        it only on one thread. One thread runs the serial kernel, more the parallel one:
        each group's sums are the same either way, so the bits are too."""
        if out.strides[-1] != 4 or x.strides[-1] != 4:
            raise ValueError("bind_packed: x's and out's rows must be unit-stride float32")
        xq, xd, xs = _packed_scratch(x, sums_span(t), scratch)
        what = f"repacked {t.name} product kernel"
        drivers = _packed_kernels(frozenset((t,)), ggml_order)
        serial_args = (x, packed, xq, xd, xs, out, _F16_TO_F32, int(t))
        serial = self._bind_call(f"one-thread {what}", drivers.serial, *serial_args)
        # many threads: the sibling driver, this matrix and two empty ones
        joint = _sibling_args([packed], [out], [t], lambda p: p.shape[0])
        parallel = self._quantized_apart(
            t, x, (xq, xd, xs), self._bind_call(what, drivers.siblings, x, *joint)
        )
        # a joint step's product runs on one thread only: the helpers never run it
        pooled = self._pooled(x, [(t, packed, out)], (xq, xd, xs), parallel, ggml_order) \
            if alone else None  # fmt: skip
        return self._serial_or_parallel(serial, parallel, pooled, alone)

    def _quantized_apart(
        self, t: Type, x: np.ndarray, quantized: tuple[np.ndarray, ...],
        driver: KernelCall,
    ) -> KernelCall:  # fmt: skip
        """A sibling driver's call (``driver``: :meth:`_call` with all its arguments up
        to ``quantized``, the activations' codes, scales and sums), with ``x`` quantized
        by the driver, or first on every thread by :func:`._numba_repack.quantize_rows`
        when it has many rows (then called first: ``before``). A :class:`KernelCall`
        still, whose ``args[0]`` is the driver's name (what :meth:`_serial_or_parallel`
        reads)."""
        quantize_rows = self._quantize_rows
        if x.shape[0] < QUANTIZE_APART_ROWS:
            # for a later prompt's plan: the second process may compile it meanwhile
            self.want_ahead(quantize_rows, x, *quantized, _F16_TO_F32, int(t), rank=2)
            return self._bind_call(*driver.args, *quantized, _F16_TO_F32, False)
        if self._ahead is not None:  # this plan calls it (before its few-row products)
            self._ahead.keep(quantize_rows)
        quantize = self._bind_call("activation quantizing kernel", quantize_rows, x,
                                   *quantized, _F16_TO_F32, int(t))  # fmt: skip
        self._expect(*quantize.args)
        return self._bind_call(*driver.args, *quantized, _F16_TO_F32, True, before=quantize)

    def bind_matvec_float(
        self, w: np.ndarray, x: np.ndarray, out: np.ndarray, t: Type = Type.F32
    ) -> Callable[[], None]:
        """``out[t, o] = Σ_i w[o, i]·x[t, i]`` for float weights ``w`` ``(n_out, n)`` of
        type ``t`` (F32, F16, or BF16 as its raw ``uint16``) and a few float32 rows ``x``,
        all with unit-stride rows (:mod:`._numba_fmatvec`: each weight read once, F16
        and BF16 widened in registers)."""
        raw = {Type.F16: w.view(np.uint16), Type.BF16: w.view(np.int16)}.get(t, w)
        if raw.strides[-1] != raw.itemsize or x.strides[-1] != 4 or out.strides[-1] != 4:
            raise ValueError("bind_matvec_float: rows must be unit-stride")
        args = (raw, x, out, _F16_TO_F32)
        what = f"float matrix-vector kernel for {t.name}"
        serial = self._bind_call(f"one-thread {what}", self._fmatvec_serial, *args)
        parallel = self._bind_call(what, self._fmatvec, *args)
        return self._serial_or_parallel(serial, parallel)

    def widen_f16(self, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out[...] = src`` for 2-d float16 ``src`` into float32 ``out`` (unit-stride
        rows), eight values per ``vcvtph2ps`` where the CPU has F16C: numpy's conversion
        would be most of the time of a prompt on F16 weights. Returns ``out``."""
        self._call(_WIDEN_WEIGHTS, self._widen_f16_rows, src.view(np.uint16)[None, None],
                   out[None, None], src.shape[0], _F16_TO_F32)  # fmt: skip
        return out

    def bind_widen_f16(self, src: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """``widen(out)``: :meth:`widen_f16` of a plan's F16 weights ``src``, its kernel
        expected (:meth:`expect`) for the float32 scratch of unit-stride rows it gets."""
        scratch = np.empty((1, 1), np.float32)[None, None]  # the type of out[None, None]
        self._expect(_WIDEN_WEIGHTS, self._widen_f16_rows, src.view(np.uint16)[None, None],
                     scratch, src.shape[0], _F16_TO_F32)  # fmt: skip
        return partial(self.widen_f16, src)

    def bind_matvec_siblings(
        self, x: np.ndarray, products: Sequence[tuple[Type, np.ndarray, np.ndarray]]
    ) -> Callable[[], None] | None:
        """:meth:`bind_matvec` for up to :data:`MAX_SIBLINGS` products ``(t, blocks, out)``
        of the same ``x``, run as one: ``x`` is quantized once and, on more than one
        thread, every row of every matrix is shared out in one parallel region (one
        wake-up and one quantization, not three: a layer's Q, K and V run markedly
        faster so). Each row is computed as :meth:`bind_matvec` computes it, to the bit. None
        when the products cannot go together: a type or layout the integer kernels do not
        take, a matrix of fewer than four rows, or arrays numba would type differently."""
        if not 2 <= len(products) <= MAX_SIBLINGS or x.dtype != np.float32:
            return None
        if len({vec_dot_type(t) for t, _, _ in products}) != 1:  # x is quantized once
            return None
        rows, outs = [], []
        for t, blocks, out in products:
            r = block_rows(blocks)
            if r is None or fused_path(t, blocks_contiguous=True) != INT8:
                return None
            if r.shape[0] < 4 or out.shape != (x.shape[0], r.shape[0]):
                return None
            rows.append(r)
            outs.append(out)
        if not (_typed_alike(rows) and _typed_alike(outs)):
            return None
        one_by_one = [self.bind_matvec(t, b, x, o) for t, b, o in products]
        joint = _sibling_args(rows, outs, [t for t, _, _ in products],
                              lambda r: -(-r.shape[0] // 4) * 4)  # fmt: skip
        together = self._bind_call("integer matrix-vector kernel for sibling products",
                           self._int8_siblings, x, *joint, *_q8_scratch(x),
                           _F16_TO_F32)  # fmt: skip
        return self._one_by_one_or_together(one_by_one, together)

    def bind_packed_siblings(
        self,
        x: np.ndarray,
        products: Sequence[tuple[Type, np.ndarray, np.ndarray]],
        scratch: Callable[..., np.ndarray] = np.empty,
        ggml_order: bool = False,
    ) -> Callable[[], None] | None:
        """:meth:`bind_packed` for up to :data:`MAX_SIBLINGS` products ``(t, packed,
        out)`` of the same ``x``, run as one: ``x`` quantized once and, on more than one
        thread, every group of every matrix shared out in one parallel region. Each
        group is computed as :meth:`bind_packed` computes it, to the bit. None when the
        products cannot go together (arrays numba would type differently)."""
        if not 2 <= len(products) <= MAX_SIBLINGS or x.dtype != np.float32:
            return None
        if len({activation_form(t) for t, _, _ in products}) != 1:  # x is quantized once, for all
            return None
        packs = [packed for _, packed, _ in products]
        outs = [out for _, _, out in products]
        if any(o.strides[-1] != 4 or o.shape[0] != x.shape[0] for o in outs):
            return None
        if not (_typed_alike(packs) and _typed_alike(outs)):
            return None
        one_by_one = [self.bind_packed(t, p, x, o, scratch, ggml_order, alone=False)
                      for t, p, o in products]  # fmt: skip
        joint = _sibling_args(packs, outs, [t for t, _, _ in products], lambda p: p.shape[0])
        kinds = frozenset(t for t, _, _ in products)
        what = f"repacked sibling products kernel for {'+'.join(sorted(t.name for t in kinds))}"
        drivers = _packed_kernels(kinds, ggml_order)
        first = products[0][0]
        quantized = _packed_scratch(x, sums_span(first), scratch)
        together = self._quantized_apart(
            first, x, quantized, self._bind_call(what, drivers.siblings, x, *joint)
        )
        pooled = self._pooled(x, products, quantized, together, ggml_order)
        return self._one_by_one_or_together(one_by_one, together, pooled)

    def _pooled(
        self, x: np.ndarray, products: Sequence[tuple[Type, np.ndarray, np.ndarray]],
        quantized: tuple[np.ndarray, ...], region: Callable[[], None], ggml_order: bool,
    ) -> Callable[[], None]:  # fmt: skip
        """Repacked products of a few rows ``x`` on more than one thread: a job of the
        spinning helpers (:mod:`.pool`), which starts in well under a microsecond where
        the numba ``region`` takes microseconds to wake its worker (dozens of products a
        token). Each
        group is computed as the drivers compute it, so the bits are theirs. ``region``
        itself when the step is not one for them: many rows (a prompt's products are
        long, and their activations are quantized apart), numba on one thread,
        ``TENSORPLUG_CPU_SPIN=0``, a job the disk cache lacks (:meth:`_job_ready`), or
        arrays that are not C-contiguous."""
        pool = self._pool(x.shape[0])
        if pool is None:
            return region
        packs = [packed for _, packed, _ in products]
        outs = [out for _, _, out in products]
        if not all(a.flags.c_contiguous for a in (x, *quantized, *packs, *outs)):
            return region
        kinds = [t for t, _, _ in products]
        job = _packed_job(frozenset(kinds), ggml_order)
        if not self._job_ready(job):
            return region
        chunks = pool.chunks(self.max_threads, sum(p.shape[0] for p in packs))
        xq, xd, xs = quantized
        block = packed_job_block(x, packs, outs, kinds, xq, xd, xs, _F16_TO_F32, chunks)
        return _PooledJob(self, pool, job.address, block, chunks, region,
                          (x, *quantized, *packs, *outs))  # fmt: skip

    def _serial_or_parallel(
        self, serial: KernelCall, parallel: KernelCall,
        pooled: Callable[[], None] | None = None, alone: bool = True,
    ) -> Callable[[], None]:  # fmt: skip
        """A product's step: the serial kernel on one thread (no parallel region to open),
        else the parallel one (``pooled``, the same on the spinning helpers, where it is
        given); the count is read at each call, since ``set_num_threads`` may change it
        after binding. Both are :class:`KernelCall` s (``args``: ``what``, the kernel, its
        arguments); ``alone`` as :meth:`bind_packed`'s."""

        kernel, parallel_what = serial.args[1], parallel.args[0]
        if alone or self.n_threads == 1:  # (a joint step's products run on one thread only)
            self._will_call(serial if self.n_threads == 1 else parallel)
        if self.n_threads > 1:  # a one-thread step comes later (on one, it runs first)
            self._want_other_count(serial, ONE_THREAD_RANK)
        elif alone:
            self._want_other_count(parallel, MORE_THREADS_RANK)
        many = parallel if pooled is None else pooled

        def run() -> None:  # every token: the set is asked before the method is called
            if self.n_threads == 1 and (
                kernel in self._serial_ok or self._serial_ready(kernel, parallel_what)
            ):
                serial()
            else:
                many()

        return _ProductStep(run, pooled)

    def _serial_ready(self, serial: Any, parallel: str) -> bool:
        """Whether one thread runs the one-thread kernel ``serial`` now, rather than the
        parallel kernel called ``parallel`` on one thread (the same bits: no sum depends
        on the split).

        On a first run the second process compiles the one-thread kernels (:mod:`.ahead`)
        after the parallel ones this process needs first; the thread governor's
        one-thread warm-up step would then wait for them, a large share of SmolLM2's
        first run. So while the child
        has ``serial`` still to finish and ``parallel`` has run here, ``parallel`` runs."""
        if serial in self._serial_ok:
            return True
        if self._ahead is not None and parallel in self._called and self._ahead.has(serial):
            return False
        self._serial_ok.add(serial)
        return True

    def _one_by_one_or_together(
        self, one_by_one: Sequence[Callable[[], None]], together: Callable[[], None],
        pooled: Callable[[], None] | None = None,
    ) -> Callable[[], None]:  # fmt: skip
        """A joint product's step: on one thread each product's serial kernel (there is
        no region to save), on more the joint parallel kernel (``pooled``, the same on
        the spinning helpers, where it is given)."""

        if self.n_threads > 1:
            self._will_call(together)
        else:
            self._want_other_count(together, MORE_THREADS_RANK)
        many = together if pooled is None else pooled

        def run() -> None:
            if self.n_threads == 1:
                for product in one_by_one:
                    product()
            else:
                many()

        return _ProductStep(run, pooled)

    def _will_call(self, call: Callable[[], None]) -> None:
        """A step of the plan being bound calls ``call`` at this thread count (a partial
        of :meth:`_call`, or of :meth:`_quantized_apart`'s: ``args`` ``(what, kernel,
        *kernel's arguments)``): noted for the waits for the second process
        (:meth:`.ahead.Ahead.will_call`). A kernel the plan first calls after its first
        attention goes to the second process (rank 0: after the attention job, before
        the kernels of other thread counts): this process compiles in the order the
        steps call, so the second one takes what they call last. Otherwise Gemma 3's
        first run on two threads would compile its output product's driver (Q6_K, a
        long compile) here after the wait for the attention job, while the second
        process compiles the one-thread drivers the run does not need yet."""
        if not isinstance(call, partial) or len(call.args) < 2:  # (a KernelCall is one)
            return
        kernel, args = call.args[1], call.args[2:]
        self._expect(call.args[0], kernel, *args)
        if self._ahead is not None:
            self._ahead.will_call(kernel, *args)
        if self._attention_bound and kernel not in self._plan_kernels:
            self.want_ahead(kernel, *args, rank=0)
        self._plan_kernels.add(kernel)

    def _want_other_count(self, call: Callable[[], None], rank: int) -> None:
        """A product step's kernel for another thread count than this one's (``call``, a
        partial as :meth:`_will_call` reads) goes to the second process at ``rank``, so
        that a step or a later run at that count loads it rather than compiling it: on
        more threads the one-thread kernel (the thread governor's trial steps), on one
        thread of a process that may run more (``NUMBA_NUM_THREADS`` > 1) the multi-thread
        one, after everything this run calls. Otherwise a small Q5_K model's first run
        at ``-t 2`` after one at ``-t 1`` would compile its sibling products kernel, tens
        of seconds, before its first token."""
        if self.n_threads == 1 and self.max_threads < 2:
            return
        if isinstance(call, partial) and len(call.args) >= 2:
            self.want_ahead(call.args[1], *call.args[2:], rank=rank)

    def want_ahead(self, kernel: Callable[..., Any], *args: Any, rank: int = 1) -> None:
        """Have ``kernel(*args)`` compiled by the second process if numba has not got it
        (:mod:`.ahead`; :meth:`compile_ahead` starts it); lower ``rank`` first."""
        if self._ahead is None:
            return
        if isinstance(kernel, KernelRef):
            if kernel.kept(args):  # (known without numba)
                return
            dispatcher = kernel.dispatcher()
            sig = tuple(dispatcher.typeof_pyval(a) for a in args)
            if (numba_internals.enabled() and sig not in dispatcher.overloads
                    and compiled.is_cached(dispatcher, sig)):  # fmt: skip
                # numba's cache has it (a second process made it): loaded and kept now,
                # so a later launch finds it kept, and need not import numba to ask
                kernel.ready(args)
                self._llvm_ran = True
                return
        self._ahead.want(kernel, *args, rank=rank)

    def compile_ahead(self) -> None:
        """Start compiling what :meth:`want_ahead` gathered (after a plan is bound)."""
        self._attention_bound, self._plan_kernels = False, set()
        if self._ahead is not None:
            self._ahead.start()

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
        args = (q, k, v, mask, order, 0, 1.0, 0.0, DOT_LANES, out, _F16_TO_F32)
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
            serial in self._serial_ok or self._serial_ready(serial, _ATTENTION)
        )) or (self.n_threads > 1 and self._parallel_attention_pending()):  # fmt: skip
            self._call("one-thread flash attention kernel", serial, q, k, v, mask,
                       order, used, scale, softcap, lanes, out, _F16_TO_F32)  # fmt: skip
        else:
            self._call(_ATTENTION, self._attend, q, k, v, mask, order, used,
                       scale, softcap, lanes, out, _F16_TO_F32, self.n_threads)  # fmt: skip

    def _parallel_attention_pending(self) -> bool:
        """Whether the second process (:mod:`.ahead`) has the parallel attention kernel
        still to finish and this process has not called it: a first run on several
        threads then runs the one-thread kernel, which comes first
        (:meth:`want_attend_ahead`), rather than wait for the parallel one."""
        return (self._ahead is not None and _ATTENTION not in self._called
                and self._ahead.has(self._attend))  # fmt: skip

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
        self._attention_bound = True
        halves = (k, v, visible, mask)
        if (any(a is None or a.dtype != np.uint16 or a.ndim != 4 for a in halves)
                or not (q.flags.c_contiguous and out.flags.c_contiguous)
                or order.dtype != np.int32 or q.dtype != np.float32):  # fmt: skip
            return self._bind_attend_kernels(q, k, v, visible, mask, order, scale, softcap,
                                             lanes, out)  # fmt: skip
        assert visible is not None  # checked above; mypy does not follow any()
        job = self._attend_job
        if not job.load_kept() and self._ahead is not None and not job.ready():
            self._ahead.want_job(job, rank=-1)  # before any kernel: a layer's first need
        blocks = [attend_job_block(q, k, v, visible, mask, order, scale, softcap, lanes, out,
                                   _F16_TO_F32, threads)
                  for threads in (1, self.max_threads)]  # fmt: skip
        return _JobStep(self, job, "flash attention job", blocks, (q, *halves, order, out),
                        self._pool(q.shape[2]))  # fmt: skip

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

    def _job_address(self, job: Any, what: str) -> int:
        """The address of the job function ``job`` (:func:`.job_function.job_function`),
        loaded from the disk cache or compiled, after the compile-ahead process, if it
        has the job, is done with it; ``what`` names it in the compile notice."""
        if job.ready():
            return int(job.address)
        if self._ahead is not None:
            self._ahead.wait_for(job)
        with self._first_use(what):
            compiled.compile_job(job.job())  # from the disk cache if the other process put it
        return int(job.address)

    def _job_ready(self, job: Any) -> bool:
        """Whether a step may run ``job`` (a job function of the helpers): compiled, or
        loaded now from the disk cache. Where the cache lacks it, the compile-ahead
        process makes it for later plans and runs, and this step runs its numba region
        (compiling the jobs here doubled a first run's time to its first token); with
        no such process (``TENSORPLUG_CPU_COMPILE_AHEAD=0``), it is compiled here."""
        if job.ready():
            return True
        if self._ahead is None:
            compiled.compile_job(job.job())
            return True
        self._ahead.want_job(job, rank=4)  # after every kernel a step calls
        return False

    def _pool(self, rows: int) -> Any:
        """The spinning helpers (:func:`.pool.spin_pool`) for a step of ``rows`` rows
        where steps may run on more than one thread (numba's most, not the count now: a
        plan is bound at the count of its first compute and kept for others, as the
        thread governor's trials run it) and ``TENSORPLUG_CPU_SPIN`` lets them, else
        None. Only a generation step's few rows: a prompt's steps (from
        ``QUANTIZE_APART_ROWS``) are numba regions, products and attention alike, since
        a helper woken between TBB's regions, whose worker spins on the other core
        after each, comes too late to take a share (a prompt's attention of Gemma 3 on
        two threads runs no faster on the helpers than on one thread, and faster as a
        region)."""
        if rows >= QUANTIZE_APART_ROWS or self.max_threads < 2 or not SPIN.get():
            return None
        return spin_pool(pool_kernels())

    def finish_ahead(self) -> None:
        """Wait until the compile-ahead process has made every kernel and job wanted so
        far (a first run's): plans bound after it find them all in the disk cache, as a
        later run's do. For tests and benchmarks that want that state at once."""
        if self._ahead is not None:
            self._ahead.finish()

    @property
    def max_threads(self) -> int:
        """The most threads numba's kernels may use in this process
        (``NUMBA_NUM_THREADS``): what a plan is bound for, whatever the count now."""
        return self._threads.count

    def rows_region(self, step: Step, spec: JobSpec) -> Step | None:
        """``step``, a prompt's row job too large for a program (:func:`.program.rows_regions`),
        with its rows shared out in :data:`REGION_CHUNKS_PER_THREAD` chunks a thread as a
        numba region of its job on more than one thread, and run as it is on one; None
        while numba's disk cache lacks the job (the compile-ahead process makes it).

        As one thread's loop, or numpy's, a small model's prompt on two threads would run
        its norms, rope, SwiGLU and residual adds, a noticeable share of the prompt, as
        slowly as on one thread (the worker pool's sleeping threads wake too late to
        help); here the threads share them, each chunk computing its rows as the step
        does."""
        job = made_job("_numba_jobs", "step_job", spec.name)
        if not self._job_ready(job):
            return None
        chunks = min(spec.rows, REGION_CHUNKS_PER_THREAD * self.max_threads)
        per = -(-spec.rows // chunks)
        block = job_block(spec.arrays, spec.ints, spec.scalars, per=per)
        if self.n_threads > 1:
            self._expect("parallel job runner", self._run_in_region, 0, 0, 0)
        return _RowsRegion(self, step, int(job.address), block, -(-spec.rows // per),
                           spec.arrays)  # fmt: skip

    def _run_region(self, fn: int, block: int, chunks: int) -> None:
        """:func:`._numba_pool.run_region` of a job (loaded at its first call)."""
        self._call("parallel job runner", self._run_in_region, fn, block, chunks)

    def spin_pool(self) -> Any:
        """The spinning helpers a generation step's jobs share (:meth:`_pool` for its few
        rows), or None where steps do not use them."""
        return self._pool(1)

    def ready_step_job(self, name: str) -> int | None:
        """The address of the step job ``name`` (:func:`._numba_jobs.jobs`), or None
        while numba's disk cache lacks it: the compile-ahead process makes it meanwhile
        (where there is none, it is compiled here)."""
        job = made_job("_numba_jobs", "step_job", name)
        return int(job.address) if self._job_ready(job) else None

    def program_ready(self) -> bool:
        """Whether the programs' runner (:func:`._numba_pool.run_program`, :mod:`.program`)
        is compiled or in numba's disk cache; where it is not, the compile-ahead process
        makes it for later plans (where there is none, it is compiled here)."""
        runner = self.program_runner
        if runner.resolved and runner.overloads:
            return True
        args = (np.zeros(MAILBOX_SIZE, np.int64), np.zeros((1, PROGRAM_FIELDS), np.int64), 0)
        if runner.load_kept(args):  # (at once where it already was)
            return True
        dispatcher = runner.dispatcher()
        sig = tuple(dispatcher.typeof_pyval(a) for a in args)
        if self._ahead is not None and not compiled.is_cached(dispatcher, sig):
            self.want_ahead(runner, *args, rank=4)
            return False
        runner.ready(args)  # numba's load (or compile) of it, kept
        return True

    def repack_moves(self, lay: PackedLayout, natural: np.ndarray, packed: np.ndarray) -> bool:
        """``lay``'s word moves of the ggml blocks ``natural`` into ``packed`` (as
        :meth:`..repack.PackedLayout.pack` has them) by :func:`._numba_pack.repack_moves`;
        False, nothing done, where it cannot: numba's JIT disabled (the kernel would
        run as Python), a layout whose words it would read unaligned (:func:`move_table`),
        or an array not C-contiguous or not aligned for its words (bytes a caller passed
        from anywhere)."""
        table = move_table(lay)
        if table is None or numba_jit_disabled():
            return False
        if not (natural.flags.c_contiguous and packed.flags.c_contiguous):
            return False
        words, blocks = natural.reshape(-1), packed.reshape(-1)
        if words.ctypes.data % 2 or blocks.ctypes.data % 4:
            return False
        groups, nb = packed.shape[:2]
        self._call("repack kernel", self._repack_moves, words.view(np.uint16), words,
                   blocks.view(np.uint32), blocks.view(np.uint16), blocks, groups, nb,
                   lay.type.type_size, lay.block, table)  # fmt: skip
        return True

    def glu_kind(self, fn: GluOp) -> int | None:
        """:func:`._numba_rows.glu_rows`'s code for ``fn`` (None: not one of its)."""
        return self._glu_kinds.get(fn)

    def rms_norm_rows(self, x: np.ndarray, out: np.ndarray, eps: float) -> None:
        """:func:`._numba_rows.rms_norm_rows` on 2-d float32 rows."""
        self._resolved(self._rms_norm_call(x, out, eps))

    def _rms_norm_call(self, x: np.ndarray, out: np.ndarray, eps: float) -> _Call:
        return "rms_norm kernel", self._rms_norm_rows, (x, out, eps)

    def rope_rows(self, *args: Any) -> None:
        """:func:`._numba_rows.rope_rows` (a generation step's few tokens)."""
        self._resolved(self._rope_call(*args))

    def _rope_call(self, *args: Any) -> _Call:
        return "rope kernel", self._rope_rows, args

    def has_glu(self, fn: GluOp) -> bool:
        return fn in self._glu_kinds

    def glu_rows(self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
        """:func:`._numba_rows.glu_rows` on 2-d float32 rows (``fn``: :meth:`has_glu`)."""
        self._resolved(self._glu_call(fn, x, g, out))

    def _glu_call(self, fn: GluOp, x: np.ndarray, g: np.ndarray, out: np.ndarray) -> _Call:
        args = (x, g, out, self._glu_kinds[fn], glu_table(fn))
        return "gated activation kernel", self._glu_rows, args

    def set_rows(self, table: np.ndarray, values: np.ndarray, idx: np.ndarray) -> int:
        """:func:`._numba_rows.set_rows`: -1 when written, else the first bad index's
        position (nothing written)."""
        return int(self._resolved(self._set_rows_call(table, values, idx)))

    def _set_rows_call(self, table: np.ndarray, values: np.ndarray, idx: np.ndarray) -> _Call:
        return "set_rows kernel", self._set_rows, (table, values, idx)

    def _resolved(self, call: _Call) -> Any:
        what, kernel, args = call
        return self._call(what, kernel, *args)

    def _bind_call(
        self, what: str, kernel: Any, *args: Any, before: Callable[[], Any] | None = None
    ) -> KernelCall:
        return KernelCall(self._call, what, kernel, *args, before=before)

    def bound(self, method: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        """``method(*args)`` (:meth:`rms_norm_rows`, :meth:`rope_rows`, :meth:`glu_rows`
        or :meth:`set_rows`) as a plan's step calls it every compute, with these
        arguments: a partial of ``method`` (:mod:`.program` reads a step as its job by
        that), whose calls after the first go straight to the kernel's code for these
        arguments' types (:class:`KernelCall`)."""
        return RowsCall(method, *args, resolve=self._resolvers[method], run=self._call)

    def expect(self, method: Callable[..., Any], *args: Any) -> None:
        """A step of the plan being bound calls ``method`` (:meth:`rms_norm_rows`,
        :meth:`rope_rows`, :meth:`glu_rows` or :meth:`set_rows`) with arguments of the
        types of ``args`` when it runs: noted, so that :meth:`load_expected` loads its
        kernel when the plan is prepared rather than run."""
        resolve = self._resolvers.get(method)
        if resolve is not None:  # (another callable: its first call loads what it needs)
            what, kernel, kernel_args = resolve(*args)
            self._expect(what, kernel, *kernel_args)

    def _expect(self, what: str, kernel: Any, *args: Any) -> None:
        if what not in self._called:
            self._expected.append((what, kernel, args))

    def take_expected(self) -> list[_Call]:
        """What :meth:`expect` noted since it was last taken (a plan takes what its
        binding noted, and keeps it)."""
        expected, self._expected = self._expected, []
        return expected

    def load_expected(self, expected: Sequence[_Call]) -> None:
        """Make ready, without calling them, the kernels of ``expected`` (a plan's first
        calls, :meth:`take_expected`) that this process has not called yet, as their
        first call would (:meth:`_call`: loaded from numba's disk cache, or compiled
        after the second process is done with them): a prepared plan (``graph_prepare``)
        then runs as one that ran once."""
        for what, kernel, args in expected:
            if what in self._called or not isinstance(kernel, KernelRef):
                continue  # called already, or not a kernel (nothing to load)
            if kernel.load_kept(args):
                self._llvm_ran = True  # LLVM's loader ran (:meth:`settle`)
            else:
                dispatcher = kernel.dispatcher()
                sig = tuple(dispatcher.typeof_pyval(a) for a in args)
                if sig not in dispatcher.overloads:
                    if self._ahead is not None:
                        self._ahead.wait_for(kernel)
                    with self._first_use(what):
                        compiled.guarded(dispatcher.compile, sig)
                compiled.keep_overload(dispatcher, args)
            self._called.add(what)

    def softmax_rows(
        self, s: np.ndarray, mask: np.ndarray, used: int, scale: float, row: np.ndarray
    ) -> None:
        """:func:`._numba_attention.softmax_rows` (a prompt's attention weights)."""
        self._call("attention softmax kernel", self._softmax_rows, s, mask, used, scale, row)

    def bind_widen_f16_rows(self, raw: np.ndarray, out: np.ndarray) -> Callable[[int], None]:
        """``widen(used)``: :func:`._numba_attention.widen_f16_rows`, rows ``j < used`` of
        4-d float16 ``raw`` into float32 ``out`` of the same shape, whose last axis is
        unit-stride (checked here, once a plan, with the view of the raw halves made)."""
        if out.strides[-1] != out.itemsize:
            raise ValueError(f"widen_f16_rows: out's rows must be unit-stride, not {out.strides}")
        halves = raw.view(np.uint16)
        self._expect("f16 widening kernel", self._widen_f16_rows, halves, out, 0, _F16_TO_F32)

        def widen(used: int) -> None:
            self._call("f16 widening kernel", self._widen_f16_rows, halves, out, used,
                       _F16_TO_F32)  # fmt: skip

        return widen

    def visible_columns(self, mask: np.ndarray) -> int:
        """:func:`._numba_attention.visible_columns` (raw f16 or float32 masks)."""
        return int(self._visible_columns(mask, _F16_TO_F32))

    def dequantize(self, t: Type, blocks: np.ndarray, out: np.ndarray) -> None:
        """Decode ``(…, rows, nblocks, type_size)`` blocks into float32 ``out (…, rows, n)``."""
        self.bind_dequantize(t, blocks)(out)

    def bind_dequantize(
        self, t: Type, blocks: np.ndarray, out: np.ndarray | None = None
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``decode(out)`` of these blocks, returning ``out``, with everything that depends
        on the blocks alone chosen here, once (a plan binds each chunk of a prompt's
        product when it is built: chosen per call, this would cost microseconds of Python
        with the GIL held, at every call). The table's decoding path says which kernel:
        vectors (:mod:`._numba_decode`) for the types that have them when each row's
        blocks lie contiguous, scalar loops otherwise.

        ``out``: the array the step will decode into, where the caller knows it: the
        kernel's first call is then noted (:meth:`expect`), so that preparing the plan
        loads it. Loaded at a prompt's first call instead, it would add its loading time
        to the first prompt (numba's extension entry points, read at a dispatcher's first
        call by arguments, and the kernel)."""
        if blocks.ndim > 3:  # one call per matrix
            parts = [(idx, self.bind_dequantize(t, blocks[idx])) for idx in
                     np.ndindex(blocks.shape[:-3])]  # fmt: skip

            def each(out: np.ndarray) -> np.ndarray:
                for idx, decode in parts:
                    decode(out[idx])
                return out

            return each
        scalar, what = self._kernels[t][1], f"decoding kernel for {t.name}"
        rows = block_rows(blocks)
        found = self._vector_decoder(t, contiguous=rows is not None)
        vector, extra = (scalar, ()) if found is None else found
        rows = None if found is None else rows
        vector_what = f"row decoding kernel for {t.name}"
        if out is not None and rows is not None and out.strides[-1] == 4:
            self._expect(vector_what, vector, rows, out, _F16_TO_F32, *extra)
        elif out is not None:
            self._expect(what, scalar, blocks, out, _F16_TO_F32)

        def decode(out: np.ndarray) -> np.ndarray:
            if rows is not None and out.strides[-1] == 4:  # the vectors store unit-stride
                self._call(vector_what, vector, rows, out, _F16_TO_F32, *extra)
            else:
                self._call(what, scalar, blocks, out, _F16_TO_F32)
            return out

        return decode

    def row_decoder(self, t: Type) -> tuple[int, int] | None:
        """How a job decodes a ``t`` table's byte rows (:func:`._numba_jobs._get_rows_job`,
        ``(decoder, kind)``) where that is what the get_rows step does: the vector
        decoder :meth:`bind_dequantize` chooses for contiguous rows, or a float table's
        copy or exact widening; None where the step decodes otherwise (a scalar loop)."""
        if t in (Type.F32, Type.F16):
            return (ROWS_F32 if t == Type.F32 else ROWS_F16), 0
        found = self._vector_decoder(t, contiguous=True) if t in self._kernels else None
        if found is None:
            return None
        decoder, extra = found
        code = ROW_DECODER_CODES.get(str(decoder.tensorplug_origin[-1]))
        return None if code is None else (code, extra[0] if extra else 0)  # rows32's: the type

    def _vector_decoder(
        self, t: Type, contiguous: bool
    ) -> tuple[KernelRef, tuple[int, ...]] | None:
        """The vector row decoder that decoding ``t`` takes (the table's
        ``DECODE_VECTOR`` path, for rows whose blocks are ``contiguous``) and its
        arguments after ``(rows, out, f16 table)``; None where a scalar loop decodes."""
        chosen = select(t, PLAIN, MANY, numba=True, blocks_contiguous=contiguous).name
        return self._row_decoders[t] if chosen == DECODE_VECTOR else None

    def _call(self, what: str, kernel: Callable[..., Any], *args: Any) -> Any:
        if what in self._called:
            return kernel(*args)
        ref = kernel if isinstance(kernel, KernelRef) else None
        if ref is not None and ref.load_kept(args):  # its code kept by an earlier process
            self._called.add(what)
            self._llvm_ran = True  # LLVM's loader ran (:meth:`settle`)
            return kernel(*args)
        if self._ahead is not None:  # the second process may have it: let it finish
            self._ahead.wait_for(kernel)
        dispatcher = kernel if ref is None else ref.dispatcher()
        with self._first_use(what):  # (a load from a damaged cache raises before it runs)
            result = compiled.guarded(dispatcher, *args)
        compiled.keep_overload(dispatcher, args)
        self._called.add(what)
        return result

    @contextlib.contextmanager
    def _first_use(self, what: str) -> Iterator[None]:
        """Around a kernel's first call, which compiles it (seconds) unless numba's disk
        cache has it (milliseconds, more on a busy machine): say so if a compile runs
        long, so a first run does not look hung. The clock starts at numba's own
        "compile" event, which a load from the cache never raises: a slow cache read is
        not announced."""
        notice = threading.Timer(COMPILE_NOTICE_S, _log.warning, (
            "numba is compiling the %s (once: it is cached on disk for later runs)", what
        ))  # fmt: skip
        notice.daemon = True
        numba = numba_module()
        try:
            with numba.core.event.install_listener(
                "numba:compile", _on_first_compile(numba, notice.start)
            ):
                yield
        finally:
            notice.cancel()
            self._llvm_ran = True

    def _note_llvm_ran(self) -> None:
        self._llvm_ran = True

    def settle(self) -> None:
        """After a compute: if a kernel was loaded or compiled during it, LLVM's code
        that doing so paged in is dropped again (:mod:`.llvm_pages`): tens of megabytes
        of RSS per load, which a process with its kernels loaded does not run."""
        if self._llvm_ran:
            self._llvm_ran = False
            _release_llvm_pages()
        if self._ahead is not None and self._ahead.jobs:  # wanted while the child was busy
            self._ahead.start()

    def set_num_threads(self, n: int) -> None:
        self.n_threads = max(1, min(n, self.max_threads))
        self._threads.set_num_threads(self.n_threads)


def _on_first_compile(numba: Any, start: Callable[[], None]) -> Any:
    """A numba event listener that calls ``start`` when the first compile begins (nested
    compiles of the kernel's callees raise the event again; ``start`` runs once)."""
    started: list[bool] = []

    def once() -> None:
        if not started:
            started.append(True)
            start()

    return _on_compile(numba, once)


def _on_compile(numba: Any, note: Callable[[], None]) -> Any:
    """A numba event listener that calls ``note`` whenever a compile begins."""

    class Compile(numba.core.event.Listener):  # type: ignore[misc, name-defined]
        def on_start(self, event: Any) -> None:
            note()

        def on_end(self, event: Any) -> None:
            pass

    return Compile()


def _q8_scratch(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for ``x``'s rows quantized to Q8_0: codes, block scales, block code sums."""
    n_tok, n = x.shape
    return (np.empty((n_tok, n), np.int8), np.empty((n_tok, n // 32), np.float32),
            np.empty((n_tok, n // 32), np.int32))  # fmt: skip


class KernelCall(partial[Any]):
    """``run(what, kernel, *arguments)`` (:meth:`JitKernels._call`) for a step whose
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
        self._run = kernel.for_types(*self._arguments) if isinstance(kernel, KernelRef) else kernel
        return result


class RowsCall(partial[Any]):
    """A row kernel's method of :class:`JitKernels` (:meth:`JitKernels.rms_norm_rows`...)
    with fixed arguments, as :meth:`JitKernels.bound` makes it: a partial of the method
    (:mod:`.program` lowers it to its job by that), whose first call resolves the
    method's kernel call (``resolve``: ``(what, kernel, arguments)``) and makes it
    through ``run`` (:meth:`JitKernels._call`), and whose later calls go straight to the
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
        direct = kernel.for_types(*arguments) if isinstance(kernel, KernelRef) else kernel
        self._call = (direct, tuple(arguments))
        return result


class _PooledJob:
    """A step that runs a job on the spinning helpers (:meth:`JitKernels._pooled`), or
    its numba ``region`` on one thread (set after
    binding) and while another thread's job holds the pool. Holds the job's argument
    block and the arrays it names by address, which must live as long as the step."""

    def __init__(
        self, jit: JitKernels, pool: Any, fn: int, block: np.ndarray, chunks: int,
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


class _ProductStep:
    """A product's step (:meth:`JitKernels._serial_or_parallel`,
    :meth:`JitKernels._one_by_one_or_together`): ``run``, which picks its kernel at each
    call; a program's job (:mod:`.program`) where it has one on the helpers."""

    def __init__(self, run: Callable[[], None], pooled: Callable[[], None] | None) -> None:
        self._run, self._pooled = run, pooled

    def __call__(self) -> None:
        self._run()

    def job_call(self) -> JobCall | None:
        return self._pooled.job_call() if isinstance(self._pooled, _PooledJob) else None


class _RowsRegion:
    """A prompt's row step (:meth:`JitKernels.rows_region`): ``step`` on one thread, its
    job's ``chunks`` as a numba region on more. Holds the job's argument block and the
    arrays it names by address, which must live as long as the step."""

    def __init__(
        self, jit: JitKernels, step: Step, fn: int, block: np.ndarray, chunks: int,
        arrays: tuple[np.ndarray, ...],
    ) -> None:  # fmt: skip
        self._jit, self._step, self._fn = jit, step, fn
        self._block, self._at, self._chunks, self._arrays = block, block.ctypes.data, chunks, arrays

    def __call__(self) -> None:
        if self._jit.n_threads == 1:
            self._step()
        else:
            self._jit._run_region(self._fn, self._at, self._chunks)


class _JobStep:
    """A step that runs one job function (:meth:`JitKernels.bind_attend`): on one thread
    alone (:func:`._numba_pool.run_alone`), on more shared with the spinning helpers
    (``pool``), or as a numba region where there are none for the step (None) or
    another thread's job holds them. ``blocks``:
    the job's argument block and chunk count for one thread and for numba's most
    (a plan is bound at the count of its first compute and kept for others); the job
    is loaded, or waited for, at the first call. Holds the arrays the blocks name by
    address, which must live as long as the step."""

    def __init__(
        self, jit: JitKernels, job: Any, what: str,
        blocks: Sequence[tuple[np.ndarray, int]], arrays: tuple[np.ndarray | None, ...],
        pool: Any,
    ) -> None:  # fmt: skip
        self._jit, self._job, self._what, self._fn = jit, job, what, 0
        (self._one, self._one_chunks), (self._many, self._many_chunks) = blocks
        self._one_at, self._many_at = self._one.ctypes.data, self._many.ctypes.data
        self._pool = pool
        self._alone, self._region = jit._run_alone, jit._run_in_region
        self._arrays = arrays
        if jit.n_threads == 1:  # (the numbers of its calls' kinds: addresses and a count)
            jit._expect("job runner", self._alone, 0, 0, 0)
        elif pool is None:
            jit._expect("parallel job runner", self._region, 0, 0, 0)

    def __call__(self) -> None:
        fn = self._fn or self._load()
        jit = self._jit
        n = jit.n_threads
        if n == 1:
            jit._call("job runner", self._alone, fn, self._one_at, self._one_chunks)
        elif self._pool is None or not self._pool.run(n, fn, self._many_at, self._many_chunks):
            jit._run_region(fn, self._many_at, self._many_chunks)

    def _load(self) -> int:
        self._fn = self._jit._job_address(self._job, self._what)
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


def _sibling_args(
    weights: list[np.ndarray],
    outs: list[np.ndarray],
    kinds: Sequence[Type],
    span: Callable[[np.ndarray], int],
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], tuple[int, ...], np.ndarray]:
    """A joint kernel's matrices and results, padded with empty ones to
    :data:`MAX_SIBLINGS` (one compiled kernel for any count), their type ids, and where
    each matrix's ``span`` units (rows, groups) start in the range they share."""
    pad = MAX_SIBLINGS - len(weights)
    weights = [*weights, *(weights[0][:0] for _ in range(pad))]
    outs = [*outs, *(outs[0][:, :0] for _ in range(pad))]
    ids = tuple(int(t) for t in kinds) + (int(kinds[0]),) * pad
    starts = np.zeros(MAX_SIBLINGS + 1, np.int64)
    for m, w in enumerate(weights):
        starts[m + 1] = starts[m] + span(w)
    return tuple(weights), tuple(outs), ids, starts


def _packed_scratch(
    x: np.ndarray, per: int, scratch: Callable[..., np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for ``x``'s rows quantized for a repacked product: codes, block scales, and
    sums of the codes over ``per`` values (:func:`.job_blocks.sums_span`)."""
    n_tok, n = x.shape
    return (scratch((n_tok, n), np.int8), scratch((n_tok, n // 32), np.float32),
            scratch((n_tok, n // per), np.int32))  # fmt: skip


@functools.cache
def pool_kernels() -> PoolKernels:
    """The spinning helpers' kernels (:class:`.pool.PoolKernels`), by reference."""
    return PoolKernels(*(module_kernel("_numba_pool", name) for name in PoolKernels._fields))


def load_jit() -> JitKernels | None:
    """The numba kernels, or None when numba is missing, broken or disabled; cached."""
    with _lock:
        if "kernels" not in _state:
            _state["kernels"], _state["status"] = _try_load()
        return _state["kernels"]  # type: ignore[no-any-return]


def jit_status() -> str:
    """One line for ``get_features``: the numba version in use, or why there is none."""
    load_jit()
    return str(_state["status"])


def _numba_environment() -> str | None:
    """Checks numba's own settings before numba reads them (at its import): a value it
    cannot read raises SettingError; too many threads, which crash numba, are lowered
    in the environment. Returns why the kernels cannot be used, or None."""
    threads = NUMBA_THREADS.get()
    if sys.modules.get("numba") is not None:  # imported by someone else: read them already
        import numba

        n = int(getattr(numba.config, "NUMBA_NUM_THREADS", 1))
        if n > MAX_NUMBA_THREADS:
            _log.warning("numba was imported with NUMBA_NUM_THREADS=%d (more than %d, which "
                         "crashes it): using the numpy kernels", n, MAX_NUMBA_THREADS)  # fmt: skip
            return f"numba was imported with NUMBA_NUM_THREADS={n}, over {MAX_NUMBA_THREADS}"
    elif threads is not None and threads > MAX_NUMBA_THREADS:
        _log.warning("%s=%d is more threads than numba can start; using %d",
                     NUMBA_THREADS.env, threads, MAX_NUMBA_THREADS)  # fmt: skip
        os.environ[NUMBA_THREADS.env] = str(MAX_NUMBA_THREADS)
    return None


def _try_load() -> tuple[JitKernels | None, str]:
    if not JIT.get():  # a value it cannot read raises SettingError, naming the valid ones
        return None, f"disabled by {JIT.env}"
    why_not = _numba_environment()
    if why_not is not None:
        return None, why_not
    if importlib.util.find_spec("numba") is None:
        return None, "numba not installed (pip install -e 'plugins/cpu[numba]')"
    # the threads first (:mod:`.threading_layer`: without numba, as kept kernels need
    # them; numba, imported by a user before, starts its own): the layer a user set in
    # numba.config counts, and is checked here, not at the first parallel kernel, where
    # numba's ValueError surfaced
    numba_config = getattr(sys.modules.get("numba"), "config", None)
    layer = THREADING_LAYER.get(
        {THREADING_LAYER.env: str(getattr(numba_config, "THREADING_LAYER", "default"))}
        if numba_config is not None else None
    )  # fmt: skip
    preload_tbb(layer)
    try:
        threads = start_threads(layer)
    except ValueError as e:  # no layer loads (TBB asked for and missing, ...)
        _log.warning("numba's threading layer failed to start, using numpy kernels: %s", e)
        return None, f"numba's threading layer failed to start: {e}"
    if not kept_code_ready():
        try:  # numba now: what a launch needs is not all kept (a first run, ...)
            numba_module()
            from . import _numba_quant  # noqa: F401  (compiles nothing yet; checks numba works)
        except ImportError:
            return None, "numba not installed (pip install -e 'plugins/cpu[numba]')"
        except Exception as e:  # a numba build that does not match this numpy, etc.
            _log.warning("numba failed to import, using numpy kernels: %s", e)
            return None, f"numba failed to import: {type(e).__name__}: {e}"
    kernels = JitKernels(threads)
    _release_llvm_pages()  # llvmlite's (and numba's) import: static initializers all over LLVM
    why_public = numba_internals.why_off()
    launch = "fast launch" if why_public is None else f"numba's public API only ({why_public})"
    return kernels, f"numba {kernels.version}, {threads.layer} threading layer, {launch}"


def _numba_version() -> str:
    """numba's version as installed (read without importing it), else as imported (a
    source tree)."""
    return installed.version("numba") or str(getattr(numba_module(), "__version__", "unknown"))


def _release_llvm_pages() -> None:
    """Where the fast launch is on, LLVM's code pages this process has no more use for
    given back (:mod:`.numba_internals.llvm_pages`)."""
    if numba_internals.enabled():
        from .numba_internals.llvm_pages import release

        numba_internals.attempt("giving back LLVM's pages", release)


def _typed_alike(arrays: Sequence[np.ndarray]) -> bool:
    """Whether numba types every array of ``arrays`` alike (one compiled kernel takes
    them all, as a tuple)."""
    keys = {arg_key((a,)) for a in arrays}
    return len(keys) == 1 and None not in keys


class _Drivers(NamedTuple):
    """The repacked products' drivers for a set of types (:func:`._numba_repack.packed_kernels`)."""

    serial: KernelRef
    siblings: KernelRef


def _packed_kernels(kinds: frozenset[Type], ggml_order: bool) -> _Drivers:
    """The drivers of repacked products of ``kinds``, by reference (their origins as
    :func:`._numba_repack.packed_kernels` tags them)."""
    ids, order = tuple(sorted(int(t) for t in kinds)), bool(ggml_order)
    return _Drivers(*(made_kernel("_numba_repack", "packed_driver", ids, order, name)
                      for name in _Drivers._fields))  # fmt: skip


def _packed_job(kinds: frozenset[Type], ggml_order: bool) -> JobRef:
    """The job of repacked products of ``kinds`` on the spinning helpers, by reference
    (its origin as :func:`._numba_repack.packed_job` tags it)."""
    ids = tuple(sorted(int(t) for t in kinds))
    return made_job("_numba_repack", "packed_job_of", ids, bool(ggml_order))

"""The numba products of the CPU plugin: quantized and float weights times a few rows,
in ggml's integer way or fused float dots, repacked weights, sibling products of one
activation run as one, and decoding weights to float32.

Which kernel takes which type is the table of :mod:`.dispatch`; this module binds what
it chooses, through the calls every family shares (:class:`.jit_binding.Binding`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from functools import partial
from typing import ClassVar, NamedTuple

import numpy as np

from tensorplug.iquants import IQ4_TYPES
from tensorplug.kquants import K_TYPES
from tensorplug.types import Type

from ..repack import PackedLayout, move_table
from .activations import round_rows, vec_dot_type
from .arg_types import arg_key
from .dispatch import DECODE_VECTOR, FLOAT_FUSED, INT8, MANY, PLAIN, fused_path, path, select
from .jit_binding import F16_TO_F32, Binding
from .jit_steps import KernelCall, PooledJob
from .job_blocks import (
    QUANTIZE_APART_ROWS,
    ROW_DECODER_CODES,
    ROWS_F16,
    ROWS_F32,
    TYPES32,
    activation_form,
    packed_job_block,
    sums_span,
)
from .kernel_refs import JobRef, KernelRef, made_job, made_kernel, module_kernel
from .numba_internals import numba_jit_disabled
from .numpy_kernels import NUMPY_KERNELS
from .steps import Step, block_rows, reshape_view

__all__ = ["MAX_SIBLINGS", "ProductKernels"]

#: most products :meth:`ProductKernels.bind_matvec_siblings` runs as one (a layer's Q, K, V)
MAX_SIBLINGS = 3
#: the widening kernel's name for F16 weights (the attention's F16 cache has another
#: signature, and a name of its own: :meth:`.jit_calls.KernelCalls.load_expected` goes
#: by name)
_WIDEN_WEIGHTS = "f16 weight widening kernel"
_QUANT, _KQUANT, _IQUANT = "_numba_quant", "_numba_kquant", "_numba_iquant"


class ProductKernels(Binding):
    """The products' and decoders' kernels, by reference (:mod:`.kernel_refs`: their
    kept code where it is kept, numba's dispatchers otherwise), and their steps."""

    max_siblings = MAX_SIBLINGS
    # the float kernels of every type the table's fused float path takes: a matrix × a
    # few rows, and decoding (one pair of drivers for every K-quant, told the type by
    # id; the IQ4 types' pairs in a module of their own)
    _kernels: ClassVar[dict[Type, tuple[Callable[..., None], Callable[..., None]]]] = {
        t: (functools.partial(module_kernel(_KQUANT, "matvec_k"), kind=int(t)),
            functools.partial(module_kernel(_KQUANT, "dequantize_k"), kind=int(t)))
           if t in K_TYPES else
           (module_kernel(_IQUANT if t in IQ4_TYPES else _QUANT, f"matvec_{t.name.lower()}"),
            module_kernel(_IQUANT if t in IQ4_TYPES else _QUANT,
                          f"dequantize_{t.name.lower()}"))
        for t in path(FLOAT_FUSED).types
    }  # fmt: skip
    # ggml's way (the table's INT8 path): activations quantized to the weight type's
    # vec_dot_type, integer dots; and those activations as floats for the other paths
    _round = module_kernel(_QUANT, "round_activations")
    _int8 = module_kernel("_numba_kint8", "matvec_int8")
    _int8_serial = module_kernel("_numba_kint8", "matvec_int8_serial")
    _int8_siblings = module_kernel("_numba_kint8", "matvec_int8_siblings")
    # weights stored repacked (CPU_REPACK): eight rows at a time, any activation rows;
    # drivers per set of types, which compile those types' tiles only; many rows'
    # activations quantized apart, on every thread, for any driver
    _quantize_rows = module_kernel("_numba_repack", "quantize_rows")
    _repack_moves = module_kernel("_numba_pack", "repack_moves")
    # F32, F16 and BF16 weights times a few rows, each weight read once
    _fmatvec = module_kernel("_numba_fmatvec", "matvec_float")
    _fmatvec_serial = module_kernel("_numba_fmatvec", "matvec_float_serial")
    _widen_f16_rows = module_kernel("_numba_attention", "widen_f16_rows")
    # the vector decoders of whole byte rows (the table's DECODE_VECTOR path), and the
    # arguments after (rows, out, table)
    _row_decoders: ClassVar[dict[Type, tuple[KernelRef, tuple[int, ...]]]] = {
        t: (module_kernel("_numba_decode", "dequantize_rows32"), (int(t),)) if t in TYPES32
           else (module_kernel("_numba_decode", f"dequantize_{t.name.lower()}_rows"), ())
        for t in path(DECODE_VECTOR).types
    }  # fmt: skip

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
            product = self.bind_call(what, kernel, blocks, rounded, out, F16_TO_F32)

            def rounded_product() -> None:
                round_rows(x, t, rounded)
                product()

            return rounded_product
        xq, xd, xs = _q8_scratch(x)
        # a parallel kernel may call a serial one (not the reverse: numba's disk cache of
        # a function that calls a parallel one crashed the process that loaded it)
        what = f"integer matrix-vector kernel for {t.name}"
        args = (x, rows, xq, xd, xs, out, F16_TO_F32, int(t))
        serial = self.bind_call(f"one-thread {what}", self._int8_serial, *args)
        parallel = self.bind_call(what, self._int8, *args)

        if rows.shape[0] < 4:  # the one-row loops: one kernel, so the same bits at any -t
            return serial

        return self.serial_or_parallel(serial, parallel)

    def bind_round_rows(
        self, t: Type, x: np.ndarray, out: np.ndarray, corr: np.ndarray | None
    ) -> Step:
        """``out[...] = round_rows(x, t)`` (:mod:`.activations`) for float32 ``x`` of a
        quantized type's product, in numba where ``x`` is C-contiguous (numpy's
        otherwise, and for the float types' rounding); for Q4_1/Q5_1 also ``corr`` ``(…,
        n/32)`` = :func:`~.activations.q8_1_offset_correction`. The values are numpy's,
        bit for bit (tested)."""
        n = x.shape[-1]
        x2, out2 = reshape_view(x, (-1, n)), reshape_view(out, (-1, n))
        spare = np.empty((1, 1), np.float32)  # what the types without offsets are given
        corr2 = spare if corr is None else reshape_view(corr, (-1, corr.shape[-1]))
        taken = t.is_quantized and x.flags.c_contiguous
        if not taken or x2 is None or out2 is None or corr2 is None:
            return NUMPY_KERNELS.bind_round_rows(t, x, out, corr)
        xq, xd, xs = _q8_scratch(x2)
        args = (x2, out2, corr2, xq, xd, xs, F16_TO_F32, int(t))
        return self.bind_call("activation rounding kernel", self._round, *args)

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
        serial_args = (x, packed, xq, xd, xs, out, F16_TO_F32, int(t))
        serial = self.bind_call(f"one-thread {what}", drivers.serial, *serial_args)
        # many threads: the sibling driver, this matrix and two empty ones
        joint = _sibling_args([packed], [out], [t], lambda p: p.shape[0])
        parallel = self._quantized_apart(
            t, x, (xq, xd, xs), self.bind_call(what, drivers.siblings, x, *joint)
        )
        # a joint step's product runs on one thread only: the helpers never run it
        pooled = self._pooled(x, [(t, packed, out)], (xq, xd, xs), parallel, ggml_order) \
            if alone else None  # fmt: skip
        return self.serial_or_parallel(serial, parallel, pooled, alone)

    def _quantized_apart(
        self, t: Type, x: np.ndarray, quantized: tuple[np.ndarray, ...],
        driver: KernelCall,
    ) -> KernelCall:  # fmt: skip
        """A sibling driver's call (``driver``: :meth:`call` with all its arguments up
        to ``quantized``, the activations' codes, scales and sums), with ``x`` quantized
        by the driver, or first on every thread by :func:`._numba_repack.quantize_rows`
        when it has many rows (then called first: ``before``). A :class:`KernelCall`
        still, whose ``args[0]`` is the driver's name (what :meth:`serial_or_parallel`
        reads)."""
        quantize_rows = self._quantize_rows
        if x.shape[0] < QUANTIZE_APART_ROWS:
            # for a later prompt's plan: the second process may compile it meanwhile
            self.want_ahead(quantize_rows, x, *quantized, F16_TO_F32, int(t), rank=2)
            return self.bind_call(*driver.args, *quantized, F16_TO_F32, False)
        if self.ahead is not None:  # this plan calls it (before its few-row products)
            self.ahead.keep(quantize_rows)
        quantize = self.bind_call("activation quantizing kernel", quantize_rows, x,
                                   *quantized, F16_TO_F32, int(t))  # fmt: skip
        self.expect_call(*quantize.args)
        return self.bind_call(*driver.args, *quantized, F16_TO_F32, True, before=quantize)

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
        args = (raw, x, out, F16_TO_F32)
        what = f"float matrix-vector kernel for {t.name}"
        serial = self.bind_call(f"one-thread {what}", self._fmatvec_serial, *args)
        parallel = self.bind_call(what, self._fmatvec, *args)
        return self.serial_or_parallel(serial, parallel)

    def widen_f16(self, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out[...] = src`` for 2-d float16 ``src`` into float32 ``out`` (unit-stride
        rows), eight values per ``vcvtph2ps`` where the CPU has F16C: numpy's conversion
        would be most of the time of a prompt on F16 weights. Returns ``out``."""
        self.call(_WIDEN_WEIGHTS, self._widen_f16_rows, src.view(np.uint16)[None, None],
                   out[None, None], src.shape[0], F16_TO_F32)  # fmt: skip
        return out

    def bind_widen_f16(self, src: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """``widen(out)``: :meth:`widen_f16` of a plan's F16 weights ``src``, its kernel
        expected (:meth:`expect`) for the float32 scratch of unit-stride rows it gets."""
        scratch = np.empty((1, 1), np.float32)[None, None]  # the type of out[None, None]
        self.expect_call(_WIDEN_WEIGHTS, self._widen_f16_rows, src.view(np.uint16)[None, None],
                     scratch, src.shape[0], F16_TO_F32)  # fmt: skip
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
        together = self.bind_call("integer matrix-vector kernel for sibling products",
                           self._int8_siblings, x, *joint, *_q8_scratch(x),
                           F16_TO_F32)  # fmt: skip
        return self.one_by_one_or_together(one_by_one, together)

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
            first, x, quantized, self.bind_call(what, drivers.siblings, x, *joint)
        )
        pooled = self._pooled(x, products, quantized, together, ggml_order)
        return self.one_by_one_or_together(one_by_one, together, pooled)

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
        ``TENSORPLUG_CPU_SPIN=0``, a job the disk cache lacks (:meth:`job_ready`), or
        arrays that are not C-contiguous."""
        pool = self.pool_for(x.shape[0])
        if pool is None:
            return region
        packs = [packed for _, packed, _ in products]
        outs = [out for _, _, out in products]
        if not all(a.flags.c_contiguous for a in (x, *quantized, *packs, *outs)):
            return region
        kinds = [t for t, _, _ in products]
        job = _packed_job(frozenset(kinds), ggml_order)
        if not self.job_ready(job):
            return region
        chunks = pool.chunks(self.max_threads, sum(p.shape[0] for p in packs))
        xq, xd, xs = quantized
        block = packed_job_block(x, packs, outs, kinds, xq, xd, xs, F16_TO_F32, chunks)
        return PooledJob(self, pool, job.address, block, chunks, region,
                          (x, *quantized, *packs, *outs))  # fmt: skip

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
        self.call("repack kernel", self._repack_moves, words.view(np.uint16), words,
                   blocks.view(np.uint32), blocks.view(np.uint16), blocks, groups, nb,
                   lay.type.type_size, lay.block, table)  # fmt: skip
        return True

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
            self.expect_call(vector_what, vector, rows, out, F16_TO_F32, *extra)
        elif out is not None:
            self.expect_call(what, scalar, blocks, out, F16_TO_F32)

        def decode(out: np.ndarray) -> np.ndarray:
            if rows is not None and out.strides[-1] == 4:  # the vectors store unit-stride
                self.call(vector_what, vector, rows, out, F16_TO_F32, *extra)
            else:
                self.call(what, scalar, blocks, out, F16_TO_F32)
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


def _q8_scratch(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for ``x``'s rows quantized to Q8_0: codes, block scales, block code sums."""
    n_tok, n = x.shape
    return (np.empty((n_tok, n), np.int8), np.empty((n_tok, n // 32), np.float32),
            np.empty((n_tok, n // 32), np.int32))  # fmt: skip


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

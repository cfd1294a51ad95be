"""The compiled side of :mod:`.program`: a generation step's small kernels as jobs.

A job is what the spinning helpers run (:mod:`._numba_pool`): a C function ``void
fn(int64 job, int64 lo, int64 hi)`` over an argument block at address ``job``. The
products and attention already are jobs; here are the steps between them (the norm,
its weight, rope, the KV cache's new rows, the gated activation, the residual adds),
so that a decode graph can run as one compiled call (:func:`._numba_pool.run_program`)
instead of a Python call a node; and the token's embedding rows (:func:`_get_rows_job`),
read from the model file with ``pread`` as the step reads them, so that a generated token
is one call. Each job calls the kernel the step calls, or does numpy's float32 operation
(or the exact widening the step's numpy does), so the bits are the step's.

In a generation step they are small (a few rows): one chunk, run by the caller alone.
The row jobs (the binary operations, the norm, rope, the gated activation) also take a
prompt's rows in chunks: chunk ``c`` is rows ``c·per .. (c+1)·per`` of the step
(:data:`PER` rows a chunk; a row of a binary operation is one of ``out``'s last axis),
so that a numba region can share a prompt's step out over threads
(:meth:`.jit.JitKernels.rows_region`). A chunk computes its rows as the whole step
would: the bits do not depend on the split. The others (copy, the KV cache's rows, the
embedding rows) are one chunk always. ``lo`` = -1 (the prologue) does nothing.

A block is ``int64``: field :data:`STATUS` first (nonzero when a job refused its input:
:func:`_set_rows_job`'s bad index; :func:`_get_rows_job`'s, or a file read that came up
short), then :data:`PER`, then the arrays as :func:`.job_blocks.describe4` writes them
(C-contiguous, as the step's kernel saw them, so its loops vectorize as they did; a
copy's source any strides), from :data:`ARGS` on, then its integers, then its floats (as
float64 bits): :func:`.job_blocks.block_size` counts them, :func:`.job_blocks.job_block`
writes them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from . import _numba_ir as _ir
from ._numba_decode import (
    dequantize_q4_k_rows,
    dequantize_q5_k_rows,
    dequantize_q6_k_rows,
    dequantize_rows32,
)
from ._numba_pool import address, view4
from ._numba_rows import glu_rows, rms_norm_rows, rope_rows, set_rows
from .job_blocks import (
    ADD,
    ARGS,
    HAS_PREAD,
    MUL,
    PER,
    ROWS_32,
    ROWS_F16,
    ROWS_Q4_K,
    ROWS_Q5_K,
    ROWS_Q6_K,
    STATUS,
    SUB,
    block_size,
)
from .job_blocks import ARRAY4_FIELDS as A4
from .job_function import job_function

__all__ = ["jobs"]


@njit(inline="always")
def _chunk_rows(b: Any, lo: Any, hi: Any, rows: Any) -> Any:
    """The rows chunks ``lo..hi`` of a row job cover: ``lo·per`` up to ``hi·per`` (or
    the last row)."""
    per = b[PER]
    return min(lo * per, rows), min(hi * per, rows)


# each job's block size (a constant in its compiled code)
_BINARY, _COPY, _RMS_NORM = block_size(3, 2), block_size(2, 0), block_size(2, 1)
_ROPE, _GLU, _SET_ROWS = block_size(6, 5), block_size(4, 1), block_size(3, 2)
_GET_ROWS = block_size(5, 7)


@njit(inline="always")
def _floats(job: Any, at: int, n: int) -> Any:
    """The block's ``n`` float64 scalars from field ``at``."""
    return carray(address(job + 8 * at), n, np.float64)


@njit(inline="always")
def _fields(job: Any, n: int) -> Any:
    return carray(address(job), n, np.int64)


@njit(inline="always")
def _c4(b: Any, at: int, dtype: Any) -> Any:
    """The C-contiguous 4-d array of ``dtype`` that ``describe4`` wrote at field ``at``
    (C layout, as the step's own kernel saw it: its loops vectorize as they did)."""
    return carray(address(b[at]), (b[at + 1], b[at + 2], b[at + 3], b[at + 4]), dtype)


@njit(inline="always")
def _flat(b: Any, at: int, dtype: Any) -> Any:
    """The array at field ``at`` (C-contiguous) as one axis."""
    return carray(address(b[at]), b[at + 1] * b[at + 2] * b[at + 3] * b[at + 4], dtype)


def _binary_job(job: Any, lo: Any, hi: Any) -> None:
    """``out = x (op) y`` over C-contiguous float32 arrays, ``y`` of ``out``'s shape or
    of its trailing axes (repeated over the leading ones: element ``i`` of ``out`` meets
    ``y[i % y.size]``), as numpy's float32 loop: one rounding each; integers: the
    operation, ``y.size``. A row is one of ``out``'s last axis; ``y.size`` is a multiple
    of it, or 1 (a scalar's one-element array: read as a row of that value)."""
    if lo < 0:
        return
    b = _fields(job, _BINARY)
    op, m = b[ARGS + 3 * A4], b[ARGS + 3 * A4 + 1]
    n = b[ARGS + 2 * A4 + 4]  # out's last extent: a row
    rows = b[ARGS + 2 * A4 + 1] * b[ARGS + 2 * A4 + 2] * b[ARGS + 2 * A4 + 3]
    x = carray(address(b[ARGS]), (rows, n), np.float32)
    out = carray(address(b[ARGS + 2 * A4]), (rows, n), np.float32)
    if m < n:  # one value: y as a row of it
        y = np.full((1, n), carray(address(b[ARGS + A4]), 1, np.float32)[0], np.float32)
    else:
        y = carray(address(b[ARGS + A4]), (m // n, n), np.float32)
    r0, r1 = _chunk_rows(b, lo, hi, rows)
    for r in range(r0, r1):  # whole rows, each an inner loop from 0 that vectorizes
        xr, yr, o = x[r], y[r % y.shape[0]], out[r]
        if op == ADD:
            for i in range(n):
                o[i] = xr[i] + yr[i]
        elif op == SUB:
            for i in range(n):
                o[i] = xr[i] - yr[i]
        elif op == MUL:
            for i in range(n):
                o[i] = xr[i] * yr[i]
        else:
            for i in range(n):
                o[i] = xr[i] / yr[i]


def _copy_job(job: Any, lo: Any, hi: Any) -> None:
    """``out = x`` (``np.copyto``) into C-contiguous float32 ``out`` from ``x`` of its
    shape and any strides (a permuted view: a batch's queries for attention)."""
    if lo < 0:
        return
    b = _fields(job, _COPY)
    x, out = view4(b, ARGS, np.float32), _c4(b, ARGS + A4, np.float32)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            for k in range(out.shape[2]):
                for m in range(out.shape[3]):
                    out[i, j, k, m] = x[i, j, k, m]


def _rms_norm_job(job: Any, lo: Any, hi: Any) -> None:
    """:func:`._numba_rows.rms_norm_rows` over rows ``x[0, 0]`` (2-d); float: eps."""
    if lo < 0:
        return
    b = _fields(job, _RMS_NORM)
    x, out = _c4(b, ARGS, np.float32)[0, 0], _c4(b, ARGS + A4, np.float32)[0, 0]
    eps = _floats(job, ARGS + 2 * A4, 1)[0]
    r0, r1 = _chunk_rows(b, lo, hi, x.shape[0])
    rms_norm_rows(x[r0:r1], out[r0:r1], eps)


def _rope_job(job: Any, lo: Any, hi: Any) -> None:
    """:func:`._numba_rows.rope_rows` over ``x[0]`` (3-d) with positions ``pos`` (int32)
    and the frequency factors, ramp and kept share (1-d, maybe empty); integers: neox,
    n_dims; floats: theta_scale, freq_scale, mscale."""
    if lo < 0:
        return
    b = _fields(job, _ROPE)
    x, out = _c4(b, ARGS, np.float32), _c4(b, ARGS + A4, np.float32)
    pos = _c4(b, ARGS + 2 * A4, np.int32)
    factors = _c4(b, ARGS + 3 * A4, np.float32)
    ramp = _c4(b, ARGS + 4 * A4, np.float32)
    keep = _c4(b, ARGS + 5 * A4, np.float32)
    at = ARGS + 6 * A4
    s = _floats(job, at + 2, 3)
    r0, r1 = _chunk_rows(b, lo, hi, x.shape[1])  # tokens
    rope_rows(x[0, r0:r1], out[0, r0:r1], pos[0, 0, 0, r0:r1], factors[0, 0, 0], ramp[0, 0, 0],
              keep[0, 0, 0], b[at] != 0, b[at + 1], np.float32(s[0]), np.float32(s[1]),
              np.float32(s[2]))  # fmt: skip


def _glu_job(job: Any, lo: Any, hi: Any) -> None:
    """:func:`._numba_rows.glu_rows` over rows ``[0, 0]`` (2-d) with its f16 table
    (``table[0, 0, 0]``); integer: the kind."""
    if lo < 0:
        return
    b = _fields(job, _GLU)
    x, g = _c4(b, ARGS, np.float32), _c4(b, ARGS + A4, np.float32)
    out, table = _c4(b, ARGS + 2 * A4, np.float32), _c4(b, ARGS + 3 * A4, np.float32)
    kind = b[ARGS + 4 * A4]
    r0, r1 = _chunk_rows(b, lo, hi, out.shape[2])
    glu_rows(x[0, 0, r0:r1], g[0, 0, r0:r1], out[0, 0, r0:r1], kind, table[0, 0, 0])


def _set_rows_job(job: Any, lo: Any, hi: Any) -> None:
    """:func:`._numba_rows.set_rows` of float32 ``values[0, 0]`` into ``table[0, 0]``
    (raw f16 ``uint16`` or float32) at ``idx[0, 0, 0]`` (int32 or int64); integers:
    whether the table is f16, whether the indices are int64. A bad index writes nothing and
    sets :data:`STATUS` to its position + 1 (the step then raises what it raises)."""
    if lo < 0:
        return
    b = _fields(job, _SET_ROWS)
    values = _c4(b, ARGS + A4, np.float32)[0, 0]
    f16, wide = b[ARGS + 3 * A4] != 0, b[ARGS + 3 * A4 + 1] != 0
    if f16:
        table16 = _c4(b, ARGS, np.uint16)[0, 0]
        if wide:
            bad = set_rows(table16, values, _c4(b, ARGS + 2 * A4, np.int64)[0, 0, 0])
        else:
            bad = set_rows(table16, values, _c4(b, ARGS + 2 * A4, np.int32)[0, 0, 0])
    else:
        table32 = _c4(b, ARGS, np.float32)[0, 0]
        if wide:
            bad = set_rows(table32, values, _c4(b, ARGS + 2 * A4, np.int64)[0, 0, 0])
        else:
            bad = set_rows(table32, values, _c4(b, ARGS + 2 * A4, np.int32)[0, 0, 0])
    b[STATUS] = bad + 1


@intrinsic
def _pread(typingctx: Any, fd: Any, at: Any, n: Any, offset: Any) -> Any:
    """libc's ``pread(fd, (void *) at, n, offset)``: the count read, or -1 (an error, or
    no ``pread`` on this OS)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        i32, i64 = ir.IntType(32), ir.IntType(64)
        if not HAS_PREAD:
            return ir.Constant(i64, -1)
        fnty = ir.FunctionType(i64, [i32, _ir.VOID_PTR, i64, i64])
        fn = _ir.declare(builder.module, fnty, "pread")
        fd, at, n, offset = args
        return builder.call(fn, [builder.trunc(fd, i32), builder.inttoptr(at, _ir.VOID_PTR),
                                 n, offset])  # fmt: skip

    return types.int64(types.int64, types.int64, types.int64, types.int64), codegen


@njit(inline="always")
def _read_fully(fd: int, at: int, n: int, offset: int) -> bool:
    """``n`` bytes of ``fd`` from ``offset`` to address ``at``; False where a read fails
    or the file ends first (the step then reads again, and raises what it raises)."""
    done = 0
    while done < n:
        got: int = _pread(fd, at + done, n - done, offset + done)  # type: ignore[call-arg]
        if got <= 0:
            return False
        done += got
    return True


@njit(inline="always")
def _decode_row(src: Any, dst: Any, f16: Any, decoder: int, kind: int) -> None:
    """One byte row ``src (1, size)`` as float32 ``dst (1, n)``, as the step's decoding
    (:meth:`.jit.JitKernels.bind_dequantize`'s row decoders; numpy's exact widening)."""
    if decoder == ROWS_32:
        dequantize_rows32(src, dst, f16, kind)
    elif decoder == ROWS_Q4_K:
        dequantize_q4_k_rows(src, dst, f16)
    elif decoder == ROWS_Q5_K:
        dequantize_q5_k_rows(src, dst, f16)
    elif decoder == ROWS_Q6_K:
        dequantize_q6_k_rows(src, dst, f16)
    elif decoder == ROWS_F16:
        for k in range(dst.shape[1]):
            dst[0, k] = f16[np.int64(src[0, 2 * k]) | (np.int64(src[0, 2 * k + 1]) << 8)]
    else:
        out = dst.reshape(dst.size).view(np.uint8)
        for k in range(out.size):
            out[k] = src[0, k]


def _get_rows_job(job: Any, lo: Any, hi: Any) -> None:
    """Rows ``idx`` (uint32, 1-d) of a table as float32 ``out[0, 0]`` (2-d): each row's
    bytes read from the file (integer ``fd`` ≥ 0: with ``pread`` at ``offset + i·stride``
    into ``scratch[0, 0]``'s row, C-contiguous) or taken from the table's byte rows
    ``table[0, 0]`` in memory (each row's bytes contiguous), then decoded (``decoder``,
    ``kind``: :data:`ROWS_F32`…; ``f16[0, 0, 0]`` the half-float table). Integers: fd,
    offset, stride, rows in the table, bytes a row, decoder, kind. An index past the
    table, or a read that fails, sets :data:`STATUS` (the step then raises what it
    raises); the indices are checked before a row is written."""
    if lo < 0:
        return
    b = _fields(job, _GET_ROWS)
    idx = _flat(b, ARGS + A4, np.uint32)
    f16 = _flat(b, ARGS + 4 * A4, np.float32)
    at = ARGS + 5 * A4
    fd, offset, stride, n_rows = b[at], b[at + 1], b[at + 2], b[at + 3]
    size, decoder, kind = b[at + 4], b[at + 5], b[at + 6]
    n_out = b[ARGS + 3 * A4 + 4]  # out's last extent: a row's values
    for r in range(idx.size):
        if np.int64(idx[r]) >= n_rows:
            b[STATUS] = r + 1
            return
    for r in range(idx.size):
        i = np.int64(idx[r])
        if fd >= 0:
            row_at = b[ARGS + 2 * A4] + r * size
            if not _read_fully(fd, row_at, size, offset + i * stride):
                b[STATUS] = r + 1
                return
        else:
            row_at = b[ARGS] + i * b[ARGS + 7]  # the table's row stride
        src = carray(address(row_at), (1, size), np.uint8)
        dst = carray(address(b[ARGS + 3 * A4] + 4 * r * n_out), (1, n_out), np.float32)
        _decode_row(src, dst, f16, decoder, kind)
    b[STATUS] = 0


@functools.cache
def jobs() -> dict[str, Any]:
    """The job functions by name (not compiled yet: :func:`.job_function.job_function`),
    each tagged with its origin for the compile-ahead process (:mod:`.ahead`)."""
    made = {
        "binary": job_function(_binary_job, "step_binary_job"),
        "copy": job_function(_copy_job, "step_copy_job"),
        "rms_norm": job_function(_rms_norm_job, "step_rms_norm_job"),
        "rope": job_function(_rope_job, "step_rope_job"),
        "glu": job_function(_glu_job, "step_glu_job"),
        "set_rows": job_function(_set_rows_job, "step_set_rows_job"),
        "get_rows": job_function(_get_rows_job, "step_get_rows_job"),
    }
    for name, job in made.items():
        job.tensorplug_origin = ("made_job", __name__, "step_job", name)
    return made


def step_job(name: str) -> Any:
    """The job function ``name`` of :func:`jobs` (what its origin names)."""
    return jobs()[name]

"""The compiled side of :mod:`.program`: a generation step's small kernels as jobs.

A job is what the spinning helpers run (:mod:`._numba_pool`): a C function ``void
fn(int64 job, int64 lo, int64 hi)`` over an argument block at address ``job``. The
products and attention already are jobs; here are the steps between them (the norm,
its weight, rope, the KV cache's new rows, the gated activation, the residual adds),
so that a decode graph can run as one compiled call (:func:`._numba_pool.run_program`)
instead of a Python call a node. Each job calls the kernel the step calls, or does
numpy's float32 operation, so the bits are the step's.

These jobs are small (a few rows): one chunk each, run by the caller alone; ``lo`` = -1
(the prologue) does nothing.

A block is ``int64``: field :data:`STATUS` first (nonzero when a job refused its input:
:func:`_set_rows_job`'s bad index), then the arrays as :func:`._numba_pool.describe4`
writes them (C-contiguous, as the step's kernel saw them, so its loops vectorize as they
did; a copy's source any strides), from :data:`ARGS` on, then its integers, then its
floats (as float64 bits): :func:`block_size` counts them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numba import carray, njit

from ._numba_cache import job_function
from ._numba_pool import ARRAY4_FIELDS as A4
from ._numba_pool import address, view4
from ._numba_rows import glu_rows, rms_norm_rows, rope_rows, set_rows

__all__ = ["ADD", "ARGS", "DIV", "MUL", "STATUS", "SUB", "block_size", "jobs"]

#: the block's status field, and where its arrays start
STATUS, ARGS = 0, 1
#: :func:`binary_job`'s operations (field ``ARGS + 3·A4``)
ADD, SUB, MUL, DIV = 0, 1, 2, 3


def block_size(arrays: int, scalars: int) -> int:
    """The int64 fields of a block of ``arrays`` arrays and ``scalars`` numbers."""
    return ARGS + A4 * arrays + scalars


# each job's block size (a constant in its compiled code)
_BINARY, _COPY, _RMS_NORM = block_size(3, 2), block_size(2, 0), block_size(2, 1)
_ROPE, _GLU, _SET_ROWS = block_size(6, 5), block_size(4, 1), block_size(3, 2)


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
    operation, ``y.size``."""
    if lo < 0:
        return
    b = _fields(job, _BINARY)
    x, y = _flat(b, ARGS, np.float32), _flat(b, ARGS + A4, np.float32)
    out = _flat(b, ARGS + 2 * A4, np.float32)
    op, m = b[ARGS + 3 * A4], b[ARGS + 3 * A4 + 1]
    for r in range(0, out.size, m):
        if op == ADD:
            for i in range(m):
                out[r + i] = x[r + i] + y[i]
        elif op == SUB:
            for i in range(m):
                out[r + i] = x[r + i] - y[i]
        elif op == MUL:
            for i in range(m):
                out[r + i] = x[r + i] * y[i]
        else:
            for i in range(m):
                out[r + i] = x[r + i] / y[i]


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
    x, out = _c4(b, ARGS, np.float32), _c4(b, ARGS + A4, np.float32)
    eps = _floats(job, ARGS + 2 * A4, 1)[0]
    rms_norm_rows(x[0, 0], out[0, 0], eps)


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
    rope_rows(x[0], out[0], pos[0, 0, 0], factors[0, 0, 0], ramp[0, 0, 0], keep[0, 0, 0],
              b[at] != 0, b[at + 1], np.float32(s[0]), np.float32(s[1]),
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
    glu_rows(x[0, 0], g[0, 0], out[0, 0], kind, table[0, 0, 0])


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


@functools.cache
def jobs() -> dict[str, Any]:
    """The job functions by name (not compiled yet: :func:`._numba_cache.job_function`),
    each tagged with its origin for the compile-ahead process (:mod:`.ahead`)."""
    made = {
        "binary": job_function(_binary_job, "step_binary_job", error_model="numpy"),
        "copy": job_function(_copy_job, "step_copy_job"),
        "rms_norm": job_function(_rms_norm_job, "step_rms_norm_job"),
        "rope": job_function(_rope_job, "step_rope_job"),
        "glu": job_function(_glu_job, "step_glu_job", error_model="numpy"),
        "set_rows": job_function(_set_rows_job, "step_set_rows_job"),
    }
    for name, job in made.items():
        job.tensorplug_origin = ("step_job", name)
    return made

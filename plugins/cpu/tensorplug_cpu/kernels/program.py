"""A generation step's graph as one compiled call: the plan's steps lowered to jobs.

A plan runs a Python call a node: ~140 calls a token for a 100M model, 514 for SmolLM2,
each Python's dispatch around a kernel that, for the few rows of a generation step, often
computes in less time than that dispatch (a 768-wide norm, a residual add). The products
and attention already run as jobs of the spinning helpers (:mod:`.pool`): a compiled
function by address over an argument block. Here the small steps become jobs as well
(:mod:`._numba_jobs`), and a run of consecutive job steps becomes one :class:`Program`: a
table of (function, block, chunks, flags) that :func:`._numba_pool.run_program` walks in
one call, the helpers spinning from one product to the next. In the models checked
(SmolLM2, the benchmark's 100M, 270M and 660M models), one sequence's step or a batch's,
every node is a job, the token's embedding row too (read from the file with ``pread``
inside the job, as the step reads it; Gemma's scaling of it a binary job by a one-element
operand), so a token is one call into compiled code; a node of another architecture
without a job form splits its program in two.

What a program computes is what its steps compute, bit for bit: each job calls the
step's kernel, or does numpy's float32 operation, and a product's job computes each group
of weight rows as its driver does. So a program is used wherever it can be, and the steps
run as before wherever it cannot:

* a step with no job form (another op, another dtype, more than four axes) ends a
  program and runs as itself;
* a job numba's disk cache lacks (a first run) is not waited for: the compile-ahead
  process makes it for the next plan or run (:meth:`.provider.CompiledKernels.ready_step_job`);
* another thread's job holds the helpers (two models computing at once): the program's
  steps run one by one, as each would then;
* a job that refuses its input (:func:`._numba_jobs._set_rows_job`'s bad index) stops the
  program there, and its step runs again to raise the error it raises.

``TENSORPLUG_CPU_PROGRAM=0`` turns programs off (:mod:`..settings`).

A prompt's steps are too large for a job the caller runs alone (:data:`SMALL`); where
they are row jobs (:data:`.job_blocks.CHUNKED`: the norm, rope, the gated activation,
the binary operations) :func:`rows_regions` makes each its job's rows shared out as a
numba region on more than one thread, rather than one thread's loop or numpy's
(:meth:`.provider.CompiledKernels.rows_region`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..settings import PROGRAM
from .common import SplitRows, Step, StepSequence, block_rows
from .convert import GetRowsStep, SetRowsStep
from .gelu_table import glu_table
from .job_blocks import CHECKED, CHUNKED, HAS_PREAD, MAILBOX_SIZE, PROGRAM_FIELDS, SHARED, job_block
from .job_calls import JobCall, JobSpec

if TYPE_CHECKING:
    from .provider import CompiledKernels

__all__ = [
    "MIN_JOBS",
    "SMALL",
    "JobCall",
    "JobSpec",
    "Program",
    "job_spec",
    "lower",
    "programs",
    "rows_regions",
]

#: A run of fewer job steps stays as it is: one call saves little there, and a segment's
#: table costs its own call.
MIN_JOBS = 4
#: The most elements a small step's array has to become a job (a generation step's few
#: rows): a job runs on the caller alone, where a prompt's rows are split over threads
#: or run in numpy's vector loops.
SMALL = 1 << 16


class Program:
    """Consecutive steps of a plan as one call of :func:`._numba_pool.run_program`;
    ``steps`` are kept to run instead where the program cannot run (module docstring)."""

    def __init__(
        self, jit: CompiledKernels, steps: Sequence[Step], calls: Sequence[Sequence[JobCall]]
    ) -> None:
        """``calls``: each step's jobs, in order (a :class:`.common.StepSequence` has one
        a part)."""
        self.steps = tuple(steps)
        #: the step each row of the tables runs a job of
        self._step_of = [k for k, jobs in enumerate(calls) for _ in jobs]
        rows = [call for jobs in calls for call in jobs]
        self._jit, self._pool = jit, jit.spin_pool()
        self._mailbox = np.zeros(MAILBOX_SIZE, np.int64)  # one thread: unused
        self._one = _table(rows, one=True)
        self._many = _table(rows, one=False)
        #: the runner for these arguments' types (made ready: ``program_ready``)
        self._run_alone = jit.program_runner.for_types(self._mailbox, self._one, 0)
        # what the tables name by address: the blocks, and the arrays the blocks name
        self._keep = tuple((call.one[0], call.many[0], *call.arrays) for call in rows)

    def __len__(self) -> int:
        return len(self.steps)

    def __call__(self) -> None:
        n = self._jit.n_threads
        ran: int | None
        if n == 1:
            ran = int(self._run_alone(self._mailbox, self._one, 0))
        else:  # None: no helpers here, or another thread's job holds them
            ran = None if self._pool is None else self._pool.run_program(n, self._many)
        if ran is None:
            self._steps(0)
        elif ran >= 0:  # a job refused its input: its step raises why, as it would alone
            self._steps(self._step_of[ran])

    def _steps(self, first: int) -> None:
        """The steps from ``first`` on, as a plan runs them (numpy's warnings off: ggml's
        kernels give inf and NaN silently)."""
        with np.errstate(all="ignore"):
            for step in self.steps[first:]:
                step()


def _table(calls: Sequence[JobCall], one: bool) -> np.ndarray:
    table = np.zeros((len(calls), PROGRAM_FIELDS), np.int64)
    for r, call in enumerate(calls):
        block, chunks = call.one if one else call.many
        flags = (SHARED if call.shared else 0) | (CHECKED if call.checked else 0)
        table[r] = (call.fn, block.ctypes.data, chunks, flags)
    return table


def programs(steps: Sequence[Step], jit: CompiledKernels) -> list[tuple[Step, int]]:
    """``steps`` with each run of at least :data:`MIN_JOBS` consecutive job steps
    replaced by one :class:`Program`: ``(step, index of its first step in steps)``; the
    steps themselves where programs are off or their runner is not ready yet (a first
    run: the jobs are lowered all the same, so that the compile-ahead process is asked
    for those the disk cache lacks too, and the next run has them all)."""
    plain = [(step, i) for i, step in enumerate(steps)]
    if not PROGRAM.get():
        return plain
    ready = jit.program_ready()
    calls = [lower(step, jit) for step in steps]
    if not ready:
        return plain
    runs: list[tuple[Step, int]] = []
    pending: list[tuple[Step, list[JobCall]]] = []
    start = 0

    def flush() -> None:
        if len(pending) >= MIN_JOBS:
            runs.append((Program(jit, [s for s, _ in pending], [c for _, c in pending]), start))
        else:
            runs.extend((s, start + k) for k, (s, _) in enumerate(pending))
        pending.clear()

    for i, (step, call) in enumerate(zip(steps, calls, strict=True)):
        if call is None:
            flush()
            runs.append((step, i))
            continue
        if not pending:
            start = i
        pending.append((step, call))
    flush()
    return runs


# -- lowering ---------------------------------------------------------------------------------

_BINARY = {np.add: 0, np.subtract: 1, np.multiply: 2, np.divide: 3}  # _numba_jobs' codes


def lower(step: Step, jit: CompiledKernels) -> list[JobCall] | None:
    """``step`` as jobs (a :class:`.common.StepSequence`'s parts, in order; any other
    step one), or None where it has no job form or its job is not ready."""
    if not isinstance(step, StepSequence):
        one = _lower_one(step, jit)
        return None if one is None else [one]
    calls: list[JobCall] = []
    for part in step.steps:
        jobs = lower(part, jit)
        if jobs is None:
            return None
        calls += jobs
    return calls


def _lower_one(step: Step, jit: CompiledKernels) -> JobCall | None:
    job_call = getattr(step, "job_call", None)
    if job_call is not None:  # products, attention: jobs already
        return job_call()  # type: ignore[no-any-return]
    spec = job_spec(step, jit, SMALL)
    return None if spec is None else _job(jit, spec)


def job_spec(step: Step, jit: CompiledKernels, limit: int | None = None) -> JobSpec | None:
    """``step`` as its step job would run it, or None where it has none (another op,
    another dtype, more than four axes, arrays of more than ``limit`` elements)."""
    if isinstance(step, SplitRows):
        step = step.whole
    if isinstance(step, SetRowsStep):
        return _set_rows(step, limit)
    if isinstance(step, GetRowsStep):
        return _get_rows(step, jit)
    if not isinstance(step, partial) or step.keywords:
        return None
    func, args = step.func, step.args
    if func in _BINARY:
        return _binary(_BINARY[func], args, limit)
    if func is np.copyto:
        return _copy(args, limit)
    if getattr(func, "__self__", None) is jit:
        name = getattr(func, "__name__", "")
        if name == "rms_norm_rows":
            return _rms_norm(args, limit)
        if name == "rope_rows":
            return _rope(args, limit)
        if name == "glu_rows":
            return _glu(args, jit, limit)
    return None


def rows_regions(steps: Sequence[Step], jit: CompiledKernels) -> list[Step]:
    """``steps`` with each row job's step too large for a program (:data:`SMALL`) as
    its rows shared out in a numba region on more than one thread
    (:meth:`.provider.CompiledKernels.rows_region`; the step itself on one), where numba may use
    more than one thread and the job is ready."""

    def region(step: Step) -> Step:
        if isinstance(step, StepSequence):
            parts = tuple(region(part) for part in step.steps)
            return step if parts == step.steps else StepSequence(parts)
        spec = job_spec(step, jit)
        if spec is None or spec.name not in CHUNKED or spec.values <= SMALL or spec.rows < 2:
            return step
        return jit.rows_region(step, spec) or step

    return [region(step) for step in steps] if jit.max_threads > 1 else list(steps)


def _as4(a: Any, limit: int | None, dtype: type = np.float32,
         contiguous: bool = True) -> np.ndarray | None:  # fmt: skip
    """``a`` with leading axes up to four (a view), if it is an array of ``dtype`` of no
    more than ``limit`` elements, C-contiguous unless not asked to be (the jobs read
    their arrays as C-contiguous, as the steps' kernels did; a copy's source has any
    strides)."""
    if (not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim > 4
            or (contiguous and not a.flags.c_contiguous)
            or (limit is not None and a.size > limit)):  # fmt: skip
        return None
    return a[(np.newaxis,) * (4 - a.ndim)]


def _all4(limit: int | None, *arrays: tuple[Any, type]) -> list[np.ndarray] | None:
    """Each ``(array, dtype)`` as :func:`_as4` makes it, or None if any is not."""
    made = [_as4(a, limit, dtype) for a, dtype in arrays]
    return None if any(a is None for a in made) else made  # type: ignore[return-value]


def _job(jit: CompiledKernels, spec: JobSpec) -> JobCall | None:
    """``spec``'s job, run whole by the caller; None while the job is not ready."""

    fn = jit.ready_step_job(spec.name)
    if fn is None:
        return None
    block = job_block(spec.arrays, spec.ints, spec.scalars, per=spec.rows)
    return JobCall.alone(fn, block, spec.arrays, spec.checked)


def _binary(op: int, args: tuple[Any, ...], limit: int | None) -> JobSpec | None:
    arrays = _all4(limit, *((a, np.float32) for a in args)) if len(args) == 3 else None
    if arrays is None or arrays[0].shape != arrays[2].shape:
        return None
    y, out = arrays[1], arrays[2]
    # y the same shape, or repeated over out's leading axes (a norm's weight over a
    # step's rows): element i of out meets y's element i % y.size
    trailing = y.shape[next((k for k, d in enumerate(y.shape) if d != 1), 4) :]
    if y.size == 0 or trailing != out.shape[4 - len(trailing) :]:
        return None
    return JobSpec("binary", tuple(arrays), ints=(op, y.size), values=out.size,
                   rows=out.size // out.shape[3])  # fmt: skip


def _copy(args: tuple[Any, ...], limit: int | None) -> JobSpec | None:
    if len(args) != 2:
        return None
    out, x = _as4(args[0], limit), _as4(args[1], limit, contiguous=False)
    if out is None or x is None or x.shape != out.shape:
        return None
    return JobSpec("copy", (x, out), values=out.size)


def _rms_norm(args: tuple[Any, ...], limit: int | None) -> JobSpec | None:
    x, out, eps = args
    arrays = _all4(limit, (x, np.float32), (out, np.float32))
    if arrays is None or x.ndim != 2:
        return None
    return JobSpec("rms_norm", tuple(arrays), scalars=(float(eps),), values=out.size,
                   rows=x.shape[0])  # fmt: skip


def _rope(args: tuple[Any, ...], limit: int | None) -> JobSpec | None:
    x, out, pos, factors, ramp, keep, neox, n_dims, theta_scale, freq_scale, mscale = args
    arrays = _all4(limit, (x, np.float32), (out, np.float32), (pos, np.int32),
                   (factors, np.float32), (ramp, np.float32), (keep, np.float32))  # fmt: skip
    if arrays is None or x.ndim != 3 or any(a.ndim != 1 for a in args[2:6]):
        return None
    return JobSpec("rope", tuple(arrays), ints=(int(bool(neox)), int(n_dims)),
                   scalars=(float(theta_scale), float(freq_scale), float(mscale)),
                   values=out.size, rows=x.shape[0])  # fmt: skip


def _glu(args: tuple[Any, ...], jit: CompiledKernels, limit: int | None) -> JobSpec | None:
    fn, x, g, out = args
    kind = jit.glu_kind(fn)
    arrays = _all4(limit, (x, np.float32), (g, np.float32), (out, np.float32))
    if arrays is None or x.ndim != 2 or kind is None:
        return None
    table = glu_table(fn)[np.newaxis, np.newaxis, np.newaxis]  # GeGLU's: larger than SMALL
    return JobSpec("glu", (*arrays, table), ints=(kind,), values=out.size, rows=x.shape[0])


def _set_rows(step: SetRowsStep, limit: int | None) -> JobSpec | None:
    table, values, idx = step.table, step.values, step.idx
    if (table.dtype not in (np.uint16, np.float32) or idx.dtype not in (np.int32, np.int64)
            or table.ndim != 2 or idx.ndim != 1):  # fmt: skip
        return None
    arrays = _all4(limit, (values, np.float32), (idx, idx.dtype.type))
    if arrays is None:
        return None
    if not table.flags.c_contiguous:
        return None
    table4 = table[np.newaxis, np.newaxis]  # a KV cache: larger than SMALL
    return JobSpec("set_rows", (table4, *arrays),
                   ints=(int(table.dtype == np.uint16), int(idx.dtype == np.int64)),
                   values=values.size, checked=True)  # fmt: skip


def _byte_rows(a: np.ndarray) -> np.ndarray | None:
    """A table's rows (2-d values, or 3-d quantized blocks) as ``uint8`` rows of their
    bytes (a view), where each row's bytes are contiguous; else None."""
    if a.ndim == 3:
        return block_rows(a)
    if a.ndim == 2 and a.strides[1] == a.itemsize:
        return a.view(np.uint8)
    return None


def _get_rows(step: GetRowsStep, jit: CompiledKernels) -> JobSpec | None:
    """The rows of a 2-d table as :func:`._numba_jobs._get_rows_job`, for a table whose
    rows it decodes as the step does, in memory or read from its file. Not limited to
    :data:`SMALL`: a prompt's rows are one thread's work as a step too."""

    decoder = jit.row_decoder(step.type)
    idx, out = step.idx, step.out
    table = _byte_rows(step.table)
    if (decoder is None or table is None or idx.ndim != 1 or out.ndim != 2
            or out.dtype != np.float32 or not idx.flags.c_contiguous
            or not out.flags.c_contiguous):  # fmt: skip
        return None
    fd, offset, read_into = -1, 0, table  # (in memory: the job reads no scratch)
    if step.file_rows is not None:
        scratch = None if step.taken is None else _byte_rows(step.taken)
        if not HAS_PREAD or scratch is None or not scratch.flags.c_contiguous:
            return None
        fd, offset, read_into = step.file_rows.fileno(), step.file_rows.offset + step.first, scratch
    arrays = tuple(a[(np.newaxis,) * (4 - a.ndim)] for a in
                   (table, idx, read_into, out, jit.f16_to_f32))  # fmt: skip
    ints = (fd, offset, step.stride, table.shape[0], table.shape[1], *decoder)
    return JobSpec("get_rows", arrays, ints=ints, values=out.size, checked=True)

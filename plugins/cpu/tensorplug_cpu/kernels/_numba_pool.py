"""The compiled side of :mod:`.pool`: helper threads that spin between jobs, and the
caller's share of a job, over one shared ``int64`` mailbox.

Why not numba's parallel regions for a generation step: a TBB region wakes its worker
each time, which takes microseconds, longer the more other work came between two
regions, and a small model's token opens dozens of them between short serial steps, so
a second core speeds a token up far less than llama.cpp's spinning threads do. Here a
helper spins on the mailbox for a while after each job (:data:`SPIN_NS`), so the next one
reaches it in well under a microsecond.

A job is a C function ``void fn(int64 job, int64 lo, int64 hi)`` (a numba ``cfunc``, by
address) and ``job``, the address of its argument block: ``fn(job, c, c + 1)`` computes
chunk ``c``; ``fn(job, -1, -1)`` is its prologue (quantizing the activations), which the
caller runs alone before sharing the chunks out.

The protocol (fields of the mailbox, each on its own cache line):

* ``TICKET`` is ``(sequence << 32) | next chunk``. The caller publishes a job by storing
  the new sequence with no chunk left to claim, writing ``FN``, ``JOB``, ``CHUNKS`` and
  zeroing ``DONE``, then storing ``TICKET = seq << 32`` (release). Anyone claims chunk
  ``c`` by a compare-and-swap of ``TICKET`` from ``(seq, c)`` to ``(seq, c + 1)`` for
  ``c < CHUNKS``: a claim names its job, so a helper that read an older job's ticket
  can never take a chunk of a newer one.
* After each chunk, ``DONE += 1``. The caller claims until none is left, then waits for
  ``DONE == CHUNKS`` (chunks that helpers claimed and still run). It never waits for a
  helper that has not claimed anything: a helper that is asleep, descheduled by a busy
  machine or not started yet leaves its share to the caller, so the worst a job can
  be is one thread's speed plus one chunk, never a hang (the way OpenMP's fixed shares
  collapsed beside busy processes, :mod:`.threading_layer`).
* ``WANTED`` helpers may claim (the backend's thread count less one); ``AWAKE`` counts the
  helpers inside :func:`helper_loop`, so the caller knows whom to wake; ``STOP`` ends them.

Each chunk computes exactly what the same chunk of the numba driver computes, so the
bits do not depend on who ran it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.extending import intrinsic

from ._numba_cache import kernel
from ._numba_ir import VOID_PTR, declare
from .job_blocks import (
    AWAKE,
    CHECKED,
    CHUNKS,
    DONE,
    FN,
    JOB,
    SHARED,
    STOP,
    TICKET,
    WANTED,
)

__all__ = ["BUSY_NS", "BUSY_YIELDS", "NAP_NS", "address", "helper_loop", "nap", "run_alone",
           "run_program", "run_region", "run_shared", "view4"]  # fmt: skip

# the mailbox's fields, and the helpers' spin (:mod:`.job_blocks`)
_CHUNK_BITS = 32
_CHUNK_MASK = (1 << _CHUNK_BITS) - 1
_SEQ_MASK = (1 << 31) - 1  # the sequence wraps in 31 bits: the ticket stays positive

#: A ``sched_yield`` that returns this much later ran another thread on this core: the
#: machine is busy, and a helper that spins there takes the calling thread's share of
#: it (SmolLM2 beside two busy processes generates markedly slower spinning on than
#: with numba's sleeping workers). The helper naps instead (:data:`NAP_NS`) between
#: looks at the mailbox.
BUSY_NS = 100_000
#: How long a helper that found its core busy sleeps before it looks for chunks again.
#: It does not leave the step: a server's own threads (the event loop, a request's
#: relay) take a core for well under a millisecond at a time, and a helper that left
#: at the first of them slept through the rest of the step's program (only Python
#: wakes a sleeping helper, at a program's start), which the caller then computed
#: alone. Napping, it takes its share again as soon as the core is free.
#: It leaves once :data:`BUSY_YIELDS` yields in a row found the core busy (busy
#: processes beside this one: there the caller is faster alone), and
#: :data:`~.job_blocks.SPIN_NS` after its last chunk.
NAP_NS = 50_000
#: Busy yields in a row after which a helper leaves: the core is taken for longer than
#: a burst of this process's own threads.
BUSY_YIELDS = 4
_PAUSES = 16

#: ``pause`` exists on x86 only (an LLVM intrinsic of that target)
_X86 = llvm.get_process_triple().startswith(("x86_64", "i386", "i686"))
#: POSIX ``sched_yield`` and ``nanosleep``; Windows spins on pause alone
_POSIX = sys.platform != "win32"
#: POSIX clock_gettime's monotonic clock, whose number differs by OS (Linux 1, macOS 6)
_CLOCK = getattr(time, "CLOCK_MONOTONIC", None) if sys.platform != "win32" else None


def _intrinsic(fn: Any) -> Any:
    """numba's ``intrinsic``, typed as the numba code that calls it sees it (mypy would
    take the typing context for an argument of every call)."""
    return intrinsic(fn)


def _slot(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
    """The address of ``mailbox[i]`` (``args[0]``, ``args[1]``)."""
    ary = context.make_array(sig.args[0])(context, builder, args[0])
    return builder.gep(ary.data, [args[1]])  # the mailbox: one C-contiguous row of int64


@_intrinsic
def atomic_load(typingctx: Any, mailbox: Any, i: Any) -> Any:
    """``mailbox[i]``, an acquire load: what was written before the matching release
    store is visible after it."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.load_atomic(_slot(context, builder, sig, args), "acquire", 8)

    return types.int64(mailbox, i), codegen


@_intrinsic
def atomic_store(typingctx: Any, mailbox: Any, i: Any, value: Any) -> Any:
    """``mailbox[i] = value``, a release store."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(value, _slot(context, builder, sig, args), "release", 8)
        return context.get_dummy_value()

    return types.void(mailbox, i, value), codegen


@_intrinsic
def atomic_add(typingctx: Any, mailbox: Any, i: Any, value: Any) -> Any:
    """``mailbox[i] += value`` at once (sequentially consistent); the old value."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", _slot(context, builder, sig, args), value, "seq_cst")

    return types.int64(mailbox, i, value), codegen


@_intrinsic
def compare_and_swap(typingctx: Any, mailbox: Any, i: Any, expected: Any, new: Any) -> Any:
    """``mailbox[i] = new`` if it still holds ``expected`` (sequentially consistent);
    whether it did."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        pair = builder.cmpxchg(_slot(context, builder, sig, args), args[2], args[3],
                               "seq_cst", "seq_cst")  # fmt: skip
        return builder.extract_value(pair, 1)

    return types.boolean(mailbox, i, expected, new), codegen


@_intrinsic
def spin_pause(typingctx: Any) -> Any:
    """x86's ``pause`` (a spinning core's hint: it yields the pipeline to its sibling
    hyperthread and leaves the loop without a memory-order flush); nothing elsewhere."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        if _X86:
            fn = declare(builder.module, ir.FunctionType(ir.VoidType(), []),
                         "llvm.x86.sse2.pause")  # fmt: skip
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@_intrinsic
def yield_cpu(typingctx: Any) -> Any:
    """``sched_yield()``: a spinning helper lets a runnable thread of this core run (a
    TBB worker of the prompt's regions, another process) rather than take its slice."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        if _POSIX:
            fn = declare(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


def _timespec(builder: ir.IRBuilder) -> tuple[Any, tuple[Any, Any]]:
    """A ``struct timespec`` on the stack (made once a call, not once an iteration): its
    address as ``i64*``, and its seconds' and nanoseconds' fields."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    with builder.goto_entry_block():
        spec = builder.alloca(ir.ArrayType(i64, 2))
    sec, nsec = (builder.gep(spec, [ir.Constant(i32, 0), ir.Constant(i32, i)]) for i in (0, 1))
    return builder.bitcast(spec, i64.as_pointer()), (sec, nsec)


@_intrinsic
def nap(typingctx: Any, ns: Any) -> Any:
    """``nanosleep`` for ``ns`` nanoseconds (less than a second): the thread leaves its
    core to whoever wants it for that long, where ``sched_yield`` gives it back at once
    to a spinner that asks again; nothing where there is no ``nanosleep`` (Windows)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        if _POSIX:
            i64 = ir.IntType(64)
            spec, (sec, nsec) = _timespec(builder)
            builder.store(ir.Constant(i64, 0), sec)
            builder.store(context.cast(builder, args[0], sig.args[0], types.int64), nsec)
            fnty = ir.FunctionType(ir.IntType(32), [spec.type, spec.type])
            fn = declare(builder.module, fnty, "nanosleep")
            builder.call(fn, [spec, ir.Constant(spec.type, None)])
        return context.get_dummy_value()

    return types.void(ns), codegen


@_intrinsic
def now_ns(typingctx: Any) -> Any:
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds (a vDSO call, tens of ns); 0
    where there is no such clock (Windows: the spin is bounded by rounds there)."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        i32, i64 = ir.IntType(32), ir.IntType(64)
        if _CLOCK is None:
            return ir.Constant(i64, 0)
        spec, fields = _timespec(builder)
        fn = declare(builder.module, ir.FunctionType(i32, [i32, spec.type]), "clock_gettime")
        builder.call(fn, [ir.Constant(i32, _CLOCK), spec])
        sec, nsec = (builder.load(field) for field in fields)
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

    return types.int64(), codegen


@_intrinsic
def call_job(typingctx: Any, fn: Any, job: Any, lo: Any, hi: Any) -> Any:
    """``((void (*)(int64, int64, int64)) fn)(job, lo, hi)``: a chunk of a job."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [i64, i64, i64])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64, types.int64), codegen


@_intrinsic
def address(typingctx: Any, addr: Any) -> Any:
    """An ``int64`` address as the ``void *`` that ``numba.carray`` takes: how a job
    function sees the arrays its argument block names."""

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], VOID_PTR)

    return types.voidptr(types.int64), codegen


@njit(inline="always")
def view4(block: Any, at: int, dtype: Any) -> Any:
    """The 4-d array of ``dtype`` that :func:`describe4` wrote at field ``at``."""
    one = carray(address(block[at]), 1, dtype)
    return np.lib.stride_tricks.as_strided(
        one, (block[at + 1], block[at + 2], block[at + 3], block[at + 4]),
        (block[at + 5], block[at + 6], block[at + 7], block[at + 8]),
    )  # fmt: skip


@njit(inline="always")
def _claim_and_run(mailbox: Any, word: int) -> bool:
    """Claim the chunk ``word`` (a ``TICKET`` value just read) names, if any is left, and
    run it; whether one ran. The job's fields are read before the claim, which only
    succeeds while that job is unfinished, so they were that job's."""
    chunk = word & _CHUNK_MASK
    if chunk >= atomic_load(mailbox, CHUNKS):
        return False
    fn, job = atomic_load(mailbox, FN), atomic_load(mailbox, JOB)
    if not compare_and_swap(mailbox, TICKET, word, word + 1):
        return False
    call_job(fn, job, chunk, chunk + 1)
    atomic_add(mailbox, DONE, 1)
    return True


@kernel(nogil=True)
def helper_loop(mailbox: Any, rank: int, spin_ns: int, rounds: int) -> None:
    """A helper's turn: claim and run chunks of whatever job is published, spinning
    between jobs, napping instead while a yield shows the core busy (:data:`BUSY_NS`,
    :data:`NAP_NS`); return when ``spin_ns`` have passed since its last chunk (or
    ``rounds`` idle rounds), after :data:`BUSY_YIELDS` busy yields in a row, when
    ``STOP`` is set, or when this helper (``rank`` from 0) is beyond ``WANTED``.
    ``AWAKE`` counts it meanwhile."""
    atomic_add(mailbox, AWAKE, 1)
    last = now_ns()
    idle = 0
    busy = 0  # busy yields in a row
    while idle < rounds:
        if atomic_load(mailbox, STOP) != 0 or rank >= atomic_load(mailbox, WANTED):
            break
        if _claim_and_run(mailbox, atomic_load(mailbox, TICKET)):
            idle = 0
            last = now_ns()
            continue
        idle += 1
        for _ in range(_PAUSES):
            spin_pause()
            if (atomic_load(mailbox, TICKET) & _CHUNK_MASK) < atomic_load(mailbox, CHUNKS):
                break
        else:
            before = now_ns()
            yield_cpu()
            after = now_ns()
            if after - last > spin_ns:
                break
            if after - before <= BUSY_NS:
                busy = 0
                continue
            busy += 1
            if busy >= BUSY_YIELDS:
                break
            nap(NAP_NS)
    atomic_add(mailbox, AWAKE, -1)


@njit(inline="always")
def _alone(fn: int, job: int, chunks: int) -> None:
    """:func:`run_alone`'s work, inlined where a program runs its jobs too."""
    call_job(fn, job, -1, -1)
    call_job(fn, job, 0, chunks)


@njit(inline="always")
def _share(mailbox: Any, fn: int, job: int, chunks: int) -> None:
    """:func:`run_shared`'s work, inlined where a program runs its jobs too."""
    call_job(fn, job, -1, -1)
    seq = ((atomic_load(mailbox, TICKET) >> _CHUNK_BITS) + 1) & _SEQ_MASK
    # the new sequence first, with no chunk to claim: a helper that read the last job's
    # ticket and then sees this job's fields must fail its claim, not run a chunk of
    # this job under the last one's number (a second run of it, and one DONE too many)
    atomic_store(mailbox, TICKET, (seq << _CHUNK_BITS) | _CHUNK_MASK)
    atomic_store(mailbox, FN, fn)
    atomic_store(mailbox, JOB, job)
    atomic_store(mailbox, CHUNKS, chunks)
    atomic_store(mailbox, DONE, 0)
    atomic_store(mailbox, TICKET, seq << _CHUNK_BITS)
    while (
        _claim_and_run(mailbox, atomic_load(mailbox, TICKET))
        or (atomic_load(mailbox, TICKET) & _CHUNK_MASK) < chunks
    ):
        pass
    while atomic_load(mailbox, DONE) < chunks:
        spin_pause()


@kernel(nogil=True)
def run_shared(mailbox: Any, fn: int, job: int, chunks: int) -> None:
    """A job on the calling thread and the awake helpers: its prologue here, then
    chunks ``0 .. chunks-1`` to whoever claims them; returns when all are done. One
    caller at a time (:class:`.pool.SpinPool` holds a lock around this)."""
    _share(mailbox, fn, job, chunks)


@kernel(nogil=True)
def run_program(mailbox: Any, program: Any, helpers: int) -> int:
    """Jobs one after another in one call: each row of ``program`` (``fn, job, chunks,
    flags``) as :func:`run_shared` runs it where it is ``SHARED`` and there are
    ``helpers``, else alone as :func:`run_alone`. The helpers spin from one job to the
    next. Returns -1 when every job has run, or the row of a ``CHECKED`` job that set
    its status (the jobs after it have not run). The caller holds the pool's lock where
    there are helpers."""
    for r in range(program.shape[0]):
        fn, job, chunks, flags = program[r, 0], program[r, 1], program[r, 2], program[r, 3]
        if helpers > 0 and flags & SHARED:
            _share(mailbox, fn, job, chunks)
        else:
            _alone(fn, job, chunks)
        if flags & CHECKED and carray(address(job), 1, np.int64)[0] != 0:
            return r
    return -1


@kernel(nogil=True)
def run_alone(fn: int, job: int, chunks: int) -> None:
    """A job on the calling thread alone: its prologue, then chunks ``0 .. chunks-1``
    in one call (a job function then sets up its scratch once)."""
    _alone(fn, job, chunks)


@kernel(parallel=True)
def run_region(fn: int, job: int, chunks: int) -> None:
    """A job as a numba parallel region: its prologue here, then a task a chunk on
    numba's threads; for a prompt's steps, whose products are regions too (a helper
    woken between TBB's regions came too late to take a share), and where the spinning
    helpers are not to be had (turned off, or another thread's job holds them)."""
    call_job(fn, job, -1, -1)
    for c in prange(chunks):
        chunk = np.int64(c)  # prange's index may be unsigned: the job takes int64
        call_job(fn, job, chunk, chunk + 1)

"""The calls every family of the numba kernels shares (:class:`KernelCalls`).

A kernel's first call loads its kept code, or has numba load or compile it (and keeps
that code for later processes), saying so when a compile runs long; the kernels a plan
will call only as it runs are noted when it is bound and readied when it is prepared;
the kernels a first run reaches later go to the compile-ahead process (:mod:`.ahead`);
the thread counts pick each product's serial or parallel kernel at each call; a
prompt's row jobs are shared out as regions; LLVM's pages that a load paged in are
given back after a compute.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from ..settings import SPIN
from . import compiled, numba_internals
from .jit_binding import Binding, CompileAhead
from .jit_steps import KernelCall, ProductStep, RowsRegion
from .job_blocks import MAILBOX_SIZE, PROGRAM_FIELDS, QUANTIZE_APART_ROWS, job_block
from .job_calls import JobSpec
from .kernel_refs import KernelRef, made_job, module_kernel
from .numba_import import numba_module, on_import
from .numba_internals import numba_private
from .pool import PoolKernels, spin_pool
from .steps import Step
from .threading_layer import Threads

__all__ = ["COMPILE_NOTICE_S", "KernelCalls", "pool_kernels", "release_llvm_pages"]

_log = logging.getLogger("tensorplug_cpu")

#: chunks a thread of a prompt's row step shared out as a region (:meth:`KernelCalls.rows_region`):
#: a few, so that a thread that finishes first takes another
REGION_CHUNKS_PER_THREAD = 4
#: the second process's ranks of the products' kernels of another thread count
#: (:meth:`KernelCalls.want_other_count`): the one-thread kernels a run on more threads
#: reaches in its governor's trial steps; and those a later run on more threads than
#: this one calls, after every kernel and job of this run's (whose ranks go up to 4)
ONE_THREAD_RANK, MORE_THREADS_RANK = 1, 5
#: A first kernel call still running after this many seconds is compiling: say so.
COMPILE_NOTICE_S = 0.5
#: one kernel call as :meth:`KernelCalls.call` takes it: what it is, the kernel, its arguments
_Call = tuple[str, Any, tuple[Any, ...]]


class KernelCalls(Binding):
    """The calls the kernel families share (see the module), on the threading layer
    ``threads``, with the compile-ahead process ``ahead`` (None: none)."""

    #: what runs a program (:mod:`.program`): :func:`._numba_pool.run_program`
    program_runner = module_kernel("_numba_pool", "run_program")
    runner_alone = module_kernel("_numba_pool", "run_alone")
    runner_in_region = module_kernel("_numba_pool", "run_region")

    def __init__(self, threads: Threads, ahead: CompileAhead | None) -> None:
        self._threads = threads
        self.called: set[str] = set()
        #: first calls the plan being bound makes only when it runs (:meth:`expect_call`)
        self._expected: list[_Call] = []
        #: whether LLVM ran (a kernel loaded or compiled) since :meth:`settle` last looked:
        #: set by a kernel's first call, and by any compile (a known kernel typed anew)
        self._llvm_ran = False
        on_import(lambda numba: numba_internals.attempt(
            "listening for numba's compiles", numba_private.listen_for_compiles, numba,
            self.note_llvm_ran))  # fmt: skip
        self.serial_ok: set[Any] = set()
        #: the kernels a second process compiles meanwhile on a first run (:mod:`.ahead`)
        self.ahead = ahead
        #: threads of the parallel kernels (:meth:`set_num_threads`); at one, the
        #: products that have a serial kernel call it instead
        self.n_threads: int = threads.get_num_threads()
        #: the plan being bound (:meth:`compile_ahead` ends it): whether a step of it
        #: runs attention yet, and the kernels its steps call so far
        self.attention_bound = False
        self._plan_kernels: set[Any] = set()

    def serial_or_parallel(
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
            self.will_call(serial if self.n_threads == 1 else parallel)
        if self.n_threads > 1:  # a one-thread step comes later (on one, it runs first)
            self.want_other_count(serial, ONE_THREAD_RANK)
        elif alone:
            self.want_other_count(parallel, MORE_THREADS_RANK)
        many = parallel if pooled is None else pooled

        def run() -> None:  # every token: the set is asked before the method is called
            if self.n_threads == 1 and (
                kernel in self.serial_ok or self.serial_ready(kernel, parallel_what)
            ):
                serial()
            else:
                many()

        return ProductStep(run, pooled, (serial, parallel))

    def serial_ready(self, serial: Any, parallel: str) -> bool:
        """Whether one thread runs the one-thread kernel ``serial`` now, rather than the
        parallel kernel called ``parallel`` on one thread (the same bits: no sum depends
        on the split).

        On a first run the second process compiles the one-thread kernels (:mod:`.ahead`)
        after the parallel ones this process needs first; the thread governor's
        one-thread warm-up step would then wait for them, a large share of SmolLM2's
        first run. So while the child
        has ``serial`` still to finish and ``parallel`` has run here, ``parallel`` runs."""
        if serial in self.serial_ok:
            return True
        if self.ahead is not None and parallel in self.called and self.ahead.has(serial):
            return False
        self.serial_ok.add(serial)
        return True

    def one_by_one_or_together(
        self, one_by_one: Sequence[Callable[[], None]], together: Callable[[], None],
        pooled: Callable[[], None] | None = None,
    ) -> Callable[[], None]:  # fmt: skip
        """A joint product's step: on one thread each product's serial kernel (there is
        no region to save), on more the joint parallel kernel (``pooled``, the same on
        the spinning helpers, where it is given)."""

        if self.n_threads > 1:
            self.will_call(together)
        else:
            self.want_other_count(together, MORE_THREADS_RANK)
        many = together if pooled is None else pooled

        def run() -> None:
            if self.n_threads == 1:
                for product in one_by_one:
                    product()
            else:
                many()

        return ProductStep(run, pooled, (*one_by_one, together))

    def will_call(self, call: Callable[[], None]) -> None:
        """A step of the plan being bound calls ``call`` at this thread count (a partial
        of :meth:`call`, or a repacked product's quantizing call: ``args`` ``(what,
        kernel, *kernel's arguments)``): noted for the waits for the second process
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
        self.expect_call(call.args[0], kernel, *args)
        if self.ahead is not None:
            self.ahead.will_call(kernel, *args)
        if self.attention_bound and kernel not in self._plan_kernels:
            self.want_ahead(kernel, *args, rank=0)
        self._plan_kernels.add(kernel)

    def want_other_count(self, call: Callable[[], None], rank: int) -> None:
        """A product step's kernel for another thread count than this one's (``call``, a
        partial as :meth:`will_call` reads) goes to the second process at ``rank``, so
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
        if self.ahead is None:
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
        self.ahead.want(kernel, *args, rank=rank)

    def compile_ahead(self) -> None:
        """Start compiling what :meth:`want_ahead` gathered (after a plan is bound)."""
        self.attention_bound, self._plan_kernels = False, set()
        if self.ahead is not None:
            self.ahead.start()

    def job_address(self, job: Any, what: str) -> int:
        """The address of the job function ``job`` (:func:`.job_function.job_function`),
        loaded from the disk cache or compiled, after the compile-ahead process, if it
        has the job, is done with it; ``what`` names it in the compile notice."""
        if job.ready():
            return int(job.address)
        if self.ahead is not None:
            self.ahead.wait_for(job)
        with self.first_use(what):
            compiled.compile_job(job.job())  # from the disk cache if the other process put it
        return int(job.address)

    def job_ready(self, job: Any) -> bool:
        """Whether a step may run ``job`` (a job function of the helpers): compiled, or
        loaded now from the disk cache. Where the cache lacks it, the compile-ahead
        process makes it for later plans and runs, and this step runs its numba region
        (compiling the jobs here doubled a first run's time to its first token); with
        no such process (``TENSORPLUG_CPU_COMPILE_AHEAD=0``), it is compiled here."""
        if job.ready():
            return True
        if self.ahead is None:
            compiled.compile_job(job.job())
            return True
        self.ahead.want_job(job, rank=4)  # after every kernel a step calls
        return False

    def pool_for(self, rows: int) -> Any:
        """The spinning helpers (:func:`.pool.spin_pool`) for a step of ``rows`` rows
        where steps may run on more than one thread (numba's most, not the count now: a
        plan is bound at the count of its first compute and kept for others, as the
        thread governor's trials run it) and ``TENSORPLUG_CPU_SPIN`` lets them, else
        None. Only a step of fewer than ``QUANTIZE_APART_ROWS`` rows (a generation
        step's, with up to that many sequences, and a short prompt's): a long prompt's
        steps are numba regions, products and attention alike, whose activations are
        quantized on every thread rather than by a job's prologue on one."""
        if rows >= QUANTIZE_APART_ROWS or self.max_threads < 2 or not SPIN.get():
            return None
        return spin_pool(pool_kernels())

    def finish_ahead(self) -> None:
        """Wait until the compile-ahead process has made every kernel and job wanted so
        far (a first run's): plans bound after it find them all in the disk cache, as a
        later run's do. For tests and benchmarks that want that state at once."""
        if self.ahead is not None:
            self.ahead.finish()

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
        if not self.job_ready(job):
            return None
        chunks = min(spec.rows, REGION_CHUNKS_PER_THREAD * self.max_threads)
        per = -(-spec.rows // chunks)
        block = job_block(spec.arrays, spec.ints, spec.scalars, per=per)
        if self.n_threads > 1:
            self.expect_call("parallel job runner", self.runner_in_region, 0, 0, 0)
        return RowsRegion(self, step, int(job.address), block, -(-spec.rows // per),
                           spec.arrays)  # fmt: skip

    def run_region(self, fn: int, block: int, chunks: int) -> None:
        """:func:`._numba_pool.run_region` of a job (loaded at its first call)."""
        self.call("parallel job runner", self.runner_in_region, fn, block, chunks)

    def spin_pool(self) -> Any:
        """The spinning helpers a generation step's jobs share (:meth:`pool_for` for its few
        rows), or None where steps do not use them."""
        return self.pool_for(1)

    def ready_step_job(self, name: str) -> int | None:
        """The address of the step job ``name`` (:func:`._numba_jobs.jobs`), or None
        while numba's disk cache lacks it: the compile-ahead process makes it meanwhile
        (where there is none, it is compiled here)."""
        job = made_job("_numba_jobs", "step_job", name)
        return int(job.address) if self.job_ready(job) else None

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
        if self.ahead is not None and not compiled.is_cached(dispatcher, sig):
            self.want_ahead(runner, *args, rank=4)
            return False
        runner.ready(args)  # numba's load (or compile) of it, kept
        return True

    def call_resolved(self, call: _Call) -> Any:
        what, kernel, args = call
        return self.call(what, kernel, *args)

    def bind_call(
        self, what: str, kernel: Any, *args: Any, before: Callable[[], Any] | None = None
    ) -> KernelCall:
        return KernelCall(self.call, what, kernel, *args, before=before)

    def expect_call(self, what: str, kernel: Any, *args: Any) -> None:
        if what not in self.called:
            self._expected.append((what, kernel, args))

    def take_expected(self) -> list[_Call]:
        """What :meth:`expect` noted since it was last taken (a plan takes what its
        binding noted, and keeps it)."""
        expected, self._expected = self._expected, []
        return expected

    def load_expected(self, expected: Sequence[_Call]) -> None:
        """Make ready, without calling them, the kernels of ``expected`` (a plan's first
        calls, :meth:`take_expected`) that this process has not called yet, as their
        first call would (:meth:`call`: loaded from numba's disk cache, or compiled
        after the second process is done with them): a prepared plan (``graph_prepare``)
        then runs as one that ran once."""
        for what, kernel, args in expected:
            if what in self.called or not isinstance(kernel, KernelRef):
                continue  # called already, or not a kernel (nothing to load)
            if kernel.load_kept(args):
                self._llvm_ran = True  # LLVM's loader ran (:meth:`settle`)
            else:
                dispatcher = kernel.dispatcher()
                sig = tuple(dispatcher.typeof_pyval(a) for a in args)
                if sig not in dispatcher.overloads:
                    if self.ahead is not None:
                        self.ahead.wait_for(kernel)
                    with self.first_use(what):
                        compiled.guarded(dispatcher.compile, sig)
                compiled.keep_overload(dispatcher, args)
            self.called.add(what)

    def call(self, what: str, kernel: Callable[..., Any], *args: Any) -> Any:
        if what in self.called:
            return kernel(*args)
        ref = kernel if isinstance(kernel, KernelRef) else None
        if ref is not None and ref.load_kept(args):  # its code kept by an earlier process
            self.called.add(what)
            self._llvm_ran = True  # LLVM's loader ran (:meth:`settle`)
            return kernel(*args)
        if self.ahead is not None:  # the second process may have it: let it finish
            self.ahead.wait_for(kernel)
        dispatcher = kernel if ref is None else ref.dispatcher()
        with self.first_use(what):  # (a load from a damaged cache raises before it runs)
            result = compiled.guarded(dispatcher, *args)
        compiled.keep_overload(dispatcher, args)
        self.called.add(what)
        return result

    @contextlib.contextmanager
    def first_use(self, what: str) -> Iterator[None]:
        """Around a kernel's first call, which compiles it (seconds) unless numba's disk
        cache has it (milliseconds, more on a busy machine): say so if a compile runs
        long, so a first run does not look hung. Where the fast launch is on, the clock
        starts at numba's own "compile" event, which a load from the cache never raises
        (a slow cache read is not announced); elsewhere at the call, and the notice says
        either may be running."""
        watched = numba_internals.enabled()  # numba's events are not its public API
        doing = "compiling" if watched else "loading or compiling"
        notice = threading.Timer(COMPILE_NOTICE_S, _log.warning, (
            "numba is %s the %s (once: it is cached on disk for later runs)", doing, what
        ))  # fmt: skip
        notice.daemon = True
        numba = numba_module()
        watch: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if watched:
            watch = numba_private.first_compile_noticed(numba, notice.start)
        else:
            notice.start()
        try:
            with watch:
                yield
        finally:
            notice.cancel()
            self._llvm_ran = True

    def note_llvm_ran(self) -> None:
        self._llvm_ran = True

    def settle(self) -> None:
        """After a compute: if a kernel was loaded or compiled during it, LLVM's code
        that doing so paged in is dropped again (:mod:`.llvm_pages`): tens of megabytes
        of RSS per load, which a process with its kernels loaded does not run."""
        if self._llvm_ran:
            self._llvm_ran = False
            release_llvm_pages()
        if self.ahead is not None and self.ahead.jobs:  # wanted while the child was busy
            self.ahead.start()

    def set_num_threads(self, n: int) -> None:
        self.n_threads = max(1, min(n, self.max_threads))
        self._threads.set_num_threads(self.n_threads)


@functools.cache
def pool_kernels() -> PoolKernels:
    """The spinning helpers' kernels (:class:`.pool.PoolKernels`), by reference."""
    return PoolKernels(*(module_kernel("_numba_pool", name) for name in PoolKernels._fields))


def release_llvm_pages() -> None:
    """Where the fast launch is on, LLVM's code pages this process has no more use for
    given back (:mod:`.numba_internals.llvm_pages`)."""
    if numba_internals.enabled():
        from .numba_internals.llvm_pages import release

        numba_internals.attempt("giving back LLVM's pages", release)

"""Kernels compiled ahead, in a second process, while this one compiles the others.

A first run on a new install compiles every numba kernel its model needs (tens of
seconds of one core for SmolLM2), one after another, since numba
compiles under a global lock: threads would only take turns. Most of those kernels are
known before the first is called: a CPU plan binds every step of its graph, with its
arrays, before it runs one. So after a plan is bound, the kernels that its steps will
call last, and that numba's disk cache does not hold yet, are handed to a child process
(``python -m tensorplug_cpu.kernels.ahead_child``, the numba signatures pickled on its
stdin), which compiles them into the same disk cache on the other core while this
process compiles the rest in the order the graph needs them. The child says on its
stdout which job it has finished; when this process reaches a kernel the child has, it
waits for that line and loads the kernel from the cache; while it waits, it takes
back a job the child has not started that its plans call, and the child skips a job
whose kernel the cache has by the time it gets there. The child hands back nothing
else: if it fails (or is killed), the kernels it had are compiled here as they would
have been, after the wait.

Which kernels go ahead is the binder's choice (:meth:`Ahead.want`): flash attention,
the kernels a plan first calls after it, and the one-thread products, which a step on
more threads reaches only after the multi-thread ones (the thread governor's trial).
``TENSORPLUG_CPU_COMPILE_AHEAD=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..settings import COMPILE_AHEAD
from .kernel_identity import instruction_forms, origin_of
from .numba_internals import numba_jit_disabled

__all__ = ["CHILD", "Ahead", "Job", "cached", "compile_kernel", "compile_target", "origin_of"]

_log = logging.getLogger("tensorplug_cpu")

#: the longest this process waits for the child before compiling a kernel itself
WAIT_S = 300.0


#: the child's module (``python -m``), which finds kernels by their origins
CHILD = f"{__package__}.ahead_child"


def compile_target(resolve: Callable[[tuple[Any, ...]], Any], origin: tuple[Any, ...]) -> Any:
    """What is compiled for ``origin`` (:func:`origin_of`): the dispatcher ``resolve``
    finds for it, a job as :class:`_JobCompile`."""
    found = resolve(origin)
    return _JobCompile(found) if origin[0] in _JOB_ORIGINS else found


#: the origins of job functions, which compile without a signature
_JOB_ORIGINS = ("made_job", "job")


@dataclass(frozen=True)
class _JobCompile:
    """A job function of the spinning helpers (:func:`.job_function.job_function`) as
    the child compiles kernels: ``compile(signature)`` (it has one signature)."""

    job: Any

    def compile(self, signature: tuple[Any, ...]) -> None:
        from .compiled import note_compiled

        self.job.compile()
        note_compiled(self.job, ())

    def cached(self, signature: tuple[Any, ...]) -> bool:
        from .compiled import job_cached

        return job_cached(self.job)


def cached(kernel: Any, signature: tuple[Any, ...]) -> bool:
    """Whether numba's disk cache already holds :func:`compile_target`'s ``kernel`` for
    ``signature``: the other process compiled it meanwhile."""
    if isinstance(kernel, _JobCompile):
        return kernel.cached(signature)
    from .compiled import is_cached

    return is_cached(kernel, signature)


def compile_kernel(kernel: Any, signature: tuple[Any, ...]) -> None:
    """numba's load or compile of ``kernel`` (a dispatcher, or a job as
    :class:`_JobCompile`) for ``signature``, noted as cached (:mod:`.compiled`)."""
    if isinstance(kernel, _JobCompile):
        kernel.compile(signature)
        return
    from .compiled import guarded, note_compiled

    guarded(kernel.compile, signature)
    note_compiled(kernel, signature)


@dataclass(frozen=True)
class Job:
    """One kernel and signature for the child to compile; lower ``rank`` first."""

    origin: tuple[Any, ...]
    signature: tuple[Any, ...]  # numba types
    rank: int = 0


@dataclass
class Ahead:
    """The kernels this process wants compiled ahead, and the child compiling them;
    ``resolve`` finds a kernel by its origin (:func:`.kernel_refs.resolve`), for the
    jobs this process takes back from the child."""

    resolve: Callable[[tuple[Any, ...]], Any]
    jobs: dict[Job, None] = field(default_factory=dict)  # wanted, not yet handed over
    #: the child's jobs, in its order; how many it has said are done (it takes them in
    #: order, so the next is the one it is compiling); those this process took back;
    #: whether it has ended. What it has still to finish follows (:meth:`_unfinished`).
    queue: list[Job] = field(default_factory=list)
    reported: int = 0
    taken: set[int] = field(default_factory=set)
    ended: bool = False
    #: kernels already looked at, at their first signature only: a plan binds a kernel
    #: once per layer, with arrays of the same types, and typing the arguments of
    #: every bind (numba's typeof, array by array) would cost a warm launch a visible
    #: share of its time. A kernel
    #: that later meets another signature compiles it here, as without this module.
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    #: kernels this process's plans call, in the order bound, with the numba types of
    #: their first arguments (:meth:`will_call`): what it compiles while it waits for
    #: the child
    later: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)
    #: the origins :attr:`later` has had, in the order bound (a plan binds a kernel once
    #: per layer: a few kernels)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    child: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    def want(self, kernel: Any, *args: Any, rank: int = 0) -> None:
        """Ask for ``kernel(*args)`` ahead, if numba has neither compiled nor cached it;
        the child compiles lower ``rank`` first (what this process will need first)."""
        origin = origin_of(kernel)
        if origin is None or origin in self.seen:
            return
        self.seen.add(origin)
        sig = tuple(kernel.typeof_pyval(a) for a in args)
        from .compiled import is_cached

        if sig in kernel.overloads or is_cached(kernel, sig):
            return
        self.jobs[Job(origin, sig, rank)] = None

    def want_job(self, job: Any, rank: int) -> None:
        """Ask for a job function of the spinning helpers (:mod:`.pool`) ahead, if the
        disk cache lacks it: made by the child for the next plan, or the next run,
        while this one runs its steps as numba regions (compiled here, the products'
        and attention's jobs would make SmolLM2's first run on two threads take about
        twice as long)."""
        origin = origin_of(job)
        if origin is None or origin in self.seen:
            return
        self.seen.add(origin)
        from .compiled import job_cached

        if not job_cached(job):
            self.jobs[Job(origin, (), rank)] = None

    def will_call(self, kernel: Any, *args: Any) -> None:
        """A bound step of this process calls ``kernel(*args)``: noted, at the kernel's
        first bind, so that a wait for the child can compile it meanwhile
        (:meth:`wait_for`); only while there is a child to wait for (kernels wanted or
        handed), so a warm launch types nothing here. The types are kept, not the
        arrays: a plan's arrays must not outlive it (kept, they held a closed model's
        repacked weights and compute buffers in memory for the rest of the process)."""
        if not self.jobs and not self.running():
            return
        origin = origin_of(kernel)
        if origin is None or origin in self.calls:
            return
        self.calls.append(origin)
        self.later.append((kernel, tuple(kernel.typeof_pyval(a) for a in args)))

    def keep(self, kernel: Any) -> None:
        """``kernel`` is compiled here: a step already bound calls it (a kernel not yet
        handed to the child is not handed; one handed is waited for)."""
        origin = origin_of(kernel)
        if origin is None:
            return
        self.seen.add(origin)
        self.jobs = {job: None for job in self.jobs if job.origin != origin}

    def start(self) -> None:
        """Hand the wanted kernels to a child, unless one is still compiling (they wait
        for the next plan's call then)."""
        if not self.jobs or self.running():
            return
        jobs, self.jobs = sorted(self.jobs, key=lambda job: job.rank), {}
        payload = pickle.dumps((instruction_forms(), jobs))
        try:
            # its own session: a Ctrl-C at the terminal is this process's to handle; the
            # child prints nothing a user would see, and outlives this process if it must
            # (what it compiles is the next run's: a child killed at a short run's exit
            # would leave that run's one-thread kernels to compile in the next, seconds of
            # its start)
            child = subprocess.Popen(
                [sys.executable, "-m", CHILD],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
            assert child.stdin is not None
            child.stdin.write(payload)
            child.stdin.close()
        except OSError as e:  # no process to spare: this one compiles them all
            _log.debug("could not start the compile-ahead process: %s", e)
            return
        self.child, self.started = child, time.monotonic()
        self.queue, self.reported, self.taken, self.ended = jobs, 0, set(), False
        _log.debug("compiling %d kernels ahead in process %d", len(jobs), child.pid)

    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def finish(self) -> None:
        """Return once every kernel wanted so far is compiled by a child (those still
        waiting handed over as the last child ends), or a child has failed."""
        while True:
            if self.child is not None:
                self.child.wait()
            if not self.jobs:
                return
            self.start()
            if self.child is None or self.child.returncode is not None:
                return  # no process to spare: the steps compile their own kernels

    def hand_over(self) -> None:
        """At exit: the kernels still wanted go to a child of their own, even while the
        last child compiles (it goes on alone). This process binds no plan again to hand
        them over at, and a short run's would otherwise never be compiled: its plan's
        programs' jobs (:mod:`.program`), wanted while the child compiles the kernels the
        steps call, would be wanted again by the next run, again too late, and so on."""
        if self.jobs and self.running():
            self.child = None
        self.start()

    def wait_for(self, kernel: Any) -> None:
        """Before ``kernel`` is first called: if the child has it, wait until the child
        says it is done with it (it is then in the disk cache), or has ended. Meanwhile
        this process compiles the kernels its plans call later (:meth:`will_call`) that
        neither it nor the child has yet: SmolLM2's first run on two threads waits for
        the attention kernels about as long as its output product's driver takes to
        compile, so it compiles that driver meanwhile rather than after the wait; then
        the child's jobs it calls that the child has not started (:meth:`_take_back`)."""
        origin, child = origin_of(kernel), self.child
        if origin is None or child is None or child.stdout is None:
            return
        while self._unfinished(origin):
            if time.monotonic() - self.started > WAIT_S:
                self.close()
                break
            if not self.has(kernel):  # said so meanwhile (or ended)
                break
            if self._compile_one_later() or self._take_back(origin):
                continue
            if not self._heard(child.stdout.readline()):
                break

    def _take_back(self, origin: tuple[Any, ...]) -> bool:
        """Compile here, rather than wait idle, a job the child has not started that this
        process's plans call: the awaited kernel itself, else the one they call first
        (:attr:`calls`). The child skips a job whose kernel the disk cache has by the
        time it gets there. False when there is none (the child's other jobs are for
        later plans or runs: one of them compiled here could outlast the wait). Without
        it, Gemma 3's first run on one thread would wait seconds, idle, for the attention
        job and two product drivers queued behind it."""
        busy = self.reported  # the job the child is compiling (it reports in order)
        first = {self.queue[i].origin: i for i in range(len(self.queue) - 1, busy, -1)
                 if i not in self.taken}  # fmt: skip
        for wanted in (origin, *self.calls):
            i = first.get(wanted)
            if i is None:
                continue
            job = self.queue[i]
            compile_kernel(compile_target(self.resolve, job.origin), job.signature)
            self.taken.add(i)
            return True
        return False

    def _compile_one_later(self) -> bool:
        """Compile (or load from the disk cache) the next kernel of :attr:`later` that
        this process lacks and the child was not handed; False when none is left."""
        while self.later:
            kernel, sig = self.later.pop(0)
            origin = origin_of(kernel)
            if origin is None or self._unfinished(origin):  # the child's: wait for it instead
                continue
            if sig in kernel.overloads:
                continue
            compile_kernel(kernel, sig)
            return True
        return False

    def has(self, kernel: Any) -> bool:
        """Whether the child has still to finish ``kernel``: what it has said so far is
        read without waiting (where the OS can poll a pipe; elsewhere a kernel handed
        to it counts as unfinished until :meth:`wait_for`)."""
        origin = origin_of(kernel)
        if origin is None or not self._unfinished(origin):
            return False
        child = self.child
        if child is not None and child.stdout is not None and os.name == "posix":
            try:
                while self._unfinished(origin) and select.select([child.stdout], [], [], 0)[0]:
                    if not self._heard(child.stdout.readline()):
                        break
            except (OSError, ValueError):  # a pipe that cannot be polled: as unfinished
                pass
        return self._unfinished(origin)

    def _unfinished(self, origin: tuple[Any, ...]) -> bool:
        """Whether the child has a job of ``origin`` it has not said it finished, and
        this process has not taken back (none once it has ended)."""
        if self.ended:
            return False
        queue, taken = self.queue, self.taken
        return any(queue[i].origin == origin for i in range(self.reported, len(queue))
                   if i not in taken)  # fmt: skip

    def _heard(self, line: bytes) -> bool:
        """Take one line the child said, ``"<job index>\\n"`` per finished job; False
        when it has ended (an empty line: whatever it did not finish is compiled here)."""
        if not line:
            self.ended = True
            return False
        self.reported = int(line) + 1
        return True

    def close(self) -> None:
        """End the child, if it still runs."""
        if self.running():
            assert self.child is not None
            self.child.kill()
            self.child.wait()


def enabled() -> bool:
    """Whether kernels may be compiled ahead (``TENSORPLUG_CPU_COMPILE_AHEAD``)."""
    return bool(COMPILE_AHEAD.get()) and not numba_jit_disabled()

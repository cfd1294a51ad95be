"""A first run's kernels compiled by a second process (``tensorplug_cpu.kernels.ahead``;
the child is ``ahead_child``): what it compiles lands in numba's disk cache, so this
process loads it instead of compiling it, and a child that fails costs only its wait."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("numba")

import numpy as np

from tensorplug.settings import SettingError
from tensorplug.types import Type
from tensorplug_cpu.kernels import _numba_rows as rows
from tensorplug_cpu.kernels import ahead
from tensorplug_cpu.kernels._numba_attention import visible_columns
from tensorplug_cpu.kernels._numba_repack import packed_kernels
from tensorplug_cpu.kernels.kernel_refs import resolve

# in a fresh process with an empty cache (numba reads NUMBA_CACHE_DIR when imported)
_CHILD_COMPILES = """
import numpy as np
from numba.core import event
from tensorplug_cpu.kernels import _numba_rows as rows
from tensorplug_cpu.kernels._numba_attention import visible_columns
from tensorplug_cpu.kernels.compiled import is_cached
from tensorplug_cpu.kernels.ahead import Ahead, Job
from tensorplug_cpu.kernels.kernel_refs import resolve
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

mask = np.zeros((1, 1, 4, 16), np.float32)
mask[0, 0, :, 9:] = -np.inf
x = np.linspace(-1, 1, 3 * 32, dtype=np.float32).reshape(3, 32)
out = np.empty_like(x)
a = Ahead(resolve)
a.want(visible_columns, mask, table)
a.want(rows.rms_norm_rows, x, out, 1e-5)
{extra}
a.start()
a.wait_for(visible_columns)
a.wait_for(rows.rms_norm_rows)
sig = tuple(visible_columns.typeof_pyval(v) for v in (mask, table))
print("cached", is_cached(visible_columns, sig))


class Compiles(event.Listener):
    n = 0

    def on_start(self, ev):
        Compiles.n += 1

    def on_end(self, ev):
        pass


with event.install_listener("numba:compile", Compiles()):
    seen = visible_columns(mask, table)
    rows.rms_norm_rows(x, out, 1e-5)
print("seen", seen, "compiled", Compiles.n > 0)
expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-5)
print("rms", bool(np.allclose(out, expected, rtol=1e-5)))
"""


def _run(tmp_path: Path, extra: str = "") -> list[str]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    code = textwrap.dedent(_CHILD_COMPILES).format(extra=extra)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("\n")


def test_what_the_child_compiles_is_loaded_here_not_compiled(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out[:3] == ["cached True", "seen 9 compiled False", "rms True"]


def test_a_child_that_fails_leaves_the_kernels_to_this_process(tmp_path: Path) -> None:
    """Its first job cannot be made (an origin no process knows): the child dies before
    finishing any, and the waits return; this process compiles both kernels itself,
    the first while it waits (taken back from the child's queue: in the disk cache
    before its call), the other then or at its call (whether the child has died by
    then is a race)."""
    bad = "a.jobs = {Job(('module', 'no.such.module', 'k'), (), -1): None, **a.jobs}"
    out = _run(tmp_path, bad)
    assert out[0] == "cached True" and out[1].startswith("seen 9 compiled") and out[2] == "rms True"


_HANDED_AT_EXIT = """
import numpy as np
from tensorplug_cpu.kernels import _numba_rows as rows
from tensorplug_cpu.kernels._numba_attention import visible_columns
from tensorplug_cpu.kernels.compiled import is_cached
from tensorplug_cpu.kernels.ahead import Ahead
from tensorplug_cpu.kernels.kernel_refs import resolve
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

mask = np.zeros((1, 1, 4, 16), np.float32)
x = np.ones((3, 32), np.float32)
a = Ahead(resolve)
a.want(visible_columns, mask, table)
a.start()
a.want(rows.rms_norm_rows, x, x, 1e-5)  # while the child compiles: kept for later
print("pending", len(a.jobs), a.running())
a.hand_over()  # at exit (the CPU's kernels register it): a child of its own
print("pending", len(a.jobs))
assert a.child is not None
a.child.wait(timeout=300)
sig = tuple(rows.rms_norm_rows.typeof_pyval(v) for v in (x, x, 1e-5))
print("cached", is_cached(rows.rms_norm_rows, sig))
"""


def test_what_is_wanted_while_the_child_compiles_is_handed_over_at_exit(tmp_path: Path) -> None:
    """A short run binds no plan after its first: what its plan wanted while the child
    was busy (the programs' jobs) goes to a child of its own at exit, or no run would
    ever have it (each wanted it again while its own child was busy)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", _HANDED_AT_EXIT], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:3] == ["pending 1 True", "pending 0", "cached True"]


def test_a_driver_and_a_module_kernel_are_found_again_by_their_origin() -> None:
    drivers = packed_kernels(frozenset({Type.Q4_1}))
    for kernel in (drivers.serial, drivers.siblings, visible_columns):
        origin = ahead.origin_of(kernel)
        assert origin is not None and resolve(origin) is kernel
    assert ahead.origin_of(len) is None


def test_the_setting_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORPLUG_CPU_COMPILE_AHEAD", "0")
    assert not ahead.enabled()
    monkeypatch.setenv("TENSORPLUG_CPU_COMPILE_AHEAD", "1")
    assert ahead.enabled()
    monkeypatch.setenv("TENSORPLUG_CPU_COMPILE_AHEAD", "maybe")
    with pytest.raises(SettingError, match="TENSORPLUG_CPU_COMPILE_AHEAD"):
        ahead.enabled()


_HAS = """
import numpy as np
from tensorplug_cpu.kernels import _numba_rows as rows
from tensorplug_cpu.kernels._numba_attention import visible_columns
from tensorplug_cpu.kernels import ahead
from tensorplug_cpu.kernels.ahead import Ahead
from tensorplug_cpu.kernels.kernel_refs import resolve
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

mask = np.zeros((1, 1, 4, 16), np.float32)
x = np.ones((3, 32), np.float32)
a = Ahead(resolve)
a.want(visible_columns, mask, table)
a.want(rows.rms_norm_rows, x, np.empty_like(x), 1e-5)
a.start()
print("compiling", a.has(visible_columns), a.has(rows.rms_norm_rows))
a.wait_for(rows.rms_norm_rows)  # not started by the child: taken back, compiled here
print("taken", a.has(rows.rms_norm_rows), sorted(a.taken))
a.wait_for(visible_columns)
print("done", a.has(visible_columns), a.has(rows.rms_norm_rows), a.has(rows.set_rows))
a.child.wait()  # it skips the job taken back: the cache has it (ahead.cached)
sig = tuple(rows.rms_norm_rows.typeof_pyval(v) for v in (x, x, 1e-5))
print("child", a.child.returncode, a.child.stdout.read().decode().split(),
      ahead.cached(rows.rms_norm_rows, sig))
"""


def test_whether_the_child_still_has_a_kernel_is_asked_without_waiting(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_HAS)], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[0] == "compiling True True"  # a compile takes seconds; asking, none
    assert lines[1] == "taken False [1]"
    assert lines[2] == "done False False False"
    assert lines[3] == "child 0 ['1'] True"  # job 0 was heard by the wait; job 1 skipped


class _Child:
    """An :class:`~tensorplug_cpu.kernels.ahead.Ahead` stand-in: which kernels it still has."""

    def __init__(self, *unfinished: object) -> None:
        self.unfinished = set(unfinished)

    def has(self, kernel: object) -> bool:
        return kernel in self.unfinished


def test_one_thread_runs_the_parallel_kernel_while_the_child_compiles_the_serial_one() -> None:
    """A first run's one-thread step (the thread governor's warm-up) ran the one-thread
    kernels, and so waited seconds for the child compiling them; the parallel kernels
    it already has give the same bits on one thread."""
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    assert jit is not None
    serial, parallel = object(), "a parallel kernel"
    saved = jit.ahead, set(jit.called), set(jit.serial_ok)
    try:
        child = _Child(serial)
        jit.ahead = child  # type: ignore[assignment]
        assert jit.serial_ready(serial, parallel)  # the parallel one has not run: wait
        jit.serial_ok.discard(serial)
        jit.called.add(parallel)
        assert not jit.serial_ready(serial, parallel)  # the child has it: parallel
        assert not jit.serial_ready(serial, parallel)
        child.unfinished.clear()  # the child is done
        assert jit.serial_ready(serial, parallel)
        child.unfinished.add(serial)
        assert jit.serial_ready(serial, parallel)  # once free, always
        jit.ahead = None
        other = object()
        assert jit.serial_ready(other, parallel)  # no child: the serial kernel
    finally:
        jit.ahead, jit.called, jit.serial_ok = saved


def test_a_kernel_kept_here_is_not_handed_to_the_child() -> None:
    """A plan that calls a kernel itself (a prompt's activation quantizer) keeps it
    from the child, even where a later step of the plan asked for it ahead: this
    process would otherwise wait for the child at its first product."""
    a = ahead.Ahead(resolve)
    x = np.ones((3, 32), np.float32)
    a.want(rows.rms_norm_rows, x, np.empty_like(x), 1e-5)
    a.keep(rows.rms_norm_rows)
    assert not a.jobs
    a.want(rows.rms_norm_rows, x, np.empty_like(x), 1e-5)
    assert not a.jobs


class _Wants:
    """An Ahead stand-in that records what is asked of it."""

    def __init__(self) -> None:
        self.wanted: list[tuple[object, int]] = []
        self.jobs: list[tuple[object, int]] = []
        self.kept: list[object] = []

    def want(self, kernel: object, *args: object, rank: int = 0) -> None:
        self.wanted.append((kernel, rank))

    def want_job(self, job: object, rank: int) -> None:
        self.jobs.append((job, rank))

    def keep(self, kernel: object) -> None:
        self.kept.append(kernel)

    def will_call(self, kernel: object, *args: object) -> None:
        pass


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_tok", [1, 24, 128])
def test_what_goes_ahead_is_what_this_many_threads_needs_later(
    threads: int, n_tok: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On one thread the one-thread product runs first (compiled here, not handed over);
    on two, the parallel ones, with the one-thread kernels after. The one-thread
    attention goes ahead first at either count (it compiles sooner, and runs on two
    threads until the parallel one is done). A prompt's activation quantizer is kept here; a token
    plan's asks for it ahead, for a later prompt. On one thread of a process that may run
    more, the multi-thread product goes ahead last, for a later run on more threads
    (which compiled it before its first token: 20 s for a 100M Q5_K model)."""
    from tensorplug_cpu.kernels import _numba_repack as repack
    from tensorplug_cpu.kernels import compiled
    from tensorplug_cpu.kernels.jit import JitKernels, load_jit
    from tensorplug_cpu.kernels.jit_calls import MORE_THREADS_RANK, ONE_THREAD_RANK
    from tensorplug_cpu.kernels.job_blocks import QUANTIZE_APART_ROWS
    from tensorplug_cpu.kernels.kernel_identity import origin_of
    from tensorplug_cpu.kernels.kernel_refs import KernelRef, kernel_ref
    from tensorplug_cpu.repack import LAYOUTS

    jit = load_jit()
    assert jit is not None
    packed = np.zeros((1, 2 * LAYOUTS[Type.Q4_0].block), np.uint8)  # 8 rows of 64: bound only
    x = np.ones((n_tok, 64), np.float32)
    monkeypatch.setattr(JitKernels, "max_threads", property(lambda self: 2))
    # as on a first run: nothing kept, nothing in numba's disk cache (else not wanted)
    monkeypatch.setattr(KernelRef, "kept", lambda self, args: False)
    monkeypatch.setattr(compiled, "is_cached", lambda dispatcher, sig: False)
    saved = jit.ahead, jit.n_threads
    try:
        jit.ahead = recorder = _Wants()  # type: ignore[assignment]
        jit.n_threads = threads
        jit.bind_packed(Type.Q4_0, packed, x, np.empty((n_tok, 8), np.float32))
        jit.bind_matvec_float(np.ones((8, 64), np.float32), x, np.empty((n_tok, 8), np.float32))
        q = np.ones((1, 4, n_tok, 64), np.float32)
        kv = np.ones((1, 2, 32, 64), np.float32)
        no_mask, out = np.zeros((0, 0, 0, 0), np.float32), np.empty((1, n_tok, 4, 64), np.float32)
        jit.want_attend_ahead(q, kv, kv, no_mask, np.zeros(0, np.int32), out)
    finally:
        jit.ahead, jit.n_threads = saved

    def ref(dispatcher: object) -> KernelRef:
        origin = origin_of(dispatcher)
        assert origin is not None
        return kernel_ref(origin)

    serial, siblings = (ref(d) for d in repack.packed_kernels(frozenset({Type.Q4_0})))
    quantize_rows = ref(repack.quantize_rows)
    wanted = dict(recorder.wanted)
    assert (serial in wanted) == (threads > 1)
    # the multi-thread driver: this run's own on two threads (compiled here), a later
    # run's on one, after everything this one calls
    assert wanted.get(siblings) == (MORE_THREADS_RANK if threads == 1 else None)
    # every product's kernels of the other count alike (the float one's too)
    assert wanted.get(jit._fmatvec_serial) == (ONE_THREAD_RANK if threads > 1 else None)
    assert wanted.get(jit._fmatvec) == (MORE_THREADS_RANK if threads == 1 else None)
    later_runs = {siblings, jit._fmatvec}
    assert max(rank for kernel, rank in recorder.wanted if kernel not in later_runs) \
        < MORE_THREADS_RANK  # fmt: skip
    names = [(rank, str((origin_of(kernel) or ("",))[-1])) for kernel, rank in recorder.wanted]
    attention = sorted((rank, name) for rank, name in names if name.startswith("attend"))
    assert [name for _, name in attention] == ["attend_serial", "attend"]  # the sooner one
    assert (quantize_rows in recorder.kept) == (n_tok >= QUANTIZE_APART_ROWS)
    assert (quantize_rows in wanted) == (n_tok < QUANTIZE_APART_ROWS)
    # a spinning helpers' job the disk cache lacks goes after every kernel a step calls
    this_run = [rank for rank in wanted.values() if rank < MORE_THREADS_RANK]
    assert all(max(this_run) < rank < MORE_THREADS_RANK for _, rank in recorder.jobs)


def test_an_f16_cache_s_attention_job_goes_ahead_first_and_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An F16 cache's attention runs one job function at every thread count: where the
    disk cache lacks it, it is handed to the second process before any kernel (a
    layer's attention comes after its first products), and the step's first call
    waits for the child, then loads it; later calls neither wait nor load."""
    from tensorplug_cpu.kernels import jit as jit_module

    jit = jit_module.load_jit()
    assert jit is not None
    events: list[str] = []

    class Uncompiled:
        """A job that neither kept code nor numba's cache has (a JobRef's interface)."""

        tensorplug_origin = ("made_job", "tensorplug_cpu.kernels._numba_attention", "attend_job")
        address = 0

        def load_kept(self) -> bool:
            return False

        def ready(self) -> bool:
            return self.address != 0

        def job(self) -> Uncompiled:
            return self

        def compile(self) -> None:
            events.append("compiled")
            self.address = 1234

    class Child(_Wants):
        def wait_for(self, kernel: object) -> None:
            events.append("waited")

    job, child = Uncompiled(), Child()
    monkeypatch.setattr(jit, "ahead", child)
    monkeypatch.setattr(jit, "_attend_job", job)
    monkeypatch.setattr(jit, "n_threads", 1)
    monkeypatch.setattr(jit, "call", lambda what, kernel, *args: events.append(f"ran {args[0]}"))
    q, out = np.ones((1, 2, 1, 64), np.float32), np.empty((1, 1, 2, 64), np.float32)
    halves = np.ones((1, 1, 8, 64), np.uint16)
    mask = np.zeros((1, 1, 1, 8), np.uint16)
    step = jit.bind_attend(q, halves, halves, mask, mask, np.zeros(0, np.int32), 0.125, 0.0, 64,
                           out)  # fmt: skip
    assert child.jobs == [(job, -1)] and not child.wanted  # no attention kernel wanted
    assert events == []
    step()
    step()
    assert events == ["waited", "compiled", "ran 1234", "ran 1234"]


def test_a_kernel_a_plan_first_calls_after_its_attention_goes_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This process compiles kernels in the order a plan's steps call them; the second
    one takes those first called after the plan's first attention (a layer's later
    products, the output product), once each, right after the attention job (rank 0).
    A kernel the plan called before its attention stays here; a new plan starts afresh."""
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    assert jit is not None
    recorder = _Wants()
    monkeypatch.setattr(jit, "ahead", recorder)
    monkeypatch.setattr(jit, "_plan_kernels", set())
    monkeypatch.setattr(jit, "attention_bound", False)
    before, after = (lambda *a: None), (lambda *a: None)
    jit.will_call(partial(jit.call, "before", before, 1))
    q, out = np.ones((1, 2, 1, 64), np.float32), np.empty((1, 1, 2, 64), np.float32)
    kv, mask = np.ones((1, 1, 8, 64), np.float32), np.zeros((1, 1, 1, 8), np.float32)
    jit.bind_attend(q, kv, kv, mask, mask, np.zeros(0, np.int32), 0.125, 0.0, 64, out)
    recorder.wanted.clear()  # the F32 cache's attention kernels
    for kernel in (before, after, after):
        jit.will_call(partial(jit.call, "a product", kernel, 2))
    assert recorder.wanted == [(after, 0)]
    monkeypatch.setattr(jit, "ahead", None)
    jit.compile_ahead()  # the plan is bound
    assert not jit.attention_bound and not jit._plan_kernels


class _Pending:
    """A compile-ahead stand-in whose child has ``pending`` still to finish."""

    def __init__(self, pending: object) -> None:
        self.pending = pending

    def has(self, kernel: object) -> bool:
        return kernel is self.pending

    def wait_for(self, kernel: object) -> None:
        pass


def test_a_first_run_on_two_threads_runs_the_one_thread_attention_until_the_parallel_is_done() -> (
    None
):
    """While the second process compiles the parallel attention kernel, a step on two
    threads runs the one-thread kernel (the same bits), which went ahead first; once
    the parallel one is done, that one."""
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    assert jit is not None
    ran: list[str] = []

    def parallel(*args: object) -> None:
        ran.append("parallel")

    def serial(*args: object) -> None:
        ran.append("serial")

    saved = jit.ahead, jit.n_threads, jit._attend, jit._attend_serial, set(jit.called)
    q = np.ones((1, 2, 1, 64), np.float32)
    kv = np.ones((1, 1, 8, 64), np.float32)
    args = (q, kv, kv, np.zeros((0, 0, 0, 0), np.float32), np.zeros(0, np.int32), 8, 1.0, 0.0,
            64, np.empty((1, 1, 2, 64), np.float32))  # fmt: skip
    try:
        jit._attend, jit._attend_serial, jit.n_threads = parallel, serial, 2  # type: ignore[assignment]
        jit.called.discard("flash attention kernel")
        jit.ahead = _Pending(parallel)  # type: ignore[assignment]
        jit.attend(*args)
        jit.ahead = _Pending(None)  # type: ignore[assignment]  # the child is done
        jit.attend(*args)
        jit.attend(*args)
    finally:
        jit.ahead, jit.n_threads, jit._attend, jit._attend_serial, jit.called = saved
    assert ran == ["serial", "parallel", "parallel"]


_LATER = """
import numpy as np
from tensorplug_cpu.kernels import _numba_rows as rows
from tensorplug_cpu.kernels._numba_attention import visible_columns
from tensorplug_cpu.kernels.ahead import Ahead, Job, origin_of
from tensorplug_cpu.kernels.kernel_refs import resolve
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

x = np.ones((3, 32), np.float32)
mask = np.zeros((1, 1, 4, 16), np.float32)
a = Ahead(resolve)
a.will_call(rows.rms_norm_rows, x, np.empty_like(x), 1e-5)
print(len(a.later))  # nothing wanted ahead, no child: nothing to do while waiting
a.want(visible_columns, mask, table)
a.will_call(visible_columns, mask, table)
a.will_call(rows.rms_norm_rows, x, np.empty_like(x), 1e-5)
a.will_call(rows.rms_norm_rows, x[:, :16], np.empty_like(x[:, :16]), 1e-5)  # seen: once
a.queue = [Job(origin_of(visible_columns), ())]  # the child's, unfinished: not compiled here
print(any(isinstance(v, np.ndarray) for _, sig in a.later for v in sig))  # types, not arrays
print(a._compile_one_later(), len(visible_columns.signatures), len(rows.rms_norm_rows.signatures))
print(a._compile_one_later())
"""


def test_a_wait_for_the_child_compiles_what_this_process_calls_later(tmp_path: Path) -> None:
    """While this process waits for the child, it compiles the kernels its bound steps
    call later, in their order, except those the child has: once each, and only once
    there is a child to wait for (a fresh process with an empty cache, so that nothing
    is compiled already)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_LATER)], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:4] == ["0", "False", "True 0 1", "False"]

"""The thread governor: which count it runs generation steps at, given their times.

Step times are made up by a model of the machine (seconds per step at each count), so
every decision is deterministic; the runner's wiring is checked on the tiny model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorplug as tp
from tensorplug.errors import RunError
from tensorplug_llm.placement import Placement
from tensorplug_llm.runner import ModelRunner
from tensorplug_llm.threads import ThreadGovernor, thread_counts
from tensorplug_llm.tiny import write_tiny_llama


class Machine:
    """Step times by thread count; records every count the governor applies."""

    def __init__(self, seconds: dict[int, float]) -> None:
        self.seconds = seconds
        self.applied: list[int] = []

    def apply(self, n: int) -> None:
        self.applied.append(n)

    def run(self, governor: ThreadGovernor, steps: int) -> list[int]:
        """The count each of ``steps`` steps ran at."""
        counts = []
        for _ in range(steps):
            n = self.applied[-1]
            counts.append(n)
            governor.step_done(self.seconds[n])
        return counts


def test_thread_counts_halve_down_to_one() -> None:
    assert thread_counts(16) == [16, 8, 4, 2, 1]
    assert thread_counts(6) == [6, 3, 1]
    assert thread_counts(1) == [1]


def test_an_idle_machine_keeps_every_core_and_explores_ever_more_rarely() -> None:
    machine = Machine({2: 1.0, 1: 1.6})
    governor = ThreadGovernor(machine.apply, 2)
    counts = machine.run(governor, 600)
    assert governor.current == 2 and governor.switches == 0
    # trials after 3 steps, then waits of 16, 32, 64, ... steps: a handful in 600
    assert 4 <= governor.explorations <= 7
    assert counts.count(1) == 4 * governor.explorations  # a settling step + 3 timed ones
    assert counts[-200:].count(1) <= 4  # late on, at most one trial


def test_a_busy_machine_moves_to_one_thread_within_a_few_steps() -> None:
    machine = Machine({2: 6.0, 1: 1.5})  # two busy processes: both threads wait
    governor = ThreadGovernor(machine.apply, 2)
    counts = machine.run(governor, 200)
    # 1 settling + 3 timed steps on two threads, 1 settling + 1 on one: 4x faster says enough
    assert counts[:6] == [2, 2, 2, 2, 1, 1] and counts[6:12] == [1] * 6
    assert governor.current == 1 and governor.switches == 1
    # trying two threads again costs 2 steps (settling, one 4x slower), ever more rarely
    assert counts[6:].count(2) == 2 * governor.explorations - 2
    assert counts[-100:].count(2) <= 2


def test_the_load_going_away_brings_the_cores_back() -> None:
    machine = Machine({2: 6.0, 1: 1.5})
    governor = ThreadGovernor(machine.apply, 2)
    machine.run(governor, 60)
    assert governor.current == 1
    machine.seconds = {2: 1.0, 1: 1.5}  # the other processes ended
    machine.run(governor, 200)
    assert governor.current == 2 and governor.switches == 2


@pytest.mark.parametrize("paused", [True, False])
def test_steps_after_a_prompt_batch_are_not_held_against_the_thread_count(paused: bool) -> None:
    machine = Machine({2: 0.010, 1: 0.016})
    governor = ThreadGovernor(machine.apply, 2)
    if paused:
        governor.pause(0.15)  # the runner, after a prompt batch
    spun = 0.0
    while spun < 0.15:  # BLAS's threads still spin: steps on two threads are slow
        n = machine.applied[-1]
        step = 0.05 if n == 2 else machine.seconds[n]
        governor.step_done(step)
        spun += step
    machine.run(governor, 100)
    assert governor.switches == (0 if paused else 2)  # unpaused: off to 1 thread and back
    assert governor.current == 2


def test_a_difference_within_the_margin_changes_nothing() -> None:
    machine = Machine({2: 1.0, 1: 0.92})
    governor = ThreadGovernor(machine.apply, 2)  # 10%
    machine.run(governor, 300)
    assert governor.current == 2 and governor.switches == 0


def test_many_cores_walk_down_and_back_one_halving_at_a_time() -> None:
    machine = Machine({8: 4.0, 4: 2.0, 2: 1.0, 1: 1.2})
    governor = ThreadGovernor(machine.apply, 8)
    machine.run(governor, 400)
    assert governor.current == 2  # 8 -> 4 -> 2; 1 is tried and loses
    assert set(machine.applied) == {8, 4, 2, 1}


def test_one_core_never_explores() -> None:
    machine = Machine({1: 1.0})
    governor = ThreadGovernor(machine.apply, 1)
    machine.run(governor, 50)
    assert machine.applied == [1] and governor.explorations == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="first_wait >= window"):
        ThreadGovernor(lambda n: None, 2, window=4, first_wait=2)
    with pytest.raises(ValueError, match="abandon > 1"):  # every trial would end at once
        ThreadGovernor(lambda n: None, 2, abandon=1.0)


# -- the runner ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("governor") / "tiny.gguf"
    write_tiny_llama(path, "f32", seed=3)
    return path


def _cpu_model(path: Path, **kwargs: object) -> ModelRunner:
    placement = Placement.on(tp.registry.dev_by_name("CPU"), 2)  # type: ignore[arg-type]
    return ModelRunner(path, placement=placement, n_ctx=64, **kwargs)  # type: ignore[arg-type]


def _threads_seen(model: ModelRunner) -> Callable[[], list[int]]:
    seen: list[int] = []
    for i, (backend, setter) in enumerate(model._thread_setters):

        def record(be: object, n: int, setter: Callable[..., None] = setter) -> None:
            seen.append(n)
            setter(be, n)

        model._thread_setters[i] = (backend, record)
    return lambda: seen


def test_the_runner_governs_generation_steps_unless_threads_are_fixed(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tensorplug_llm.runner.available_cores", lambda: 2)
    monkeypatch.setattr("tensorplug_llm.runner.AFTER_BATCH_SECONDS", 0.0)  # tiny steps
    with _cpu_model(tiny) as model:
        assert model.governor is not None and model.governor.counts == [2, 1]
        seen = _threads_seen(model)
        model.generate([1, 2, 3], 20)
        # after the prompt, 1 step untimed, 3 timed on two threads, then a trial on one
        assert 1 in seen()
        assert model.governor.explorations >= 1
        model.set_n_threads(1)
        assert model.governor is None
    with _cpu_model(tiny, n_threads=1) as fixed:
        assert fixed.governor is None
        seen = _threads_seen(fixed)
        fixed.generate([1, 2, 3], 20)
        assert seen() == []  # nothing changes a fixed count


def test_a_bad_thread_count_is_refused(tiny: Path) -> None:
    with _cpu_model(tiny) as model, pytest.raises(RunError, match="n_threads"):
        model.set_n_threads(0)


def test_prompts_run_on_every_core_whatever_the_governor_chose(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend may round differently at another thread count (BLAS's own threading
    does): a prompt's numbers must not depend on how busy the machine was when the
    governor last chose."""
    monkeypatch.setattr("tensorplug_llm.runner.available_cores", lambda: 2)
    with _cpu_model(tiny) as model:
        assert model.governor is not None
        model.governor.current = model.governor.applied = 1  # as after a busy spell
        model._apply_threads(1)
        seen = _threads_seen(model)
        model.eval([1, 2, 3, 4])
        model.eval([5])
        assert seen() == [2, 1]  # the prompt on both cores, the generation step on one


def test_a_prompt_in_the_middle_of_a_trial_drops_it() -> None:
    machine = Machine({2: 1.0, 1: 1.6})
    governor = ThreadGovernor(machine.apply, 2)
    machine.run(governor, 5)  # 1 settling + 3 timed on two threads, then the trial's first
    assert machine.applied[-1] == 1 and governor.explorations == 1
    governor.pause(0.0)  # a chat turn's prompt
    assert machine.applied[-1] == 2 and governor.applied == 2
    machine.run(governor, 200)  # and it carries on: the trial is run again, and loses
    assert governor.current == 2 and governor.switches == 0 and governor.explorations >= 2


def test_the_warm_up_runs_a_token_step_at_every_count_the_governor_may_choose(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend may run other kernels at another thread count (the CPU's serial
    mat×vec at one); their first load must be loading time, not the first trial's."""
    monkeypatch.setattr("tensorplug_llm.runner.available_cores", lambda: 2)
    applied: list[int] = []
    real = ModelRunner._apply_threads

    def record(self: ModelRunner, n: int) -> None:
        applied.append(n)
        real(self, n)

    monkeypatch.setattr(ModelRunner, "_apply_threads", record)
    with _cpu_model(tiny) as model:
        # the governor starts on every core; the warm-up's token steps run on one thread,
        # then every core, where the governor starts (it may ask for it again)
        one = applied.index(1)
        assert set(applied[:one]) == {2} and set(applied[one + 1 :]) == {2}
        assert model.governor is not None and model.governor.applied == 2
        assert model.n_past == 0 and model.timings.gen_tokens == 0  # all forgotten
    applied.clear()
    with _cpu_model(tiny, n_threads=1):
        assert applied == [1]  # a fixed count: nothing else is run


def test_a_warm_up_after_loading_runs_each_count_and_is_no_governor_trial(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tensorplug run`` warms up once it knows its prompt (``ModelRunner.warm_up``), when
    the governor already exists: its token steps still run at every count, which the
    governor's own choice (applied at each token step) must not override, and the
    governor times none of them."""
    monkeypatch.setattr("tensorplug_llm.runner.available_cores", lambda: 2)
    ran: list[tuple[int, int | None]] = []  # (tokens, the thread count they ran at)
    real = ModelRunner.eval

    def record(self: ModelRunner, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, tokens, *args, **kwargs)
        ran.append((len(tokens), self._threads))
        return out

    monkeypatch.setattr(ModelRunner, "eval", record)
    with _cpu_model(tiny, warmup=False) as model:
        governor = model.governor
        assert governor is not None and ran == []
        model.warm_up(7)  # the prompt's step prepared (ModelRunner.prepare), the token's run
        assert {n for n, _ in ran} == {1} and (1, 1) in ran and ran[-1] == (1, 2)
        assert model.governor is governor and governor.applied == 2 and model.n_past == 0
        assert governor.explorations == 0 and governor.switches == 0

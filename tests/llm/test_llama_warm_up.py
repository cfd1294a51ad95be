"""The model's warm-up loads every kernel a prompt takes, whatever its length: the first
real prompt or token of a session waits for no kernel load (or compile). Each case runs
in a process of its own: kernels stay loaded for the whole process, so an earlier case's
prompts would hide what a warm-up missed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from plan_runs import kept_plans, record_runs

pytest.importorskip("numba")

from tensorplug_llm.runner import WARM_UP_STEPS
from tensorplug_llm.tiny import write_tiny_llama

#: loads a model (its warm-up), runs prompts of many lengths and a token after each, and
#: prints the CPU kernels whose compiled versions changed meanwhile (loaded or compiled)
_PROMPTS = """
import importlib, json, pkgutil, sys
from numba.core.registry import CPUDispatcher
from tensorplug_cpu import kernels
from tensorplug_cpu.kernels.numba_internals.kept_kernels import kept_loads
from tensorplug_llm.runner import ModelRunner

def versions():
    found = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.name.startswith("_numba_"):
            module = importlib.import_module(f"{kernels.__name__}.{info.name}")
            for name, value in vars(module).items():
                if isinstance(value, CPUDispatcher):
                    found[f"{info.name}.{name}"] = len(value.overloads)
    found["kept code"] = kept_loads()  # loaded without numba's overloads knowing
    return found

m = ModelRunner(sys.argv[1], n_ctx=64, n_batch=32, n_threads=int(sys.argv[2]))
before = versions()
for n in (2, 3, 5, 9, 16, 17, 32):
    m.reset()
    m.eval(list(range(1, n + 1)))
    m.eval([1])
after = versions()
print(json.dumps(sorted(k for k, v in after.items() if v != before.get(k))))
"""


@pytest.mark.parametrize("weight_type", ["f16", "q4_0", "iq4_nl"])
@pytest.mark.parametrize("threads", [1, 2])
def test_prompts_of_any_length_load_no_kernel_after_the_warm_up(
    tmp_path: Path, weight_type: str, threads: int
) -> None:
    assert max(WARM_UP_STEPS) > 16 and 1 in WARM_UP_STEPS  # a prompt step and a token step
    path = write_tiny_llama(tmp_path / "m.gguf", weight_type)
    done = subprocess.run(
        [sys.executable, "-c", _PROMPTS, str(path), str(threads)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_warm_up_for_the_prompts_length_builds_the_plan_that_prompt_runs_on(
    tmp_path: Path,
) -> None:
    """``tensorplug run`` knows its prompt before it warms up: the warm-up's prompt step
    is then that prompt's length, and the prompt builds no graph of its own."""
    from tensorplug_llm.runner import ModelRunner

    m = ModelRunner(write_tiny_llama(tmp_path / "m.gguf", "q4_0"), n_ctx=64, n_batch=32,
              n_threads=1, warmup=False)  # fmt: skip
    try:
        reserved = m.timings.graphs_built  # the largest steps', which size the buffers
        m.warm_up(7)
        built = m.timings.graphs_built
        assert built == reserved + 2 and m.timings.load_s > 0 and m.n_past == 0
        first = m.eval(list(range(1, 8)))
        assert m.timings.graphs_built == built  # the warm-up's step graph
        m.eval([1])
        assert m.timings.graphs_built == built
        m.reset()
        m.eval(list(range(1, 10)))  # a length not warmed up builds its own
        assert m.timings.graphs_built == built + 1
        m.reset()
        np.testing.assert_array_equal(m.eval(list(range(1, 8))), first)
    finally:
        m.close()


@pytest.mark.parametrize("n_prompt", [7, 30])
def test_the_prompts_step_is_prepared_not_computed(tmp_path: Path, n_prompt: int) -> None:
    """The warm-up computes no prompt-shaped step (that was a throw-away prompt, and for
    a long one the prompt's whole work twice): the prompt's step is built, allocated,
    its CPU plan bound and its kernels made ready (``ModelRunner.prepare``), only a token's
    step is computed, the cache is left empty, and the prompt then runs on that plan
    with the numbers of a model that was never warmed up."""
    from tensorplug_llm.runner import ModelRunner

    path = write_tiny_llama(tmp_path / "m.gguf", "q4_0")
    prompt = list(range(1, n_prompt + 1))
    cold = ModelRunner(path, n_ctx=64, n_batch=32, n_threads=1, warmup=False)
    try:
        want = cold.eval(prompt)
    finally:
        cold.close()
    m = ModelRunner(path, n_ctx=64, n_batch=32, n_threads=1, warmup=False)
    try:
        cpu: Any = next(iter(m.sched_for(len(prompt)).backends))
        reserved = m.timings.graphs_built
        computed: list[int] = []  # the token counts of the steps computed
        step = m._step

        def counted(batch: Any, *args: Any, **kwargs: Any) -> Any:
            computed.append(len(batch))
            return step(batch, *args, **kwargs)

        m._step = counted  # type: ignore[method-assign]
        m.warm_up(len(prompt))
        built = m.timings.graphs_built
        assert built == reserved + 2  # the prompt's step and the token's
        assert m.n_past == 0 and m.kv.n_used == 0
        assert computed == [1]  # a token's step, never the prompt's
        prepared = kept_plans(cpu)
        ran = record_runs(cpu)
        got = m.eval(prompt)
        assert m.timings.graphs_built == built and len(ran) == 1 and ran[0] in prepared
    finally:
        m.close()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n_prompt", [7, 30])
def test_a_prepared_steps_first_compute_does_what_its_next_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_prompt: int
) -> None:
    """``prepare`` settles the plan's calls (``jit_steps.settle``): its first compute
    looks up no kernel code by its arguments' types that later computes do not, where
    each call's first run keyed its arguments twice (a server's first request of each
    step shape paid several milliseconds for it)."""
    from tensorplug_cpu.kernels import kernel_refs
    from tensorplug_llm.runner import ModelRunner

    keyed: list[int] = []
    arg_key = kernel_refs.arg_key

    def counted(args: Any) -> Any:
        keyed.append(1)
        return arg_key(args)

    m = ModelRunner(write_tiny_llama(tmp_path / "m.gguf", "q4_0"), n_ctx=64, n_batch=32,
              n_threads=1, warmup=False)  # fmt: skip
    try:
        prompt = list(range(1, n_prompt + 1))
        m.eval(prompt[:-1])  # another step shape: every kernel called once, loaded
        m.reset()
        m.prepare(n_prompt)
        monkeypatch.setattr(kernel_refs, "arg_key", counted)
        runs = []
        for _ in range(2):
            keyed.clear()
            m.eval(prompt)
            m.reset()
            runs.append(len(keyed))
        assert runs[0] == runs[1], runs
    finally:
        m.close()


def test_prepare_refuses_a_step_no_batch_could_be(tmp_path: Path) -> None:
    from tensorplug.errors import RunError
    from tensorplug_llm.runner import ModelRunner

    m = ModelRunner(write_tiny_llama(tmp_path / "m.gguf", "q4_0"), n_ctx=64, n_batch=32,
              n_threads=1, warmup=False)  # fmt: skip
    try:
        for n_tokens, n_outputs, words in [(0, 1, "1 to n_batch = 32"), (33, 1, "got 33"),
                                           (4, 0, "n_outputs must be 1 to n_tokens = 4"),
                                           (4, 5, "got 5")]:  # fmt: skip
            with pytest.raises(RunError, match=words):
                m.prepare(n_tokens, n_outputs)
        m.prepare(4, 4)  # a decode step of four sequences
        assert m.kv.n_used == 0
    finally:
        m.close()

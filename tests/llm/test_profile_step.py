"""benchmarks/profile_step.py: every probe on a token's path runs, and the times add up."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_step.py"


def test_a_generated_token_is_profiled_down_to_the_compiled_program(tmp_path: Path) -> None:
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "q4_0", n_embd=64, n_ff=128, n_layer=2,
                            n_head=4, n_head_kv=2, n_vocab=320)  # fmt: skip
    cmd = [sys.executable, str(SCRIPT), "--models", str(path), "--threads", "1",
           "--tokens", "12", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {r["function"]: r for r in result["rows"]}
    # one token: one eval, one decode, one step, one graph compute, one compiled program
    for name in ("ModelRunner.eval", "ModelRunner.decode", "ModelRunner._step",
                 "Scheduler.graph_compute", "CpuBackend._run", "Program.__call__",
                 "StepIO.read"):  # fmt: skip
        assert rows[name]["calls"] == 1, name
    assert rows["KVCells.mask"]["calls"] == 1  # no sliding window in this model
    # each level holds the one below it; own times are what is left
    chain = ["ModelRunner.eval", "ModelRunner.decode", "ModelRunner._step",
             "Scheduler.graph_compute", "CpuBackend._run", "Program.__call__"]  # fmt: skip
    for outer, inner in itertools.pairwise(chain):
        assert rows[outer]["total_us"] >= rows[inner]["total_us"] > 0, (outer, inner)
    program = rows["Program.__call__"]
    assert program["own_us"] == program["total_us"]  # nothing probed below it
    python = result["python_us"]
    assert 0 < python["p10"] <= python["p50"] <= python["p90"]
    assert python["p50"] < result["profiled_token_us"]
    # the probes' cost comes off (the probed tokens' extra: noise can make it any size)
    assert result["python_bare_us"] <= python["p50"]
    # the token's graph runs as one compiled program plus the steps no program can hold
    plan = result["plan"]
    assert plan["programs"] >= 1
    assert plan["calls"] == plan["programs"] + (plan["steps"] - plan["steps_in_programs"])
    assert plan["calls"] < plan["steps"] <= plan["nodes"]


def test_the_timer_splits_a_call_into_its_own_time_and_its_callees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = importlib.util.spec_from_file_location("profile_step", SCRIPT)
    assert spec is not None and spec.loader is not None
    profile_step = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "profile_step", profile_step)  # for its dataclass
    spec.loader.exec_module(profile_step)
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])  # a clock the test moves

    class Work:
        def outer(self) -> str:
            now[0] += 5
            self.inner()
            self.inner()
            now[0] += 1
            return "done"

        def inner(self) -> None:
            now[0] += 10

    module = types.ModuleType("fake_work")
    module.Work = Work  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_work", module)
    timer = profile_step.Timer()
    timer.wrap(0, "fake_work", "Work", "outer")
    timer.wrap(1, "fake_work", "Work", "inner")
    assert Work().outer() == "done"  # not yet probed
    assert timer.take() == {"Work.outer": (0, 0.0, 0.0), "Work.inner": (0, 0.0, 0.0)}
    timer.on()
    assert Work().outer() == "done"
    assert timer.take() == {"Work.outer": (1, 26.0, 6.0), "Work.inner": (2, 20.0, 20.0)}
    assert timer.take() == {"Work.outer": (0, 0.0, 0.0), "Work.inner": (0, 0.0, 0.0)}
    timer.off()
    assert Work.outer.__qualname__.endswith("Work.outer")  # the class's own methods again
    assert Work().outer() == "done" and timer.take()["Work.outer"] == (0, 0.0, 0.0)
    with pytest.raises(SystemExit, match="fake_work.Work.gone is gone: update PROBES"):
        timer.wrap(0, "fake_work", "Work", "gone")

"""The backend author's guide is true: its example backend, copied out of
docs/writing-a-backend.md, passes the conformance kit for the cases it supports."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np

import tensorplug as tp
from tensorplug.testing.families import catalogue
from tensorplug.testing.refbackend import reference_backend
from tensorplug.testing.runner import Outcome, run_cases

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "writing-a-backend.md"


def _example() -> types.ModuleType:
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(r"<!-- example: (\w+) [^>]*-->\n```python\n(.*?)```", text, re.DOTALL)
    assert m, "the guide's example block is missing"
    name, code = m.groups()
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(code, f"{GUIDE.name}:{name}", "exec"), module.__dict__)
    return module


def test_the_guides_example_is_short() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(r"<!-- example: \w+ [^>]*-->\n```python\n(.*?)```", text, re.DOTALL)
    assert m is not None and len(m.group(1).splitlines()) <= 80


def test_the_guides_backend_passes_the_kit() -> None:
    lite = _example()
    backend = lite.create_reg().devices()[0].init_backend()
    cases = catalogue(True, ["add", "mul", "scale", "neg"], [])
    report = run_cases(cases, backend, reference_backend())
    assert report.ok, [r.message for r in report.results if r.outcome is Outcome.FAIL]
    passed = report.count(Outcome.PASS)
    assert passed >= 15, report.summary()
    assert report.count(Outcome.UNSUPPORTED) == len(cases) - passed  # F16 etc.: said so


def test_the_guides_backend_is_placed_only_when_named() -> None:
    lite = _example()
    dev = lite.create_reg().devices()[0]
    assert dev.type is tp.DeviceType.ACCEL and dev.buffer_type().name == "LITE0"
    assert dev.buffer_type().is_host
    x = tp.new_tensor("f32", (2, 3), "x")
    y = tp.ops.scale(tp.ops.neg(x), 2.0)
    sched = tp.Scheduler([dev.init_backend(), tp.init_by_name("CPU")])
    g = tp.Graph(y)
    sched.alloc_graph(g)
    tp.set_array(x, np.arange(6, dtype=np.float32).reshape(2, 3))
    sched.graph_compute(g)
    np.testing.assert_array_equal(tp.get_array(y), -2 * np.arange(6).reshape(2, 3))
    assert sched.get_tensor_backend(y).name == "LITE0"

"""The CPU backend against the independent float64 formulas, through the conformance kit.

This is ``tensorplug check --backend CPU``: the full catalogue (about 600 cases, a
couple of seconds), every node compared with :mod:`tensorplug.testing.reference` and the
``gguf`` codecs, with sentinels around every tensor. The CPU backend comes from the
registry, as any application would get it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tensorplug import registry
from tensorplug.backend import Status
from tensorplug.graph import Graph
from tensorplug.opcodes import VIEW_OPS
from tensorplug.testing import Outcome, all_cases, check_backend, reference_backend, run_case

pytestmark = pytest.mark.skipif(
    registry.dev_by_name("CPU") is None, reason="the CPU backend plugin is not installed"
)


def test_cpu_backend_passes_the_full_catalogue() -> None:
    report = check_backend("CPU", full=True)
    problems = [f"{r.outcome.value}: {r.case}: {r.message}" for r in report.results if not r.passed]
    assert not problems, report.summary() + "\n" + "\n".join(problems)


def test_check_cli_end_to_end() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorplug",
            "check",
            "--backend",
            "CPU",
            "--op",
            "add",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    data = json.loads(run.stdout)
    assert data["backend"] == "CPU" and data["reference"] == "reference" and data["ok"]
    n = sum(c.op.value == "add" for c in all_cases())
    assert data["summary"] == {"pass": n, "fail": 0, "unsupported": 0, "total": n}


def test_kit_catches_a_cpu_kernel_writing_past_its_output() -> None:
    """A CPU backend with one element written past the end of every result."""
    cpu = registry.init_by_name("CPU")
    compute = cpu._graph_compute

    def overflowing(graph: Graph) -> Status:
        status = compute(graph)
        for node in graph.nodes:
            if node.op not in VIEW_OPS:
                assert node.buffer is not None
                mem = node.buffer.host_array()
                end = node.offset + node.nbytes
                mem[end : end + 4] = np.frombuffer(np.float32(1.5).tobytes(), np.uint8)
        return status

    cpu._graph_compute = overflowing  # type: ignore[method-assign]
    case = next(c for c in all_cases() if c.name.startswith("RMS_NORM(type=f32,shape=[4,64]"))
    result = run_case(case, cpu, reference_backend())
    assert result.outcome is Outcome.FAIL
    assert (
        result.message.startswith("CPU, node 0 RMS_NORM")
        and "write after <rms_norm>" in result.message
    )

"""The conformance catalogue (its quick subset; ``--tensorplug-full`` for all of it) on
OpenCL0, against the float64 reference formulas, through tensorplug's pytest plugin.

The full catalogue also runs from the command line: ``tensorplug check --backend OpenCL0``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")
from pending_opencl import PENDING

from tensorplug_opencl import score

if score()[0] == 0:
    pytest.skip(f"no OpenCL device: {score()[1]}", allow_module_level=True)


def test_opencl_conformance(
    tensorplug_case: Any, tensorplug_check: Callable[..., Any], request: pytest.FixtureRequest
) -> None:
    reason = PENDING.get(str(tensorplug_case))
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    tensorplug_check(tensorplug_case, backend="OpenCL0", reference="reference")

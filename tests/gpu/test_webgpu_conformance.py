"""The conformance catalogue (its quick subset; ``--tensorplug-full`` for all of it) on
WebGPU0, against the float64 reference formulas, through tensorplug's pytest plugin.

CI runs it on lavapipe (Mesa's software Vulkan). The full catalogue also runs from the
command line: ``tensorplug check --backend WebGPU0``. Cases the WGSL kernels do not
have yet (flash attention, quantizing copies) skip as unsupported, with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("wgpu", reason="wgpu is not installed (pip install wgpu)")
from tensorplug_webgpu import score

if score()[0] == 0:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true but WebGPU cannot run here: {score()[1]}", pytrace=False)
    pytest.skip(f"no WebGPU adapter: {score()[1]}", allow_module_level=True)


def test_webgpu_conformance(tensorplug_case: Any, tensorplug_check: Callable[..., Any]) -> None:
    tensorplug_check(tensorplug_case, backend="WebGPU0", reference="reference")

"""The OpenCL runtime's side of the 8-bit integer matrix-vector path: its scratch buffer.

PoCL's devices are CPUs, for which the encoder never picks the GPU kernels; here the
device's limits say GPU, so the OpenCL backend itself quantizes the activations into
its scratch buffer and runs ``k_mvq_*`` — eagerly and through graph plans, whose
scratch must stay theirs when the backend's grows. Held to the numpy formula of the
same computation (tests/mmvq_reference.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from mmvq_reference import Product

import tensorplug as tp
from tensorplug import Type
from tensorplug.testing import catalogue, run_cases

pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")

from tensorplug_opencl import score

if score()[0] == 0:
    pytest.skip(f"no OpenCL device: {score()[1]}", allow_module_level=True)


@pytest.fixture(scope="module")
def backend() -> Iterator[tp.Backend]:
    from tensorplug_opencl.reg import create_reg

    device = create_reg().devices()[0]  # shared by the process: limits restored after
    saved = device.limits  # type: ignore[attr-defined]
    device.limits = dataclasses.replace(saved, gpu=True)  # type: ignore[attr-defined]
    be = device.init_backend()
    yield be
    be.free()
    device.limits = saved  # type: ignore[attr-defined]


@pytest.mark.parametrize("wtype", [Type.Q8_0, Type.Q5_1, Type.Q3_K, Type.Q4_K, Type.Q6_K])
@pytest.mark.parametrize("tokens", [1, 8])
def test_eager_compute_quantizes_into_scratch(
    backend: tp.Backend, wtype: Type, tokens: int
) -> None:
    p = Product(backend, wtype, tokens)
    x = p.new_input()
    backend.graph_compute(p.graph)
    p.check(x)


def test_a_plan_keeps_its_scratch_when_the_backend_grows(backend: tp.Backend) -> None:
    small = Product(backend, Type.Q4_0, 1, k=64)
    plan = backend.graph_plan_create(small.graph)
    x = small.new_input()
    backend.graph_plan_compute(plan)
    backend.synchronize()
    small.check(x)
    big = Product(backend, Type.Q4_K, 8, k=2048)  # grows the backend's scratch
    x_big = big.new_input()
    backend.graph_compute(big.graph)
    big.check(x_big)
    x = small.new_input()
    backend.graph_plan_compute(plan)
    backend.synchronize()
    small.check(x)
    backend.graph_plan_free(plan)


def test_the_kits_mul_mat_cases_pass_with_gpu_kernels(backend: tp.Backend) -> None:
    """The conformance kit's mul_mat family (every weight type, 1 and 7 tokens among
    them) through the OpenCL runtime choosing the GPU kernels, mmvq included."""
    report = run_cases(catalogue(True, ["mul_mat"]), backend, tp.registry.init_by_name("CPU"))
    failed = [(r.case, r.message) for r in report.results if r.outcome.name == "FAIL"]
    assert failed == []
    assert sum(r.outcome.name == "PASS" for r in report.results) >= 100

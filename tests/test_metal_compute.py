"""The Metal backend's numbers, from its real host code over a fake of Metal — NOT Metal.

The conformance kit judges the Metal backend op by op against the CPU backend, the
plugin running as it would on a Mac except that pyobjc's ``Metal`` is
``tests/fake_metal.py``: its dispatches run the shared library's kernels on PoCL. So
every encoder, argument struct, buffer binding, threadgroup grid, command buffer and
blit the plugin makes is checked by value; Apple's compiler, simdgroups and timing are
not (``scripts/metal-check.sh`` runs on a Mac).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fake_metal import FakeMetal, FakeObjC

import tensorplug as tp
from tensorplug import ops
from tensorplug.testing import catalogue, run_cases
from tensorplug_kernels.emulate import PoclEmulator, pocl_emulator
from tensorplug_metal.reg import MetalReg


@pytest.fixture(scope="module")
def emulator() -> PoclEmulator:
    pytest.importorskip("pyopencl", reason="the fake runs kernels on PoCL: pip install pyopencl")
    try:
        return pocl_emulator(128)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))


@pytest.fixture
def fake(emulator: PoclEmulator) -> FakeMetal:
    return FakeMetal(emulator, FakeObjC())


@pytest.fixture
def backend(fake: FakeMetal) -> Iterator[Any]:
    be = MetalReg(fake, fake.state.objc).devices()[0].init_backend()
    yield be
    be.free()


def test_every_catalogue_case_agrees_with_the_cpu_backend(backend: Any, fake: FakeMetal) -> None:
    report = run_cases(catalogue(full=True), backend, tp.registry.init_by_name("CPU"))
    failed = [
        (r.case, r.message, r.traceback[-800:]) for r in report.results if r.outcome.name == "FAIL"
    ]
    unsupported = {r.case for r in report.results if r.outcome.name == "UNSUPPORTED"}
    passed = sum(r.outcome.name == "PASS" for r in report.results)
    assert failed == []
    # only writes into K-quants are left to the CPU, as in ggml's GPU backends
    assert all("_k" in name.lower() for name in unsupported), unsupported
    assert passed >= 850
    assert len(fake.state.dispatches) >= passed  # the kernels really ran
    # every command buffer and encoder was made inside an autorelease pool
    assert fake.state.objc.pools >= fake.state.command_buffers > 0


def test_a_graph_plan_replays_its_bound_dispatches(backend: Any, fake: FakeMetal) -> None:
    rng = np.random.default_rng(1)
    x = tp.new_tensor("f32", (4, 64), "x")
    y = ops.rms_norm(ops.add(x, x), 1e-6)
    graph = tp.Graph(y)
    tp.alloc_tensors([x, *graph.nodes], backend.buffer_type())
    plan = backend.graph_plan_create(graph)
    for _ in range(3):
        data = rng.standard_normal((4, 64)).astype(np.float32)
        tp.set_array(x, data)
        before = len(fake.state.dispatches)
        backend.graph_plan_compute(plan)
        backend.synchronize()
        assert len(fake.state.dispatches) == before + len(plan.dispatches)
        s = 2 * data
        want = s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(tp.get_array(y), want, rtol=1e-5, atol=1e-6)
    backend.graph_plan_free(plan)


def test_the_tiny_model_runs_on_the_fake_metal_device_like_on_the_cpu(
    fake: FakeMetal, tmp_path: Any
) -> None:
    """The whole model path: weights mapped from the GGUF file into no-copy views, the
    KV cache in shared buffers, the scheduler splitting between Metal and the CPU."""
    from tensorplug.models.cli import DEMO_MAX_NMSE
    from tensorplug.models.placement import Placement
    from tensorplug.models.runner import Llama
    from tensorplug.models.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "q8_0", 3)
    tokens = [1, 5, 9, 2, 7, 4]
    dev = MetalReg(fake, fake.state.objc).devices()[0]
    cpu = tp.registry.dev_by_name("CPU")
    logits = {}
    for name, where in (("Metal", dev), ("CPU", cpu)):
        with Llama(path, placement=Placement.on(where, 2), n_ctx=32, warmup=False) as m:
            if where is dev:
                assert all(mem.mapped for d, mem in m.memory.items() if d is dev)
            logits[name] = m.eval(tokens, all_logits=True)
    want, got = logits["CPU"], logits["Metal"]
    nmse = float(((got - want) ** 2).sum() / (want**2).sum())
    # the CPU backend multiplies Q8_0 weights by 8-bit activations, the kernels in float:
    # the agreement every cross-device run is held to
    assert nmse < DEMO_MAX_NMSE
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert any(
        d.kernel.startswith("k_mm") or d.kernel.startswith("k_mv") for d in fake.state.dispatches
    )

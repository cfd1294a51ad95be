"""The Metal backend's numbers, from its real host code over a fake of Metal — NOT Metal.

The conformance kit judges the Metal backend op by op against the CPU backend, the
plugin running as it would on a Mac except that pyobjc's ``Metal`` is
``tests/fake_metal.py``: its dispatches run the shared library's kernels on PoCL. So
every encoder, argument struct, buffer binding (the backend's scratch buffer included),
threadgroup grid, command buffer and blit the plugin makes is checked by value; Apple's
compiler, simdgroups and timing are not (``scripts/metal-check.sh`` runs on a Mac).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cpu_only_cases import left_to_the_cpu
from fake_metal import FakeMetal, FakeObjC
from mmvq_reference import Product

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.quants import dequantize
from tensorplug.testing import catalogue, run_cases
from tensorplug_kernels import kernel_abis
from tensorplug_kernels.emulate import PoclEmulator, pocl_emulator
from tensorplug_kernels.encode_math import mmvq_scratch_bytes
from tensorplug_kernels.source import MMVQ_TYPES, mmvq_kernel_name
from tensorplug_metal.reg import MetalReg

#: What the few-token products of quantized weights dispatch: the Q8_1 quantizer and
#: the 8-bit integer mat-vec kernel of every weight type.
MMVQ_KERNELS = {mmvq_kernel_name(t) for t in MMVQ_TYPES} | {"k_quantize_q8_1"}


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
    # writes into K-quants are left to the CPU, as in ggml's GPU backends, and a
    # quantized KV cache
    assert all(left_to_the_cpu(name) for name in unsupported), unsupported
    assert passed >= 850
    assert len(fake.state.dispatches) >= passed  # the kernels really ran
    assert {d.kernel for d in fake.state.dispatches} >= MMVQ_KERNELS
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
        assert len(fake.state.dispatches) == before + len(plan.steps)
        s = 2 * data
        want = s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(tp.get_array(y), want, rtol=1e-5, atol=1e-6)
    backend.graph_plan_free(plan)


def test_the_tiny_model_runs_on_the_fake_metal_device_like_on_the_cpu(
    fake: FakeMetal, tmp_path: Any
) -> None:
    """The whole model path: weights mapped from the GGUF file into no-copy views, the
    KV cache in shared buffers, the scheduler splitting between Metal and the CPU."""
    from tensorplug_llm.placement import Placement
    from tensorplug_llm.run_cli import DEMO_MAX_NMSE
    from tensorplug_llm.runner import ModelRunner
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", "q8_0", 3)
    tokens = [1, 5, 9, 2, 7, 4]
    dev = MetalReg(fake, fake.state.objc).devices()[0]
    cpu = tp.registry.dev_by_name("CPU")
    assert cpu is not None
    logits = {}
    for name, where in (("Metal", dev), ("CPU", cpu)):
        with ModelRunner(path, placement=Placement.on(where, 2), n_ctx=32, warmup=False) as m:
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


# -- few tokens, quantized weights: 8-bit integer products (ggml's mmvq) ---------------------------
# The activations are quantized to Q8_1 blocks in the backend's scratch buffer (a shared
# MTLBuffer), then k_mvq_* multiplies them with the weights' codes; held to the numpy
# formula of the same computation (mmvq_reference.py) or to the CPU backend.


def _scratch_of(dispatch: Any) -> Any:
    """The MTLBuffer a dispatch binds as its ``scratch`` parameter."""
    return dispatch.buffers[kernel_abis()[dispatch.kernel].buffers.index("scratch")]


def test_the_kits_mul_mat_cases_take_the_integer_kernels(backend: Any, fake: FakeMetal) -> None:
    """The conformance kit's mul_mat family (every weight type, 1 to 8 tokens among
    them) agrees with the CPU backend with mmvq on, and really dispatched it."""
    report = run_cases(catalogue(True, ["mul_mat"]), backend, tp.registry.init_by_name("CPU"))
    failed = [(r.case, r.message) for r in report.results if r.outcome.name == "FAIL"]
    assert failed == []
    assert sum(r.outcome.name == "PASS" for r in report.results) >= 100
    assert {d.kernel for d in fake.state.dispatches} >= MMVQ_KERNELS


@pytest.mark.parametrize("wtype", MMVQ_TYPES, ids=lambda t: t.name.lower())
@pytest.mark.parametrize("tokens", [1, 8])
def test_few_tokens_use_the_integer_kernels(
    backend: Any, fake: FakeMetal, wtype: Type, tokens: int
) -> None:
    p = Product(backend, wtype, tokens)
    x = p.new_input()
    backend.graph_compute(p.graph)
    p.check(x)
    kernels = [d.kernel for d in fake.state.dispatches]
    assert kernels == ["k_quantize_q8_1", f"k_mvq_{wtype.name.lower()}"]


def test_nine_tokens_do_not(backend: Any, fake: FakeMetal) -> None:
    p = Product(backend, Type.Q4_K, 9)
    x = p.new_input()
    backend.graph_compute(p.graph)
    np.testing.assert_allclose(
        tp.get_array(p.y), x @ dequantize(p.stored, p.wtype).reshape(p.w.shape).T,
        rtol=1e-4, atol=1e-4,
    )  # fmt: skip
    assert not any("mvq" in d.kernel or "q8_1" in d.kernel for d in fake.state.dispatches)


def test_a_plan_keeps_one_scratch_buffer_across_computes(backend: Any, fake: FakeMetal) -> None:
    """Two mmvq products of different widths in one plan share one scratch buffer,
    sized for the wider when the plan is bound; computing allocates nothing, and the
    plan keeps that buffer when the backend grows its own for a larger product."""
    narrow = Product(backend, Type.Q4_0, 1, k=256)
    wide = Product(backend, Type.Q8_0, 2, k=1024)
    plan = backend.graph_plan_create(tp.Graph([narrow.y, wide.y]))
    assert [d.kernel for d in plan.steps] == [
        "k_quantize_q8_1",
        "k_mvq_q4_0",
        "k_quantize_q8_1",
        "k_mvq_q8_0",
    ]
    scratch = _scratch_of(plan.steps[0])
    assert all(_scratch_of(d) is scratch for d in plan.steps)
    assert scratch.length() == mmvq_scratch_bytes(wide.x) == 2 * (1024 // 32) * 40
    device = fake.devices[0]
    allocated = device.currentAllocatedSize()
    for _ in range(3):
        inputs = narrow.new_input(), wide.new_input()
        before = len(fake.state.dispatches)
        backend.graph_plan_compute(plan)
        backend.synchronize()
        assert len(fake.state.dispatches) == before + 4
        assert device.currentAllocatedSize() == allocated  # nothing allocated per compute
        narrow.check(inputs[0])
        wide.check(inputs[1])
    big = Product(backend, Type.Q4_0, 8, k=4096)  # 16 times the plan's scratch
    x_big = big.new_input()
    backend.graph_compute(big.graph)
    big.check(x_big)
    assert backend.runtime_buffers(1)["scratch"] is not scratch  # the backend's grew
    inputs = narrow.new_input(), wide.new_input()
    backend.graph_plan_compute(plan)
    backend.synchronize()
    assert all(_scratch_of(d) is scratch for d in plan.steps)  # the plan kept its own
    narrow.check(inputs[0])
    wide.check(inputs[1])
    backend.graph_plan_free(plan)


def test_the_scratch_buffer_grows_outside_a_plan(backend: Any, fake: FakeMetal) -> None:
    """Eager computes grow the backend's scratch to what a graph needs (at least
    doubling), never shrink it, and release the buffer grown out of at synchronize."""
    device = fake.devices[0]
    small = Product(backend, Type.Q5_K, 1, k=256)
    big = Product(backend, Type.Q6_K, 8, k=2048)
    x = small.new_input()
    backend.graph_compute(small.graph)
    small.check(x)
    first = backend.runtime_buffers(1)["scratch"]
    assert first.length() == mmvq_scratch_bytes(small.x) == (256 // 32) * 40
    allocated = device.currentAllocatedSize()
    x_big = big.new_input()
    backend.graph_compute(big.graph)
    big.check(x_big)
    grown = backend.runtime_buffers(1)["scratch"]
    assert grown.length() == mmvq_scratch_bytes(big.x) == 8 * (2048 // 32) * 40
    del first
    gc.collect()
    assert device.currentAllocatedSize() == allocated - (256 // 32) * 40 + grown.length()
    x = small.new_input()  # a smaller need reuses the grown buffer
    backend.graph_compute(small.graph)
    small.check(x)
    assert backend.runtime_buffers(1)["scratch"] is grown

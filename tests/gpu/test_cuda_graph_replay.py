"""graph_compute replays decode steps as CUDA graphs (tensorplug_kernels/runtime/replay.py,
CUDA's capture in tensorplug_cuda/backend.py) — over
the fake of cupy, NOT CUDA.

The scheduler and the model runner compute a step's graph with ``graph_compute``, no
plan. A graph seen again with the same signature (ops, parameters, shapes, strides,
buffers and offsets) is captured on its second compute and replayed from then on; a
graph that differs in any of them is launched node by node, never through a stale
capture. The fake records what a stream capture records and replays it on the next
``Graph.launch``, so a stale replay would show as wrong numbers or a launch into freed
memory; it says nothing about real CUDA graphs (test_cuda_gpu.py does, on a GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_cupy import CUDADriverError, FakeCupy, FakeGPU
from mmvq_reference import Product, cuda_product

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.quants import dequantize, quantize
from tensorplug.transfer import tensor_alloc
from tensorplug_cuda.backend import CUDABackend
from tensorplug_cuda.buffer import CUDABuffer
from tensorplug_cuda.reg import CUDAReg
from tensorplug_kernels.emulate import PoclEmulator, pocl_emulator
from tensorplug_kernels.runtime.replay import CACHE_SIZE


@pytest.fixture(scope="module")
def emulator() -> PoclEmulator:
    pytest.importorskip("pyopencl", reason="the fake runs kernels on PoCL: pip install pyopencl")
    try:
        return pocl_emulator(128)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))


@pytest.fixture
def fake(emulator: PoclEmulator) -> FakeCupy:
    return FakeCupy(emulator)


@pytest.fixture
def backend(fake: FakeCupy) -> Iterator[Any]:
    be = CUDAReg(fake).devices()[0].init_backend()
    yield be
    be.free()


class Step:
    """A decode-shaped graph: tokens through a Q4_0 matrix, silu, rms_norm times a
    weight, computed with ``graph_compute`` and checked against numpy every time."""

    def __init__(self, backend: Any, tokens: int = 1, eps: float = 1e-6) -> None:
        rng = np.random.default_rng(5)
        self.backend, self.eps, self.rng = backend, eps, rng
        self.weights = rng.standard_normal((64, 64)).astype(np.float32)
        self.gamma = rng.standard_normal(64).astype(np.float32)
        self.w = tp.new_tensor("q4_0", (64, 64), "w")
        self.g = tp.new_tensor("f32", (64,), "gamma")
        self.x = tp.new_tensor("f32", (tokens, 64), "x")
        self.mm = ops.mul_mat(self.w, self.x)
        self.act = ops.silu(self.mm)
        self.y = ops.mul(ops.rms_norm(self.act, eps), self.g)
        self.graph = tp.Graph(self.y)
        tensors = [self.w, self.g, self.x, *self.graph.nodes]
        self.buffer = tp.alloc_tensors(tensors, backend.buffer_type())
        tp.set_array(self.w, quantize(self.weights, Type.Q4_0))
        tp.set_array(self.g, self.gamma)

    def compute(self, graph: tp.Graph | None = None) -> None:
        """New input, one ``graph_compute``, the result held to the formula."""
        x = self.rng.standard_normal(self.x.shape).astype(np.float32)
        tp.set_array(self.x, x)
        assert self.backend.graph_compute(graph or self.graph) is tp.Status.SUCCESS
        np.testing.assert_allclose(tp.get_array(self.y), self.reference(x), rtol=1e-4, atol=1e-4)

    def reference(self, x: np.ndarray) -> np.ndarray:
        w = dequantize(quantize(self.weights, Type.Q4_0), Type.Q4_0)
        h = cuda_product(x, w)  # Q8_1 integer products, or cuBLAS's F16 operands
        h = h / (1 + np.exp(-h))
        return h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + self.eps) * self.gamma


def test_a_graph_computed_again_is_captured_once_then_replayed(
    backend: Any, fake: FakeCupy
) -> None:
    step = Step(backend)
    step.compute()  # first sight: launched kernel by kernel (the warm-up)
    kernels = len(fake.state.launches)
    assert kernels == 5 and not any(ln.captured for ln in fake.state.launches)
    assert fake.state.calls["begin_capture"] == 0 and backend.graphs.bound == 1
    for _ in range(3):
        step.compute()  # captured once, then one Graph.launch per compute
    assert backend.graphs.captures == 1 and backend.graphs.replays == 3
    assert fake.state.calls["begin_capture"] == 1 and fake.state.calls["graph_launch"] == 3
    captured = fake.state.launches[kernels:]  # only the capture issued kernels
    assert len(captured) == kernels and all(ln.captured for ln in captured)
    # a rebuilt graph object over the same tensors has the same signature: replayed too
    step.compute(tp.Graph(step.y))
    assert backend.graphs.replays == 4 and backend.graphs.bound == 1
    assert len(fake.state.launches) == 2 * kernels


def test_a_graph_that_differs_is_never_replayed_with_stale_launches(
    backend: Any, fake: FakeCupy
) -> None:
    first = Step(backend)
    for _ in range(2):
        first.compute()
    assert backend.graphs.replays == 1
    # other memory (a second copy), another shape, another op parameter: each its own
    for other in (Step(backend), Step(backend, tokens=2), Step(backend, eps=1e-3)):
        launched = len(fake.state.launches)
        other.compute()  # right numbers: launched eagerly, not replayed
        assert backend.graphs.replays == 1
        assert len(fake.state.launches) > launched
        assert not any(ln.captured for ln in fake.state.launches[launched:])
    assert backend.graphs.bound == 4
    first.compute()  # the first graph's capture is still cached: replayed
    assert backend.graphs.replays == 2 and backend.graphs.captures == 1


def test_the_same_graph_moved_to_other_memory_is_launched_anew(
    backend: Any, fake: FakeCupy
) -> None:
    step = Step(backend)
    for _ in range(3):
        step.compute()
    assert backend.graphs.replays == 2
    # what an allocator does when it places the graph again: the activation moves
    other = tp.alloc_tensors([tp.new_tensor("f32", (1024,))], backend.buffer_type())
    assert other is not None
    step.act.buffer = None
    tensor_alloc(other, step.act, 256)
    step.compute()  # a replay would write silu's result where it no longer is
    assert backend.graphs.replays == 2 and backend.graphs.bound == 2
    for _ in range(2):
        step.compute()  # the moved graph is captured in turn
    assert backend.graphs.replays == 4 and backend.graphs.captures == 2


def test_graphs_with_cublas_nodes_are_never_captured(backend: Any, fake: FakeCupy) -> None:
    step = Step(backend, tokens=64)  # a prompt batch: quantized weights go to cuBLAS
    for _ in range(3):
        step.compute()
    assert fake.state.calls["matmul"] == 3
    assert fake.state.calls["begin_capture"] == 0 and fake.state.calls["graph_launch"] == 0
    assert backend.graphs.bound == 0 and not backend.graphs.plans


@pytest.mark.parametrize("why", ["setting", "volta"])
def test_graphs_are_launched_eagerly_where_cuda_graphs_are_off(
    monkeypatch: pytest.MonkeyPatch, emulator: PoclEmulator, why: str
) -> None:
    if why == "setting":
        monkeypatch.setenv("TENSORPLUG_CUDA_GRAPHS", "0")
    fake = FakeCupy(emulator, FakeGPU(major=6, minor=1) if why == "volta" else FakeGPU())
    backend = CUDAReg(fake).devices()[0].init_backend()
    assert isinstance(backend, CUDABackend)
    step = Step(backend)
    for _ in range(3):
        step.compute()
    assert fake.state.calls["begin_capture"] == 0 and fake.state.calls["graph_launch"] == 0
    assert backend.graphs.bound == 0 and len(fake.state.launches) == 3 * 5


def test_the_setting_is_read_at_every_compute(
    monkeypatch: pytest.MonkeyPatch, backend: Any, fake: FakeCupy
) -> None:
    step = Step(backend)
    for _ in range(2):
        step.compute()
    assert backend.graphs.replays == 1
    monkeypatch.setenv("TENSORPLUG_CUDA_GRAPHS", "0")
    step.compute()
    assert backend.graphs.replays == 1 and fake.state.calls["graph_launch"] == 1
    monkeypatch.delenv("TENSORPLUG_CUDA_GRAPHS")
    step.compute()
    assert backend.graphs.replays == 2


def test_a_failed_capture_falls_back_and_turns_capture_off_with_one_log_line(
    backend: Any, fake: FakeCupy, caplog: pytest.LogCaptureFixture
) -> None:
    step, other = Step(backend), Step(backend, tokens=2)
    step.compute()
    fake.state.fail_next_launch = CUDADriverError(1)  # the capture's first launch fails
    with caplog.at_level(logging.INFO, logger="tensorplug_cuda"):
        for _ in range(3):
            step.compute()  # right numbers: launched eagerly at once
            other.compute()
    assert "capture failed (KernelLaunchError" in backend.graphs.off
    assert fake.state.calls["begin_capture"] == 1 and fake.state.calls["graph_launch"] == 0
    assert not backend.graphs.plans
    lines = [r.getMessage() for r in caplog.records if "without a CUDA graph" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("CUDA0: graph_compute launched")


def test_freeing_a_buffer_drops_the_cached_graphs_and_frees_its_memory(
    emulator: PoclEmulator,
) -> None:
    fake = FakeCupy(emulator, FakeGPU(memory=1 << 20))
    backend = CUDAReg(fake).devices()[0].init_backend()
    assert isinstance(backend, CUDABackend)
    step, kept = Step(backend), Step(backend, tokens=2)
    for _ in range(2):
        step.compute()
        kept.compute()
    assert len(backend.graphs.plans) == 2 and backend.graphs.replays == 2
    assert step.buffer is not None
    assert isinstance(step.buffer, CUDABuffer)  # device memory, with its pointer
    ptr = step.buffer.ptr
    step.buffer.free()
    assert len(backend.graphs.plans) == 1  # only the graph that used it is dropped
    assert ptr not in fake.state.allocations  # nothing holds its memory any more
    with pytest.raises(tp.BufferFreedError):
        backend.graph_compute(step.graph)
    used = fake.state.used[0]
    big = backend.buffer_type().alloc_buffer((1 << 20) - used)  # all that is free: it is
    big.free()
    kept.compute()
    assert backend.graphs.replays == 3


def test_the_cache_is_bounded(backend: Any) -> None:
    steps = [Step(backend, tokens=1 + i % 8, eps=1e-6 * (1 + i)) for i in range(CACHE_SIZE + 1)]
    for s in steps:
        s.compute()
    assert len(backend.graphs.plans) == CACHE_SIZE and backend.graphs.bound == CACHE_SIZE + 1
    steps[0].compute()  # the least recently used was dropped: bound again, not replayed
    assert backend.graphs.bound == CACHE_SIZE + 2 and backend.graphs.replays == 0
    steps[-1].compute()
    assert backend.graphs.replays == 1


def test_a_graph_of_views_launches_nothing_and_is_not_captured(
    backend: Any, fake: FakeCupy
) -> None:
    a = tp.new_tensor("f32", (4, 8))
    v = ops.reshape(a, (8, 4))
    tp.alloc_tensors([a], backend.buffer_type())
    graph = tp.Graph(v)
    assert graph.nodes == [v]
    for _ in range(3):
        assert backend.graph_compute(graph) is tp.Status.SUCCESS
    assert fake.state.launches == [] and fake.state.calls["begin_capture"] == 0
    assert backend.graphs.plans[0].not_captured == "the plan launches nothing"


def test_bad_indices_are_reported_from_replays(backend: Any) -> None:
    table = tp.new_tensor("f32", (4, 8))
    rows = tp.new_tensor("i32", (1,))
    y = ops.get_rows(table, rows)
    tp.alloc_tensors([table, rows, y], backend.buffer_type())
    tp.set_array(table, np.arange(32, dtype=np.float32).reshape(4, 8))
    graph = tp.Graph(y)
    for index, ok in [(2, True), (7, False), (3, True), (9, False)]:  # eager, then replays
        tp.set_array(rows, np.array([index], np.int32))
        if ok:
            backend.graph_compute(graph)
            np.testing.assert_array_equal(tp.get_array(y)[0], np.arange(8) + 8 * index)
        else:
            with pytest.raises(tp.OutOfBoundsError, match=f"index {index}"):
                backend.graph_compute(graph)
    assert backend.graphs.replays == 3


def test_a_replayed_graph_keeps_its_scratch_when_the_backend_needs_more(backend: Any) -> None:
    small = Product(backend, Type.Q6_K, 1, k=256)
    for _ in range(3):  # warm-up, capture, replay
        x = small.new_input()
        backend.graph_compute(small.graph)
        small.check(x)
    assert backend.graphs.replays == 2
    big = Product(backend, Type.Q4_0, 8, k=1024)  # 32 times the scratch: the backend grows
    x_big = big.new_input()
    backend.graph_compute(big.graph)
    big.check(x_big)
    x = small.new_input()  # the captured graph still reads and writes its own scratch
    backend.graph_compute(small.graph)
    small.check(x)
    assert backend.graphs.replays == 3


def test_a_tiny_model_decodes_through_replayed_graphs(
    monkeypatch: pytest.MonkeyPatch, emulator: PoclEmulator, tmp_path: Path
) -> None:
    """The model runner and its scheduler on the fake GPU: decode steps after the first
    are replays, and the logits are exactly those of kernel-by-kernel launches."""
    from tensorplug_llm.placement import Placement
    from tensorplug_llm.runner import ModelRunner
    from tensorplug_llm.tiny import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny-q4_0.gguf", "q4_0", 1)

    def run() -> tuple[list[np.ndarray], list[int]]:
        dev = CUDAReg(FakeCupy(emulator)).devices()[0]
        with ModelRunner(path, placement=Placement.on(dev, 2), n_ctx=32, kv_pad=32) as m:
            gpu = m.backends[0]
            assert isinstance(gpu, CUDABackend)
            logits, replays = [m.eval([1, 2, 3])], []
            for token in (4, 5, 6, 7):
                logits.append(m.eval([token]))
                replays.append(gpu.graphs.replays)
        return logits, replays

    replayed, counts = run()
    # the warm-up computed the decode graph (once eagerly, then once more at each thread
    # count of the governor): every decode step here is a replay
    assert counts[0] >= 1 and counts == [counts[0] + i for i in range(4)]
    monkeypatch.setenv("TENSORPLUG_CUDA_GRAPHS", "0")
    launched, counts = run()
    assert counts == [0, 0, 0, 0]
    for a, b in zip(replayed, launched, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len({float(x[0]) for x in replayed}) == len(replayed)  # the steps differ

"""The CUDA backend's numbers, from its real host code over a fake of cupy — NOT CUDA.

The conformance kit judges the CUDA backend op by op against the CPU backend, the
plugin running as it would on a GPU except that cupy is ``tests/fake_cupy.py``: its
kernel launches run the shared library's kernels on PoCL, its cuBLAS is numpy. So
every encoder, argument struct, pointer, grid, scratch buffer and cuBLAS view the
plugin makes is checked by value; NVRTC's code, warps and timing are not (see
test_cuda_gpu.py for what runs on a GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cpu_only_cases import left_to_the_cpu
from fake_cupy import CUDADriverError, FakeCupy, FakeGPU
from mmvq_reference import Product, cuda_product, f16_product

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.quants import dequantize, f32_to_bf16, quantize
from tensorplug.testing import catalogue, run_cases
from tensorplug_cuda import matmul as cuda_matmul
from tensorplug_cuda.reg import CUDAReg
from tensorplug_kernels.emulate import PoclEmulator, pocl_emulator
from tensorplug_kernels.source import MMVQ_TYPES, mmvq_kernel_name


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


def test_every_catalogue_case_agrees_with_the_cpu_backend(backend: Any, fake: FakeCupy) -> None:
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
    # the kernels really ran (cuBLAS computed the rest)
    assert len(fake.state.launches) >= passed - fake.state.calls["matmul"]
    assert fake.state.calls["matmul"] >= 20  # and prompt-sized mul_mats went to cuBLAS
    launched = {ln.kernel for ln in fake.state.launches}
    # few-token quantized products took the 8-bit integer kernels, for every type
    assert {mmvq_kernel_name(t) for t in MMVQ_TYPES} | {"k_quantize_q8_1"} <= launched


# -- mul_mat through cuBLAS ----------------------------------------------------------------------


def _mul_mat(backend: Any, weights: np.ndarray, wtype: Type, x: np.ndarray) -> np.ndarray:
    w = tp.new_tensor(wtype, weights.shape)
    b = tp.new_tensor("f32", x.shape)
    y = ops.mul_mat(w, b)
    buf = tp.alloc_tensors([w, b, y], backend.buffer_type())
    assert buf is not None
    stored = quantize(weights, wtype) if wtype.is_quantized else weights.astype(wtype.numpy_dtype)
    tp.set_array(w, stored)
    tp.set_array(b, x)
    backend.graph_compute(tp.Graph(y))
    return tp.get_array(y)


def _reference(weights: np.ndarray, wtype: Type, x: np.ndarray) -> np.ndarray:
    if wtype.is_quantized:
        w = dequantize(quantize(weights, wtype), wtype)
    else:
        w = weights.astype(wtype.numpy_dtype).astype(np.float64)
    r2 = x.shape[0] // w.shape[0] if x.ndim == 3 else 1
    if x.ndim == 3:
        return np.stack([x[i] @ w[i // r2].T for i in range(x.shape[0])])
    return x @ w.T


@pytest.mark.parametrize(
    ("wtype", "tokens", "cublas"),
    [
        (Type.F32, 16, True),
        (Type.F16, 9, True),
        (Type.F16, 8, False),  # a few tokens: the matrix-vector kernels
        (Type.Q4_0, 64, True),
        (Type.Q8_0, 63, False),
    ],
)
def test_mul_mat_goes_to_cublas_for_many_tokens(
    backend: Any, fake: FakeCupy, wtype: Type, tokens: int, cublas: bool
) -> None:
    rng = np.random.default_rng(1)
    weights = rng.standard_normal((48, 64)).astype(np.float32)
    x = rng.standard_normal((tokens, 64)).astype(np.float32)
    got = _mul_mat(backend, weights, wtype, x)
    if cublas and wtype is not Type.F32:  # F16 operands on the tensor cores
        np.testing.assert_allclose(
            got, _tensor_core_reference(weights, wtype, x), rtol=2**-10, atol=2**-14
        )
    else:
        np.testing.assert_allclose(got, _reference(weights, wtype, x), rtol=2e-3, atol=2e-3)
    assert fake.state.calls["matmul"] == int(cublas)
    converted = any(ln.kernel == "k_cpy" for ln in fake.state.launches)
    assert converted == (cublas and wtype is not Type.F32)  # operands converted to F16 first
    assert fake.state.calls["matmul_f16"] == int(converted)


def _tensor_core_reference(weights: np.ndarray, wtype: Type, x: np.ndarray) -> np.ndarray:
    """The F16 product with ``weights`` stored as ``wtype`` (quantized ones dequantized)."""
    w = dequantize(quantize(weights, wtype), wtype) if wtype.is_quantized else weights
    return f16_product(x, w)


@pytest.mark.parametrize(("wtype", "tokens"), [(Type.F16, 16), (Type.Q4_0, 64), (Type.Q6_K, 80)])
def test_cublas_multiplies_f16_and_quantized_weights_on_f16_operands(
    backend: Any, fake: FakeCupy, wtype: Type, tokens: int
) -> None:
    rng = np.random.default_rng(5)
    weights = rng.standard_normal((40, 256)).astype(np.float32)
    x = rng.standard_normal((tokens, 256)).astype(np.float32)
    got = _mul_mat(backend, weights, wtype, x)
    expected = _tensor_core_reference(weights, wtype, x)
    # equal up to one F16 step where F32 sums in another order round the other way
    np.testing.assert_allclose(got, expected, rtol=2**-10, atol=2**-14)
    exact = _reference(weights, wtype, x)
    assert np.abs(got - exact).max() > 1e-3  # the F16 rounding is really there
    assert fake.state.calls["matmul_f16"] == 1


@pytest.mark.parametrize("wtype", [Type.Q4_0, Type.F16])
def test_cublas_f16_can_be_switched_off_for_exact_products(
    monkeypatch: pytest.MonkeyPatch, emulator: PoclEmulator, wtype: Type
) -> None:
    monkeypatch.setenv("TENSORPLUG_CUDA_CUBLAS_F16", "0")
    fake = FakeCupy(emulator)
    backend = CUDAReg(fake).devices()[0].init_backend()
    rng = np.random.default_rng(6)
    weights = rng.standard_normal((40, 256)).astype(np.float32)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    got = _mul_mat(backend, weights, wtype, x)
    np.testing.assert_allclose(got, _reference(weights, wtype, x), rtol=1e-5, atol=1e-4)
    assert fake.state.calls["matmul"] == 1 and fake.state.calls["matmul_f16"] == 0
    backend.free()


def test_bf16_weights_are_widened_to_f32_not_narrowed_to_f16(backend: Any, fake: FakeCupy) -> None:
    w = tp.new_tensor(Type.BF16, (8, 32))
    b = tp.new_tensor("f32", (16, 32))
    y = ops.mul_mat(w, b)
    assert tp.alloc_tensors([w, b, y], backend.buffer_type()) is not None
    tp.set_array(w, f32_to_bf16(np.full((8, 32), 1e6, np.float32)))  # beyond F16's range
    tp.set_array(b, np.ones((16, 32), np.float32))
    backend.graph_compute(tp.Graph(y))
    got = tp.get_array(y)
    np.testing.assert_allclose(got, np.full((16, 8), 32 * 999424.0), rtol=1e-6)  # bf16(1e6)
    assert fake.state.calls["matmul"] == 1 and fake.state.calls["matmul_f16"] == 0


def test_cublas_broadcasts_weights_over_batches_as_ggml(backend: Any, fake: FakeCupy) -> None:
    rng = np.random.default_rng(2)
    weights = rng.standard_normal((2, 24, 32)).astype(np.float32)  # 2 matrices
    x = rng.standard_normal((6, 12, 32)).astype(np.float32)  # 6 batches: 3 per matrix
    got = _mul_mat(backend, weights, Type.F16, x)
    expected = np.stack([_tensor_core_reference(weights[i // 3], Type.F16, x[i]) for i in range(6)])
    np.testing.assert_allclose(got, expected, rtol=2**-10, atol=2**-14)
    assert fake.state.calls["matmul"] == 1


def test_without_cublas_mul_mat_falls_back_to_the_kernels(
    backend: Any, fake: FakeCupy, caplog: pytest.LogCaptureFixture
) -> None:
    fake.state.cublas_missing = True
    rng = np.random.default_rng(3)
    weights, x = rng.standard_normal((40, 32)), rng.standard_normal((20, 32)).astype(np.float32)
    with caplog.at_level(logging.WARNING):
        got = _mul_mat(backend, weights.astype(np.float32), Type.F32, x)
        again = _mul_mat(backend, weights.astype(np.float32), Type.F32, x)
    np.testing.assert_allclose(got, _reference(weights, Type.F32, x), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got, again)
    assert "libcublas" in backend.matmul.unavailable
    assert sum("cuBLAS is unavailable" in r.message for r in caplog.records) == 1  # said once


def test_no_memory_for_converted_weights_falls_back_to_the_kernels(
    emulator: PoclEmulator,
) -> None:
    # room for the tensors, not for an F32 copy of the weights
    fake = FakeCupy(emulator, FakeGPU(memory=64 * 1024))
    backend = CUDAReg(fake).devices()[0].init_backend()
    rng = np.random.default_rng(4)
    weights, x = rng.standard_normal((64, 128)), rng.standard_normal((64, 128)).astype(np.float32)
    got = _mul_mat(backend, weights.astype(np.float32), Type.Q8_0, x)
    np.testing.assert_allclose(got, _reference(weights, Type.Q8_0, x), rtol=2e-3, atol=2e-3)
    assert fake.state.calls["matmul"] == 0


def test_cublas_can_be_switched_off(
    monkeypatch: pytest.MonkeyPatch, emulator: PoclEmulator
) -> None:
    monkeypatch.setenv("TENSORPLUG_CUDA_CUBLAS", "0")
    fake = FakeCupy(emulator)
    backend = CUDAReg(fake).devices()[0].init_backend()
    x = np.ones((32, 16), np.float32)
    got = _mul_mat(backend, np.eye(16, dtype=np.float32), Type.F32, x)
    np.testing.assert_array_equal(got, x)
    assert fake.state.calls["matmul"] == 0
    assert cuda_matmul.min_tokens(tp.new_tensor("q4_k", (4, 256))) == cuda_matmul.QUANT_MIN_TOKENS


# -- graph plans and CUDA graphs -----------------------------------------------------------------


class Decode:
    """A decode-shaped graph: one token through a Q4_0 matrix, silu, rms_norm."""

    def __init__(self, backend: Any, tokens: int = 1) -> None:
        rng = np.random.default_rng(5)
        self.weights = rng.standard_normal((64, 64)).astype(np.float32)
        self.w = tp.new_tensor("q4_0", (64, 64), "w")
        self.x = tp.new_tensor("f32", (tokens, 64), "x")
        mm = ops.mul_mat(self.w, self.x)
        act = ops.silu(mm)
        self.y = ops.rms_norm(act, 1e-6)
        self.graph = tp.Graph(self.y)
        self.buffer = tp.alloc_tensors([self.w, self.x, mm, act, self.y], backend.buffer_type())
        tp.set_array(self.w, quantize(self.weights, Type.Q4_0))
        self.rng = rng

    def step(self, backend: Any, plan: Any) -> None:
        x = self.rng.standard_normal(self.x.shape).astype(np.float32)
        tp.set_array(self.x, x)
        backend.graph_plan_compute(plan)
        backend.synchronize()
        w = dequantize(quantize(self.weights, Type.Q4_0), Type.Q4_0)
        h = cuda_product(x, w)
        h = h / (1 + np.exp(-h))
        ref = h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(tp.get_array(self.y), ref, rtol=1e-4, atol=1e-4)


def test_a_decode_plan_is_captured_after_one_eager_compute_then_replayed(
    backend: Any, fake: FakeCupy
) -> None:
    decode = Decode(backend)
    plan = backend.graph_plan_create(decode.graph)
    decode.step(backend, plan)  # warm-up: launched one by one
    assert plan.captured is None and fake.state.calls["begin_capture"] == 0
    kernels = len(fake.state.launches)
    for _ in range(3):
        decode.step(backend, plan)  # captured once, then replayed with new inputs
    assert plan.captured is not None and plan.replays == 3
    assert fake.state.calls["begin_capture"] == 1 and fake.state.calls["graph_launch"] == 3
    captured = fake.state.launches[kernels:]
    assert len(captured) == kernels and all(ln.captured for ln in captured)


def test_replanning_after_the_memory_moved_drops_the_captured_graph(
    backend: Any, fake: FakeCupy
) -> None:
    decode = Decode(backend)
    plan = backend.graph_plan_create(decode.graph)
    for _ in range(2):
        decode.step(backend, plan)
    old = plan.captured
    assert decode.buffer is not None
    decode.buffer.free()
    with pytest.raises(tp.BufferFreedError):
        backend.graph_plan_compute(plan)
    moved = Decode(backend)
    backend.graph_plan_update(plan, moved.graph)
    assert plan.captured is None
    for _ in range(2):
        moved.step(backend, plan)
    assert plan.captured is not None and plan.captured is not old


@pytest.mark.parametrize("why", ["cublas", "setting", "volta", "failure"])
def test_plans_fall_back_to_eager_launches(
    monkeypatch: pytest.MonkeyPatch, emulator: PoclEmulator, why: str
) -> None:
    gpu = FakeGPU(major=6, minor=1) if why == "volta" else FakeGPU()
    if why == "setting":
        monkeypatch.setenv("TENSORPLUG_CUDA_GRAPHS", "off")
    fake = FakeCupy(emulator, gpu)
    backend = CUDAReg(fake).devices()[0].init_backend()
    decode = Decode(backend, tokens=64 if why == "cublas" else 1)
    plan = backend.graph_plan_create(decode.graph)
    decode.step(backend, plan)
    if why == "failure":
        fake.state.fail_next_launch = CUDADriverError(1)  # the capture's first launch fails
    for _ in range(2):
        decode.step(backend, plan)  # the results are right whatever happened
    assert plan.captured is None and fake.state.calls["graph_launch"] == 0
    expected = {
        "cublas": "cuBLAS",
        "setting": "TENSORPLUG_CUDA_GRAPHS=0",
        "volta": "Volta",
        "failure": "capture failed (KernelLaunchError",
    }[why]
    assert expected in plan.not_captured
    assert fake.state.calls["begin_capture"] == int(why == "failure")


def test_a_plan_belongs_to_its_backend(fake: FakeCupy) -> None:
    dev = CUDAReg(fake).devices()[0]
    first, second = dev.init_backend(), dev.init_backend()
    decode = Decode(first)
    plan = first.graph_plan_create(decode.graph)
    with pytest.raises(tp.TypeMismatchError, match="made by another backend"):
        second.graph_plan_compute(plan)
    first.graph_plan_free(plan)
    assert plan.steps == []


def test_a_plan_with_index_kernels_reports_bad_indices(backend: Any) -> None:
    table = tp.new_tensor("f32", (4, 8))
    rows = tp.new_tensor("i32", (1,))
    y = ops.get_rows(table, rows)
    tp.alloc_tensors([table, rows, y], backend.buffer_type())
    tp.set_array(table, np.arange(32, dtype=np.float32).reshape(4, 8))
    plan = backend.graph_plan_create(tp.Graph(y))
    for index, ok in [(2, True), (7, False), (3, True)]:  # eager, captured, replayed
        tp.set_array(rows, np.array([index], np.int32))
        backend.graph_plan_compute(plan)
        if ok:
            backend.synchronize()
            np.testing.assert_array_equal(tp.get_array(y)[0], np.arange(8) + 8 * index)
        else:
            with pytest.raises(tp.OutOfBoundsError, match="index 7"):
                backend.synchronize()


# -- few tokens, quantized weights: 8-bit integer products (ggml's mmvq) ---------------------------
# The activations are quantized to Q8_1 blocks in the backend's scratch buffer, then
# k_mvq_* multiplies them with the weights' codes (here tp_dot4_i8's portable fallback,
# not __dp4a); held to the numpy formula of the same computation (mmvq_reference.py).


def _cases() -> Iterator[tuple[Type, int]]:
    for t in MMVQ_TYPES:
        for tokens in (1, 3, 8):
            yield t, tokens


@pytest.mark.parametrize(("wtype", "tokens"), list(_cases()), ids=lambda v: str(v))
def test_few_tokens_use_the_integer_kernels(
    backend: Any, fake: FakeCupy, wtype: Type, tokens: int
) -> None:
    p = Product(backend, wtype, tokens)
    x = p.new_input()
    backend.graph_compute(p.graph)
    p.check(x)
    kernels = [ln.kernel for ln in fake.state.launches]
    assert kernels == ["k_quantize_q8_1", f"k_mvq_{wtype.name.lower()}"]
    assert fake.state.calls["matmul"] == 0


def test_nine_tokens_do_not(backend: Any, fake: FakeCupy) -> None:
    p = Product(backend, Type.Q4_K, 9)
    p.new_input()
    backend.graph_compute(p.graph)
    assert not any("mvq" in ln.kernel or "q8_1" in ln.kernel for ln in fake.state.launches)


def test_a_captured_plan_keeps_its_scratch_when_the_backend_needs_more(
    backend: Any, fake: FakeCupy
) -> None:
    small = Product(backend, Type.Q6_K, 1, k=256)
    plan = backend.graph_plan_create(small.graph)
    for _ in range(3):  # warm-up, capture, replay
        x = small.new_input()
        backend.graph_plan_compute(plan)
        backend.synchronize()
        small.check(x)
    assert plan.captured is not None and plan.replays == 2
    big = Product(backend, Type.Q4_0, 8, k=1024)  # 32 times the scratch: the backend grows
    x_big = big.new_input()
    backend.graph_compute(big.graph)
    backend.synchronize()
    big.check(x_big)
    x = small.new_input()  # the captured graph still reads and writes its own scratch
    backend.graph_plan_compute(plan)
    backend.synchronize()
    small.check(x)
    assert plan.replays == 3

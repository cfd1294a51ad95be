"""The PoCL emulator the CUDA and Metal fakes run their launches on, and the GPU-only
kernels it runs.

An emulated device here keeps tensors in host memory and computes each node by
encoding it as a GPU backend would and running the launches through
:class:`~tensorplug_kernels.emulate.PoclEmulator`; the conformance kit then judges it
against the CPU backend. This checks the emulator, not CUDA or Metal.

The 8-bit integer matrix-vector kernels (ggml's mmvq) are held to an independent numpy
formula of the same computation: a GPU mul_mat with quantized weights and at most 8
tokens quantizes the activations to Q8_1 blocks in the runtime's scratch buffer
(``k_quantize_q8_1``) and multiplies them with the weights' integer codes
(``k_mvq_*``). The reference (tests/mmvq_reference.py) quantizes b in numpy, the
scratch bytes must match it exactly, and the products must equal dequantized a times
dequantized b to float32 rounding. These are the portable bodies PoCL runs, not CUDA's
``__dp4a`` path.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from mmvq_reference import error_bound, q8_1_reference, q8_1_values

import tensorplug as tp
from tensorplug import Type, ops
from tensorplug.graph import Graph
from tensorplug.host import HostBuffer, HostBufferType, host_memory
from tensorplug.quants import dequantize, quantize
from tensorplug.tensor import Tensor
from tensorplug.testing import catalogue, run_cases
from tensorplug_kernels import Limits, scratch_bytes, scratch_capacity, supports
from tensorplug_kernels.emulate import HostRuntimeBuffers, PoclEmulator, pocl_emulator
from tensorplug_kernels.encode import encode
from tensorplug_kernels.encode_math import mm_variant
from tensorplug_kernels.source import MMVQ_TYPES

pytest.importorskip("pyopencl", reason="pyopencl is not installed")

LIMITS = Limits(wg=64, local_mem=32 * 1024, gpu=True, scratch=True)


@pytest.fixture(scope="module")
def emulator() -> PoclEmulator:
    try:
        return pocl_emulator(LIMITS.wg)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))


class _EmulatedBackend(tp.Backend):
    def __init__(self, device: tp.Device, emulator: PoclEmulator) -> None:
        super().__init__(device)
        self.emulator = emulator
        self.runtime = HostRuntimeBuffers()

    def _memory(self, what: object) -> np.ndarray:
        if isinstance(what, str):
            return self.runtime(what)
        assert isinstance(what, Tensor)
        base = what.view_src if what.view_src is not None else what
        assert isinstance(base.buffer, HostBuffer)
        return base.buffer.data

    def _graph_compute(self, graph: Graph) -> tp.Status:
        for node in graph.nodes:
            launches = encode(node, LIMITS)
            self.runtime.reserve(launches)
            for launch in launches:
                self.emulator.run(launch, self._memory)
        return tp.Status.SUCCESS


class _EmulatedDevice(tp.Device):
    def __init__(self, reg: tp.Reg, emulator: PoclEmulator) -> None:
        super().__init__(reg)
        self.emulator = emulator
        self._buft = HostBufferType(self, name="EMU0")

    name = property(lambda self: "EMU0")
    description = property(lambda self: "shared kernels on PoCL, host memory")
    type = property(lambda self: tp.DeviceType.ACCEL)

    def memory(self) -> tuple[int, int]:
        return host_memory()

    def _init_backend(self, params: str | None) -> _EmulatedBackend:
        return _EmulatedBackend(self, self.emulator)

    def buffer_type(self) -> tp.BufferType:
        return self._buft

    def _supports_op(self, op: Tensor) -> bool:
        return supports(op, LIMITS)

    def supports_buft(self, buft: tp.BufferType) -> bool:
        return buft is self._buft


class _EmulatedReg(tp.Reg):
    name = property(lambda self: "EMU")

    def __init__(self, emulator: PoclEmulator) -> None:
        self._devices: list[tp.Device] = [_EmulatedDevice(self, emulator)]

    def devices(self) -> list[tp.Device]:
        return self._devices


@pytest.mark.parametrize(
    "ops",
    [["mul_mat"], ["soft_max", "rope", "rms_norm"], ["get_rows", "set_rows", "cpy"]],
    ids=lambda ops: "+".join(ops),
)
def test_launches_run_on_the_emulator_agree_with_the_cpu_backend(
    emulator: PoclEmulator, ops: list[str]
) -> None:
    backend = _EmulatedReg(emulator).devices()[0].init_backend()
    cpu = tp.registry.init_by_name("CPU")
    before = emulator.launches
    report = run_cases(catalogue(False, ops), backend, cpu)
    failed = [(r.case, r.message) for r in report.results if r.outcome.name == "FAIL"]
    passed = sum(r.outcome.name == "PASS" for r in report.results)
    assert not failed
    assert passed >= 10 and emulator.launches >= before + passed  # the kernels really ran


def test_a_bad_launch_is_refused_before_it_runs(emulator: PoclEmulator) -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        emulator.launch("k_unary", b"", [], (65,), (64,))
    with pytest.raises(TypeError, match="writable 1-D uint8"):
        emulator.launch("k_unary", b"", [np.zeros(4, np.float32)], (64,), (64,))


# -- the 8-bit integer matrix-vector kernels (mmvq) ----------------------------------------


def _host(t: Tensor) -> np.ndarray:
    base = t.view_src if t.view_src is not None else t
    assert isinstance(base.buffer, HostBuffer)
    return base.buffer.data


def _run(emulator: PoclEmulator, node: Tensor, runtime: HostRuntimeBuffers) -> list[str]:
    launches = encode(node, LIMITS)
    runtime.reserve(launches)
    for launch in launches:
        emulator.run(launch, lambda what: runtime(what) if isinstance(what, str) else _host(what))
    return [ln.kernel for ln in launches]


def _cases() -> Iterator[tuple[Type, int]]:
    for t in MMVQ_TYPES:
        for tokens in (1, 3, 8):
            yield t, tokens


@pytest.mark.parametrize(("wtype", "tokens"), list(_cases()), ids=lambda v: str(v))
def test_mmvq_matches_the_q8_1_formula(emulator: PoclEmulator, wtype: Type, tokens: int) -> None:
    rng = np.random.default_rng(7 + tokens)
    n_out, k = 7, 512
    weights = rng.standard_normal((n_out, k)).astype(np.float32)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    x[0, 32:64] = 0.0  # an all-zero block: d = 0, every code 0
    stored = quantize(weights, wtype)
    a, b = tp.new_tensor(wtype, (n_out, k)), tp.new_tensor("f32", (tokens, k))
    y = ops.mul_mat(a, b)
    cpu = tp.registry.init_by_name("CPU")
    assert tp.alloc_tensors([a, b, y], cpu.buffer_type()) is not None
    tp.set_array(a, stored)
    tp.set_array(b, x)
    runtime = HostRuntimeBuffers()
    kernels = _run(emulator, y, runtime)
    assert kernels == ["k_quantize_q8_1", f"k_mvq_{wtype.name.lower()}"]

    d8, s8, codes = q8_1_reference(x)
    blocks = runtime.scratch[: tokens * (k // 32) * 40].reshape(tokens, k // 32, 40)
    np.testing.assert_array_equal(blocks[..., 0:4].copy().view(np.float32)[..., 0], d8)
    np.testing.assert_array_equal(blocks[..., 4:8].copy().view(np.float32)[..., 0], s8)
    np.testing.assert_array_equal(blocks[..., 8:].view(np.int8), codes)

    wa = dequantize(stored, wtype).reshape(n_out, k).astype(np.float64)
    xb = (codes.astype(np.float64) * d8[..., None].astype(np.float64)).reshape(tokens, k)
    got = tp.get_array(y)
    assert np.all(np.abs(got - xb @ wa.T) <= error_bound(xb, wa))


@pytest.mark.parametrize("wtype", [Type.Q4_0, Type.Q4_K, Type.Q6_K])
def test_mmvq_broadcasts_weights_over_batches_and_reads_strided_b(
    emulator: PoclEmulator, wtype: Type
) -> None:
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((2, 6, 256)).astype(np.float32)
    x = rng.standard_normal((3, 4, 256)).astype(np.float32)  # stored (token, batch, K)
    a = tp.new_tensor(wtype, (2, 6, 256))
    base = tp.new_tensor("f32", (3, 4, 256))
    b = ops.permute(base, (1, 0, 2))  # (batch 4, token 3, K): batches 2i, 2i+1 use a[i]
    y = ops.mul_mat(a, b)
    cpu = tp.registry.init_by_name("CPU")
    assert tp.alloc_tensors([a, base, b, y], cpu.buffer_type()) is not None
    stored = np.stack([quantize(w, wtype) for w in weights])
    tp.set_array(a, stored)
    tp.set_array(base, x)
    assert mm_variant(y, LIMITS) == "mmvq"
    _run(emulator, y, HostRuntimeBuffers())
    wa = np.stack([dequantize(s, wtype).reshape(6, 256) for s in stored]).astype(np.float64)
    xs = np.transpose(x, (1, 0, 2))
    d8, _, codes = q8_1_reference(xs)
    xb = (codes.astype(np.float64) * d8[..., None]).reshape(xs.shape)
    ref = np.stack([xb[i] @ wa[i // 2].T for i in range(4)])
    bound = np.stack([error_bound(xb[i], wa[i // 2]) for i in range(4)])
    assert np.all(np.abs(tp.get_array(y) - ref) <= bound)


def test_mmvq_is_chosen_only_where_it_applies() -> None:
    def node(wtype: Type, tokens: int) -> Tensor:
        return ops.mul_mat(tp.new_tensor(wtype, (4, 256)), tp.new_tensor("f32", (tokens, 256)))

    assert mm_variant(node(Type.Q4_K, 8), LIMITS) == "mmvq"
    assert mm_variant(node(Type.Q4_K, 9), LIMITS) != "mmvq"  # a batch: the tiled kernels
    assert mm_variant(node(Type.F16, 1), LIMITS) == "vector"  # float weights: float kernels
    no_scratch = Limits(wg=64, local_mem=32 * 1024, gpu=True)
    assert mm_variant(node(Type.Q4_0, 1), no_scratch) == "vector"  # runtime without scratch
    cpu_like = Limits(wg=64, local_mem=32 * 1024, scratch=True)
    assert mm_variant(node(Type.Q4_0, 1), cpu_like) == "tiled"
    launches = encode(node(Type.Q6_K, 3), LIMITS)
    assert scratch_bytes(launches) == 3 * (256 // 32) * 40
    assert all(ln.scratch == scratch_bytes(launches) for ln in launches)


def test_runtimes_grow_scratch_by_at_least_doubling() -> None:
    assert scratch_capacity(0, 0) == 0
    assert scratch_capacity(1000, 0) == 1000  # the first need, exactly
    assert scratch_capacity(1000, 1000) == 1000  # enough: no new buffer
    assert scratch_capacity(1200, 1000) == 2000  # a little more: double
    assert scratch_capacity(5000, 1000) == 5000  # far more: what is needed
    assert scratch_capacity(10, 1000) == 1000  # never shrinks


def test_a_scratch_buffer_too_small_is_refused(emulator: PoclEmulator) -> None:
    y = ops.mul_mat(tp.new_tensor(Type.Q8_0, (4, 64)), tp.new_tensor("f32", (2, 64)))
    cpu = tp.registry.init_by_name("CPU")
    assert tp.alloc_tensors([*y.src, y], cpu.buffer_type()) is not None
    runtime = HostRuntimeBuffers()  # never reserved: 0 bytes
    launch = encode(y, LIMITS)[0]
    with pytest.raises(ValueError, match="scratch buffer holds 0 bytes"):
        emulator.run(launch, lambda w: runtime(w) if isinstance(w, str) else _host(w))


@pytest.mark.parametrize(
    ("wtype", "btype", "n_out", "k", "tokens"),
    [
        (Type.Q5_K, Type.F16, 5, 256, 2),  # f16 activations, read through load_scalar
        (Type.Q8_0, Type.F32, 8195, 32, 2),  # more rows than MAX_ROW_GROUPS: groups loop
    ],
)
def test_mmvq_takes_f16_activations_and_more_rows_than_groups(
    emulator: PoclEmulator, wtype: Type, btype: Type, n_out: int, k: int, tokens: int
) -> None:
    rng = np.random.default_rng(5)
    stored = quantize(rng.standard_normal((n_out, k)).astype(np.float32), wtype)
    x = rng.standard_normal((tokens, k)).astype(btype.numpy_dtype)
    a, b = tp.new_tensor(wtype, (n_out, k)), tp.new_tensor(btype, (tokens, k))
    y = ops.mul_mat(a, b)
    cpu = tp.registry.init_by_name("CPU")
    assert tp.alloc_tensors([a, b, y], cpu.buffer_type()) is not None
    tp.set_array(a, stored)
    tp.set_array(b, x)
    assert _run(emulator, y, HostRuntimeBuffers())[1] == f"k_mvq_{wtype.name.lower()}"
    wa = dequantize(stored, wtype).reshape(n_out, k).astype(np.float64)
    xb = q8_1_values(x.astype(np.float32))
    assert np.all(np.abs(tp.get_array(y) - xb @ wa.T) <= error_bound(xb, wa))

"""The CUDA plugin's mechanics, run against a fake of cupy — NOT on CUDA.

Registration and scoring run everywhere. The rest drives the plugin's real host code
(devices, buffers, the pinned host buffer type, streams, events, copies between GPUs,
errors, out of memory) with ``tests/fake_cupy.py`` in place of cupy; its kernels run
on PoCL (the shared library's bodies in the portable dialect). That checks what the
plugin asks of CUDA and the numbers its launches produce, not CUDA itself: the tests
that need a GPU are in test_cuda_gpu.py and skip without one.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fake_cupy import CompileException, CUDADriverError, FakeCupy, FakeGPU

import tensorplug as tp
import tensorplug_cuda
from tensorplug import ops
from tensorplug_cuda import probe
from tensorplug_cuda.buffer import CUDABuffer, PinnedHostBuffer
from tensorplug_cuda.device import CUDADevice, pci_address
from tensorplug_cuda.errors import KernelBuildError, KernelLaunchError, OutOfMemoryError
from tensorplug_cuda.program import KernelProgram
from tensorplug_cuda.reg import CUDAReg
from tensorplug_kernels.emulate import PoclEmulator, pocl_emulator

WG = 128  # the fake GPUs' row work-group size (tensorplug_cuda.device.DEFAULT_WG)


@pytest.fixture(scope="module")
def emulator() -> PoclEmulator:
    pytest.importorskip("pyopencl", reason="the fake runs kernels on PoCL: pip install pyopencl")
    try:
        return pocl_emulator(WG)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))


@pytest.fixture
def fake(emulator: PoclEmulator) -> FakeCupy:
    return FakeCupy(emulator, FakeGPU(), FakeGPU(name="Fake GPU 1", pci=(0, 0x66, 0)))


@pytest.fixture
def reg(fake: FakeCupy) -> CUDAReg:
    return CUDAReg(fake)


@pytest.fixture
def backend(reg: CUDAReg) -> Iterator[Any]:
    be = reg.devices()[0].init_backend()
    yield be
    be.free()


def alloc(backend: Any, *tensors: tp.Tensor) -> tp.Buffer:
    buf = tp.alloc_tensors(list(tensors), backend.buffer_type())
    assert buf is not None
    return buf


def device_bytes(fake: FakeCupy, t: tp.Tensor) -> np.ndarray:
    """What the fake GPU holds for ``t`` now (without synchronizing anything)."""
    assert isinstance(t.buffer, CUDABuffer)  # placed in device memory
    return fake.state.device_bytes(t.buffer.ptr + t.offset, t.nbytes)[: t.nbytes]


# -- registration and scoring ------------------------------------------------------------------


def test_importing_and_scoring_the_registration_does_not_import_cupy() -> None:
    code = (
        "import sys, tensorplug_cuda as m; m.score(); "
        "assert 'cupy' not in sys.modules, 'cupy imported'; "
        "assert 'tensorplug_cuda.reg' not in sys.modules; print(m.registration.name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "CUDA"


def test_entry_point_and_registration() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="tensorplug.backends")}
    assert eps.get("cuda") == "tensorplug_cuda:registration"
    reg = tensorplug_cuda.registration
    assert reg.name == "CUDA" and reg.api_version[0] == tp.API_VERSION[0]
    assert reg.init == "tensorplug_cuda.reg:create_reg"


class FakeLibcuda:
    """The four driver API calls the probe makes, answering as told."""

    def __init__(self, init: int = 0, count: int = 1, version: int = 12040) -> None:
        self.init, self.count, self.version = init, count, version

    def cuDriverGetVersion(self, out: Any) -> int:
        out._obj.value = self.version
        return 0

    def cuInit(self, flags: int) -> int:
        return self.init

    def cuDeviceGetCount(self, out: Any) -> int:
        out._obj.value = self.count
        return 0

    def cuGetErrorName(self, code: int, out: Any) -> int:
        out._obj.value = {100: b"CUDA_ERROR_NO_DEVICE"}.get(code, b"CUDA_ERROR_UNKNOWN")
        return 0


def test_score_without_cupy_names_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    value, reason = probe.score(FakeLibcuda)
    assert value == 0 and "tensorplug-cuda[cuda12]" in reason and "[cuda13]" in reason


def test_score_without_a_driver_says_to_install_one() -> None:
    def missing() -> Any:
        raise OSError("libcuda.so.1: cannot open shared object file")

    value, reason = probe.score(missing)
    assert value == 0
    assert "no NVIDIA driver" in reason and "libcuda.so.1" in reason and "install" in reason


@pytest.mark.parametrize(
    ("lib", "expected"),
    [
        (FakeLibcuda(init=100), "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"),
        (FakeLibcuda(count=0), "sees no GPU"),
    ],
)
def test_score_when_the_driver_cannot_start_or_sees_no_gpu(lib: FakeLibcuda, expected: str) -> None:
    value, reason = probe.score(lambda: lib)
    assert value == 0 and expected in reason and "CUDA 12.4" in reason


def test_score_refuses_a_driver_older_than_the_cupy_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "cupy_cuda_major", lambda: 13)
    value, reason = probe.score(lambda: FakeLibcuda(version=12080))
    assert value == 0 and "needs a CUDA 13 driver" in reason
    assert "tensorplug-cuda[cuda12]" in reason


def test_score_counts_the_gpus_the_driver_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "cupy_cuda_major", lambda: 12)
    assert probe.score(lambda: FakeLibcuda(count=2, version=12090)) == (
        10,
        "2 NVIDIA GPU(s), driver for CUDA 12.9 (verified on an NVIDIA H200 and H100 with "
        "CUDA 13; other GPUs: scripts/gpu-check.sh)",
    )


def test_probe_reads_a_real_ctypes_int() -> None:
    count, version, problem = probe.probe_driver(FakeLibcuda(count=3, version=13000))
    assert (count, version, problem) == (3, 13000, "")
    assert isinstance(ctypes.c_int(0), ctypes.c_int)


def test_libcuda_is_loaded_by_its_own_names_and_looked_up_only_off_linux(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: list[str] = []
    lookups: list[str] = []
    present = {"libcuda.so.1"}

    def cdll(name: str) -> str:
        tried.append(name)
        if name not in present:
            raise OSError(f"{name}: cannot open shared object file")
        return name

    def find_library(name: str) -> str:
        lookups.append(name)
        return "/opt/nvidia/libcuda.so.550"

    monkeypatch.setattr(probe.ctypes, "CDLL", cdll)
    import ctypes.util  # the probe imports it only off Linux

    monkeypatch.setattr(ctypes.util, "find_library", find_library)
    monkeypatch.setattr(probe.sys, "platform", "linux")
    assert probe.load_libcuda() == "libcuda.so.1"
    present = set()
    with pytest.raises(OSError, match=r"libcuda\.so\.1: cannot open"):
        probe.load_libcuda()
    assert lookups == []  # no ldconfig subprocess on Linux, found or not
    monkeypatch.setattr(probe.sys, "platform", "freebsd14")
    present, tried[:] = {"/opt/nvidia/libcuda.so.550"}, []
    assert probe.load_libcuda() == "/opt/nvidia/libcuda.so.550"
    assert tried == ["libcuda.so.1", "libcuda.so", "/opt/nvidia/libcuda.so.550"]
    assert lookups == ["cuda"]


def test_doctor_shows_cuda_with_its_score_and_reason() -> None:
    value, reason = tensorplug_cuda.score()
    out = subprocess.run(
        [sys.executable, "-m", "tensorplug", "doctor", "--plain"],
        capture_output=True, text=True, check=True,
        env={**__import__("os").environ, "TENSORPLUG_DISABLE": "OpenCL,Ray"},
    )  # fmt: skip
    row = next(line for line in out.stdout.splitlines() if line.startswith("CUDA "))
    assert "tensorplug-cuda" in row
    if value == 0:  # the CI case: no GPU, the reason is shown
        assert " 0 " in row and "unsupported" in row and reason[:40] in out.stdout
    else:
        assert "loaded" in row


# -- devices --------------------------------------------------------------------------------------


def test_one_device_per_gpu_with_what_the_driver_reports(reg: CUDAReg) -> None:
    d0, d1 = reg.devices()
    assert isinstance(d0, CUDADevice)
    assert (d0.name, d1.name) == ("CUDA0", "CUDA1")
    assert d0.description == "Fake GPU (not CUDA) (compute capability 9.0, 132 SMs)"
    props = d0.props()
    assert props.type is tp.DeviceType.GPU
    assert props.memory_total == 256 * 2**20 and props.memory_free == props.memory_total
    assert props.caps == tp.DeviceCaps(asynchronous=True, host_buffer=True, events=True)
    assert (d0.device_id, d1.device_id) == ("0000:65:00.0", "0000:66:00.0")
    assert d0.info.bandwidth == pytest.approx(2 * 2_619_000e3 * 5120 / 8)
    assert d0.limits.wg == WG and d0.limits.gpu and d0.limits.local_mem == 49152
    feats = reg.features()
    assert feats["CUDA runtime"] == "12.9" and "sm_90" in feats["CUDA0"]
    assert feats["verified"] == probe.VERIFIED_ON


def test_the_pci_id_matches_the_opencl_plugins_for_the_same_gpu(reg: CUDAReg) -> None:
    from tensorplug_opencl.device import _pci_bus_id

    nvidia_opencl = SimpleNamespace(
        extensions="cl_nv_device_attribute_query", pci_bus_id_nv=0x65, pci_slot_id_nv=0
    )
    assert _pci_bus_id(nvidia_opencl) == reg.devices()[0].device_id == pci_address(0, 0x65, 0)

    class SameGpuThroughOpenCL(tp.Device):
        name = property(lambda self: "OpenCL0")
        description = property(lambda self: "the same GPU")
        type = property(lambda self: tp.DeviceType.GPU)
        device_id = property(lambda self: "0000:65:00.0")
        memory = lambda self: (0, 0)  # noqa: E731
        # hooks by_priority never calls, stubbed with the wrong types on purpose
        _init_backend = buffer_type = _supports_op = supports_buft = lambda self, *a: None  # type: ignore[assignment]

    from tensorplug.priority import by_priority

    devices = by_priority([SameGpuThroughOpenCL(), *reg.devices()])
    assert [d.name for d in devices] == ["OpenCL0", "CUDA1"]  # the GPU counted once


def test_supports_op_and_buffer_types(reg: CUDAReg) -> None:
    d0, d1 = reg.devices()
    assert isinstance(d0, CUDADevice)
    w, x = tp.new_tensor("q4_0", (64, 64)), tp.new_tensor("f32", (40, 64))
    assert d0.supports_op(ops.mul_mat(w, x))
    wide = tp.new_tensor("f32", (40, 256))
    assert not d0.supports_op(ops.cpy(wide, tp.new_tensor("q4_k", (40, 256))))  # as ggml
    assert d0.supports_buft(d0.buffer_type()) and not d0.supports_buft(d1.buffer_type())
    assert not d0.supports_buft(d0.host_buffer_type())
    assert not d0.supports_buft(tp.host_buffer_type())
    few = tp.new_tensor("f32", (8, 64))
    assert d0.offload_op(ops.mul_mat(w, x)) and not d0.offload_op(ops.mul_mat(w, few))


# -- buffers --------------------------------------------------------------------------------------


def test_device_buffers_are_aligned_and_round_trip(reg: CUDAReg, fake: FakeCupy) -> None:
    dev = reg.devices()[0]
    buft = dev.buffer_type()
    assert (buft.name, buft.alignment, buft.is_host) == ("CUDA0", 256, False)
    a, b = tp.new_tensor("f32", (3, 5)), tp.new_tensor("i8", (7,))
    buf = tp.alloc_tensors([a, b], buft)
    assert isinstance(buf, CUDABuffer)
    assert buf.ptr % 256 == 0 and b.offset % 256 == 0
    values = np.arange(15, dtype=np.float32).reshape(3, 5)
    tp.set_array(a, values)
    np.testing.assert_array_equal(tp.get_array(a), values)
    tp.tensor_memset(b, 7)
    assert tp.tensor_get(b) == b"\x07" * 7
    buf.clear(0)
    assert not tp.get_array(a).any()
    assert dev.memory()[0] == dev.memory()[1] - buf.size
    buf.free()
    assert dev.memory()[0] == dev.memory()[1]
    with pytest.raises(tp.BufferFreedError):
        tp.tensor_get(a)


def test_copies_between_buffers_of_one_gpu_and_of_two(reg: CUDAReg, fake: FakeCupy) -> None:
    d0, d1 = reg.devices()
    src, same, other = (tp.new_tensor("f32", (64,)) for _ in range(3))
    tp.alloc_tensors([src], d0.buffer_type())
    tp.alloc_tensors([same], d0.buffer_type())
    tp.alloc_tensors([other], d1.buffer_type())
    values = np.linspace(-1, 1, 64, dtype=np.float32)
    tp.set_array(src, values)
    before = fake.state.calls["memcpyPeerAsync"]
    tp.tensor_copy(src, same)
    tp.tensor_copy(src, other)
    np.testing.assert_array_equal(tp.get_array(same), values)
    np.testing.assert_array_equal(tp.get_array(other), values)
    assert fake.state.calls["memcpyPeerAsync"] == before + 1 and (1, 0) in fake.state.peers


def test_out_of_memory_is_recoverable(reg: CUDAReg, backend: Any) -> None:
    dev = reg.devices()[0]
    free, total = dev.memory()
    with pytest.raises(OutOfMemoryError, match="out of memory") as info:
        dev.buffer_type().alloc_buffer(free + 1)
    assert isinstance(info.value, tp.AllocationError) and isinstance(info.value, MemoryError)
    assert dev.memory() == (free, total)  # nothing was taken
    a = tp.new_tensor("f32", (4, 8))
    y = ops.scale(a, 2.0)
    alloc(backend, a, y)
    tp.set_array(a, np.ones((4, 8), np.float32))
    backend.graph_compute(tp.Graph(y))  # the device keeps working
    np.testing.assert_array_equal(tp.get_array(y), np.full((4, 8), 2.0))


def test_pinned_host_buffers_are_host_memory(reg: CUDAReg, fake: FakeCupy) -> None:
    host = reg.devices()[0].host_buffer_type()
    assert host is not None and host is reg.devices()[1].host_buffer_type()
    assert (host.name, host.is_host, host.alignment) == ("CUDA_Host", True, 256)
    t = tp.new_tensor("f32", (2, 3))
    buf = tp.alloc_tensors([t], host)
    assert isinstance(buf, PinnedHostBuffer)
    assert fake.state.calls["hostAlloc"] == 1 and buf.ptr in fake.state.pinned
    tp.set_array(t, np.full((2, 3), 5.0, np.float32))
    assert tp.tensor_array(t).sum() == 30.0  # read in place, as the CPU backend does
    buf.free()
    assert fake.state.calls["freeHost"] == 1 and not fake.state.pinned


# -- streams: asynchronous transfers and events ----------------------------------------------


def test_async_transfers_wait_for_synchronize(backend: Any, fake: FakeCupy) -> None:
    t = tp.new_tensor("f32", (16,))
    alloc(backend, t)
    values = np.arange(16, dtype=np.float32)
    backend.set_tensor_async(t, memoryview(values.tobytes()))
    assert (device_bytes(fake, t) == 0xFF).all()  # queued on the stream, not done
    out = np.zeros(16, np.float32)
    backend.get_tensor_async(t, out.data.cast("B"))
    assert not out.any()
    backend.synchronize()
    np.testing.assert_array_equal(out, values)


def test_graph_compute_async_is_queued_until_synchronize(backend: Any, fake: FakeCupy) -> None:
    a = tp.new_tensor("f32", (4, 4))
    y = ops.neg(a)
    alloc(backend, a, y)
    tp.set_array(a, np.eye(4, dtype=np.float32))
    backend.graph_compute_async(tp.Graph(y))
    assert (device_bytes(fake, y) == 0xFF).all()
    backend.synchronize()
    np.testing.assert_array_equal(tp.get_array(y), -np.eye(4))


def test_events_order_one_stream_after_another(reg: CUDAReg, fake: FakeCupy) -> None:
    dev = reg.devices()[0]
    first, second = dev.init_backend(), dev.init_backend()
    t = tp.new_tensor("f32", (8,))
    alloc(first, t)
    values = np.arange(8, dtype=np.float32)
    event = dev.event_new()
    first.set_tensor_async(t, memoryview(values.tobytes()))
    event.record(first)
    event.wait(second)
    out = np.zeros(8, np.float32)
    second.get_tensor_async(t, out.data.cast("B"))
    second.synchronize()  # only the waiting stream: the event pulls the first one along
    np.testing.assert_array_equal(out, values)
    event.synchronize()
    other = reg.devices()[1].event_new()
    with pytest.raises(tp.UnsupportedError, match="record it on a backend of that device"):
        other.record(first)


def test_copies_between_backends_of_two_gpus_are_ordered(reg: CUDAReg, fake: FakeCupy) -> None:
    b0, b1 = (d.init_backend() for d in reg.devices())
    a = tp.new_tensor("f32", (8, 8))
    y = ops.scale(a, 3.0)
    alloc(b0, a, y)
    z = tp.new_tensor("f32", (8, 8))
    alloc(b1, z)
    tp.set_array(a, np.ones((8, 8), np.float32))
    b0.graph_compute_async(tp.Graph(y))
    tp.tensor_copy_async(b0, b1, y, z)  # queued after the compute on CUDA0's stream
    out = np.zeros((8, 8), np.float32)
    b1.get_tensor_async(z, out.data.cast("B"))
    b1.synchronize()
    np.testing.assert_array_equal(out, np.full((8, 8), 3.0))
    assert fake.state.calls["memcpyPeerAsync"] == 1


def test_tensors_another_gpu_holds_are_refused(reg: CUDAReg) -> None:
    b0 = reg.devices()[0].init_backend()
    a = tp.new_tensor("f32", (4,))
    y = ops.neg(a)
    tp.alloc_tensors([a, y], reg.devices()[1].buffer_type())
    with pytest.raises(tp.UnsupportedError, match="which this GPU's kernels cannot read"):
        b0.graph_compute(tp.Graph(y))


def test_a_gpu_other_than_the_first_computes_with_its_own_context(reg: CUDAReg) -> None:
    b1 = reg.devices()[1].init_backend()  # the fake refuses launches with the wrong GPU current
    a = tp.new_tensor("f32", (3, 3))
    y = ops.exp(a)
    alloc(b1, a, y)
    tp.set_array(a, np.zeros((3, 3), np.float32))
    b1.graph_compute(tp.Graph(y))
    np.testing.assert_array_equal(tp.get_array(y), np.ones((3, 3)))


# -- errors --------------------------------------------------------------------------------------


def test_a_bad_index_is_raised_at_synchronize_and_set_rows_writes_nothing(backend: Any) -> None:
    dst = tp.new_tensor("f32", (4, 8))
    src = tp.new_tensor("f32", (2, 8))
    rows = tp.new_tensor("i32", (2,))
    out = ops.set_rows(dst, src, rows)
    alloc(backend, dst, src, rows)
    tp.view_init(out)
    tp.set_array(dst, np.zeros((4, 8), np.float32))
    tp.set_array(src, np.ones((2, 8), np.float32))
    tp.set_array(rows, np.array([1, 9], np.int32))
    with pytest.raises(tp.OutOfBoundsError, match=r"index 9"):
        backend.graph_compute(tp.Graph(out))
    assert not tp.get_array(dst).any()
    tp.set_array(rows, np.array([1, 2], np.int32))
    backend.graph_compute(tp.Graph(out))  # the error word was cleared
    assert tp.get_array(dst)[1:3].all()


def test_a_failed_launch_names_kernel_geometry_and_node(backend: Any, fake: FakeCupy) -> None:
    a = tp.new_tensor("f32", (4, 300), "activations")
    y = ops.rms_norm(a, 1e-6).set_name("attn_norm")
    alloc(backend, a, y)
    tp.set_array(a, np.ones((4, 300), np.float32))
    fake.state.fail_next_launch = CUDADriverError(701)
    with pytest.raises(KernelLaunchError) as info:
        backend.graph_compute(tp.Graph(y))
    message = str(info.value)
    assert info.value.kernel == "k_norm" and info.value.status == 701
    assert "grid (1, 4, 1) x block (128, 1, 1)" in message and "rms_norm" in message
    assert "attn_norm" in message and "registers" in message
    backend.graph_compute(tp.Graph(y))  # nothing stays broken
    np.testing.assert_allclose(tp.get_array(y), np.ones((4, 300)), rtol=1e-6)


def test_a_compile_error_names_the_kernel_and_keeps_the_log(emulator: PoclEmulator) -> None:
    fake = FakeCupy(emulator)
    log = 'src/elementwise.tpk(90): error: identifier "oops" is undefined\n1 error detected'
    fake.state.compile_error = log
    dev = CUDAReg(fake).devices()[0]
    with pytest.raises(KernelBuildError) as info:
        dev.program  # noqa: B018
    assert info.value.kernel == "k_unary" and info.value.log == log
    assert "src/elementwise.tpk:90" in str(info.value) and "sm_90" in str(info.value)
    assert isinstance(info.value, tp.PluginError)
    assert CompileException.__name__ in repr(info.value.__cause__)


def test_the_program_is_compiled_once_per_gpu_with_the_documented_options(
    reg: CUDAReg, fake: FakeCupy
) -> None:
    d0, d1 = reg.devices()
    assert d0.program is d0.program
    d1.program  # noqa: B018
    assert fake.state.calls["compile"] == 2
    assert isinstance(d0.program, KernelProgram)
    assert d0.program.options == ("--std=c++17", f"-DWG={WG}")
    assert d0.program.text.startswith('#line 1 "dialects/cuda.h"')


def test_cuda_errors_from_the_runtime_become_tensorplug_errors(
    reg: CUDAReg, fake: FakeCupy, caplog: pytest.LogCaptureFixture
) -> None:
    dev = reg.devices()[0]
    t = tp.new_tensor("f32", (4,))
    buf = tp.alloc_tensors([t], dev.buffer_type())
    assert isinstance(buf, CUDABuffer)
    buf.ptr = 12345  # a pointer into nothing: the fake driver's illegal address
    with caplog.at_level(logging.DEBUG), pytest.raises(KernelLaunchError, match="ILLEGAL_ADDRESS"):
        tp.set_array(t, np.zeros(4, np.float32))

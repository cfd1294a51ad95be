"""The OpenCL plugin's mechanics: registration, devices, buffers, streams, events, errors.

Kernel numerics are in test_opencl_ops.py. Tests that need a device skip with the
reason when pyopencl or an OpenCL platform is missing; the scoring tests run anyway.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pytest

import tensorplug as tp
import tensorplug_opencl
from tensorplug import DeviceType, Graph, Type, ops
from tensorplug_opencl import score


def _require_device() -> None:
    pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")
    value, reason = score()
    if value == 0:
        pytest.skip(f"no OpenCL device: {reason}")


@pytest.fixture(scope="module")
def device() -> Any:
    _require_device()
    from tensorplug_opencl.reg import create_reg

    return create_reg().devices()[0]


@pytest.fixture
def backend(device: Any) -> Iterator[Any]:
    be = device.init_backend()
    yield be
    be.free()


def place(buffer: tp.Buffer, *tensors: tp.Tensor) -> None:
    off = 0
    for t in tensors:
        tp.tensor_alloc(buffer, t, off)
        off += -(-max(t.nbytes, 1) // buffer.alignment) * buffer.alignment


class Gate:
    """A user event a queue waits on: work enqueued behind it cannot run until opened.

    A timer opens it anyway after ``guard`` seconds so that a wrongly blocking call
    fails the test (``opened_by_timer``) instead of hanging it.
    """

    def __init__(self, device: Any, guard: float = 20.0) -> None:
        import pyopencl as cl

        self.event = cl.UserEvent(device.context)
        self.opened_by_timer = False
        self._timer = threading.Timer(guard, self._timeout)
        self._timer.start()

    def block(self, backend: Any) -> None:
        import pyopencl as cl

        cl.enqueue_barrier(backend.queue, wait_for=[self.event])

    def _timeout(self) -> None:
        self.opened_by_timer = True
        self.open()

    def open(self) -> None:
        import pyopencl as cl

        self._timer.cancel()
        with contextlib.suppress(cl.Error):  # already opened
            self.event.set_status(cl.command_execution_status.COMPLETE)


# -- registration and scoring -------------------------------------------------------------


def test_importing_the_registration_does_not_import_pyopencl() -> None:
    code = (
        "import sys, tensorplug_opencl as m; "
        "assert 'pyopencl' not in sys.modules, 'pyopencl imported'; "
        "assert 'tensorplug_opencl.reg' not in sys.modules; print(m.registration.name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "OpenCL"


def test_entry_point_and_registration() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="tensorplug.backends")}
    assert eps.get("opencl") == "tensorplug_opencl:registration"
    reg = tensorplug_opencl.registration
    assert reg.name == "OpenCL" and reg.api_version[0] == tp.API_VERSION[0]
    assert reg.api_version[1] <= tp.API_VERSION[1]
    assert reg.init == "tensorplug_opencl.reg:create_reg"


def test_score_is_zero_with_a_reason_without_pyopencl(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    value, reason = score()
    assert value == 0 and "pip install pyopencl" in reason


@pytest.fixture
def drivers_asked_afresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugin's device list forgotten and kept nowhere: score() asks the (fake)
    drivers; forgotten again after, so that later tests ask the real ones."""
    from tensorplug_opencl.listing import DEVICES

    monkeypatch.setenv("TENSORPLUG_DEVICE_CACHE", "0")
    DEVICES.forget()
    yield
    DEVICES.forget()


def _fake_pyopencl(monkeypatch: pytest.MonkeyPatch, get_platforms: Any) -> None:
    import importlib.util

    fake = types.ModuleType("pyopencl")
    fake.get_platforms = get_platforms  # type: ignore[attr-defined]
    fake.Error = RuntimeError  # type: ignore[attr-defined]
    fake.device_type = types.SimpleNamespace(CPU=2, GPU=4)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyopencl", fake)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())


@pytest.mark.usefixtures("drivers_asked_afresh")
def test_score_is_zero_without_a_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_platform() -> list[Any]:
        raise RuntimeError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    _fake_pyopencl(monkeypatch, no_platform)
    value, reason = score()
    assert value == 0
    assert "PLATFORM_NOT_FOUND_KHR" in reason and "pocl-binary-distribution" in reason


@pytest.mark.usefixtures("drivers_asked_afresh")
def test_score_is_zero_when_platforms_have_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    class Platform:
        name = "Empty"

        def get_devices(self) -> list[Any]:
            raise RuntimeError("DEVICE_NOT_FOUND")  # the fake's cl.Error

    _fake_pyopencl(monkeypatch, lambda: [Platform()])
    value, reason = score()
    assert value == 0 and "no devices" in reason and "pocl-binary-distribution" in reason


@pytest.mark.parametrize("bundled_first", [False, True])
def test_the_host_cpu_through_two_pocls_is_listed_once_through_the_newest(
    monkeypatch: pytest.MonkeyPatch, bundled_first: bool
) -> None:
    """pyopencl's bundled PoCL 3.0 (LLVM 14) cannot build for a Zen 5; the distribution's
    PoCL beside it can. The CPU is one device: listed through the newest PoCL, whichever
    platform comes first; the older PoCL's GPU device and other vendors' devices stay."""
    from tensorplug_kernels.opencl_devices import opencl_devices as discover_devices
    from tensorplug_kernels.opencl_devices import pocl_version

    cpu, gpu = 2, 4  # cl.device_type's bits

    class Platform:
        def __init__(self, name: str, version: str, kinds: list[int]) -> None:
            self.name, self.version = name, version
            self.devices = [types.SimpleNamespace(type=k, owner=version) for k in kinds]

        def get_devices(self) -> list[Any]:
            return self.devices

    distro = Platform("Portable Computing Language", "OpenCL 3.0 PoCL 3.1+debian  Linux", [cpu])
    bundled = Platform("Portable Computing Language", "OpenCL 3.0 PoCL 3.0-rc2  Linux",
                       [cpu, gpu])  # fmt: skip
    nvidia = Platform("NVIDIA CUDA", "OpenCL 3.0 CUDA 12.4", [gpu])
    order = [bundled, nvidia, distro] if bundled_first else [distro, bundled, nvidia]
    fake = types.ModuleType("pyopencl")
    fake.get_platforms = lambda: order  # type: ignore[attr-defined]
    fake.Error = RuntimeError  # type: ignore[attr-defined]
    fake.device_type = types.SimpleNamespace(CPU=cpu, GPU=gpu)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyopencl", fake)
    got = [(d.owner, d.type) for d in discover_devices()]
    want = [(p.version, d.type) for p in order for d in p.devices if p is not bundled
            or d.type == gpu]  # fmt: skip
    assert got == want and (distro.version, cpu) in got and (bundled.version, cpu) not in got
    assert pocl_version(distro) == (3, 1) and pocl_version(bundled) == (3, 0)
    assert pocl_version(nvidia) == (0,)
    order.remove(distro)  # one PoCL: its CPU stays, whatever its version
    assert [(d.owner, d.type) for d in discover_devices()].count((bundled.version, cpu)) == 1


def test_score_counts_devices_here() -> None:
    """Each device once: the host CPU through two PoCLs is one."""
    _require_device()
    from tensorplug_kernels.opencl_devices import opencl_devices

    n = len(opencl_devices())
    value, reason = score()
    assert value > 0 and reason.startswith(f"{n} OpenCL device")


# -- devices ----------------------------------------------------------------------------------


def test_one_device_per_opencl_device_with_driver_facts(device: Any) -> None:
    """Every device the platforms list (the host CPU once where two PoCLs reach it: the
    test above), numbered in order, with its driver's facts."""
    import pyopencl as cl

    from tensorplug_opencl.reg import create_reg, discover_devices

    reg = create_reg()
    assert reg is device.reg and reg.name == "OpenCL"
    all_cl = discover_devices()
    every = [d for p in cl.get_platforms() for d in p.get_devices()]
    assert all_cl and all(any(d == e for e in every) for d in all_cl)
    assert [d.name for d in reg.devices()] == [f"OpenCL{i}" for i in range(len(all_cl))]
    for dev, cl_dev in zip(reg.devices(), all_cl, strict=True):
        assert cl_dev.name.strip() in dev.description
        free, total = dev.memory()
        assert total == cl_dev.global_mem_size and 0 <= free <= total
        props = dev.props()
        assert props.caps.asynchronous and props.caps.events
        assert props.device_id is None or isinstance(props.device_id, str)
    assert "pyopencl" in reg.features()


def test_a_device_on_the_host_cpu_is_honestly_a_cpu(device: Any) -> None:
    import pyopencl as cl

    is_cpu = bool(device.cl_device.type & cl.device_type.CPU)
    assert (device.type is DeviceType.CPU) == is_cpu
    if is_cpu:  # never worth "offloading" to the CPU we are already on
        x = tp.new_tensor(Type.F32, (512, 64))
        assert not device.offload_op(ops.mul_mat(tp.new_tensor(Type.F32, (64, 64)), x))


def test_device_type_and_pci_id_from_the_driver() -> None:
    pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    import pyopencl as cl

    from tensorplug_opencl.device import _device_type, _pci_bus_id

    def fake(kind: int, unified: bool = False, **attrs: Any) -> Any:
        return types.SimpleNamespace(type=kind, host_unified_memory=unified, **attrs)

    assert _device_type(fake(cl.device_type.GPU)) is DeviceType.GPU
    assert _device_type(fake(cl.device_type.GPU, unified=True)) is DeviceType.IGPU
    assert _device_type(fake(cl.device_type.CPU)) is DeviceType.CPU
    assert _device_type(fake(cl.device_type.ACCELERATOR)) is DeviceType.ACCEL
    nv = fake(
        cl.device_type.GPU,
        extensions="cl_nv_device_attribute_query",
        pci_bus_id_nv=0x41,
        pci_slot_id_nv=0x00,
        pci_domain_id_nv=0,
    )
    assert _pci_bus_id(nv) == "0000:41:00.0"
    uuid = fake(cl.device_type.GPU, extensions="cl_khr_device_uuid", uuid_khr=list(range(16)))
    assert _pci_bus_id(uuid) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert _pci_bus_id(fake(cl.device_type.CPU, extensions="")) is None


# -- buffers ------------------------------------------------------------------------------------


def test_buffer_type_limits_come_from_the_driver(device: Any) -> None:
    buft = device.buffer_type()
    cl_dev = device.cl_device
    assert buft.name == device.name and not buft.is_host
    assert buft.alignment == max(cl_dev.mem_base_addr_align // 8, 16)
    assert buft.max_size == cl_dev.max_mem_alloc_size
    with pytest.raises(tp.AllocationError, match="holds at most"):
        buft.alloc_buffer(buft.max_size + 1)
    free_before = device.memory()[0]
    buf = buft.alloc_buffer(1 << 20)
    assert device.memory()[0] <= free_before - (1 << 20) or device.info.free_memory_query
    buf.free()
    assert device.memory()[0] == free_before or device.info.free_memory_query
    assert device.supports_buft(buft) and not device.supports_buft(tp.host_buffer_type())


def test_buffer_set_get_memset_clear(device: Any) -> None:
    buf = device.buffer_type().alloc_buffer(4096)
    a, b = tp.new_tensor(Type.F32, (4, 8)), tp.new_tensor(Type.I8, (100,))
    place(buf, a, b)
    buf.clear(7)
    assert tp.tensor_get(b) == bytes([7]) * 100
    vals = np.arange(32, dtype=np.float32).reshape(4, 8)
    tp.set_array(a, vals)
    assert (tp.get_array(a) == vals).all()
    tp.tensor_set(a, np.array([-1, -2], np.float32), offset=8)
    tp.tensor_memset(b, 0xFF, offset=10, size=5)
    assert tp.get_array(a).reshape(-1)[:5].tolist() == [0, 1, -1, -2, 4]
    assert tp.tensor_get(b, 8, 9) == bytes([7, 7, 255, 255, 255, 255, 255, 7, 7])
    buf.free()
    with pytest.raises(tp.BufferFreedError, match="lives in buffer 'OpenCL0', which was freed"):
        tp.tensor_get(b)


def test_device_side_copy_between_buffers(device: Any) -> None:
    b1, b2 = (device.buffer_type().alloc_buffer(1024) for _ in range(2))
    src, dst, near = (tp.new_tensor(Type.F32, (16,)) for _ in range(3))
    place(b1, src, near)
    place(b2, dst)
    vals = np.linspace(-1, 1, 16, dtype=np.float32)
    tp.set_array(src, vals)
    assert b2.cpy_tensor(src, dst) is True
    assert (tp.get_array(dst) == vals).all()
    overlap = tp.Tensor(Type.F32, (16,))
    tp.tensor_alloc(b1, overlap, 0)  # the same bytes as src: OpenCL refuses, we decline
    assert b1.cpy_tensor(src, overlap) is False
    host = tp.new_tensor(Type.F32, (16,))
    tp.tensor_alloc(tp.host_buffer_type().alloc_buffer(64), host, 0)
    assert b2.cpy_tensor(host, dst) is False  # not ours: the caller goes through the host


# -- streams, events, plans -----------------------------------------------------------------------


def test_async_transfers_return_before_the_queue_runs(device: Any, backend: Any) -> None:
    buf = device.buffer_type().alloc_buffer(1024)
    t = tp.new_tensor(Type.F32, (64,))
    place(buf, t)
    vals = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    gate = Gate(device)
    gate.block(backend)
    tp.tensor_set_async(backend, t, vals)
    tp.tensor_get_async(backend, t, out)
    assert not out.any()  # nothing ran: both calls only enqueued
    gate.open()
    backend.synchronize()
    assert not gate.opened_by_timer and (out == vals).all()


def test_graph_compute_enqueues_everything_and_returns(device: Any, backend: Any) -> None:
    a = tp.new_tensor(Type.F32, (8, 32))
    y = ops.silu(ops.scale(a, 2.0))
    graph = Graph(y)
    buf = device.buffer_type().alloc_buffer(8192)
    place(buf, a, *graph.nodes)
    vals = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    tp.set_array(a, vals)
    tp.tensor_memset(y, 0)
    gate = Gate(device)
    gate.block(backend)
    assert backend.graph_compute_async(graph) is tp.Status.SUCCESS
    assert not tp.get_array(y).any()  # queued behind the gate, not run
    gate.open()
    backend.synchronize()
    ref = 2.0 * vals.astype(np.float64)
    assert not gate.opened_by_timer
    np.testing.assert_allclose(tp.get_array(y), ref / (1 + np.exp(-ref)), rtol=1e-6)


def test_events_order_work_across_backends(device: Any) -> None:
    producer, consumer = device.init_backend(), device.init_backend()
    buf = device.buffer_type().alloc_buffer(1024)
    t = tp.new_tensor(Type.I32, (32,))
    place(buf, t)
    vals = np.arange(32, dtype=np.int32) * 3
    out = np.zeros(32, np.int32)
    event = device.event_new()
    gate = Gate(device)
    gate.block(producer)
    tp.tensor_set_async(producer, t, vals)
    event.record(producer)
    event.wait(consumer)  # the consumer's read must not overtake the producer's write
    tp.tensor_get_async(consumer, t, out)
    gate.open()
    consumer.synchronize()
    assert (out == vals).all()
    event.synchronize()
    event.free()
    foreign = tp.Event(types.SimpleNamespace(name="X", context=None))  # type: ignore[arg-type]
    with pytest.raises(tp.UnsupportedError, match="belongs to device"):
        producer.event_record(foreign)
    producer.free()
    consumer.free()


def test_cpy_tensor_async_between_backends(device: Any) -> None:
    be1, be2 = device.init_backend(), device.init_backend()
    b1, b2 = (device.buffer_type().alloc_buffer(1024) for _ in range(2))
    src, dst = tp.new_tensor(Type.F16, (40,)), tp.new_tensor(Type.F16, (40,))
    place(b1, src)
    place(b2, dst)
    vals = np.linspace(0, 4, 40).astype(np.float16)
    gate = Gate(device)
    gate.block(be1)
    tp.tensor_set_async(be1, src, vals)
    assert be2.cpy_tensor_async(be1, src, dst) is True
    gate.open()
    be2.synchronize()
    assert (tp.get_array(dst) == vals).all()
    be1.free()
    be2.free()


def test_graph_plan_binds_arguments_once_and_updates(device: Any, backend: Any) -> None:
    a, b = tp.new_tensor(Type.F32, (4, 16)), tp.new_tensor(Type.F32, (16,))
    y1, y2 = ops.add(a, b), ops.mul(a, b)
    buf = device.buffer_type().alloc_buffer(8192)
    place(buf, a, b, y1, y2)
    va = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    vb = np.random.default_rng(2).standard_normal(16).astype(np.float32)
    tp.set_array(a, va)
    tp.set_array(b, vb)
    plan = backend.graph_plan_create(Graph(y1))
    assert [step.kernel for step in plan.steps] == ["k_binary"]
    assert backend.graph_plan_compute(plan) is tp.Status.SUCCESS
    backend.synchronize()
    assert (tp.get_array(y1) == va + vb).all()
    tp.set_array(a, va * 2)  # the plan reads the memory it was bound to
    backend.graph_plan_compute(plan)
    backend.synchronize()
    assert (tp.get_array(y1) == va * 2 + vb).all()
    backend.graph_plan_update(plan, Graph(y2))
    backend.graph_plan_compute(plan)
    backend.synchronize()
    assert (tp.get_array(y2) == va * 2 * vb).all()
    backend.graph_plan_free(plan)
    other = device.init_backend()
    with pytest.raises(tp.TypeMismatchError, match="another backend"):
        other.graph_plan_compute(plan)
    other.free()


# -- what is supported, and errors -------------------------------------------------------------


def test_supports_op_follows_types_and_layouts(device: Any) -> None:
    f32, q8 = tp.new_tensor(Type.F32, (4, 64)), tp.new_tensor(Type.Q8_0, (4, 64))
    i32 = tp.new_tensor(Type.I32, (4, 64))
    assert device.supports_op(ops.mul_mat(q8, f32))
    assert device.supports_op(ops.get_rows(q8, tp.new_tensor(Type.I32, (3,))))
    assert device.supports_op(ops.cpy(f32, tp.new_tensor(Type.Q4_1, (4, 64))))
    assert device.supports_op(ops.transpose(f32))  # views need no kernel
    # built by hand, past the builders' checks: things no kernel here does
    int_to_float = tp.Tensor(Type.F32, (4, 64), op=tp.Op.CPY, src=(i32, f32))
    assert not device.supports_op(int_to_float)
    strided_q = tp.Tensor(Type.Q8_0, (4, 64), strides=(34 * 2, 68))
    bad_mm = tp.Tensor(Type.F32, (4, 4), op=tp.Op.MUL_MAT, src=(strided_q, f32))
    assert not device.supports_op(bad_mm)
    glm_rope = tp.Tensor(
        Type.F32,
        (2, 3, 8),
        op=tp.Op.ROPE,
        src=(tp.new_tensor(Type.F32, (2, 3, 8)), tp.new_tensor(Type.I32, (2,))),
        op_params={"mode": 4, "n_dims": 8},
    )
    assert not device.supports_op(glm_rope)
    unknown_fn = tp.Tensor(Type.F32, (4, 64), op=tp.Op.UNARY, src=(f32,), op_params={"fn": "elu"})
    assert not device.supports_op(unknown_fn)


def test_tensors_outside_device_memory_are_refused(device: Any, backend: Any) -> None:
    a = tp.new_tensor(Type.F32, (8,))
    y = ops.neg(a)
    tp.tensor_alloc(tp.host_buffer_type().alloc_buffer(64), a, 0)
    place(device.buffer_type().alloc_buffer(64), y)
    with pytest.raises(tp.UnsupportedError, match="lives in buffer 'CPU'"):
        backend.graph_compute(Graph(y))


def test_build_failure_names_the_kernel_and_carries_the_log(device: Any) -> None:
    from tensorplug_kernels.source import Source, body_sources
    from tensorplug_opencl.errors import KernelBuildError
    from tensorplug_opencl.program import KernelProgram

    broken = Source(
        "src/broken.tpk",
        "typedef struct {\n    tp_tensor x;\n} k_broken_args;\n"
        "TP_KERNEL k_broken(TP_ARGS(k_broken_args), TP_BUFFER(x, 1) TP_IDS) {\n"
        "    TP_UNPACK(x);\n    *(TP_GLOBAL float *)x_p = no_such_value;\n}\n",
    )
    sources = (*body_sources()[:1], broken)
    with pytest.raises(KernelBuildError) as info:
        KernelProgram(device.context, device.cl_device, ["-DWG=64"], sources)
    err = info.value
    assert err.kernel == "k_broken (src/broken.tpk:6)"
    assert "k_broken" in str(err) and "no_such_value" in err.log
    assert isinstance(err, tp.PluginError)


def test_a_compiler_that_cannot_name_the_cpu_says_how_to_get_one_that_can(
    device: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PoCL 3.0 bundled in pyopencl's wheel (LLVM 14) names a CPU newer than its LLVM
    "generic" and then refuses that name: every build failed on a Zen 5 EPYC with only
    the log's line. The error now says which driver and what to install; other build
    failures say nothing of the kind."""
    from tensorplug_kernels.runtime import BuildFailed
    from tensorplug_opencl.errors import KernelBuildError
    from tensorplug_opencl.program import KernelProgram

    def refuse(self: KernelProgram, text: str, name: str | None) -> Any:
        raise BuildFailed(log)

    monkeypatch.setattr(KernelProgram, "_compile", refuse)
    log = "error: unknown target CPU 'generic'\nDevice pthread-AMD EPYC failed to build"
    with pytest.raises(KernelBuildError) as info:
        KernelProgram(device.context, device.cl_device, ["-DWG=64"])
    assert "unknown target CPU 'generic'" in str(info.value) and info.value.log == log
    assert "apt-get install pocl-opencl-icd" in str(info.value)
    log = "error: use of undeclared identifier 'no_such_value'"
    with pytest.raises(KernelBuildError) as info:
        KernelProgram(device.context, device.cl_device, ["-DWG=64"])
    assert "pocl-opencl-icd" not in str(info.value)


@pytest.mark.parametrize("weights", [Type.F16, Type.Q4_0])
def test_the_portable_build_computes_the_same(device: Any, backend: Any, weights: Type) -> None:
    """Kernels built without clang's unaligned-vector typedefs (as for a compiler that
    lacks them: vload8 and convert_T8 instead) give the same bits."""
    import pyopencl as cl

    from tensorplug.quants import quantize
    from tensorplug_kernels.encode import encode
    from tensorplug_opencl.device import build_options
    from tensorplug_opencl.program import KernelProgram

    options = [*build_options(device.info), "-DTP_PORTABLE"]
    portable = KernelProgram(device.context, device.cl_device, options)
    rng = np.random.default_rng(3)
    a, b = tp.new_tensor(weights, (16, 64)), tp.new_tensor(Type.F32, (5, 64))
    d = ops.mul_mat(a, b)
    place(device.buffer_type().alloc_buffer(16384), a, b, d)
    w = rng.standard_normal(a.shape).astype(np.float32)
    tp.set_array(a, w.astype(np.float16) if weights == Type.F16 else quantize(w, weights))
    tp.set_array(b, rng.standard_normal(b.shape).astype(np.float32))
    backend.graph_compute(Graph(d))
    want = tp.get_array(d)
    tp.tensor_memset(d, 0)
    for launch in encode(d, device.limits):
        kernel = portable.kernel(launch.kernel)
        data, buffers = backend.arguments(launch, d, {})
        kernel.set_args(data, *buffers)
        cl.enqueue_nd_range_kernel(backend.queue, kernel, launch.global_size, launch.local_size)
    backend.synchronize()
    assert want.any() and (tp.get_array(d) == want).all()


def test_driver_errors_become_tensorplug_errors() -> None:
    pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    import pyopencl as cl

    from tensorplug_opencl.errors import (
        DeviceOutOfResourcesError,
        KernelLaunchError,
        translate,
    )

    class FakeError(Exception):
        def __init__(self, code: int) -> None:
            super().__init__(f"code {code}")
            self.code = code

    oom = translate(
        FakeError(cl.status_code.OUT_OF_RESOURCES), "k_mm_f32_4 for x", kernel="k_mm_f32_4"
    )
    assert isinstance(oom, DeviceOutOfResourcesError) and isinstance(oom, tp.AllocationError)
    # asserted above: a DeviceOutOfResourcesError, whose kernel is read (isinstance
    # narrows oom to AllocationError only, where the plugin's class is not visible to mypy)
    kernel = cast(DeviceOutOfResourcesError, oom).kernel
    assert kernel == "k_mm_f32_4" and "OUT_OF_RESOURCES" in str(oom)
    other = translate(FakeError(cl.status_code.INVALID_WORK_GROUP_SIZE), "k_norm", kernel="k_norm")
    assert isinstance(other, KernelLaunchError) and "INVALID_WORK_GROUP_SIZE" in str(other)


def test_a_failed_launch_names_kernel_and_node(
    device: Any, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorplug_kernels import Launch
    from tensorplug_kernels.runtime import backend as backend_mod
    from tensorplug_opencl.errors import KernelLaunchError

    a = tp.new_tensor(Type.F32, (8,))
    y = ops.neg(a).set_name("negated")
    place(device.buffer_type().alloc_buffer(1024), a, y)
    real = backend_mod.encode

    def bad_geometry(node: tp.Tensor, limits: Any) -> list[Launch]:
        launch = real(node, limits)[0]  # a global size the local size does not divide
        return [Launch(launch.kernel, (limits.wg + 1, 1), launch.local_size, launch.args)]

    monkeypatch.setattr(backend_mod, "encode", bad_geometry)
    with pytest.raises(KernelLaunchError, match=r"k_unary .* node 'negated'") as info:
        backend.graph_compute(Graph(y))
    assert info.value.kernel == "k_unary"


def test_the_registry_finds_opencl_but_prefers_the_cpu_backend() -> None:
    _require_device()
    code = (
        "import tensorplug as tp\n"
        "from tensorplug import registry\n"
        "registry.load_all()\n"
        "names = [d.name for d in registry.devices()]\n"
        "print(','.join(names))\n"
        "be = registry.init_best(); print(be.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, best = out.stdout.split()
    assert "OpenCL0" in names.split(",")
    if "CPU" in names.split(","):
        assert best == "CPU"  # a CPU-type OpenCL device never beats the CPU backend

"""The WebGPU plugin on a real WebGPU adapter (CI: Mesa's lavapipe, software Vulkan).

Registration and devices, buffers (word-aligned WebGPU copies under tensorplug's byte
offsets), binding windows over large buffers, the bind-group cache and graph plans,
the error word, and every error path (WGSL build errors mapped to the kernel, out of
memory, a lost device). The op catalogue runs in test_webgpu_conformance.py.

Without an adapter the tests skip with the reason; with ``CI=true`` a missing adapter
fails the module instead (the README's test command installs mesa-vulkan-drivers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Graph, Type, ops

pytest.importorskip("wgpu", reason="wgpu is not installed (pip install wgpu)")

from tensorplug_webgpu import score

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
if score()[0] == 0:
    if IN_CI:
        pytest.fail(f"CI=true but WebGPU cannot run here: {score()[1]}", pytrace=False)
    pytest.skip(f"no WebGPU adapter: {score()[1]}", allow_module_level=True)


@pytest.fixture(scope="module")
def device() -> Any:
    from tensorplug_webgpu.reg import create_reg

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


def test_score_names_the_adapter_and_its_api() -> None:
    value, reason = score()
    assert value > 0
    assert "WebGPU adapter(s)" in reason and any(
        api in reason for api in ("Vulkan", "Metal", "D3D12")
    )


def test_device_facts_come_from_the_adapter(device: Any) -> None:
    assert device.name == "WebGPU0"
    assert device.info["backend_type"] in ("Vulkan", "Metal", "D3D12")
    assert device.info["backend_type"] in device.description
    if device.info["adapter_type"] == "CPU":  # lavapipe: honestly a CPU-type device
        assert device.type is tp.DeviceType.CPU
        assert not device.offload_op(ops.add(*(tp.new_tensor(Type.F32, (64, 64)),) * 2))
    lim = device.wgpu_limits
    assert lim["max-buffer-size"] - 4 < device.buffer_type().max_size <= lim["max-buffer-size"]
    assert device.binding_window <= lim["max-storage-buffer-binding-size"]
    free, total = device.memory()
    assert 0 < free <= total


def test_the_registry_prefers_the_cpu_backend_over_a_software_adapter() -> None:
    code = (
        "from tensorplug import registry\n"
        "registry.load_all()\n"
        "devs = {d.name: d.type.name for d in registry.devices()}\n"
        "print(devs.get('WebGPU0'), registry.init_best().name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    kind, best = out.stdout.split()
    if kind == "CPU":
        assert best == "CPU"


def test_buffer_set_get_memset_at_unaligned_offsets(device: Any) -> None:
    buf = device.buffer_type().alloc_buffer(4096)
    a, b = tp.new_tensor(Type.F32, (4, 8)), tp.new_tensor(Type.I8, (100,))
    place(buf, a, b)
    buf.clear(7)
    assert tp.tensor_get(b) == bytes([7]) * 100
    vals = np.arange(32, dtype=np.float32).reshape(4, 8)
    tp.set_array(a, vals)
    assert (tp.get_array(a) == vals).all()
    tp.tensor_set(a, np.array([-1, -2], np.float32), offset=8)
    tp.tensor_memset(b, 0xFF, offset=10, size=5)  # bytes 10..14: inside words 2 and 3
    tp.tensor_set(b, bytes([1, 2, 3]), offset=1)
    assert tp.get_array(a).reshape(-1)[:5].tolist() == [0, 1, -1, -2, 4]
    assert tp.tensor_get(b, 0, 16) == bytes([7, 1, 2, 3, 7, 7, 7, 7, 7, 7] + [255] * 5 + [7])
    buf.free()


def test_device_side_copy_whole_words_and_odd_bytes(device: Any) -> None:
    b1, b2 = (device.buffer_type().alloc_buffer(1024) for _ in range(2))
    src, dst = tp.new_tensor(Type.F32, (16,)), tp.new_tensor(Type.F32, (16,))
    place(b1, src)
    place(b2, dst)
    vals = np.linspace(-1, 1, 16, dtype=np.float32)
    tp.set_array(src, vals)
    assert b2.cpy_tensor(src, dst) is True
    assert (tp.get_array(dst) == vals).all()
    # views start at any byte: such copies go through the host, edge words kept
    device.write(b1.mem, 101, memoryview(bytes([9, 8, 7, 6, 5])))
    device.copy_bytes(b1.mem, 101, b2.mem, 203, 5)
    out = bytearray(8)
    device.read(b2.mem, 202, memoryview(out))
    assert bytes(out) == bytes([0, 9, 8, 7, 6, 5, 0, 0])


def test_f16_outputs_keep_their_neighbours(device: Any, backend: Any) -> None:
    """Two work-items write the two halves of each word: the atomic variant keeps both."""
    a = tp.new_tensor(Type.F16, (3, 37))
    y = ops.scale(a, 0.5)
    buf = device.buffer_type().alloc_buffer(1 << 16)
    place(buf, a, y)
    vals = np.random.default_rng(3).standard_normal((3, 37)).astype(np.float16)
    tp.set_array(a, vals)
    backend.graph_compute(Graph(y))
    np.testing.assert_array_equal(tp.get_array(y), vals * np.float16(0.5))


def test_bind_groups_are_cached_and_plans_replay(device: Any, backend: Any) -> None:
    a, b = tp.new_tensor(Type.F32, (4, 16)), tp.new_tensor(Type.F32, (16,))
    y1, y2 = ops.add(a, b), ops.mul(a, b)
    buf = device.buffer_type().alloc_buffer(8192)
    place(buf, a, b, y1, y2)
    va = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    vb = np.random.default_rng(2).standard_normal(16).astype(np.float32)
    tp.set_array(a, va)
    tp.set_array(b, vb)
    backend.graph_compute(Graph(y1))
    cached = dict(backend.bind_groups)
    backend.graph_compute(Graph(y1))
    assert backend.bind_groups == cached  # the same launch found its bind group
    plan = backend.graph_plan_create(Graph(y1))
    assert [step.kernel for step in plan.steps] == ["k_binary"]
    assert plan.steps[0].call[1] is next(iter(cached.values()))
    tp.set_array(a, va * 2)  # the plan reads the memory it was bound to
    backend.graph_plan_compute(plan)
    backend.synchronize()
    assert (tp.get_array(y1) == va * 2 + vb).all()
    backend.graph_plan_update(plan, Graph(y2))
    backend.graph_plan_compute(plan)
    backend.synchronize()
    assert (tp.get_array(y2) == va * 2 * vb).all()
    buf.free()
    assert not backend.bind_groups  # nothing stays bound to freed memory


def test_buffers_larger_than_a_binding_are_bound_per_tensor(
    device: Any, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device, "binding_window", 1024)  # as if the limit were 1 KiB
    buf = device.buffer_type().alloc_buffer(8192)
    a, b = (tp.new_tensor(Type.F32, (200,)) for _ in range(2))  # 800 bytes each
    tp.tensor_alloc(buf, a, 256)  # a, b and their sum far apart in the buffer
    tp.tensor_alloc(buf, b, 3072)
    va, vb = np.arange(200, dtype=np.float32), np.float32(100) - np.arange(200, dtype=np.float32)
    tp.set_array(a, va)
    tp.set_array(b, vb)
    out = ops.add(a, b)
    tp.tensor_alloc(buf, out, 7168)
    backend.graph_compute(Graph(out))
    assert (tp.get_array(out) == va + vb).all()
    assert buf.binding(7168, 800) == ((buf.mem, 7168, 1024), -7168)
    big = tp.new_tensor(Type.F32, (300,))  # 1200 bytes: more than one binding
    tp.tensor_alloc(buf, big, 4096)
    scaled = ops.scale(big, 2.0)
    assert not device.supports_op(scaled)  # the scheduler places it elsewhere
    tp.tensor_alloc(buf, scaled, 5376)
    with pytest.raises(tp.UnsupportedError, match="does not fit one binding"):
        backend.graph_compute(Graph(scaled))


def test_a_bad_row_index_is_reported_at_synchronize(device: Any, backend: Any) -> None:
    table, rows = tp.new_tensor(Type.F32, (4, 8)), tp.new_tensor(Type.I32, (2,))
    y = ops.get_rows(table, rows)
    buf = device.buffer_type().alloc_buffer(4096)
    place(buf, table, rows, y)
    tp.set_array(table, np.arange(32, dtype=np.float32).reshape(4, 8))
    tp.set_array(rows, np.array([1, 9], np.int32))
    with pytest.raises(tp.OutOfBoundsError, match="index 9"):
        backend.graph_compute(Graph(y))
    tp.set_array(rows, np.array([3, 0], np.int32))
    backend.graph_compute(Graph(y))  # the error word was cleared
    assert tp.get_array(y)[0].tolist() == list(range(24, 32))


def test_wgsl_errors_name_the_kernel_and_its_file_line(device: Any) -> None:
    from tensorplug_kernels.runtime import KernelBuildError
    from tensorplug_webgpu.wgsl import kernel_source, wgsl_kernels

    text = kernel_source("k_norm", 64, False).replace("var mean = 0.0f;", "var mean = nope;")
    with pytest.raises(KernelBuildError) as err:
        device.program.compile(text, "k_norm")
    kernel = wgsl_kernels()["k_norm"]
    line = kernel.line + kernel.body[: kernel.body.index("var mean")].count("\n")
    assert err.value.kernel == "k_norm"
    assert f"kernels/rows.wgsl:{line}:" in str(err.value) and "nope" in err.value.log


def test_out_of_memory_is_recoverable(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import wgpu

    keep = device.buffer_type().alloc_buffer(64)
    tp.tensor_alloc(keep, t := tp.new_tensor(Type.F32, (4,)), 0)
    tp.set_array(t, np.array([1, 2, 3, 4], np.float32))

    def refuse(**kwargs: Any) -> Any:
        raise wgpu.GPUOutOfMemoryError("Out of memory")  # what the driver says when full

    with monkeypatch.context() as m:
        m.setattr(device.gpu, "create_buffer", refuse)
        with pytest.raises(tp.AllocationError, match="out of memory"):
            device.buffer_type().alloc_buffer(1 << 20)
    assert tp.get_array(t).tolist() == [1, 2, 3, 4]  # nothing stored changed
    device.buffer_type().alloc_buffer(64).free()  # and the device goes on


def test_wgpu_errors_become_tensorplug_errors() -> None:
    import wgpu

    from tensorplug_kernels.runtime import DeviceOutOfMemoryError, KernelLaunchError
    from tensorplug_webgpu.errors import DeviceLostError, translate

    oom = translate(wgpu.GPUOutOfMemoryError("Out of memory"), "WebGPU0: allocating")
    assert isinstance(oom, DeviceOutOfMemoryError) and "nothing stored was changed" in str(oom)
    lost = translate(wgpu.GPUValidationError("Parent device is lost"), "WebGPU0: launching")
    assert isinstance(lost, DeviceLostError) and "Restart the process" in str(lost)
    other = translate(wgpu.GPUValidationError("bad"), "WebGPU0: x", kernel="k_norm")
    assert isinstance(other, KernelLaunchError) and not isinstance(other, DeviceLostError)
    assert other.kernel == "k_norm"


def test_a_headless_process_lists_the_adapter_without_wayland_noise(tmp_path: Any) -> None:
    # Without XDG_RUNTIME_DIR, Mesa's device-select layer made libwayland print an error
    # line on stderr for every command that listed adapters.
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "NODEVICE_SELECT")}
    env["TENSORPLUG_DEVICE_CACHE"] = "0"  # the adapters listed in this process, not read
    code = "from tensorplug_webgpu.reg import create_reg; print(len(create_reg().devices()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 1
    assert "XDG_RUNTIME_DIR" not in out.stderr


def test_device_select_is_skipped_only_where_it_could_not_work(tmp_path: Any) -> None:
    from tensorplug_webgpu.adapters import skip_device_select

    headless: dict[str, str] = {}
    assert skip_device_select(headless) and headless == {"NODEVICE_SELECT": "1"}
    missing_dir = {"XDG_RUNTIME_DIR": str(tmp_path / "gone")}
    assert skip_device_select(missing_dir) and missing_dir["NODEVICE_SELECT"] == "1"
    desktop = {"XDG_RUNTIME_DIR": str(tmp_path)}
    assert not skip_device_select(desktop) and "NODEVICE_SELECT" not in desktop
    for chosen in ("MESA_VK_DEVICE_SELECT", "DRI_PRIME", "NODEVICE_SELECT"):
        env = {chosen: "0"}
        assert not skip_device_select(env) and env == {chosen: "0"}

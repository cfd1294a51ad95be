"""The Metal plugin's mechanics, run against a fake of pyobjc's Metal — NOT on Metal.

Registration and scoring run everywhere. The rest drives the plugin's real host code
(devices, shared buffers, mapped weights, command buffers, blits, shared events,
ownership metadata, errors) with ``tests/fake_metal.py`` in place of pyobjc; its
dispatches run on PoCL (the shared library's bodies in the portable dialect). That
checks what the plugin asks of Metal and the numbers its dispatches produce, not Metal
itself: the plugin is not verified on Apple hardware until ``scripts/metal-check.sh``
has run on a Mac.
"""

from __future__ import annotations

import gc
import itertools
import mmap
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_metal import FakeDeviceSpec, FakeMetal, FakeObjC

import tensorplug as tp
import tensorplug_metal
from tensorplug import ops
from tensorplug_kernels.emulate import PoclEmulator, pocl_emulator
from tensorplug_kernels.runtime.mapped import MappedBuffer, view_ranges
from tensorplug_metal import buffer as metal_buffer
from tensorplug_metal import ownership, probe
from tensorplug_metal.errors import CommandBufferError, KernelBuildError, KernelLaunchError
from tensorplug_metal.reg import MetalReg

PLUGIN = Path(tensorplug_metal.__file__).parent


@pytest.fixture(scope="module")
def emulator() -> PoclEmulator:
    pytest.importorskip("pyopencl", reason="the fake runs kernels on PoCL: pip install pyopencl")
    try:
        return pocl_emulator(128)
    except tp.BackendUnavailableError as e:
        pytest.skip(str(e))


def make_reg(emulator: PoclEmulator, *specs: FakeDeviceSpec) -> tuple[MetalReg, FakeMetal]:
    objc = FakeObjC()
    fake = FakeMetal(emulator, objc, *specs)
    return MetalReg(fake, objc), fake


@pytest.fixture
def reg_fake(emulator: PoclEmulator) -> tuple[MetalReg, FakeMetal]:
    return make_reg(emulator)


@pytest.fixture
def backend(reg_fake: tuple[MetalReg, FakeMetal]) -> Iterator[Any]:
    be = reg_fake[0].devices()[0].init_backend()
    yield be
    be.free()


def alloc(backend: Any, *tensors: tp.Tensor) -> Any:
    buf = tp.alloc_tensors(list(tensors), backend.buffer_type())
    assert buf is not None
    return buf


# -- registration and scoring ------------------------------------------------------------------


def test_importing_and_scoring_the_registration_imports_no_pyobjc() -> None:
    code = (
        "import sys, tensorplug_metal as m; print(m.score()[0]); "
        "assert 'objc' not in sys.modules and 'Metal' not in sys.modules, 'pyobjc imported'; "
        "assert 'tensorplug_metal.reg' not in sys.modules; print(m.registration.name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    value, name = out.stdout.split()
    assert name == "Metal" and (value == "0" or sys.platform == "darwin")


def test_entry_point_and_registration() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="tensorplug.backends")}
    assert eps.get("metal") == "tensorplug_metal:registration"
    reg = tensorplug_metal.registration
    assert reg.name == "Metal" and reg.api_version[0] == tp.API_VERSION[0]
    assert "not verified on Apple hardware" in reg.description


def test_score_off_macos_names_the_platform() -> None:
    value, reason = probe.score(platform="linux")
    assert value == 0 and "only on macOS" in reason and "linux" in reason


def test_score_on_macos_without_pyobjc_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe.importlib.util, "find_spec", lambda name: None)
    value, reason = probe.score(platform="darwin")
    assert value == 0 and "pip install pyobjc-framework-Metal" in reason


@pytest.mark.parametrize(
    ("answer", "score", "expected"),
    [
        (0, 0, "no GPU"),
        (OSError("image not found"), 0, "could not be loaded (image not found)"),
        (1, 10, "not verified on Apple hardware"),
    ],
)
def test_score_on_macos_asks_metal_for_a_device(
    monkeypatch: pytest.MonkeyPatch, answer: Any, score: int, expected: str
) -> None:
    monkeypatch.setattr(probe.importlib.util, "find_spec", lambda name: object())

    def ask() -> int:
        if isinstance(answer, Exception):
            raise answer
        return int(answer)

    value, reason = probe.score(platform="darwin", probe=ask)
    assert value == score and expected in reason


def test_doctor_shows_metal_with_its_score_and_reason() -> None:
    value, reason = tensorplug_metal.score()
    out = subprocess.run(
        [sys.executable, "-m", "tensorplug", "doctor", "--plain"],
        capture_output=True, text=True, check=True,
        env={**__import__("os").environ, "TENSORPLUG_DISABLE": "OpenCL,Ray,CUDA"},
    )  # fmt: skip
    row = next(line for line in out.stdout.splitlines() if line.startswith("Metal "))
    assert "tensorplug-metal" in row
    if value == 0:  # the CI case: not a Mac, the reason is shown
        assert " 0 " in row and "unsupported" in row and reason[:40] in out.stdout


# -- pyobjc ownership --------------------------------------------------------------------------


def _selectors_called() -> set[bytes]:
    """Every ``new*`` selector the plugin's sources call, pyobjc's spelling turned back
    into Objective-C's (``newCommandQueue``, ``newFunctionWithName_`` -> ``...Name:``)."""
    found = set()
    for path in PLUGIN.glob("*.py"):
        for name in re.findall(r"\.(new[A-Z]\w*)\(", path.read_text()):
            found.add(name.replace("_", ":").encode())
    return found


def test_every_new_selector_the_plugin_calls_is_registered_as_already_retained() -> None:
    called = _selectors_called()
    assert len(called) >= 7  # the scan sees the plugin's calls
    missing = called - set(ownership.NEW_SELECTORS)
    assert not missing, f"register {sorted(missing)} in tensorplug_metal.ownership"
    assert all(m["retval"]["already_retained"] for m in ownership.NEW_SELECTORS.values())


def test_the_registration_reaches_pyobjc_before_any_metal_object_exists(
    reg_fake: tuple[MetalReg, FakeMetal],
) -> None:
    fake = reg_fake[1]
    assert set(fake.state.registered) == set(ownership.NEW_SELECTORS)
    error_out = fake.state.registered[b"newLibraryWithSource:options:error:"]["arguments"][4]
    assert error_out == {"type_modifier": b"o"}  # the NSError ** output stays an output


class _Recorder:
    def __init__(self) -> None:
        self.told = 0

    def registerMetaDataForSelector(self, *args: Any) -> None:
        self.told += 1


def test_every_bridge_is_told_even_when_it_reuses_a_gone_ones_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registration is remembered per bridge object, never by ``id()``, which a new
    object gets again once the old one is gone. Every object here has the same id, the
    worst case of that reuse."""
    monkeypatch.setattr(ownership, "id", lambda obj: 1, raising=False)
    first = _Recorder()
    ownership.register_ownership(first)
    second = _Recorder()
    ownership.register_ownership(second)
    assert first.told == second.told == len(ownership.NEW_SELECTORS)
    ownership.register_ownership(second)
    assert second.told == len(ownership.NEW_SELECTORS)  # once per bridge


def test_freed_buffers_give_their_memory_back(reg_fake: tuple[MetalReg, FakeMetal]) -> None:
    reg, fake = reg_fake
    dev, mtl = reg.devices()[0], fake.devices[0]
    base = mtl.currentAllocatedSize()
    buf = dev.buffer_type().alloc_buffer(1 << 20)
    assert mtl.currentAllocatedSize() == base + (1 << 20)
    buf.free()
    del buf
    gc.collect()
    assert mtl.currentAllocatedSize() == base and fake.state.leaked == []


def test_without_the_metadata_every_buffer_would_leak(emulator: PoclEmulator) -> None:
    """The fake models pyobjc issue 690, so the test above can fail."""
    objc = FakeObjC()
    fake = FakeMetal(emulator, objc)
    leaked = fake.devices[0].newBufferWithLength_options_(4096, 0)
    assert fake.state.leaked == [leaked]


# -- devices -----------------------------------------------------------------------------------


def test_one_device_per_mtldevice_with_what_metal_reports(emulator: PoclEmulator) -> None:
    reg, _ = make_reg(
        emulator,
        FakeDeviceSpec(),
        FakeDeviceSpec(name="Fake AMD Radeon (a test double)", unified=False, capacity=1 << 31),
    )
    first, second = reg.devices()
    assert (first.name, second.name) == ("Metal0", "Metal1")
    assert first.type is tp.DeviceType.IGPU and second.type is tp.DeviceType.GPU
    assert "not verified on Apple hardware" in first.description
    assert second.memory() == (1 << 31, 1 << 31)
    caps = first.caps
    assert caps.asynchronous and caps.events and caps.buffer_from_host_ptr
    assert first.limits.gpu and first.limits.wg == 128 and first.limits.local_mem == 32 * 1024
    assert first.limits.scratch  # the backend binds its scratch buffer: mmvq is on
    assert "Metal0" in reg.features() and reg.features()["verified"].startswith("not verified")


def test_memory_counts_what_this_process_allocated(reg_fake: tuple[MetalReg, FakeMetal]) -> None:
    dev = reg_fake[0].devices()[0]
    free, total = dev.memory()
    buf = dev.buffer_type().alloc_buffer(4 << 20)
    assert dev.memory() == (free - (4 << 20), total)
    buf.free()


def test_supports_ops_and_only_its_own_buffer_type(reg_fake: tuple[MetalReg, FakeMetal]) -> None:
    dev = reg_fake[0].devices()[0]
    x = tp.new_tensor("f32", (64, 8))
    assert dev.supports_op(ops.rms_norm(x, 1e-6))
    assert dev.supports_buft(dev.buffer_type())
    assert not dev.supports_buft(tp.registry.init_by_name("CPU").buffer_type())
    one_row = tp.new_tensor("f32", (1, 8))
    assert dev.offload_op(ops.scale(x, 2.0)) and not dev.offload_op(ops.scale(one_row, 2.0))


# -- buffers -----------------------------------------------------------------------------------


def test_shared_buffers_are_host_memory_the_cpu_backend_reads(backend: Any) -> None:
    a = tp.new_tensor("f32", (3, 5), "a")
    buf = alloc(backend, a)
    assert buf.is_host and buf.buft.alignment == 256 and buf.name == "Metal0"
    data = np.arange(15, dtype=np.float32).reshape(3, 5)
    tp.set_array(a, data)
    np.testing.assert_array_equal(tp.get_array(a), data)
    host = buf.host_array()[: a.nbytes].view(np.float32).reshape(3, 5)
    np.testing.assert_array_equal(host, data)  # the same bytes, no copy
    # the CPU backend computes straight from Metal's memory
    cpu = tp.registry.init_by_name("CPU")
    y = ops.scale(a, 2.0)
    tp.alloc_tensors([y], cpu.buffer_type())
    cpu.graph_compute(tp.Graph(y))
    np.testing.assert_array_equal(tp.get_array(y), 2 * data)


def test_host_access_waits_for_queued_gpu_work(backend: Any) -> None:
    a = tp.new_tensor("f32", (4, 32), "a")
    y = ops.scale(a, 3.0)
    alloc(backend, a, y)
    tp.set_array(a, np.ones((4, 32), np.float32))
    backend.graph_compute_async(tp.Graph(y))  # committed, not yet run by the fake
    np.testing.assert_array_equal(tp.get_array(y), np.full((4, 32), 3.0))
    backend.synchronize()


def test_out_of_memory_is_recoverable_and_keeps_what_is_stored(emulator: PoclEmulator) -> None:
    reg, _ = make_reg(emulator, FakeDeviceSpec(capacity=8 << 20))
    dev = reg.devices()[0]
    a = tp.new_tensor("f32", (1024,), "a")
    tp.alloc_tensors([a], dev.buffer_type())
    tp.set_array(a, np.arange(1024, dtype=np.float32))
    with pytest.raises(tp.AllocationError, match="Metal0"):
        dev.buffer_type().alloc_buffer(16 << 20)
    np.testing.assert_array_equal(tp.get_array(a), np.arange(1024, dtype=np.float32))
    dev.buffer_type().alloc_buffer(1 << 20).free()  # and the device keeps working


# -- mapped weights ----------------------------------------------------------------------------


def _mapped(tmp_path: Path, values: np.ndarray) -> Any:
    path = tmp_path / "weights.bin"
    path.write_bytes(values.tobytes())
    with path.open("rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def test_view_ranges_overlap_by_the_largest_tensor() -> None:
    page = 4096
    assert view_ranges(10_000, 1 << 20, 100, page) == [(0, 10_000)]
    ranges = view_ranges(100_000, 8 * page, 2 * page, page)
    assert ranges[0][0] == 0 and ranges[-1][1] == 100_000
    for (_, e0), (s1, _) in itertools.pairwise(ranges):
        assert e0 - s1 >= 2 * page  # any tensor of 2 pages lies whole in one view
    with pytest.raises(tp.UnsupportedError, match="do not fit"):
        view_ranges(100_000, 4 * page, 4 * page, page)


def test_mapped_weights_are_read_in_place_across_overlapping_views(
    emulator: PoclEmulator, tmp_path: Path
) -> None:
    page = mmap.PAGESIZE
    reg, _ = make_reg(emulator, FakeDeviceSpec(max_buffer=4 * page))
    dev = reg.devices()[0]
    be = dev.init_backend()
    rows = 5 * page // (4 * 64)  # five pages of f32 rows of 64: more than one view holds
    table = np.random.default_rng(3).standard_normal((rows, 64)).astype(np.float32)
    mapping = _mapped(tmp_path, table)
    row_bytes = 64 * 4
    buf = dev.buffer_from_host_ptr(memoryview(mapping), row_bytes * 4)
    assert isinstance(buf, MappedBuffer) and len(buf.views) >= 2
    assert buf.usage is tp.BufferUsage.WEIGHTS
    # four tensors of four rows each, one near the end: each is read from the view holding it
    starts = [0, rows // 2, rows - 4, 7]
    for start in starts:
        w = tp.new_tensor("f32", (4, 64))
        tp.tensor_alloc(buf, w, start * row_bytes)
        y = ops.scale(w, 2.0)
        tp.alloc_tensors([y], dev.buffer_type())
        be.graph_compute(tp.Graph(y))
        np.testing.assert_array_equal(tp.get_array(y), 2 * table[start : start + 4])
    with pytest.raises(tp.UnsupportedError, match="read-only"):
        w = tp.new_tensor("f32", (4, 64))
        tp.tensor_alloc(buf, w, 0)
        tp.set_array(w, np.zeros((4, 64), np.float32))
    be.free()


def test_memory_metal_will_not_wrap_is_copied_instead(emulator: PoclEmulator) -> None:
    reg, fake = make_reg(emulator, FakeDeviceSpec(max_buffer=1 << 16))
    dev = reg.devices()[0]
    # a tensor larger than a view could hold: wrapping refuses it with the reason
    with pytest.raises(tp.UnsupportedError, match="largest buffer"):
        dev.buffer_from_host_ptr(np.zeros(1 << 17, np.uint8), 1 << 17)
    values = np.arange(300, dtype=np.float32)
    with_odd_length = bytearray(values.tobytes())
    fake.devices[0].spec.wraps_memory = False  # now every no-copy request is refused
    buf = dev.buffer_from_host_ptr(with_odd_length, 1200)
    assert isinstance(buf, metal_buffer.MetalBuffer)  # copied into a shared buffer
    np.testing.assert_array_equal(buf.host_array().view(np.float32), values)


# -- queues, transfers, events -----------------------------------------------------------------


def test_async_transfers_complete_at_synchronize(backend: Any) -> None:
    a = tp.new_tensor("f32", (8,), "a")
    alloc(backend, a)
    tp.set_array(a, np.zeros(8, np.float32))
    data = np.arange(8, dtype=np.float32)
    backend.set_tensor_async(a, memoryview(data.tobytes()))
    out = np.zeros(8, np.float32)
    backend.get_tensor_async(a, out.data.cast("B"))
    assert not out.any()  # queued behind the write, not yet run
    backend.synchronize()
    np.testing.assert_array_equal(out, data)


def test_events_and_copies_order_one_queue_after_another(
    reg_fake: tuple[MetalReg, FakeMetal],
) -> None:
    dev = reg_fake[0].devices()[0]
    first, second = dev.init_backend(), dev.init_backend()
    a = tp.new_tensor("f32", (4, 32), "a")
    y = ops.scale(a, 5.0)
    c = tp.new_tensor("f32", (4, 32), "c")
    z = ops.add(c, c)
    alloc(first, a, y, c, z)
    tp.set_array(a, np.ones((4, 32), np.float32))
    first.graph_compute_async(tp.Graph(y))
    tp.tensor_copy_async(first, second, y, c)  # waits on the GPU for first's queued work
    event = dev.event_new()
    second.graph_compute_async(tp.Graph(z))
    event.record(second)
    event.wait(first)
    event.synchronize()
    np.testing.assert_array_equal(tp.get_array(z), np.full((4, 32), 10.0))
    first.synchronize()
    second.synchronize()


def test_an_event_of_another_device_is_refused(emulator: PoclEmulator) -> None:
    reg, _ = make_reg(emulator, FakeDeviceSpec(), FakeDeviceSpec())
    d0, d1 = reg.devices()
    with pytest.raises(tp.UnsupportedError, match="belongs to device 'Metal1'"):
        d0.init_backend().event_record(d1.event_new())


def test_a_graph_is_encoded_into_a_few_command_buffers(backend: Any) -> None:
    x = tp.new_tensor("f32", (2, 16), "x")
    t = x
    for _ in range(300):
        t = ops.scale(t, 1.0)
    graph = tp.Graph(t)
    alloc(backend, x, *graph.nodes)
    tp.set_array(x, np.ones((2, 16), np.float32))
    before = len(backend._committed)
    backend.graph_compute_async(graph)
    # 32 dispatches first, so the GPU starts early, then 256 per command buffer
    assert len(backend._committed) - before == 3
    backend.synchronize()
    np.testing.assert_array_equal(tp.get_array(t), np.ones((2, 16)))


# -- errors ------------------------------------------------------------------------------------


def test_a_gpu_fault_is_raised_at_synchronize_naming_the_nodes(
    backend: Any, reg_fake: tuple[MetalReg, FakeMetal]
) -> None:
    a = tp.new_tensor("f32", (4, 32), "a")
    y = ops.scale(a, 2.0).set_name("scaled")
    alloc(backend, a, y)
    tp.set_array(a, np.ones((4, 32), np.float32))
    reg_fake[1].state.fail_next_command_buffer = "Caused GPU Address Fault Error"
    with pytest.raises(CommandBufferError, match=r"GPU Address Fault.*") as info:
        backend.graph_compute(tp.Graph(y))
    assert "'scaled'" in str(info.value) and isinstance(info.value, tp.TensorplugError)
    backend.graph_compute(tp.Graph(y))  # the queue keeps working
    np.testing.assert_array_equal(tp.get_array(y), np.full((4, 32), 2.0))


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


def test_a_compile_error_names_the_kernel_and_keeps_the_msl_log(emulator: PoclEmulator) -> None:
    reg, fake = make_reg(emulator)
    log = "src/elementwise.tpk:90:5: error: use of undeclared identifier 'oops'"
    fake.state.compile_log = log
    with pytest.raises(KernelBuildError) as info:
        reg.devices()[0].program  # noqa: B018
    assert info.value.kernel == "k_unary" and info.value.log == log
    assert "src/elementwise.tpk:90" in str(info.value) and isinstance(info.value, tp.PluginError)


def test_the_library_is_compiled_once_without_fast_math(
    backend: Any, reg_fake: tuple[MetalReg, FakeMetal]
) -> None:
    a = tp.new_tensor("f32", (4, 32))
    y = ops.rms_norm(a, 1e-6)
    alloc(backend, a, y)
    tp.set_array(a, np.ones((4, 32), np.float32))
    backend.graph_compute(tp.Graph(y))
    backend.graph_compute(tp.Graph(y))
    compiled = reg_fake[1].state.compiled
    assert len(compiled) == 1
    assert compiled[0][1] == {"mathMode": 0, "macros": {"WG": 128}}


def test_a_threadgroup_larger_than_the_pipeline_allows_is_refused(emulator: PoclEmulator) -> None:
    reg, _ = make_reg(emulator, FakeDeviceSpec(pipeline_threads=64))
    be = reg.devices()[0].init_backend()
    a = tp.new_tensor("f32", (4, 300), "activations")
    y = ops.rms_norm(a, 1e-6).set_name("attn_norm")
    alloc(be, a, y)
    with pytest.raises(KernelLaunchError, match=r"128 threads.*attn_norm.*allows 64") as info:
        be.graph_compute(tp.Graph(y))
    assert info.value.kernel == "k_norm"


def test_tensors_in_other_memory_are_refused(backend: Any) -> None:
    a = tp.new_tensor("f32", (4,), "host_a")
    y = ops.scale(a, 2.0)
    tp.alloc_tensors([a], tp.registry.init_by_name("CPU").buffer_type())
    alloc(backend, y)
    with pytest.raises(tp.UnsupportedError, match="cannot read"):
        backend.graph_compute(tp.Graph(y))


def test_a_plan_belongs_to_its_backend_and_checks_its_buffers(
    reg_fake: tuple[MetalReg, FakeMetal],
) -> None:
    dev = reg_fake[0].devices()[0]
    first, second = dev.init_backend(), dev.init_backend()
    a = tp.new_tensor("f32", (4, 32))
    y = ops.scale(a, 2.0)
    buf = alloc(first, a, y)
    plan = first.graph_plan_create(tp.Graph(y))
    with pytest.raises(tp.TypeMismatchError, match="another backend"):
        second.graph_plan_compute(plan)
    buf.free()
    with pytest.raises(tp.BufferFreedError):
        first.graph_plan_compute(plan)

"""The plugin-facing base classes: required hooks fail early, optional ones default as ggml."""

from __future__ import annotations

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Type


class DeviceMemoryType(tp.BufferType):
    """A non-host buffer type: bytes only reachable through set/get, like VRAM."""

    def __init__(self, copies: list[str] | None = None, native_copy: bool = False) -> None:
        super().__init__()
        self.copies = copies if copies is not None else []
        self.native_copy = native_copy

    @property
    def name(self) -> str:
        return "FakeVRAM"

    @property
    def alignment(self) -> int:
        return 32

    def _alloc_buffer(self, size: int) -> tp.Buffer:
        return DeviceMemory(self, size)


class DeviceMemory(tp.Buffer):
    def __init__(self, buft: DeviceMemoryType, size: int) -> None:
        super().__init__(buft, size)
        self.mem = bytearray(size)
        self.buft_: DeviceMemoryType = buft

    def _set_tensor(self, tensor: tp.Tensor, data: memoryview, offset: int) -> None:
        start = tensor.offset + offset
        self.mem[start : start + len(data)] = data

    def _get_tensor(self, tensor: tp.Tensor, out: memoryview, offset: int) -> None:
        start = tensor.offset + offset
        out[:] = self.mem[start : start + len(out)]

    def _memset_tensor(self, tensor: tp.Tensor, value: int, offset: int, size: int) -> None:
        start = tensor.offset + offset
        self.mem[start : start + size] = bytes([value]) * size

    def _clear(self, value: int) -> None:
        self.mem[:] = bytes([value]) * self.size

    def _cpy_tensor(self, src: tp.Tensor, dst: tp.Tensor) -> bool:
        if not self.buft_.native_copy or not isinstance(src.buffer, DeviceMemory):
            return False
        self.buft_.copies.append("native")
        s, d = src.offset, dst.offset
        self.mem[d : d + dst.nbytes] = src.buffer.mem[s : s + src.nbytes]
        return True


class MiniDevice(tp.Device):
    @property
    def name(self) -> str:
        return "MINI"

    @property
    def description(self) -> str:
        return "a device for protocol tests"

    @property
    def type(self) -> tp.DeviceType:
        return tp.DeviceType.ACCEL

    def memory(self) -> tuple[int, int]:
        return (100, 200)

    def _init_backend(self, params: str | None) -> tp.Backend:
        return MiniBackend(self)

    def buffer_type(self) -> tp.BufferType:
        return DeviceMemoryType()

    def _supports_op(self, op: tp.Tensor) -> bool:
        return op.op is tp.Op.ADD

    def supports_buft(self, buft: tp.BufferType) -> bool:
        return isinstance(buft, DeviceMemoryType)


class MiniBackend(tp.Backend):
    def _graph_compute(self, graph: tp.Graph) -> tp.Status:
        return tp.Status.SUCCESS


def test_required_hooks_fail_at_instantiation_with_their_names() -> None:
    class Incomplete(tp.Device):
        @property
        def name(self) -> str:
            return "X"

    with pytest.raises(TypeError, match="abstract.*(buffer_type|description)"):
        Incomplete()  # type: ignore[abstract]

    class NoCompute(tp.Backend):
        pass

    with pytest.raises(TypeError, match="_graph_compute"):
        NoCompute(MiniDevice())  # type: ignore[abstract]

    class NoIO(tp.Buffer):
        def _clear(self, value: int) -> None: ...

    with pytest.raises(TypeError, match="_get_tensor"):
        NoIO(DeviceMemoryType(), 8)  # type: ignore[abstract]


def test_optional_members_have_ggml_defaults() -> None:
    dev = MiniDevice()
    buft = dev.buffer_type()
    t = tp.new_tensor(Type.F32, (5,))
    assert buft.max_size == tp.UNBOUNDED and buft.alloc_size(t) == 20 and not buft.is_host
    assert dev.host_buffer_type() is None and dev.device_id is None
    assert not dev.offload_op(t)
    props = dev.props()
    assert props == tp.DeviceProps(
        "MINI", "a device for protocol tests", 100, 200, tp.DeviceType.ACCEL, None, tp.DeviceCaps()
    )
    with pytest.raises(tp.UnsupportedError, match="cannot wrap host memory"):
        dev.buffer_from_host_ptr(bytearray(8))
    with pytest.raises(tp.UnsupportedError, match="does not support events"):
        dev.event_new()
    backend = dev.init_backend()
    assert backend.name == "MINI" and backend.device is dev
    with pytest.raises(tp.UnsupportedError, match="graph plans"):
        backend.graph_plan_create(tp.Graph())
    backend.synchronize()  # default: nothing queued, nothing to wait for
    assert backend.graph_compute(tp.Graph()) is tp.Status.SUCCESS
    buf = buft.alloc_buffer(64)
    with pytest.raises(tp.UnsupportedError, match="not in host memory"):
        buf.host_array()
    assert buf.base == 0


def test_async_access_falls_back_to_sync_with_bounds_checks() -> None:
    dev = MiniDevice()
    backend = dev.init_backend()
    buf = dev.buffer_type().alloc_buffer(64)
    x = tp.new_tensor(Type.F32, (4,))
    tp.tensor_alloc(buf, x, 32)
    tp.tensor_set_async(backend, x, np.array([1, 2, 3, 4], dtype=np.float32))
    out = np.zeros(4, dtype=np.float32)
    tp.tensor_get_async(backend, x, out)
    backend.synchronize()
    assert out.tolist() == [1, 2, 3, 4]
    with pytest.raises(tp.OutOfBoundsError, match=r"set_tensor_async: bytes \[0, 20\) are outside"):
        tp.tensor_set_async(backend, x, np.zeros(5, dtype=np.float32))


@pytest.mark.parametrize("native", [True, False])
def test_tensor_copy_paths_between_device_buffers(native: bool) -> None:
    copies: list[str] = []
    buft = DeviceMemoryType(copies, native_copy=native)
    b1, b2 = buft.alloc_buffer(64), buft.alloc_buffer(64)
    host = tp.host_buffer_type().alloc_buffer(64)
    xs = []
    for buf in (b1, b2, host):
        t = tp.new_tensor(Type.I32, (3,))
        tp.tensor_alloc(buf, t, 0)
        xs.append(t)
    vals = np.array([7, -8, 9], dtype=np.int32)
    tp.set_array(xs[0], vals)
    tp.tensor_copy(xs[0], xs[1])  # device -> device: native copy or through host memory
    assert copies == (["native"] if native else [])
    tp.tensor_copy(xs[1], xs[2])  # device -> host
    np.testing.assert_array_equal(tp.get_array(xs[2]), vals)
    tp.tensor_copy_async(MiniBackend(MiniDevice()), MiniBackend(MiniDevice()), xs[2], xs[0])
    np.testing.assert_array_equal(tp.get_array(xs[0]), vals)


def test_strided_tensor_on_device_reads_through_its_span() -> None:
    buf = DeviceMemoryType().alloc_buffer(128)
    x = tp.new_tensor(Type.F32, (3, 4))
    tp.tensor_alloc(buf, x, 0)
    vals = np.arange(12, dtype=np.float32).reshape(3, 4)
    tp.set_array(x, vals)
    t = tp.ops.transpose(x)
    tp.view_init(t)
    np.testing.assert_array_equal(tp.get_array(t), vals.T)
    tp.set_array(t, -vals.T)
    np.testing.assert_array_equal(tp.get_array(x), -vals)


def test_reg_device_indexing() -> None:
    class MiniReg(tp.Reg):
        @property
        def name(self) -> str:
            return "mini"

        def devices(self) -> list[tp.Device]:
            return [MiniDevice(self)]

    reg = MiniReg()
    assert reg.device_count == 1 and reg.device(0).name == "MINI"
    assert reg.api_version == tp.API_VERSION and reg.get_proc("x") is None
    with pytest.raises(IndexError, match="has 1 devices; index 3"):
        reg.device(3)


def test_async_access_at_an_offset_and_by_default_from_the_start() -> None:
    backend = MiniDevice().init_backend()
    buf = MiniDevice().buffer_type().alloc_buffer(64)
    x = tp.new_tensor(Type.F32, (4,))
    tp.tensor_alloc(buf, x, 32)
    tp.tensor_set_async(backend, x, np.array([1, 2, 3, 4], dtype=np.float32))
    tp.tensor_set_async(backend, x, np.array([-3], dtype=np.float32), 8)  # element 2 only
    tail, whole = np.zeros(2, dtype=np.float32), np.zeros(4, dtype=np.float32)
    tp.tensor_get_async(backend, x, tail, 8)
    tp.tensor_get_async(backend, x, whole)
    backend.synchronize()
    assert tail.tolist() == [-3, 4] and whole.tolist() == [1, 2, -3, 4]

"""DLPack in both directions: zero-copy with numpy (and torch where installed), and a
clear refusal, naming what to do instead, wherever sharing would be wrong."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops
from tensorplug.dlpack import raw_blocks
from tensorplug.host import tensor_array
from tensorplug.quants import quantize


def _host(shape: tuple[int, ...], type_: str = "f32") -> tp.Tensor:
    t = tp.new_tensor(type_, shape, "t")
    tp.alloc_tensors([t], tp.host_buffer_type())
    return t


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def test_numpy_views_a_host_tensor_without_copying() -> None:
    t = _host((3, 4))
    tp.set_array(t, np.arange(12, dtype=np.float32).reshape(3, 4))
    view = np.from_dlpack(t)
    assert view.shape == (3, 4) and view.dtype == np.float32
    assert _addr(view) == _addr(tensor_array(t))  # the same memory
    view[2, 3] = -1
    assert tp.get_array(t)[2, 3] == -1
    assert t.__dlpack_device__() == (1, 0)


def test_the_dlpack_keywords_numpy_passes_are_honoured() -> None:
    t = _host((4,))
    tp.set_array(t, np.ones(4, np.float32))
    assert np.from_dlpack(t, device="cpu").sum() == 4
    copied = np.from_dlpack(t, copy=True)
    assert _addr(copied) != _addr(tensor_array(t))
    capsule = t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert type(capsule).__name__ == "PyCapsule"
    with pytest.raises(tp.DLPackError, match="cannot be exported to device"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(tp.DLPackError, match="host memory has no streams"):
        t.__dlpack__(stream=7)


def test_a_strided_view_is_exported_with_its_strides() -> None:
    t = _host((4, 6))
    tp.set_array(t, np.arange(24, dtype=np.float32).reshape(4, 6))
    tr = ops.transpose(t)
    tp.view_init(tr)
    got = np.from_dlpack(tr)
    np.testing.assert_array_equal(got, np.arange(24, dtype=np.float32).reshape(4, 6).T)
    assert _addr(got) == _addr(tensor_array(t))


def test_tensors_that_must_not_be_shared_are_refused_with_the_way_out() -> None:
    with pytest.raises(tp.DLPackError, match="has no memory yet"):
        np.from_dlpack(tp.new_tensor("f32", (4,)))
    q = _host((2, 32), "q4_0")
    with pytest.raises(tp.DLPackError, match=r"no other library understands Q4_0.*raw_blocks"):
        np.from_dlpack(q)
    with pytest.raises(tp.DLPackError, match="BF16"):
        np.from_dlpack(_host((4,), "bf16"))
    # the graph allocator's memory is reused by the next graph
    cpu = tp.init_by_name("CPU")
    x = tp.new_tensor("f32", (4,), "x")
    y = ops.neg(x)
    tp.GraphAllocator(cpu.buffer_type()).alloc_graph(tp.Graph(y))
    with pytest.raises(tp.DLPackError, match="reusable compute memory.*get_array"):
        np.from_dlpack(y)


def test_device_memory_is_refused_with_copy_instead() -> None:
    dev = tp.dev_by_name("OpenCL0")
    if dev is None:
        pytest.skip("no OpenCL device (pip install pocl-binary-distribution)")
    t = tp.new_tensor("f32", (4,), "t")
    tp.alloc_tensors([t], dev.buffer_type())
    with pytest.raises(tp.DLPackError, match="copy it"):
        t.__dlpack_device__()
    with pytest.raises(tp.DLPackError, match=r"host cannot address.*get_array"):
        t.__dlpack__()


def test_raw_blocks_share_quantized_and_bf16_storage_on_request() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 64)).astype(np.float32)
    q = _host((2, 64), "q4_0")
    tp.set_array(q, quantize(w, tp.Type.Q4_0))
    blocks = np.from_dlpack(raw_blocks(q))
    assert blocks.shape == (2, 2, 18) and blocks.dtype == np.uint8
    np.testing.assert_array_equal(blocks.reshape(2, -1), quantize(w, tp.Type.Q4_0).view(np.uint8))
    assert _addr(blocks) == _addr(tensor_array(q))
    b = _host((3,), "bf16")
    assert np.from_dlpack(raw_blocks(b)).dtype == np.uint16


def test_from_dlpack_views_a_numpy_array_without_copying() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tp.from_dlpack(a, "a")
    assert t.shape == (3, 4) and t.type is tp.Type.F32 and t.name == "a"
    assert _addr(tensor_array(t)) == _addr(a)
    a[0, 0] = 100
    assert tp.get_array(t)[0, 0] == 100
    tp.set_array(t, np.zeros((3, 4), np.float32))
    assert not a.any()
    # computed on, like any host tensor
    cpu = tp.init_by_name("CPU")
    y = ops.scale(t, 2.0)
    tp.alloc_tensors([y], cpu.buffer_type())
    a[...] = 1
    cpu.graph_compute(tp.Graph(y))
    np.testing.assert_array_equal(tp.get_array(y), np.full((3, 4), 2, np.float32))


@pytest.mark.parametrize("dtype", ["float16", "int8", "int16", "int32", "int64"])
def test_from_dlpack_keeps_strides_types_and_the_memory_alive(dtype: str) -> None:
    base = (np.arange(24) % 7).astype(dtype).reshape(4, 6)
    t = tp.from_dlpack(base.T)
    assert t.shape == (6, 4) and t.strides == base.T.strides
    want = base.T.copy()
    del base
    gc.collect()
    np.testing.assert_array_equal(tp.get_array(t), want)


def test_from_dlpack_refuses_what_it_cannot_view() -> None:
    with pytest.raises(tp.TypeMismatchError, match="float64 are not one of"):
        tp.from_dlpack(np.zeros(3))
    with pytest.raises(tp.DLPackError, match="negative strides"):
        tp.from_dlpack(np.arange(4, dtype=np.float32)[::-1])
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    t = tp.from_dlpack(ro)
    np.testing.assert_array_equal(tp.get_array(t), ro)
    with pytest.raises(tp.UnsupportedError, match="read-only"):
        tp.set_array(t, np.zeros(4, np.float32))

    class OnGpu:
        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)

        def __dlpack__(self, **kw: object) -> None:
            raise AssertionError("not reached")

    with pytest.raises(tp.DLPackError, match=r"DLPack device \(2, 0\), not host memory"):
        tp.from_dlpack(OnGpu())


def test_torch_round_trip_without_copies() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = tp.from_dlpack(src)
    assert _addr(tensor_array(t)) == src.data_ptr()
    back = torch.from_dlpack(t)
    assert back.data_ptr() == src.data_ptr()
    back[0, 0] = 42
    assert src[0, 0].item() == 42

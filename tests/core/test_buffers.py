"""Buffers, tensor placement and data movement, including every bad-input case."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Type, ops


def _placed(t: Type, shape: tuple[int, ...], buf: tp.Buffer, offset: int = 0) -> tp.Tensor:
    x = tp.new_tensor(t, shape, "x")
    tp.tensor_alloc(buf, x, offset)
    return x


@pytest.fixture
def host() -> tp.Buffer:
    return tp.host_buffer_type().alloc_buffer(4096)


def test_host_buffer_type_properties_and_alignment(host: tp.Buffer) -> None:
    buft = tp.host_buffer_type()
    assert buft.name == "CPU" and buft.is_host and buft.alignment == tp.HOST_ALIGNMENT
    assert buft.max_size == tp.UNBOUNDED
    assert host.size == 4096 and host.base % tp.HOST_ALIGNMENT == 0
    assert host.usage is tp.BufferUsage.ANY
    host.usage = tp.BufferUsage.WEIGHTS
    assert host.usage is tp.BufferUsage.WEIGHTS


@pytest.mark.parametrize("size", [4096, 64 << 20])  # from the heap, and from the OS
def test_a_new_host_buffer_is_zero_without_a_clear(size: int) -> None:
    """``zeroed``: a KV cache need not be cleared at load (which wrote, and made
    resident, every page of it), even where freed memory held other bytes."""
    buft = tp.host_buffer_type()
    assert buft.zeroed
    for _ in range(2):
        buf = buft.alloc_buffer(size)
        assert not buf.host_array().any()
        buf.clear(0xA5)  # what the next allocation may get back
        buf.free()


def _huge_page_advice(array: np.ndarray) -> bool:
    """Whether any mapping over ``array``'s bytes was advised huge pages (``hg`` among
    its VmFlags in /proc/self/smaps; numpy advises the page-aligned inside of a block,
    which splits it from the block's first page)."""
    start = array.ctypes.data
    end, over, advised = start + array.nbytes, False, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                over = lo < end and hi > start
            elif head == "VmFlags:" and over:
                advised = advised or "hg" in line.split()[1:]
    return advised


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc/self/smaps")
def test_large_host_buffers_are_not_advised_huge_pages() -> None:
    """numpy advises 2 MiB pages for its own allocations of 4 MiB or more: a KV cache
    written a row per layer was then resident 2 MiB per layer (SmolLM2's 8192-token
    cache: 118 MiB after its first token). A large host buffer is a mapping of its own."""
    from tensorplug.host import MAPPED_MIN

    reference = np.zeros(64 << 20, np.uint8)
    if not _huge_page_advice(reference):
        pytest.skip("this numpy or kernel advises no huge pages: nothing to compare with")
    for size in (MAPPED_MIN, 64 << 20):
        buf = tp.host_buffer_type().alloc_buffer(size)
        data = buf.host_array()
        assert data.ctypes.data % tp.host_buffer_type().alignment == 0
        assert not _huge_page_advice(data) and not data.any()
        data[::4096] = 1  # writable, every page
        assert int(data.sum()) == size // 4096
        buf.free()


@pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps") or not hasattr(mmap, "MADV_HUGEPAGE"),
    reason="Linux's /proc/self/smaps and MADV_HUGEPAGE",
)
def test_weights_memory_is_advised_huge_pages() -> None:
    """Weights are written whole at load and then streamed from memory every token:
    on 2 MiB pages a core walks far fewer page tables (repacked products read 14-28%
    faster on the Zen 4 dev machine). Memory asked for them is advised so, from the OS
    and from the CPU's repacked buffer type alike; small blocks come from the heap as
    before, and a host buffer (a KV cache) still is not advised."""
    from tensorplug.host import MAPPED_MIN, aligned_bytes
    from tensorplug_cpu.device import create_reg

    probe = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        probe.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pytest.skip("this kernel takes no MADV_HUGEPAGE (transparent huge pages not built in)")
    finally:
        probe.close()
    data = aligned_bytes(MAPPED_MIN, "test", huge_pages=True)
    assert _huge_page_advice(data) and not data.any() and data.flags.writeable
    assert not _huge_page_advice(aligned_bytes(MAPPED_MIN, "test"))
    repack = create_reg().device(0).repack_buffer_type()  # type: ignore[attr-defined]
    buf = repack.alloc_buffer(MAPPED_MIN)
    assert _huge_page_advice(buf.data)
    buf.free()


def _resident_pages(memory: np.ndarray) -> int:
    """How many of the pages of page-aligned ``memory`` are resident (``mincore``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    pages = -(-memory.nbytes // mmap.PAGESIZE)
    vec = np.zeros(pages, np.uint8)
    assert libc.mincore(memory.ctypes.data, memory.nbytes, vec.ctypes.data) == 0
    return int((vec & 1).sum())


def _populates() -> bool:
    """Whether this kernel takes ``MADV_POPULATE_WRITE`` (Linux 5.14+)."""
    import ctypes

    probe = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        address = np.frombuffer(probe, np.uint8).ctypes.data
        return ctypes.CDLL(None).madvise(ctypes.c_void_p(address), mmap.PAGESIZE, 23) == 0
    finally:
        probe.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's MADV_POPULATE_WRITE")
def test_weights_memory_is_made_resident_by_a_thread_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding (2 MiB) pages for new weights was most of a large model's load when the
    loader's own writes faulted them in (the 660M model: 420-750 ms of its repacking,
    ~110 of it copying). A thread asks for them all at once, ahead of the writer; the
    memory is what it was (zeros, writable); a call the kernel refuses changes nothing."""
    from tensorplug import host, prefault

    if not _populates():
        pytest.skip("this kernel takes no MADV_POPULATE_WRITE (before Linux 5.14)")
    size = 3 * prefault.SLICE_BYTES // 2  # two slices, the last one short
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = np.frombuffer(mapping, np.uint8)
    assert _resident_pages(memory) == 0
    thread = prefault.populate_in_background(memory)
    assert thread is not None and thread.daemon
    thread.join(timeout=30)
    assert _resident_pages(memory) == size // mmap.PAGESIZE
    assert not memory.any()
    memory[::4096] = 1
    assert int(memory.sum()) == size // 4096

    refused = prefault.populate_in_background(memory[1:])  # not on a page: EINVAL
    assert refused is not None
    refused.join(timeout=30)
    assert int(memory.sum()) == size // 4096

    asked: list[int] = []
    monkeypatch.setattr(host, "populate_in_background", lambda m: asked.append(m.ctypes.data))
    weights = host.aligned_bytes(host.MAPPED_MIN, "test", huge_pages=True)
    other = host.aligned_bytes(host.MAPPED_MIN, "test")
    small = host.aligned_bytes(host.MAPPED_MIN // 2, "test", huge_pages=True)
    assert asked == [weights.ctypes.data]  # weights only: a KV cache stays lazy
    assert not (weights.any() or other.any() or small.any())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
def test_a_forked_child_writes_a_large_host_buffer_of_its_own() -> None:
    """Large host buffers are mappings of their own: private ones, or a child forked
    by the application (multiprocessing's default on Linux) would write into the
    parent's KV cache."""
    from tensorplug.host import MAPPED_MIN

    buf = tp.host_buffer_type().alloc_buffer(MAPPED_MIN)
    data = buf.host_array()
    data[:16] = 1
    pid = os.fork()
    if pid == 0:  # the child: write, and leave without running pytest's teardown
        data[:16] = 7
        os._exit(0 if int(data[0]) == 7 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert data[:16].tolist() == [1] * 16
    buf.free()


def test_set_get_round_trip_with_offsets(host: tp.Buffer) -> None:
    x = _placed(Type.F32, (4, 8), host, 128)
    vals = np.arange(32, dtype=np.float32).reshape(4, 8)
    tp.set_array(x, vals)
    got = tp.get_array(x)
    np.testing.assert_array_equal(got, vals)
    tp.tensor_set(x, np.array([-1, -2], dtype=np.float32), offset=8)
    assert got[0, 2] == 2  # get_array copies: later writes do not show through
    assert np.frombuffer(tp.tensor_get(x, 0, 16), dtype=np.float32).tolist() == [0, 1, -1, -2]
    tp.tensor_memset(x, 0, offset=16, size=16)
    assert tp.get_array(x)[0, 4:].tolist() == [0, 0, 0, 0]
    assert tp.get_array(x)[1, 0] == 8
    # the bytes really are at the placed offset of the buffer
    assert host.host_array()[128:132].view(np.float32)[0] == 0.0
    assert host.host_array()[136:140].view(np.float32)[0] == -1.0


def test_out_of_bounds_access_is_refused_and_stores_nothing(host: tp.Buffer) -> None:
    x = _placed(Type.F32, (4,), host)
    tp.set_array(x, np.ones(4, dtype=np.float32))
    with pytest.raises(tp.OutOfBoundsError, match=r"bytes \[12, 20\) are outside tensor 'x'"):
        tp.tensor_set(x, np.zeros(2, dtype=np.float32), offset=12)
    with pytest.raises(tp.OutOfBoundsError, match=r"get_tensor: bytes \[0, 17\) are outside"):
        tp.tensor_get(x, 0, 17)
    with pytest.raises(tp.OutOfBoundsError, match=r"memset_tensor: bytes \[-4, 0\) are outside"):
        tp.tensor_memset(x, 1, offset=-4, size=4)
    np.testing.assert_array_equal(tp.get_array(x), np.ones(4, dtype=np.float32))


def test_set_array_checks_shape_and_dtype(host: tp.Buffer) -> None:
    x = _placed(Type.F16, (2, 3), host)
    with pytest.raises(tp.ShapeError, match=r"array shape \(3, 2\)"):
        tp.set_array(x, np.zeros((3, 2), dtype=np.float16))
    with pytest.raises(tp.TypeMismatchError, match="expected float16"):
        tp.set_array(x, np.zeros((2, 3), dtype=np.float32))


def test_strided_views_read_and_write_through_strides(host: tp.Buffer) -> None:
    x = _placed(Type.F32, (3, 4), host)
    vals = np.arange(12, dtype=np.float32).reshape(3, 4)
    tp.set_array(x, vals)
    t = ops.transpose(x)
    tp.view_init(t)
    assert t.buffer is host and t.offset == x.offset
    np.testing.assert_array_equal(tp.get_array(t), vals.T)
    tp.set_array(t, vals.T * 2)
    np.testing.assert_array_equal(tp.get_array(x), vals * 2)
    col = ops.view(x, (3,), strides=(16,), offset=4)
    tp.view_init(col)
    np.testing.assert_array_equal(tp.get_array(col), vals[:, 1] * 2)


def test_quantized_tensors_move_as_raw_rows(host: tp.Buffer) -> None:
    q = _placed(Type.Q8_0, (2, 64), host)
    raw = np.random.default_rng(0).integers(0, 255, (2, 68), dtype=np.uint8)
    tp.set_array(q, raw)
    np.testing.assert_array_equal(tp.get_array(q), raw)
    assert tp.tensor_array(q).shape == (2, 2, 34)


def test_tensor_alloc_errors(host: tp.Buffer) -> None:
    x = tp.new_tensor(Type.F32, (16,), "x")
    with pytest.raises(tp.AllocationError, match="multiple of the buffer's alignment 64"):
        tp.tensor_alloc(host, x, 4)
    with pytest.raises(tp.AllocationError, match="past the end of buffer"):
        tp.tensor_alloc(host, x, 4096)
    # partly past the end: starts inside (4032 < 4096) but its 64 bytes end at 4096 + 64
    big = tp.new_tensor(Type.F32, (32,), "big")
    with pytest.raises(tp.AllocationError, match="needs 128 bytes at offset 4032, past the end"):
        tp.tensor_alloc(host, big, 4032)
    assert big.buffer is None  # nothing half-placed
    tp.tensor_alloc(host, big, 4096 - 128)  # ending exactly at the end is fine
    assert (big.buffer, big.offset) == (host, 3968)
    tp.tensor_alloc(host, x, 0)
    with pytest.raises(tp.AllocationError, match="already allocated"):
        tp.tensor_alloc(host, x, 64)
    v = ops.view(x, (4,))
    with pytest.raises(tp.AllocationError, match="is a view"):
        tp.tensor_alloc(host, v, 64)
    with pytest.raises(tp.NotAllocatedError, match="base"):
        tp.view_init(ops.view(tp.new_tensor(Type.F32, (4,)), (2,)))
    with pytest.raises(tp.ShapeError, match=r"view_init: tensor 'x' .* is not a view"):
        tp.view_init(x)


def test_freed_buffer_refuses_use(host: tp.Buffer) -> None:
    x = _placed(Type.F32, (4,), host)
    host.free()
    host.free()  # idempotent
    assert host.is_freed
    with pytest.raises(tp.BufferFreedError, match="was freed"):
        tp.tensor_set(x, np.zeros(4, dtype=np.float32))
    with pytest.raises(tp.BufferFreedError, match=r"buffer 'CPU' \(4096 bytes\) was freed"):
        host.clear(0)
    with pytest.raises(tp.BufferFreedError, match=r"buffer 'CPU' \(4096 bytes\) was freed"):
        tp.tensor_alloc(host, tp.new_tensor(Type.F32, (4,)), 0)


def test_allocation_limits() -> None:
    with pytest.raises(tp.AllocationError, match="negative size"):
        tp.host_buffer_type().alloc_buffer(-1)

    class Small(tp.HostBufferType):
        @property
        def max_size(self) -> int:
            return 1024

    with pytest.raises(tp.AllocationError, match="holds at most 1024 bytes"):
        Small().alloc_buffer(2048)
    assert Small().alloc_buffer(1024).size == 1024


def test_tensor_copy_between_buffers_and_layout_check(host: tp.Buffer) -> None:
    other = tp.host_buffer_type().alloc_buffer(256)
    a = _placed(Type.F32, (2, 3), host)
    b = _placed(Type.F32, (2, 3), other)
    tp.set_array(a, np.arange(6, dtype=np.float32).reshape(2, 3))
    tp.tensor_copy(a, b)
    np.testing.assert_array_equal(tp.get_array(b), tp.get_array(a))
    c = _placed(Type.F32, (3, 2), other, 64)
    with pytest.raises(tp.LayoutMismatchError, match="same type, shape and strides"):
        tp.tensor_copy(a, c)


def test_buffer_from_numpy_and_mmap_is_zero_copy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    arr = np.zeros(64, dtype=np.uint8)
    buf = tp.host_buffer_type().buffer_from_host_memory(arr, tp.BufferUsage.WEIGHTS)
    x = tp.new_tensor(Type.F32, (4,))
    tp.tensor_alloc(buf, x, 0)
    tp.set_array(x, np.array([1, 2, 3, 4], dtype=np.float32))
    assert arr[:16].view(np.float32).tolist() == [1, 2, 3, 4]  # wrote through, no copy
    assert buf.usage is tp.BufferUsage.WEIGHTS

    path = tmp_path / "w.bin"
    path.write_bytes(np.arange(16, dtype=np.float32).tobytes())
    with path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    ro = tp.host_buffer_type().buffer_from_host_memory(mm)
    y = tp.new_tensor(Type.F32, (16,))
    tp.tensor_alloc(ro, y, 0)
    del mm  # the buffer keeps the mapping alive
    np.testing.assert_array_equal(tp.get_array(y), np.arange(16, dtype=np.float32))
    with pytest.raises(tp.UnsupportedError, match="read-only memory"):
        tp.set_array(y, np.zeros(16, dtype=np.float32))
    with pytest.raises(tp.TypeMismatchError, match="buffer protocol"):
        tp.host_buffer_type().buffer_from_host_memory(object())


def test_multi_buffer_groups_members() -> None:
    buft = tp.host_buffer_type()
    parts = [buft.alloc_buffer(128), buft.alloc_buffer(64)]
    multi = tp.MultiBuffer(parts)
    assert multi.size == 192
    multi.usage = tp.BufferUsage.COMPUTE
    assert all(p.usage is tp.BufferUsage.COMPUTE for p in parts)
    multi.clear(7)
    assert all(int(p.host_array()[0]) == 7 for p in parts)
    multi.free()
    assert all(p.is_freed for p in parts)
    with pytest.raises(ValueError, match="at least one"):
        tp.MultiBuffer([])


def test_byte_access_defaults_offsets_and_sizes(host: tp.Buffer) -> None:
    """Defaults and partial spans of tensor_set/get/memset (mutation-run survivors)."""
    x = _placed(Type.I8, (8,), host, 64)
    tp.tensor_memset(_placed(Type.I8, (64,), host, 0), 0x55)  # bytes just before x
    tp.tensor_set(x, bytes(range(1, 9)))  # the default offset is the tensor's first byte
    assert tp.tensor_get(x) == bytes(range(1, 9))
    assert tp.tensor_get(x, 5) == bytes([6, 7, 8])  # from an offset to the end
    assert tp.tensor_get(x, 2, 3) == bytes([3, 4, 5])
    assert tp.tensor_get(x, 8) == b"" and tp.tensor_get(x, 3, 0) == b""
    tp.tensor_memset(x, 0, offset=6)  # from an offset to the end
    assert tp.tensor_get(x) == bytes([1, 2, 3, 4, 5, 6, 0, 0])
    tp.tensor_memset(x, 9)  # the whole tensor by default
    assert tp.tensor_get(x) == bytes([9] * 8)

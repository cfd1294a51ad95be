"""Memory views and byte transfers: either exact or refused with an error that says
what was wrong — never other bytes read, written or silently dropped."""

from __future__ import annotations

import numpy as np
import pytest

import tensorplug as tp
from tensorplug import ops

REPACKED = ["q4_0", "q5_0", "q8_0", "q4_k", "q6_k"]


def _repacked(type_name: str) -> tuple[tp.Tensor, np.ndarray]:
    """A 24×256 matrix in CPU_REPACK holding random bytes (every layout round-trips
    any bytes), and those bytes."""
    dev = tp.dev_by_name("CPU")
    assert dev is not None
    w = tp.new_tensor(type_name, (24, 256), "w")
    tp.alloc_tensors([w], dev.repack_buffer_type())  # type: ignore[attr-defined]
    raw = np.random.default_rng(7).integers(0, 256, (24, w.row_bytes), dtype=np.uint8)
    tp.set_array(w, raw)
    np.testing.assert_array_equal(tp.get_array(w), raw)
    return w, raw


@pytest.mark.parametrize("type_name", REPACKED)
@pytest.mark.parametrize(("first", "rows"), [(1, 8), (0, 4), (8, 4), (4, 16)])
def test_a_repacked_view_off_the_eight_row_groups_is_refused(
    type_name: str, first: int, rows: int
) -> None:
    w, raw = _repacked(type_name)
    view = ops.view(w, (rows, 256), offset=first * w.row_bytes)
    with pytest.raises(tp.UnsupportedError, match="groups of 8 starting at a row"):
        tp.view_init(view)
    assert view.buffer is None  # refused: not half-placed
    np.testing.assert_array_equal(tp.get_array(w), raw)


@pytest.mark.parametrize("type_name", REPACKED)
def test_a_repacked_view_of_whole_groups_reads_and_writes_its_own_rows(type_name: str) -> None:
    w, raw = _repacked(type_name)
    view = ops.view(w, (8, 256), offset=8 * w.row_bytes)
    tp.view_init(view)
    np.testing.assert_array_equal(tp.get_array(view), raw[8:16])
    tp.set_array(view, np.zeros((8, w.row_bytes), np.uint8))
    expect = raw.copy()
    expect[8:16] = 0
    np.testing.assert_array_equal(tp.get_array(w), expect)
    tp.tensor_memset(view, 1, 3, 5)
    expect[8, 3:8] = 1
    np.testing.assert_array_equal(tp.get_array(w), expect)


@pytest.mark.parametrize(("offset", "size"), [(10, -5), (0, -1), (-4, 8)])
def test_a_negative_memset_size_or_offset_is_an_error_not_to_the_end(
    offset: int, size: int
) -> None:
    values = np.arange(8, dtype=np.float32)
    t = tp.from_dlpack(values)
    with pytest.raises(tp.OutOfBoundsError, match="negative|outside"):
        tp.tensor_memset(t, 0, offset, size)
    np.testing.assert_array_equal(values, np.arange(8, dtype=np.float32))


def test_raw_byte_writes_to_a_strided_dlpack_view_are_refused() -> None:
    """``a[:, ::2]``'s byte span holds ``a``'s other columns: a raw write would clobber
    them, so it is refused; its own values are written element by element."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tp.from_dlpack(a[:, ::2])
    before = a.copy()
    with pytest.raises(tp.LayoutMismatchError, match="set_array"):
        tp.tensor_memset(t, 0)
    with pytest.raises(tp.LayoutMismatchError, match="other elements"):
        tp.tensor_set(t, bytes(t.nbytes))
    with pytest.raises(tp.LayoutMismatchError):
        t.require_allocated().clear(0)
    np.testing.assert_array_equal(a, before)
    tp.set_array(t, np.full((3, 2), -1, np.float32))  # element-wise: only its columns
    before[:, ::2] = -1
    np.testing.assert_array_equal(a, before)
    tp.tensor_memset(t, 0, 0, 4)  # one element's own bytes are its own
    before[0, 0] = 0
    np.testing.assert_array_equal(a, before)


@pytest.mark.parametrize("device", ["CPU", "OpenCL0"])
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_zero_element_tensors_read_and_write_as_empty(device: str, shape: tuple[int, ...]) -> None:
    dev = tp.dev_by_name(device)
    if dev is None:
        pytest.skip(f"no {device} device (pip install pocl-binary-distribution for OpenCL)")
    be = dev.init_backend()
    t = tp.new_tensor("f32", shape, "empty")
    tp.alloc_tensors([t], be.buffer_type())
    tp.set_array(t, np.zeros(shape, np.float32))
    got = tp.get_array(t)
    assert got.shape == shape and got.dtype == np.float32
    assert tp.tensor_get(t) == b""
    tp.tensor_memset(t, 0)
    out = np.empty(shape, np.float32)
    tp.tensor_get_async(be, t, out)
    be.synchronize()

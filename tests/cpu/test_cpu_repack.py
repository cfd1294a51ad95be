"""Weights stored repacked (``CPU_REPACK``): the layout, the buffer that hides it, the
products that read it, and where the backend and the scheduler let it be read.

Products are held to the float64 product of the weights as ``gguf.quants`` decodes
them and the activations as ggml rounds them for the type (Q8_0; Q8_1 with its ``s`` for
Q4_1 and Q5_1; Q8_K for the K-quants and IQ4_XS: ``ggml_product``): what is left
between them is float32 accumulation. And a row's bits must not depend on the rows
computed beside it, which is what lets a serving engine batch requests.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest
from test_cpu_helpers import backend_for, ggml_product, nmse, q8_activations

import tensorplug as tp
from tensorplug import ops
from tensorplug.errors import UnsupportedError
from tensorplug.quants import quantize

RNG = np.random.default_rng(35)
TYPES = [tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_0, tp.Type.Q5_1, tp.Type.Q8_0, tp.Type.IQ4_NL,
         tp.Type.IQ4_XS, tp.Type.Q2_K, tp.Type.Q4_K, tp.Type.Q5_K, tp.Type.Q6_K]  # fmt: skip


def _cpu() -> tuple[tp.Backend, tp.BufferType]:
    from tensorplug_cpu.device import create_reg

    dev = create_reg().device(0)
    return dev.init_backend(), dev.repack_buffer_type()  # type: ignore[attr-defined]


def _weights(t: tp.Type, n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.ascontiguousarray(quantize(RNG.standard_normal((n_out, n_in)).astype(np.float32), t))
    decoded = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t)))
    return raw, decoded.astype(np.float64).reshape(n_out, n_in)


def _repacked(t: tp.Type, raw: np.ndarray, buft: tp.BufferType) -> tp.Tensor:
    w = tp.new_tensor(t, (raw.shape[0], raw.shape[1] * t.block_size // t.type_size), "w")
    assert tp.alloc_tensors([w], buft, tp.BufferUsage.WEIGHTS) is not None
    tp.set_array(w, raw)
    return w


# -- the layout and the buffer -----------------------------------------------------------------


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_unpack_undoes_pack_for_any_bytes(t: tp.Type) -> None:
    from tensorplug_cpu.repack import LAYOUTS

    lay = LAYOUTS[t]
    blocks = RNG.integers(0, 256, (24, 5, t.type_size), dtype=np.uint8)
    packed = np.empty((3, 5, lay.block), np.uint8)
    lay.pack(blocks, packed)
    back = np.empty_like(blocks)
    lay.unpack(packed, back)
    assert np.array_equal(back, blocks)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_the_compiled_repack_writes_numpys_bytes(t: tp.Type) -> None:
    """The compiled moves (every move of a block at once, the K-quants' scale bytes
    among them) against numpy's move-by-move pass, for shapes of one block to several
    groups of several blocks; a source not aligned for the kernel's 16-bit words is
    left to numpy, with the same bytes."""
    pytest.importorskip("numba", reason="the compiled repack is numba's")
    from tensorplug_cpu.kernels.jit import load_jit
    from tensorplug_cpu.repack import LAYOUTS
    from tensorplug_cpu.repack_buffer import pack_blocks

    jit = load_jit()
    assert jit is not None
    lay = LAYOUTS[t]
    for groups, nb in ((1, 1), (3, 2), (5, 7)):
        blocks = RNG.integers(0, 256, (8 * groups, nb, t.type_size), dtype=np.uint8)
        want = np.zeros((groups, nb, lay.block), np.uint8)
        lay.pack(blocks, want)
        got = np.zeros_like(want)
        assert jit.repack_moves(lay, blocks, got)
        lay.pack(blocks, got, moved=True)
        assert np.array_equal(got, want)
        odd = np.empty(blocks.nbytes + 1, np.uint8)[1:].reshape(blocks.shape)
        odd[...] = blocks
        assert not jit.repack_moves(lay, odd, np.zeros_like(want))
        got = np.zeros_like(want)
        pack_blocks(lay, odd, got, jit.repack_moves)
        assert np.array_equal(got, want)


def test_a_layout_the_compiled_repack_would_read_unaligned_is_left_to_numpy() -> None:
    """A move table is made only for layouts whose words the kernel reads aligned: a
    16-bit move from an odd byte of a block (no layout today) gets none, and its blocks
    are packed by numpy."""
    pytest.importorskip("numba", reason="the compiled repack is numba's")
    from tensorplug_cpu.kernels.jit import load_jit
    from tensorplug_cpu.repack import LAYOUTS, Move, PackedLayout, move_table
    from tensorplug_cpu.repack_buffer import pack_blocks

    q4 = LAYOUTS[tp.Type.Q4_0]
    assert move_table(q4) is not None
    odd = PackedLayout(tp.Type.Q4_0, (Move(np.uint16, 1, 0, 1), Move(np.uint32, 2, 16, 4)), 16,
                       chunks=4, offset=8)  # fmt: skip
    assert move_table(odd) is None
    jit = load_jit()
    assert jit is not None
    blocks = RNG.integers(0, 256, (16, 3, 18), dtype=np.uint8)
    want, got = np.zeros((2, 3, odd.block), np.uint8), np.zeros((2, 3, odd.block), np.uint8)
    odd.pack(blocks, want)
    assert not jit.repack_moves(odd, blocks, got)
    pack_blocks(odd, blocks, got, jit.repack_moves)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("t", [tp.Type.Q4_0, tp.Type.Q8_0, tp.Type.IQ4_NL], ids=lambda t: t.name)
def test_a_32_value_block_is_a_reordering_of_the_eight_rows_bytes(t: tp.Type) -> None:
    from tensorplug_cpu.repack import LAYOUTS

    lay = LAYOUTS[t]
    blocks = RNG.integers(0, 256, (24, 5, t.type_size), dtype=np.uint8)
    packed = np.empty((3, 5, lay.block), np.uint8)
    lay.pack(blocks, packed)
    assert lay.block == 8 * t.type_size
    # block b of group g: the eight rows' scales, then 4-byte chunks row after row
    g, b = 1, 3
    rows = blocks[8 * g : 8 * g + 8, b]
    assert np.array_equal(packed[g, b, :16].reshape(8, 2), rows[:, :2])
    chunks = packed[g, b, 16:].reshape(lay.chunks, 8, 4)
    assert np.array_equal(chunks[2], rows[:, 2 + 8 : 2 + 12])


def test_a_q5_0_block_regroups_the_fifth_bits_by_run_of_codes() -> None:
    """Word ``2c + h`` holds, at bits ``4r..4r+3``, row ``r``'s fifth bits of values
    ``16h + 4c ..``: the 32 codes of that run, in the order the run's bytes hold them."""
    from tensorplug_cpu.repack import LAYOUTS

    lay = LAYOUTS[tp.Type.Q5_0]
    blocks = RNG.integers(0, 256, (8, 1, 22), dtype=np.uint8)
    packed = np.empty((1, 1, lay.block), np.uint8)
    lay.pack(blocks, packed)
    assert lay.block == 8 * 22
    qh = blocks[:, 0, 2:6].copy().view("<u4")[:, 0]  # each row's 32 fifth bits
    words = packed[0, 0, 16:48].copy().view("<u4")
    for c in range(4):
        for h in range(2):
            for r in range(8):
                for i in range(4):
                    want = (int(qh[r]) >> (16 * h + 4 * c + i)) & 1
                    assert (int(words[2 * c + h]) >> (4 * r + i)) & 1 == want
    assert np.array_equal(
        packed[0, 0, 48 + 32 : 48 + 64].reshape(8, 4), blocks[:, 0, 6 + 4 : 6 + 8]
    )


def test_a_q4_k_block_unpacks_each_rows_six_bit_scales() -> None:
    from tensorplug_cpu.repack import LAYOUTS

    lay = LAYOUTS[tp.Type.Q4_K]
    raw = quantize(RNG.standard_normal((8, 256)).astype(np.float32), tp.Type.Q4_K)
    blocks = np.ascontiguousarray(raw).reshape(8, 1, 144)
    packed = np.empty((1, 1, lay.block), np.uint8)
    lay.pack(blocks, packed)
    assert lay.block == 1184  # 8·144, and 32 bytes more for the scales as bytes
    for r in range(8):
        q = blocks[r, 0, 4:16].astype(int)
        for s in range(8):  # ggml's get_scale_min_k4
            if s < 4:
                sc, m = q[s] & 63, q[s + 4] & 63
            else:
                sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4)
                m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4)
            assert (packed[0, 0, 32 + 8 * s + r], packed[0, 0, 96 + 8 * s + r]) == (sc, m)
    assert np.array_equal(packed[0, 0, :16].reshape(8, 2), blocks[:, 0, 0:2])  # d
    assert np.array_equal(packed[0, 0, 16:32].reshape(8, 2), blocks[:, 0, 2:4])  # dmin
    # pair 1, chunk 2: bytes 32 + 8..11 of each row's codes
    chunk = packed[0, 0, 160 + 32 * (8 + 2) : 160 + 32 * (8 + 3)].reshape(8, 4)
    assert np.array_equal(chunk, blocks[:, 0, 16 + 40 : 16 + 44])


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_the_buffer_reads_and_writes_ggml_bytes_at_any_offset(t: tp.Type) -> None:
    """set_tensor/get_tensor/memset_tensor take byte ranges of the tensor in ggml's
    layout, inside a group of eight rows or across groups; the bytes stored are the
    repacked ones."""
    _, buft = _cpu()
    raw, _ = _weights(t, 24, 256)
    w = _repacked(t, raw, buft)
    assert np.array_equal(tp.get_array(w), raw)
    buf = w.require_allocated()
    assert buf.name == "CPU_REPACK" and not buf.is_host
    stored = buf.data[w.offset : w.offset + w.nbytes]  # type: ignore[attr-defined]
    assert not np.array_equal(stored, raw.ravel())  # repacked, not as given
    flat = raw.ravel().copy()
    row = raw.shape[1]
    for start, size in ((5, 7), (row * 7 + 3, row + 9), (row * 8, row * 8), (0, flat.size)):
        patch = RNG.integers(0, 256, size, dtype=np.uint8)
        buf.set_tensor(w, patch.data, start)
        flat[start : start + size] = patch
        out = np.empty(size, np.uint8)
        buf.get_tensor(w, out.data, start)
        assert np.array_equal(out, patch)
        assert np.array_equal(tp.get_array(w).ravel(), flat)
    buf.memset_tensor(w, 0x3C, row * 5 + 1, row * 4)
    flat[row * 5 + 1 : row * 9 + 1] = 0x3C
    assert np.array_equal(tp.get_array(w).ravel(), flat)
    buf.clear(0x11)
    assert (tp.get_array(w) == 0x11).all()


def test_copying_a_host_tensor_in_repacks_it() -> None:
    _, buft = _cpu()
    raw, _ = _weights(tp.Type.Q4_0, 16, 64)
    src = tp.new_tensor("q4_0", (16, 64), "src")
    tp.alloc_tensors([src], tp.host_buffer_type())
    tp.set_array(src, raw)
    dst = tp.new_tensor("q4_0", (16, 64), "dst")
    buf = tp.alloc_tensors([dst], buft)
    assert buf is not None and buf.cpy_tensor(src, dst)
    assert np.array_equal(tp.get_array(dst), raw)


@pytest.mark.parametrize(
    ("type_", "shape", "why"),
    [
        ("f32", (16, 64), "type"),
        ("q3_k", (16, 256), "type"),
        ("q4_0", (12, 64), "rows"),
        ("q8_0", (2, 8, 64), "3-d"),
    ],
)
def test_what_the_buffer_type_does_not_take_is_refused_clearly(
    type_: str, shape: tuple[int, ...], why: str
) -> None:
    _, buft = _cpu()
    t = tp.new_tensor(type_, shape, "x")
    assert not buft.accepts(t)
    with pytest.raises(UnsupportedError, match=r"CPU_REPACK cannot hold .*multiple of 8"):
        tp.alloc_tensors([t], buft)
    assert buft.accepts(tp.new_tensor("q4_0", (16, 64), "ok"))


def test_the_cpu_offers_it_as_an_extra_buffer_type() -> None:
    pytest.importorskip("numba", reason="CPU_REPACK is offered with the numba kernels")
    cpu = tp.registry.dev_by_name("CPU")
    assert cpu is not None
    bufts = tp.extra_buffer_types(cpu)
    assert [b.name for b in bufts] == ["CPU_REPACK"]
    assert cpu.supports_buft(bufts[0]) and cpu.supports_buft(cpu.buffer_type())


# -- products --------------------------------------------------------------------------------


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 2, 3, 4, 5, 7, 16, 33])  # every tile size, and more
def test_products_match_ggml_activations_times_the_weights(t: tp.Type, n_tok: int) -> None:
    pytest.importorskip("numba", reason="the repacked products are numba's")
    backend, buft = _cpu()
    raw, w64 = _weights(t, 40, 512)
    w = _repacked(t, raw, buft)
    x = tp.new_tensor("f32", (n_tok, 512), "x")
    y = ops.mul_mat(w, x)
    g = tp.Graph(y)
    tp.alloc_tensors([x, y], tp.host_buffer_type())
    xv = RNG.standard_normal((n_tok, 512)).astype(np.float32)
    tp.set_array(x, xv)
    backend.graph_compute(g)
    expected = ggml_product(xv, w64, t, raw)  # Q8_0, or Q8_K for the K-quants
    got = tp.get_array(y)
    assert np.abs(got - expected).max() <= 2e-6 * np.abs(expected).max()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_one_thread_and_two_give_the_same_bits(t: tp.Type) -> None:
    pytest.importorskip("numba", reason="the repacked products are numba's")
    backend, buft = _cpu()
    raw, _ = _weights(t, 520, 256)  # many groups: several chunks of the parallel kernel
    w = _repacked(t, raw, buft)
    outs = []
    for threads in (1, 2):
        x = tp.new_tensor("f32", (19, 256), "x")
        y = ops.mul_mat(w, x)
        tp.alloc_tensors([x, y], tp.host_buffer_type())
        tp.set_array(x, np.cos(np.arange(19 * 256, dtype=np.float32)).reshape(19, 256))
        tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
        backend.graph_compute(tp.Graph(y))
        outs.append(tp.get_array(y))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_a_row_is_computed_the_same_whatever_the_row_count(t: tp.Type) -> None:
    """Row ``r`` of a product of ``n`` activation rows is the same row computed alone, bit
    for bit, for every ``n`` up to 40 (every tile size, every remainder of the tiles,
    and the parallel quantizer from 16 rows up): what lets a serving engine compute one
    request's decode token beside another's prompt chunk without changing either."""
    pytest.importorskip("numba", reason="the repacked products are numba's")
    backend, buft = _cpu()
    # batch-invariant, as the engine asks: ggml's own orders of Q4_K and Q6_K depend on
    # the row count (test_cpu_ggml_order)
    tp.get_proc("CPU", "set_batch_invariant")(backend, True)  # type: ignore[misc]
    raw, _ = _weights(t, 48, 512)
    w = _repacked(t, raw, buft)
    xv = RNG.standard_normal((40, 512)).astype(np.float32)
    alone = []
    for r in range(40):
        x = tp.new_tensor("f32", (1, 512), "x")
        y = ops.mul_mat(w, x)
        tp.alloc_tensors([x, y], tp.host_buffer_type())
        tp.set_array(x, xv[r : r + 1])
        backend.graph_compute(tp.Graph(y))
        alone.append(tp.get_array(y)[0])
    for n in range(1, 41):
        x = tp.new_tensor("f32", (n, 512), "x")
        y = ops.mul_mat(w, x)
        tp.alloc_tensors([x, y], tp.host_buffer_type())
        tp.set_array(x, xv[:n])
        backend.graph_compute(tp.Graph(y))
        np.testing.assert_array_equal(tp.get_array(y), np.stack(alone[:n]), err_msg=f"{n} rows")


@pytest.mark.parametrize("t", [tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_1], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 8])
def test_few_rows_are_the_bits_of_the_unrepacked_kernels(t: tp.Type, n_tok: int) -> None:
    """Q4_0: both compute each block's exact integer sum times ``d_w·d_x``, block after
    block; Q4_1 and Q5_1: both keep ggml's ``vec_dot`` order (eight float sums a row,
    the minimums beside them), whose bits are llama.cpp's. Repacking must not change a
    generation step's numbers."""
    pytest.importorskip("numba", reason="the integer kernels are numba's")
    backend, buft = _cpu()
    raw, _ = _weights(t, 64, 512)
    packed = _repacked(t, raw, buft)
    plain = tp.new_tensor(t, (64, 512), "plain")
    tp.alloc_tensors([plain], tp.host_buffer_type())
    tp.set_array(plain, raw)
    x = tp.new_tensor("f32", (n_tok, 512), "x")
    ya, yb = ops.mul_mat(packed, x), ops.mul_mat(plain, x)
    tp.alloc_tensors([x, ya, yb], tp.host_buffer_type())
    tp.set_array(x, RNG.standard_normal((n_tok, 512)).astype(np.float32))
    backend.graph_compute(tp.Graph([ya, yb]))
    np.testing.assert_array_equal(tp.get_array(ya), tp.get_array(yb))


@pytest.mark.parametrize("t", [tp.Type.Q8_0, tp.Type.Q4_1], ids=lambda t: t.name)
def test_without_numba_the_weights_are_unpacked_and_multiplied_exactly(t: tp.Type) -> None:
    _, buft = _cpu()
    raw, w64 = _weights(t, 16, 128)
    w = _repacked(t, raw, buft)
    x = tp.new_tensor("f32", (3, 128), "x")
    y = ops.mul_mat(w, x)
    tp.alloc_tensors([x, y], tp.host_buffer_type())
    xv = RNG.standard_normal((3, 128)).astype(np.float32)
    tp.set_array(x, xv)
    backend_for(jit=False).graph_compute(tp.Graph(y))
    assert nmse(tp.get_array(y), ggml_product(xv, w64, t, raw)) < 1e-12


def test_weights_written_after_a_compute_are_read_fresh() -> None:
    pytest.importorskip("numba", reason="the repacked products are numba's")
    backend, buft = _cpu()
    raw, _ = _weights(tp.Type.Q4_0, 16, 64)
    w = _repacked(tp.Type.Q4_0, raw, buft)
    x = tp.new_tensor("f32", (1, 64), "x")
    y = ops.mul_mat(w, x)
    g = tp.Graph(y)
    tp.alloc_tensors([x, y], tp.host_buffer_type())
    tp.set_array(x, np.ones((1, 64), np.float32))
    backend.graph_compute(g)
    first = tp.get_array(y)
    raw2, w64 = _weights(tp.Type.Q4_0, 16, 64)
    tp.set_array(w, raw2)
    backend.graph_compute(g)
    assert not np.array_equal(tp.get_array(y), first)
    expected = q8_activations(np.ones((1, 64), np.float32)) @ w64.T
    np.testing.assert_allclose(tp.get_array(y), expected, rtol=1e-5, atol=1e-5)


# -- who may read it ---------------------------------------------------------------------------


def test_only_whole_matrix_products_read_it() -> None:
    backend, buft = _cpu()
    raw, _ = _weights(tp.Type.Q8_0, 16, 64)
    w = _repacked(tp.Type.Q8_0, raw, buft)
    x = tp.new_tensor("f32", (2, 64), "x")
    ids = tp.new_tensor("i32", (2,), "ids")
    tp.alloc_tensors([x, ids], tp.host_buffer_type())
    dev = backend.device
    assert dev.supports_op(ops.mul_mat(w, x))
    assert not dev.supports_op(ops.get_rows(w, ids))
    assert not dev.supports_op(ops.mul_mat(ops.view(w, (8, 64), offset=w.strides[0] * 4), x))
    assert not dev.supports_op(ops.cpy(w, tp.new_tensor("q8_0", (16, 64), "copy")))


def test_the_scheduler_names_what_cannot_read_repacked_weights() -> None:
    backend, buft = _cpu()
    raw, _ = _weights(tp.Type.Q4_0, 16, 64)
    w = _repacked(tp.Type.Q4_0, raw, buft)
    ids = tp.new_tensor("i32", (2,), "ids")
    rows = ops.get_rows(w, ids)
    with pytest.raises(UnsupportedError, match=r"CPU_REPACK"):
        tp.Scheduler([backend]).alloc_graph(tp.Graph(rows))


# -- the IR on other hosts -----------------------------------------------------------------------

_OTHER_HOSTS = """
import re
import gguf, numpy as np
from numba import njit
from tensorplug.quants import quantize
from tensorplug.types import Type
from tensorplug_cpu.kernels import _numba_ir as ir, _numba_repack as rp
from tensorplug_cpu.kernels.job_blocks import sums_span
from tensorplug_cpu.kernels._numba_quant import quantize_q8_0, quantize_q8_1, quantize_q8_k
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table
from tensorplug_cpu.repack import LAYOUTS

# before anything is compiled in this process
ir.HAS_VNNI, ir.HAS_AVX2, ir.HAS_F16C, ir.HAS_32_REGS, ir.ON_ZEN = {flags}
rng = np.random.default_rng(7)
N = rp.WIDE_TILE  # the widest tile: each activation row's sums and accumulators at once
x = rng.standard_normal((N, 256)).astype(np.float32)
xq, xd, xs = np.empty((N, 256), np.int8), np.empty((N, 8), np.float32), np.empty((N, 8), np.int32)
quantize_q8_0(x, xq, xd, xs, table)
x64 = xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 32, axis=1)
xs1 = np.empty((N, 8), np.int32)  # Q8_1: each block's s = f16(d·Σcode), as float32 bits
quantize_q8_1(x, np.empty_like(xq), np.empty_like(xd), xs1, table)
s_minus_sum = xs1.view(np.float32).astype(np.float64) - xd * xs  # what s adds beyond d·Σcode
kq, kd, ks = np.empty_like(xq), np.empty_like(xd), np.empty_like(xs)  # Q8_K: IQ4_XS, Q4_K
quantize_q8_k(x, kq, kd, ks, table)
names = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "iq4_xs", "q2_k", "q4_k", "q5_k",
         "q6_k")
# then in ggml's order (TENSORPLUG_CPU_GGML_PRODUCT_ORDER): Q5_0, Q8_0 and Q6_K (its
# vec_dot's, then its tiled product's), and Q4_K's tile of ggml's four-row gemm
ggml_ordered = [("q5_0", True, False), ("q8_0", True, False), ("q6_k", True, False),
                ("q6_k", True, True), ("q4_k", True, False)]  # fmt: skip
for name, ggml_order, tiled in [(n, False, False) for n in names] + ggml_ordered:
    t = Type[name.upper()]
    lay = LAYOUTS[t]
    raw = np.ascontiguousarray(quantize(rng.standard_normal((16, 256)).astype(np.float32), t))
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).astype(np.float64)
    nb = 256 // t.block_size
    packed = np.empty((2, nb, lay.block), np.uint8)
    lay.pack(raw.reshape(16, nb, -1), packed)
    form = rp.TILED_FORM if tiled else rp.GEMM_FORM if name == "q4_k" and ggml_order else 0
    tile = rp.tile_kernel(lay, N, ggml_order, form)

    @njit(cache=False)
    def run(packed, xq, xd, xs, out):
        for g in range(2):
            tile(packed, g, xq, xd, xs, table, 0, out)

    out = np.full((N, 16), np.nan, np.float32)  # rows a tile left unwritten stay NaN
    sums = xq.reshape(N, -1, 16).sum(-1, dtype=np.int32) if name in ("q2_k", "q6_k") else xs
    sums = sums * -rp.Q6_K_OFFSET if name == "q6_k" else sums  # its offset's share, as _quantize
    sums = xs1 if name in ("q4_1", "q5_1") else sums
    if name in ("iq4_xs", "q4_k", "q5_k") or name == "q6_k" and ggml_order:  # their kernels
        k16 = kq.reshape(N, -1, 16).sum(-1, dtype=np.int32) * -rp.Q6_K_OFFSET  # take one d a
        k5 = (kd * ks.astype(np.float32)).view(np.int32)  # super-block: Q8_K's; Q5_K: d·Σx
        run(packed.reshape(2, -1), kq, kd, k16 if name == "q6_k" else k5 if name == "q5_k" else ks,
            out)
        expected = (kq.astype(np.float64) * np.repeat(kd.astype(np.float64), 32, axis=1)) @ w.T
    else:
        run(packed.reshape(2, -1), xq, xd, sums, out)
        expected = x64 @ w.T
    if name in ("q4_1", "q5_1"):  # the minimums times Q8_1's s (ggml_product's term)
        m = raw.reshape(16, nb, -1)[..., 2:4].copy().view(np.float16)[..., 0]
        expected += s_minus_sum @ m.astype(np.float64).T
    computed = ~np.isnan(out[:, 0])
    err = np.abs(out[computed] - expected[computed]).max() / np.abs(expected).max()
    assert err < 2e-6, (name, ggml_order, err)
    print(name + ("_tiled" if tiled else "_ggml" if ggml_order else ""), "ok")
# the last tile's IR (Q4_K in ggml's order) asks for the stream ahead off Zen cores only
print("prefetch", "llvm.prefetch" in "".join(run.inspect_llvm().values()))
# ... and realigns its stack on entry (ir.align_stack): no spilled vector straddles a line
print("aligned", "alignstack(64)" in "".join(run.inspect_llvm().values()),
      bool(re.search(r"andq\\s+\\$-64, %rsp", "".join(run.inspect_asm().values()))))

# a driver takes tiles of the layout's height on this host (rp.tile_rows: 8, 4 or 2), the
# rest in tiles of up to four: 11 rows at once give each row's bits alone, and the right
# values
for t in (Type.Q8_0, Type.Q4_1, Type.Q4_K, Type.Q5_K, Type.Q6_K):
    lay = LAYOUTS[t]
    raw = np.ascontiguousarray(quantize(rng.standard_normal((16, 256)).astype(np.float32), t))
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).astype(np.float64)
    nb = 256 // t.block_size
    packed = np.empty((2, nb, lay.block), np.uint8)
    lay.pack(raw.reshape(16, nb, -1), packed)
    driver = rp.packed_kernels(frozenset({{t}})).serial
    x11 = rng.standard_normal((11, 256)).astype(np.float32)

    def product(x):  # (Q8_K's scale is written to each of its eight 32-value blocks)
        n = x.shape[0]
        q, d = np.empty((n, 256), np.int8), np.empty((n, 8), np.float32)
        s = np.empty((n, 256 // sums_span(t)), np.int32)  # Q6_K: a sum per 16 values
        out = np.empty((n, 16), np.float32)
        driver(x, packed.reshape(2, -1), q, d, s, out, table, int(t))
        return out, q, d

    out, q11, d11 = product(x11)
    alone = np.concatenate([product(x11[r : r + 1])[0] for r in range(11)])
    assert np.array_equal(out, alone), t
    expected = (q11.astype(np.float64) * np.repeat(d11.astype(np.float64), 32, axis=1)) @ w.T
    err = np.abs(out - expected).max() / np.abs(expected).max()
    assert err < (2e-6 if t == Type.Q8_0 else 1e-2), (t, err)  # Q4_1: less Q8_1's s term
    print("driver", t.name, rp.tile_rows(lay), "ok")
# Q6_K's tiles: eight rows on a Zen core with 32 registers, else four
assert rp.tile_rows(LAYOUTS[Type.Q6_K]) == (8 if ir.HAS_32_REGS and ir.ON_ZEN else 4)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [(False, True, True, True, True), (False, False, False, False, False)],
    ids=["avx2", "portable"],
)
def test_the_ir_for_hosts_without_vnni_or_avx2_computes_the_same(flags: tuple[bool, ...]) -> None:
    """Hosts without AVX512-VNNI get ``vpmaddubsw``/``vpmaddwd`` (16-bit partial sums,
    widened before they could overflow); without AVX2 or F16C, portable widening IR and
    table-decoded scales. This machine compiles each form in a fresh process (the choice
    is made when a kernel is first compiled) and checks its widest tiles against the
    decoded weights, and its drivers' tile heights with 32 vector registers (an AVX-512
    Zen core without VNNI: Q6_K's tiles of eight) and with 16, that a tile
    prefetches the stream ahead off Zen cores only, and that the function holding a tile
    realigns its stack (``_numba_ir.align_stack``: its spills then never straddle a
    cache line, whatever stack a thread entered it with)."""
    pytest.importorskip("numba", reason="the repacked products are numba's")
    code = textwrap.dedent(_OTHER_HOSTS).format(flags=flags)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    names = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "iq4_xs", "q2_k", "q4_k", "q5_k",
             "q6_k", "q5_0_ggml", "q8_0_ggml", "q6_k_ggml", "q6_k_tiled", "q4_k_ggml"]  # fmt: skip
    rows = {
        "Q8_0": 8 if flags[3] else 4,
        "Q4_1": 4,
        "Q4_K": 2 if flags[3] else 4,
        "Q5_K": 8 if flags[3] else 4,
        "Q6_K": 8 if flags[3] and flags[4] else 4,  # eights on a Zen core (flags[4]) only
    }
    drivers = [w for t, n in rows.items() for w in ("driver", t, str(n), "ok")]
    prefetch = ["prefetch", str(not flags[4])]  # rp.prefetches: not on a Zen core
    aligned = ["aligned", "True", "True"]
    assert done.stdout.split() == [w for n in names for w in (n, "ok")] + prefetch + aligned + (
        drivers
    )


@pytest.mark.parametrize(
    ("t", "form"),
    [(tp.Type.Q4_K, 0), (tp.Type.Q4_K, 2), (tp.Type.Q5_K, 0), (tp.Type.Q6_K, 1)],
    ids=["Q4_K", "Q4_K-gemm", "Q5_K", "Q6_K-tiled"],
)
def test_a_tile_of_two_groups_is_each_groups_tile_to_the_bit(t: tp.Type, form: int) -> None:
    """Where a driver multiplies two eight-row groups at once (``pairs_groups``: Q4_K,
    also in ggml's gemm order, Q5_K, and Q6_K in ggml's tiled order, on an AVX-512 core
    with VNNI, off Zen), each lane must do what the one-group tile does for its row: a
    row's bits may not depend on whether its group was paired (an odd last group, and a
    chunk's edge between threads, are not)."""
    pytest.importorskip("numba", reason="the repacked products are numba's")
    from numba import njit

    from tensorplug_cpu.kernels import _numba_repack as rp
    from tensorplug_cpu.kernels._numba_quant import quantize_q8_k
    from tensorplug_cpu.kernels.jit import F16_TO_F32 as table
    from tensorplug_cpu.repack import LAYOUTS

    lay = LAYOUTS[t]
    if not rp.pairs_groups(lay, form):
        pytest.skip("this CPU multiplies one group at a time (pairs_groups: AVX512-VNNI, "
                    "32 registers, not a Zen core)")  # fmt: skip
    n, groups = rp.tile_rows(lay, True), 3
    raw, w64 = _weights(t, 8 * groups, 512)
    blocks = np.empty((groups, 2, lay.block), np.uint8)
    lay.pack(raw.reshape(8 * groups, 2, -1), blocks)
    packed = blocks.reshape(groups, -1)
    x = RNG.standard_normal((n, 512)).astype(np.float32)
    xq, xd = np.empty((n, 512), np.int8), np.empty((n, 16), np.float32)
    xs = np.empty((n, 16), np.int32)
    quantize_q8_k(x, xq, xd, xs, table)
    if t == tp.Type.Q5_K:  # the sums the tiles take: Q4_K Σx, Q5_K d_x·Σx (_scaled_sums),
        xs = (xd * xs.astype(np.float32)).view(np.int32)  # Q6_K −32·Σx over 16 (_sums_of_16)
    elif t == tp.Type.Q6_K:
        xs = xq.reshape(n, -1, 16).sum(-1, dtype=np.int32) * -rp.Q6_K_OFFSET
    one, two = (rp.tile_kernel(lay, n, True, form | paired) for paired in (0, rp.PAIRED))

    @njit(cache=False)
    def run(paired: bool, out: np.ndarray) -> None:
        if paired:
            two(packed, 1, xq, xd, xs, table, 0, out)  # groups 1 and 2
        else:
            for g in (1, 2):
                one(packed, g, xq, xd, xs, table, 0, out)

    outs = [np.full((n, 8 * groups), np.nan, np.float32) for _ in range(2)]
    for paired, out in zip((False, True), outs, strict=True):
        run(paired, out)
    np.testing.assert_array_equal(outs[1], outs[0])
    assert np.isnan(outs[1][:, :8]).all()  # group 0 was not asked for
    expected = (xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 32, axis=1)) @ w64.T
    err = np.abs(outs[1][:, 8:] - expected[:, 8:]).max() / np.abs(expected).max()
    assert err < 2e-6


def test_a_driver_computes_only_the_types_it_was_made_for() -> None:
    """A first run compiles the tiles of its model's weight types only (issue 42: one
    switch over every layout was ~70 s of SmolLM2's first run): the drivers made for
    Q4_0 give the backend's bits, those made for Q8_0 have no Q4_0 tile to run."""
    pytest.importorskip("numba", reason="the repacked products are numba's")
    from tensorplug_cpu.kernels import _numba_repack as rp
    from tensorplug_cpu.repack_buffer import packed_rows

    backend, buft = _cpu()
    raw, _ = _weights(tp.Type.Q4_0, 16, 64)
    w = _repacked(tp.Type.Q4_0, raw, buft)
    xv = RNG.standard_normal((3, 64)).astype(np.float32)
    x = tp.new_tensor("f32", xv.shape, "x")
    y = ops.mul_mat(w, x)
    tp.alloc_tensors([x, y], tp.host_buffer_type())
    tp.set_array(x, xv)
    tp.get_proc("CPU", "set_n_threads")(backend, 1)  # type: ignore[misc]
    backend.graph_compute(tp.Graph(y))
    table = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    args = (np.empty((3, 64), np.int8), np.empty((3, 2), np.float32),
            np.empty((3, 2), np.int32))  # fmt: skip
    for kinds, expected in [({tp.Type.Q4_0}, tp.get_array(y)), ({tp.Type.Q8_0}, None)]:
        out = np.full((3, 16), np.nan, np.float32)
        drivers = rp.packed_kernels(frozenset(kinds))
        drivers.serial(xv, packed_rows(w), *args, out, table.astype(np.float32),
                       int(tp.Type.Q4_0))  # fmt: skip
        if expected is None:
            assert np.isnan(out).all()  # the Q8_0 drivers hold no Q4_0 tile
        else:
            np.testing.assert_array_equal(out, expected)
    assert rp.packed_kernels(frozenset({tp.Type.Q8_0})) is drivers  # made once per set
    with pytest.raises(ValueError, match="F32 weights have no repacked layout"):
        rp.kinds_mask([tp.Type.F32])

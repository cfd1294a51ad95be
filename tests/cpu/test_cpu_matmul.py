"""CPU mul_mat: float and quantized weights, batch broadcasting, strided operands.

Quantized references decode the weights with ``gguf.quants`` (llama.cpp's own Python
port), then multiply in float64.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute, ggml_activations, ggml_product, nmse

import tensorplug as tp
from tensorplug import ops
from tensorplug.quants import bf16_to_f32, f32_to_bf16, quantize
from tensorplug_cpu.kernels import dispatch, matmul

RNG = np.random.default_rng(99)
QUANTS = [
    tp.Type.Q8_0,
    tp.Type.Q4_0,
    tp.Type.Q4_1,
    tp.Type.Q5_0,
    tp.Type.Q5_1,
    tp.Type.Q2_K,
    tp.Type.Q3_K,
    tp.Type.Q4_K,
    tp.Type.Q5_K,
    tp.Type.Q6_K,
    tp.Type.IQ4_NL,
    tp.Type.IQ4_XS,
]
MUL_MAT_NMSE = 5e-4  # DESIGN.md's threshold


def _f32(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _quantized(t: tp.Type, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(raw rows to store, float64 values gguf decodes them to)."""
    qt = gguf.GGMLQuantizationType[t.name]
    # gguf has no K-quant or IQ4 encoder: those bytes come from the core's (held to ggml's
    # bytes by test_kquants.py, test_iquants.py); decoding is gguf's for every type
    no_encoder = t.block_size == 256 or t == tp.Type.IQ4_NL
    raw = quantize(_f32(shape), t) if no_encoder else gguf.quants.quantize(_f32(shape), qt)
    return raw, gguf.quants.dequantize(raw, qt).astype(np.float64)


def _ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml's mul_mat: out[..., t, o] = Σ b[..., t, i]·a[..., o, i]; a repeated onto b."""
    # annotated: numpy's stubs take the concatenated shape for a 0-d one
    a4: np.ndarray = a.reshape((1,) * (4 - a.ndim) + a.shape)
    b4: np.ndarray = b.reshape((1,) * (4 - b.ndim) + b.shape)
    out = np.empty((*b4.shape[:2], b4.shape[2], a4.shape[2]))
    r0, r1 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    for j0 in range(b4.shape[0]):
        for j1 in range(b4.shape[1]):
            out[j0, j1] = b4[j0, j1] @ a4[j0 // r0, j1 // r1].T
    return out.reshape((*b.shape[:-1], a.shape[-2]))


def test_f32_2d_is_blas_exact() -> None:
    a, b = tp.new_tensor("f32", (48, 64), "w"), tp.new_tensor("f32", (7, 64), "x")
    av, bv = _f32(a.shape), _f32(b.shape)
    out = ops.mul_mat(a, b)
    compute(out, {a: av, b: bv})
    assert out.shape == (7, 48) and out.type == tp.Type.F32
    assert nmse(tp.get_array(out), bv.astype(np.float64) @ av.T.astype(np.float64)) < 1e-12


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((2, 1, 5, 32), (2, 3, 4, 32)),  # b's heads share a's single head
        ((1, 2, 5, 32), (3, 4, 1, 32)),  # both batch axes broadcast, one token
        ((2, 2, 5, 32), (2, 6, 4, 32)),  # grouped-query: heads j use a head j // 3
        ((5, 32), (2, 3, 4, 32)),
    ],
)
@pytest.mark.parametrize("ta", [tp.Type.F32, tp.Type.F16, tp.Type.Q8_0])
def test_batch_broadcasting(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], ta: tp.Type
) -> None:
    a, b = tp.new_tensor(ta, a_shape, "a"), tp.new_tensor("f32", b_shape, "b")
    if ta == tp.Type.Q8_0:
        av, a64 = _quantized(ta, a_shape)
    else:
        av = _f32(a_shape).astype(ta.numpy_dtype)
        a64 = av.astype(np.float64)
    bv = _f32(b_shape)
    out = ops.mul_mat(a, b)
    compute(out, {a: av, b: bv})
    b64 = ggml_activations(bv, ta)  # every path rounds as ggml does for ta
    assert nmse(tp.get_array(out), _ref(a64, b64)) < 1e-10


@pytest.mark.parametrize("ta", [tp.Type.F32, tp.Type.F16, tp.Type.BF16])
def test_transposed_weights_and_permuted_activations(ta: tp.Type) -> None:
    """a = vᵀ (columns strided, as in attention without flash), b a permuted view."""
    v = tp.new_tensor(ta, (40, 24), "v")  # a = transpose(v): (24, 40), non-dense rows
    xb = tp.new_tensor("f32", (3, 40, 2), "xb")
    b = ops.permute(xb, (2, 0, 1))  # (2, 3, 40)
    out = ops.mul_mat(ops.transpose(v), b)
    vv = _f32(v.shape)
    if ta == tp.Type.BF16:
        stored, v64 = f32_to_bf16(vv), bf16_to_f32(f32_to_bf16(vv)).astype(np.float64)
    else:
        stored = vv.astype(ta.numpy_dtype)
        v64 = stored.astype(np.float64)
    xv = _f32(xb.shape)
    compute(out, {v: stored, xb: xv})
    expected = _ref(v64.T, ggml_activations(xv, ta).transpose(2, 0, 1))
    assert out.shape == (2, 3, 24)
    assert nmse(tp.get_array(out), expected) < 1e-10


@pytest.mark.parametrize("tb", [tp.Type.F16, tp.Type.BF16])
def test_half_precision_activations(tb: tp.Type) -> None:
    a, b = tp.new_tensor("f32", (16, 32), "a"), tp.new_tensor(tb, (3, 32), "b")
    av, bv = _f32(a.shape), _f32(b.shape)
    stored = f32_to_bf16(bv) if tb == tp.Type.BF16 else bv.astype(np.float16)
    b64 = bf16_to_f32(stored) if tb == tp.Type.BF16 else stored.astype(np.float32)
    out = ops.mul_mat(a, b)
    compute(out, {a: av, b: stored})
    assert nmse(tp.get_array(out), b64.astype(np.float64) @ av.T) < 1e-12


@pytest.mark.parametrize("t", QUANTS)
@pytest.mark.parametrize("n_tokens", [1, 5, 12, 16, 33])  # 12, 16: fused for some types only
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "numpy"])
def test_quantized_weights(t: tp.Type, n_tokens: int, jit: bool) -> None:
    a, b = tp.new_tensor(t, (96, 256), "w"), tp.new_tensor("f32", (n_tokens, 256), "x")
    raw, a64 = _quantized(t, a.shape)
    bv = _f32(b.shape)
    out = ops.mul_mat(a, b)
    compute(out, {a: raw, b: bv}, backend_for(jit=jit))
    err = nmse(tp.get_array(out), ggml_product(bv, a64, t, raw))
    # the weights are decoded exactly and the activations rounded exactly as ggml rounds
    # them for t, on every path; only float32 accumulation remains
    assert err < 1e-10 < MUL_MAT_NMSE


@pytest.mark.parametrize("t", [tp.Type.Q4_0, tp.Type.F16])
@pytest.mark.parametrize("n_tokens", [2, 20])
def test_tiled_decoding_of_large_weights(
    t: tp.Type, n_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights above TILE_ELEMS are decoded in row tiles; shrink it to exercise that."""
    monkeypatch.setattr(matmul, "TILE_ELEMS", 64 * 10)  # 10 rows of 64 per tile
    a = tp.new_tensor(t, (2, 37, 64), "w")
    b = tp.new_tensor("f32", (4, n_tokens, 64), "x")
    if t.is_quantized:
        raw, a64 = _quantized(t, a.shape)
    else:
        raw = _f32(a.shape).astype(np.float16)
        a64 = raw.astype(np.float64)
    bv = _f32(b.shape)
    out = ops.mul_mat(a, b)
    compute(out, {a: raw.reshape(*a.shape[:-1], -1) if t.is_quantized else raw, b: bv},
            backend_for(jit=False))  # fmt: skip
    assert nmse(tp.get_array(out), _ref(a64, ggml_activations(bv, t))) < 1e-10


def test_quantized_rows_of_a_weight_view() -> None:
    """A row slice of a quantized matrix (a view with an offset) multiplies correctly."""
    w = tp.new_tensor(tp.Type.Q8_0, (20, 64), "w")
    rows = ops.view(w, (8, 64), offset=5 * w.row_bytes)  # rows 5..12
    x = tp.new_tensor("f32", (1, 64), "x")
    out = ops.mul_mat(rows, x)
    raw, w64 = _quantized(tp.Type.Q8_0, w.shape)
    xv = _f32(x.shape)
    compute(out, {w: raw, x: xv})
    x64 = ggml_activations(xv, tp.Type.Q8_0)
    assert nmse(tp.get_array(out), x64 @ w64[5:13].T) < 1e-10


@pytest.mark.parametrize("watched", [True, False], ids=["events", "no-events"])
def test_a_slow_first_kernel_call_says_it_is_compiling(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, watched: bool
) -> None:
    """numba compiles on first use (seconds): a first call whose compile is still running
    after COMPILE_NOTICE_S logs one line, later calls and fast first calls log nothing
    (a first call that compiles nothing says nothing: tests/hostile/
    test_compile_notice_hostile.py). Where the fast launch is off, numba's compile
    events are not listened to: the clock starts at the call, and the line says a load
    may be what takes the time."""
    import logging
    import threading

    from numba.core import event

    from tensorplug_cpu.kernels import jit as jit_module
    from tensorplug_cpu.kernels import jit_calls

    kernels = jit_module.load_jit()
    if kernels is None:
        pytest.skip(f"numba kernels unavailable: {jit_module.jit_status()}")
    calls: list[int] = []
    notices: list[str] = []
    said = threading.Event()

    class Said(logging.Handler):  # the timer's thread logs: read what it passed, not caplog
        def emit(self, record: logging.LogRecord) -> None:
            if "compiling" in record.getMessage():
                notices.append(record.getMessage())
                said.set()

    def slow_kernel(*args: object) -> None:
        calls.append(len(args))
        if len(calls) == 1:  # the first call compiles, as numba announces it, until the
            # notice is out: however late a busy machine runs the notice's timer
            with event.trigger_event("numba:compile", data={"dispatcher": None, "args": ()}):
                said.wait(300)

    monkeypatch.setattr(jit_calls, "COMPILE_NOTICE_S", 0.05)
    monkeypatch.setattr(jit_calls.numba_internals, "enabled", lambda: watched)
    monkeypatch.setitem(kernels._kernels, tp.Type.Q2_K, (slow_kernel, slow_kernel))
    monkeypatch.setattr(kernels, "called", set())
    handler = Said()
    logging.getLogger("tensorplug_cpu").addHandler(handler)
    try:
        with caplog.at_level("WARNING", logger="tensorplug_cpu"):
            blocks, x, out = np.zeros((1, 1, 84), np.uint8), np.zeros((1, 256)), np.zeros((1, 1))
            for _ in range(3):
                kernels.matvec(tp.Type.Q2_K, blocks, x, out)
    finally:
        logging.getLogger("tensorplug_cpu").removeHandler(handler)
    doing = "compiling" if watched else "loading or compiling"
    assert notices == [
        f"numba is {doing} the matrix-vector kernel for Q2_K (once: it is cached on disk "
        "for later runs)"
    ]
    assert len(calls) == 3


@pytest.mark.parametrize("t", [tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_0, tp.Type.Q5_1,
                               tp.Type.Q8_0, tp.Type.Q4_K, tp.Type.Q5_K, tp.Type.Q6_K,
                               tp.Type.IQ4_NL, tp.Type.IQ4_XS])  # fmt: skip
def test_the_vector_row_decoders_match_the_numpy_codec_bit_for_bit(t: tp.Type) -> None:
    """A prompt's weight chunks decode a vector per block (numba): the same float32
    weights as :func:`tensorplug.quants.dequantize_blocks`, scales of every kind
    (subnormal, huge, inf, NaN) included, and the scalar kernel on strided blocks."""
    pytest.importorskip("numba")
    from tensorplug.quants import dequantize_blocks, quantize
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    assert jit is not None
    rng = np.random.default_rng(3)
    n = 8 * t.block_size
    raw = quantize(rng.standard_normal((9, n)).astype(np.float32) * 5, t)
    raw = np.ascontiguousarray(raw).reshape(9, 8, t.type_size)
    scales = np.array([6e-8, 65504, np.inf, -np.inf, np.nan, -0.0, 1e-3, -2.5], np.float16)
    at = 208 if t == tp.Type.Q6_K else 0  # the block's f16 scale d
    raw[0, :, at : at + 2] = scales.view(np.uint8).reshape(8, 2)
    want = dequantize_blocks(raw, t)
    out = np.full((9, n), np.nan, np.float32)
    jit.dequantize(t, raw, out)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    strided = np.ascontiguousarray(np.concatenate([raw, raw], axis=1))[:, ::2]  # every other block
    jit.dequantize(t, strided, out)
    np.testing.assert_array_equal(out, dequantize_blocks(strided, t))


@pytest.mark.parametrize("ta", [tp.Type.F32, tp.Type.F16, tp.Type.BF16])
@pytest.mark.parametrize("n_in", [100, 264])  # tails: after runs of 32, of 8 and of 1
@pytest.mark.parametrize("n_tokens", [1, 3, dispatch.FLOAT_MATVEC_MAX_TOKENS])
def test_float_weights_times_a_few_rows(ta: tp.Type, n_in: int, n_tokens: int) -> None:
    """A few rows take the kernels that read each weight once (F16 widened in registers);
    one thread and two give the same bits."""
    a, b = tp.new_tensor(ta, (40, n_in), "w"), tp.new_tensor("f32", (n_tokens, n_in), "x")
    bv = _f32(b.shape)
    if ta == tp.Type.BF16:
        av = f32_to_bf16(_f32(a.shape))
        a64 = bf16_to_f32(av).astype(np.float64)
    else:
        av = _f32(a.shape).astype(ta.numpy_dtype)
        a64 = av.astype(np.float64)
    outs = []
    for threads in (1, 2):
        backend = backend_for()
        tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
        out = ops.mul_mat(a, b)
        compute(out, {a: av, b: bv}, backend)
        outs.append(tp.get_array(out))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert nmse(outs[0], ggml_activations(bv, ta) @ a64.T) < 1e-12


def test_float_kernels_without_f16c_read_halves_through_the_table() -> None:
    """Hosts without F16C look each half up in the f16 → f32 table; compiled that way in a
    fresh process (the choice is made when the kernel is first compiled)."""
    import subprocess
    import sys
    import textwrap

    pytest.importorskip("numba", reason="the float kernels are numba's")
    code = textwrap.dedent("""
        import numpy as np
        from numba import njit
        from tensorplug_cpu.kernels import _numba_fmatvec as fm, _numba_ir as ir
        from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

        ir.HAS_F16C = False  # before anything is compiled in this process
        rng = np.random.default_rng(3)
        w = rng.standard_normal((5, 77)).astype(np.float16)
        x = rng.standard_normal((2, 77)).astype(np.float32)

        @njit(cache=False)
        def run(w, x, out):
            for o in range(w.shape[0]):
                for t in range(x.shape[0]):
                    out[t, o] = fm._row_dot(w, o, x, t, table)

        out = np.empty((2, 5), np.float32)
        run(w.view(np.uint16), x, out)
        want = x.astype(np.float64) @ w.astype(np.float64).T
        print(float(np.abs(out - want).max() / np.abs(want).max()))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout) < 1e-6


@pytest.mark.parametrize("t", QUANTS, ids=lambda t: t.name)
def test_numba_and_numpy_round_the_activations_to_the_same_bits(t: tp.Type) -> None:
    """The decoding paths round a prompt's activations in numba where they can, in numpy
    elsewhere: the same values (and Q8_1 corrections), so numba changes no number."""
    from tensorplug_cpu.kernels.activations import q8_1_offset_correction, round_rows
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    if jit is None:
        pytest.skip("numba kernels unavailable")
    x = _f32((5, 512)) * np.float32(3)
    x[1] = 0  # an all-zero row: zero scales, as ggml's
    x[2, 7] = -40  # the largest magnitude negative: Q8_K's iscale takes its sign
    out, corr = np.empty_like(x), np.empty((5, 16), np.float32)
    jit.bind_round_rows(t, x, out, corr)()
    np.testing.assert_array_equal(out, round_rows(x, t))
    if t in (tp.Type.Q4_1, tp.Type.Q5_1):
        np.testing.assert_array_equal(corr, q8_1_offset_correction(x))

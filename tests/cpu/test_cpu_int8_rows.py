"""The integer mat×vec kernels row by row: groups of four rows, the rows left over, the
types streamed one row at a time, and the portable (non-AVX2, non-F16C) form of the
same LLVM IR.

Each product is held to the float64 product of the weights as ``gguf.quants`` decodes
them and the activations as ggml rounds them for the weight type (Q8_0, Q8_1 with its
``s``, Q8_K: ``test_cpu_helpers.ggml_product``), so only float32 accumulation is left
between them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest
from test_cpu_helpers import ggml_product, throwaway_cache_env

import tensorplug as tp
from tensorplug.quants import quantize

pytest.importorskip("numba", reason="the integer kernels are numba's (pip install numba)")

RNG = np.random.default_rng(2024)
TYPES = [tp.Type.Q4_0, tp.Type.Q4_1, tp.Type.Q5_0, tp.Type.Q5_1, tp.Type.Q8_0, tp.Type.Q4_K,
         tp.Type.Q6_K]  # fmt: skip


def _weights(t: tp.Type, n_out: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.ascontiguousarray(quantize(RNG.standard_normal((n_out, n)).astype(np.float32), t))
    decoded = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t)))
    return raw, decoded.astype(np.float64)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_out", [3, 101, 260])  # no group, groups and leftovers, many chunks
def test_products_match_the_decoded_weights(t: tp.Type, n_out: int) -> None:
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    if jit is None:
        pytest.skip("numba kernels unavailable")
    raw, w64 = _weights(t, n_out, 512)
    x = RNG.standard_normal((3, 512)).astype(np.float32)
    out = np.full((3, n_out), np.nan, np.float32)
    jit.matvec(t, raw.reshape(n_out, -1, t.type_size), x, out)
    expected = ggml_product(x, w64, t, raw)
    assert np.abs(out - expected).max() <= 2e-6 * np.abs(expected).max()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_one_thread_kernel_gives_the_parallel_kernels_numbers(t: tp.Type) -> None:
    """At one thread a product runs a serial kernel (no parallel region); its rows must
    be bit for bit those of the parallel kernel, or a result would depend on ``-t``."""
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    if jit is None:
        pytest.skip("numba kernels unavailable")
    n = 768 if t in (tp.Type.Q4_K, tp.Type.Q6_K) else 640
    for n_out in (3, 103):  # fewer rows than a group; groups and three left over
        raw, w64 = _weights(t, n_out, n)
        blocks = raw.reshape(n_out, -1, t.type_size)
        x = RNG.standard_normal((8, n)).astype(np.float32)  # a fused product's most rows
        before = jit.n_threads
        outs = []
        try:
            for threads in (1, 2):
                jit.set_num_threads(threads)
                out = np.full((8, n_out), np.nan, np.float32)
                jit.bind_matvec(t, blocks, x, out)()
                outs.append(out)
        finally:
            jit.set_num_threads(before)
        expected = ggml_product(x, w64, t, raw)
        assert np.abs(outs[0] - expected).max() <= 2e-6 * np.abs(expected).max()
        np.testing.assert_array_equal(outs[0], outs[1])


_PORTABLE = """
import sys
import numpy as np
from numba import njit
from tensorplug.types import Type
from tensorplug_cpu.kernels import _numba_introw as rows, _numba_ir as ir
from tensorplug_cpu.kernels._numba_quant import quantize_activations
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

ir.HAS_AVX2 = ir.HAS_F16C = False  # before anything is compiled in this process
cases = np.load(sys.argv[1])
x = cases["x"]
for name in {names!r}:
    t = Type[name.upper()]
    raw, expected = cases[name + "_raw"], cases[name + "_expected"]
    xq, xd = np.empty((1, 512), np.int8), np.empty((1, 16), np.float32)
    xs = np.empty((1, 16), np.int32)
    quantize_activations(x, xq, xd, xs, table, int(t))
    group = rows.GROUP[name]
    kernel = getattr(rows, "rows" + str(group) + "_dot_" + name)

    @njit(cache=False)
    def run(raw, xq, xd, xs, out):
        for o in range(0, 8, group):
            some = kernel(raw, o, xq, xd, xs, table, xd.size)
            for i in range(group):
                out[o + i] = some[i]

    out = np.empty(8, np.float32)
    run(raw, xq[0], xd[0], xs[0], out)
    err = np.abs(out - expected).max() / np.abs(expected).max()
    assert err < 2e-6, (name, err)
    print(name, "ok")
"""


def test_the_portable_ir_computes_the_same_products(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Hosts without AVX2 or F16C get widening vector IR and table-decoded scales; this
    machine compiles that form in a fresh process (the choice is made when a kernel is
    first compiled) and checks it against the decoded weights."""
    names = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q6_k"]
    rng = np.random.default_rng(7)
    cases = {"x": rng.standard_normal((1, 512)).astype(np.float32)}
    for name in names:
        t = tp.Type[name.upper()]
        raw, w64 = _weights(t, 8, 512)
        cases[name + "_raw"] = raw
        cases[name + "_expected"] = ggml_product(cases["x"], w64, t, raw)[0]
    # allow_pickle given (numpy's default) so that the arrays in **cases are not typed
    # against that bool parameter
    np.savez(tmp_path / "cases.npz", allow_pickle=True, **cases)
    code = textwrap.dedent(_PORTABLE).format(names=names)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cases.npz")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [w for n in names for w in (n, "ok")]


_FAST_CALLER = """
import numpy as np
from numba import njit
from tensorplug_cpu.kernels._numba_quant import DOT_FASTMATH, quantize_q8_0
from tensorplug_cpu.kernels.jit import F16_TO_F32 as table

@njit(fastmath=DOT_FASTMATH, cache=False)  # like the mat×vec kernels, which quantize first
def fast_caller(x, xq, xd, xs):
    quantize_q8_0(x, xq, xd, xs, table)

x = np.zeros((1, 32), np.float32)
x[0, 0] = np.float32(0.49827388)  # amax/127 rounds up to f16 0x1C05; amax·(1/127) down
xq, xd, xs = np.empty((1, 32), np.int8), np.empty((1, 1), np.float32), np.empty((1, 1), np.int32)
fast_caller(x, xq, xd, xs)
print(repr(float(xd[0, 0])), repr(float(np.float16(x[0, 0] / np.float32(127)))))
"""


def test_quantizing_inside_a_fast_math_kernel_rounds_as_ggml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """numba gives a callee that sets no ``fastmath`` its caller's flags, and the
    mat×vec kernels (reassociation, reciprocals allowed) call the activation quantizer:
    ``amax / 127`` became ``amax · (1/127)`` and some scales came out one f16 step
    lower than ggml's (a Gemma 3 prompt's logits moved by up to 0.9). Compiled afresh
    (an empty numba cache) and first from such a caller, the scale must still be
    ggml's ``f16(amax / 127)``."""
    env = throwaway_cache_env(tmp_path)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_FAST_CALLER)],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got, want = done.stdout.split()
    assert got == want


@pytest.mark.parametrize("t", [tp.Type.Q4_0, tp.Type.Q4_K, tp.Type.Q6_K], ids=lambda t: t.name)
def test_an_infinite_activation_makes_its_rows_products_nan_as_ggmls(t: tp.Type) -> None:
    """An activation row holding inf (a broken model's overflow) has NaN products, as
    llama.cpp's do (its scale is infinite and its codes 0), and the other rows keep
    their values: the K-quants' Q8_K quantizer raised ZeroDivisionError there. (Last
    in the file: it draws from ``RNG`` after the other tests.)"""
    from tensorplug_cpu.kernels.jit import load_jit

    jit = load_jit()
    if jit is None:
        pytest.skip("numba kernels unavailable")
    raw, _ = _weights(t, 64, 512)
    x = RNG.standard_normal((3, 512)).astype(np.float32)
    clean = np.zeros((3, 64), np.float32)
    jit.matvec(t, raw.reshape(64, -1, t.type_size), x, clean)
    x[1, 7] = np.inf
    out = np.zeros((3, 64), np.float32)
    jit.matvec(t, raw.reshape(64, -1, t.type_size), x, out)
    assert np.isnan(out[1]).all()
    assert np.array_equal(out[[0, 2]], clean[[0, 2]])

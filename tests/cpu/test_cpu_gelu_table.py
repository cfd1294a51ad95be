"""The CPU's GELU and GeGLU are ggml's: a lookup in ggml's F16 table, bit for bit.

ggml's CPU rounds the input to f16 and reads ``ggml_table_gelu_f16`` (``GGML_GELU_FP16``),
so its GELU is up to an f16 rounding (2^-11) from the tanh formula. Computed by the
formula, Gemma 3 270M's first GeGLU was 3.6e-4 off llama.cpp's, which its later 8-bit
activation roundings grew into a logit difference of 1.9. Held here: the table itself
and one row of Gemma 3's GeGLU, both recorded from llama-cpp-python 0.3.36 by
``tests/data/make_gelu_fixture.py``; the numba kernel (a generation step's few rows)
and numpy's (a prompt's), at one and two threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute

import tensorplug as tp
from tensorplug import ops
from tensorplug_cpu.kernels.gelu_table import gelu_f16_table

GGML = np.load(Path(__file__).parents[1] / "data" / "gelu_llamacpp.npz")
#: every f16 value the lookup can meet: finite and inside ggml's clamps (-10, 10)
_F16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
LOOKED_UP = np.isfinite(_F16) & (np.abs(_F16.astype(np.float32)) < 10)


def _ggml_gelu(x: np.ndarray) -> np.ndarray:
    """ggml's ``ggml_vec_gelu_f32`` by its recorded table: 0 at or below -10, x at or
    above 10, else the table's entry at x's f16 bits."""
    table = GGML["table"].view(np.float16).astype(np.float32)
    with np.errstate(over="ignore"):
        looked = table[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, looked)).astype(np.float32)


def test_the_table_is_ggmls_wherever_it_is_read() -> None:
    ours = gelu_f16_table()[LOOKED_UP].astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(ours, GGML["table"][LOOKED_UP])
    # and it is not the formula: f16 rounding moves most entries
    x = _F16[LOOKED_UP].astype(np.float64)
    formula = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    assert np.mean(gelu_f16_table()[LOOKED_UP] != formula.astype(np.float32)) > 0.5


def _run(
    out: tp.Tensor, inputs: dict[tp.Tensor, np.ndarray], jit: bool, threads: int
) -> np.ndarray:
    backend = backend_for(jit=jit)
    tp.get_proc("CPU", "set_n_threads")(backend, threads)  # type: ignore[misc]
    compute(out, inputs, backend)
    return tp.get_array(out).copy()


@pytest.mark.parametrize("threads", [1, 2])
# a step's row, a prompt's, and one of 2^18 values or more, which numba splits over the
# worker pool (without numba, numpy's passes compute each)
@pytest.mark.parametrize("rows", [1, 9, 130])
@pytest.mark.parametrize("jit", [True, False])
def test_geglu_of_gemma3s_first_ffn_is_llama_cpps(rows: int, jit: bool, threads: int) -> None:
    gate = np.tile(GGML["gate"], (rows, 1))
    up = np.tile(GGML["up"], (rows, 1))
    a = tp.new_tensor("f32", gate.shape, "gate")
    b = tp.new_tensor("f32", up.shape, "up")
    got = _run(ops.geglu(a, b), {a: gate, b: up}, jit, threads)
    np.testing.assert_array_equal(got, np.tile(GGML["geglu"], (rows, 1)))


@pytest.mark.parametrize("rows", [4, 12])
@pytest.mark.parametrize("jit", [True, False])
def test_gelu_and_geglu_look_every_value_up_as_ggml(rows: int, jit: bool) -> None:
    """Random values of every size, the clamps' edges, and gates that are inf or NaN
    where x <= -10 (0, as ggml's loop writes it) or x >= 10 (x·g)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows, 64)) * rng.choice([0.01, 1, 4, 30], (rows, 64))
    x = x.astype(np.float32)
    x[0, :8] = [-10, 10, -9.999, 9.999, -1e30, 1e30, -0.0, 6e-8]
    g = rng.standard_normal((rows, 64)).astype(np.float32)
    g[0, 4:6] = [np.inf, np.nan]
    ta = tp.new_tensor("f32", x.shape, "x")
    tg = tp.new_tensor("f32", g.shape, "g")
    gelu = _run(ops.gelu(ta), {ta: x}, jit, 2)
    np.testing.assert_array_equal(gelu, _ggml_gelu(x))
    geglu = _run(ops.geglu(ta, tg), {ta: x, tg: g}, jit, 2)
    with np.errstate(invalid="ignore"):
        want = np.where(x <= -10, np.float32(0), _ggml_gelu(x) * g)
    np.testing.assert_array_equal(geglu, want)


def test_the_table_is_built_only_for_a_gelu() -> None:
    """A SwiGLU model's launch builds no table (1.8 ms on the dev machine): its gated
    activations get a one-entry stand-in, which they never read; the first GeGLU builds
    it. In a process of its own, where nothing has asked for the table yet."""
    code = textwrap.dedent(
        """
        import json
        import numpy as np
        import tensorplug as tp
        from tensorplug import ops
        from tensorplug_cpu.kernels.gelu_table import gelu_f16_table
        from test_cpu_helpers import backend_for, compute
        x = np.linspace(-3, 3, 3 * 64, dtype=np.float32).reshape(3, 64)
        g = np.full((3, 64), 2.0, np.float32)
        found = {}
        for op in (ops.swiglu, ops.geglu):
            a, b = tp.new_tensor("f32", x.shape, "a"), tp.new_tensor("f32", g.shape, "b")
            out = op(a, b)
            compute(out, {a: x, b: g}, backend_for(jit=True))
            found[op.__name__] = [gelu_f16_table.cache_info().currsize,
                                  tp.get_array(out).tolist()]
        print(json.dumps(found))
        """
    )
    here = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    x = np.linspace(-3, 3, 3 * 64, dtype=np.float32).reshape(3, 64)
    assert found["swiglu"][0] == 0 and found["geglu"][0] == 1
    silu = x / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(found["swiglu"][1], silu * 2, rtol=1e-6)
    np.testing.assert_array_equal(found["geglu"][1], _ggml_gelu(x) * np.float32(2))

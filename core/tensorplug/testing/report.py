"""Rendering check and bench results: a rich table on a terminal, plain text, CSV or JSON.

CSV and JSON come from the standard library and carry every field, for CI logs and
dashboards; the tables are for people.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from typing import IO, Any

from ..extras import available
from .bench import BenchResult
from .runner import CheckReport, Outcome

__all__ = ["render_bench", "render_check"]

_OUTCOME_STYLE = {Outcome.PASS: "green", Outcome.FAIL: "bold red", Outcome.UNSUPPORTED: "yellow"}


def _fmt_error(error: float | None) -> str:
    return "-" if error is None else f"{error:.2e}"


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    plain: bool,
    out: IO[str],
    styles: Sequence[str] = (),
) -> None:
    """Aligned columns as plain text, or a rich table whose last column wraps (when rich,
    an optional dependency, is installed: ``tensorplug[rich]``)."""
    if plain or not available("rich"):
        widths = [max(len(c) for c in col) for col in zip(headers, *rows, strict=False)]
        for row in (headers, *rows):
            cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
            out.write("  ".join(cells).rstrip() + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(header_style="bold")
    for i, h in enumerate(headers):
        last = i == len(headers) - 1
        table.add_column(h, no_wrap=not last, overflow="fold" if last else "ellipsis")
    for i, row in enumerate(rows):
        table.add_row(*row, style=styles[i] if i < len(styles) else None)
    Console(file=out, highlight=False).print(table)


def render_check(
    report: CheckReport,
    output: str = "table",
    plain: bool = True,
    out: IO[str] | None = None,
    problems_only: bool = False,
    every_case: bool = False,
) -> None:
    """Write ``report`` as ``table``, ``csv`` or ``json`` (every case in both).

    The table is for people: one row per op, then a row for each case that failed or is
    unsupported, then the summary (``every_case``: a row for every case instead; case
    names run to 200 characters, which is why they are not the default)."""
    out = out or sys.stdout
    results = [r for r in report.results if not (problems_only and r.passed)]
    if output == "json":
        data = report.to_dict()
        data["cases"] = [r.to_dict() for r in results]
        json.dump(data, out, indent=2)
        out.write("\n")
        return
    if output == "csv":
        fields = ["case", "op", "outcome", "error", "message", "seconds", "contract_needed"]
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        for r in results:
            writer.writerow(r.to_dict())
        return
    if output != "table":
        raise ValueError(f"unknown output format {output!r}; use table, csv or json")
    if not every_case and not problems_only:
        _op_table(report, plain, out)
        results = [r for r in results if not r.passed]
    rows = [
        [
            r.outcome.value,
            r.case,
            _fmt_error(r.error),
            r.message + (f" (at {r.where})" if r.where else ""),
        ]
        for r in results
    ]
    styles = [_OUTCOME_STYLE[r.outcome] for r in results]
    if rows:
        _table(["result", "case", "NMSE", "detail"], rows, plain, out, styles)
    if newer := report.contract_unsupported:
        out.write(
            f"note: {len(newer)} cases need a later op contract than {report.backend}'s plugin "
            "declares (its api_version): they are not run on it, here or by the scheduler. "
            "To be judged on them, implement them and declare the newer version "
            "(docs/writing-a-backend.md, 'Upgrading a plugin').\n"
        )
    out.write(report.summary() + "\n")


def _op_table(report: CheckReport, plain: bool, out: IO[str]) -> None:
    """One row per op: how many cases passed, failed, are unsupported; the worst error."""
    by_op: dict[str, list[Any]] = {}
    for r in report.results:
        by_op.setdefault(r.op, []).append(r)
    rows, styles = [], []
    for op, rs in by_op.items():
        counts = {o: sum(r.outcome is o for r in rs) for o in Outcome}
        errors = [r.error for r in rs if r.error is not None and r.passed]
        worst_error = _fmt_error(max(errors, default=None))
        rows.append([op, str(len(rs)), str(counts[Outcome.PASS]), str(counts[Outcome.FAIL]),
                     str(counts[Outcome.UNSUPPORTED]), worst_error])  # fmt: skip
        worst = Outcome.FAIL if counts[Outcome.FAIL] else (
            Outcome.UNSUPPORTED if counts[Outcome.UNSUPPORTED] else Outcome.PASS)  # fmt: skip
        styles.append(_OUTCOME_STYLE[worst])
    _table(["op", "cases", "pass", "fail", "unsupported", "worst NMSE"], rows, plain, out, styles)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_bench(
    results: Sequence[BenchResult],
    backend: str,
    as_json: bool = False,
    plain: bool = True,
    out: IO[str] | None = None,
) -> None:
    """Write bench results: µs/run, the rate (GFLOP/s or GB/s), numpy's time and speedup."""
    out = out or sys.stdout
    if as_json:
        data: dict[str, Any] = {"backend": backend, "results": [r.to_dict() for r in results]}
        json.dump(data, out, indent=2)
        out.write("\n")
        return
    rows = []
    for r in results:
        if r.us is None:
            rows.append([r.case, "-", "-", "-", "-", "-", "-", r.message])
            continue
        rate = f"{r.gflops:.2f} GFLOP/s" if r.gflops is not None else f"{r.gbps:.2f} GB/s"
        per_node = _num(r.us_per_node, ".2f") if r.nodes > 1 else "-"
        rows.append(
            [
                r.case,
                str(r.runs),
                _num(r.us, ".1f"),
                per_node,
                rate,
                _num(r.numpy_us, ".1f"),
                _num(r.speedup, ".2f") + "x" if r.speedup is not None else "-",
                r.message,
            ]
        )
    headers = ["case", "runs", "µs/run", "µs/node", "rate", "numpy µs", "speedup", "note"]
    _table(headers, rows, plain, out)
    out.write(
        f"{backend}: {len(results)} cases; speedup = numpy's µs / {backend}'s µs "
        "(above 1: faster than numpy)\n"
    )

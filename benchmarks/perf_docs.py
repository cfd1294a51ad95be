"""The tables of ``docs/performance.md`` that benchmarks regenerate (``--write-docs``).

A figure means something only beside the machine and the day it was measured on, so a
benchmark never edits the page by hand: it hands its rows here, and each row gets the
CPU's model as ``lscpu`` names it and today's date. A table lives between two markers,
``<!-- perf:NAME -->`` and ``<!-- /perf:NAME -->``; a new row replaces the row with the
same key measured on the same machine and leaves every other machine's rows as they
are, so running a benchmark again updates its own figures and nothing else.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The page the benchmarks write by default.
PERFORMANCE_MD = Path(__file__).resolve().parent.parent / "docs" / "performance.md"

#: What :func:`checked_writer` gives: rows in, a line saying where they went out.
RowsWriter = Callable[[Sequence[Sequence[str]]], str]

#: The two columns every generated table ends with.
STAMP_COLUMNS = ("machine", "date")


class PerfDocsError(ValueError):
    """The page or a row cannot be written as asked; the message says what to change."""


@dataclass(frozen=True)
class Table:
    """A generated table: its marker ``name``, its ``columns`` (before machine and
    date), and how many leading columns identify a row (with the machine)."""

    name: str
    columns: tuple[str, ...]
    key_columns: int

    def __post_init__(self) -> None:
        if not 1 <= self.key_columns <= len(self.columns):
            raise PerfDocsError(
                f"table {self.name!r}: key_columns must be between 1 and "
                f"{len(self.columns)}, got {self.key_columns}"
            )

    @property
    def begin(self) -> str:
        return f"<!-- perf:{self.name} -->"

    @property
    def end(self) -> str:
        return f"<!-- /perf:{self.name} -->"


def cpu_model(lscpu_output: str | None = None) -> str:
    """The CPU's model name as ``lscpu`` prints it ("Model name:"), else as
    ``/proc/cpuinfo`` does, with its family and model numbers and its widest vector
    instructions where those say them: ``AMD EPYC (family 25 model 1, AVX2)``. A VM's
    CPU is often named only "AMD EPYC" or "Intel(R) Xeon(R) Processor", which would make
    guests of two generations of cores one machine, and one's rows replace the other's.
    ``lscpu_output`` stands in for running ``lscpu``."""
    if lscpu_output is None:
        try:
            lscpu_output = subprocess.run(
                ["lscpu"], capture_output=True, text=True, check=False,
                env={**os.environ, "LC_ALL": "C"}, timeout=30,
            ).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            lscpu_output = ""
    named = _described(_fields(lscpu_output), "Model name", "CPU family", "Model", "Flags")
    if named:
        return named
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    first = cpuinfo.split("\n\n")[0]  # the first processor's lines
    named = _described(_fields(first), "model name", "cpu family", "model", "flags")
    if named:
        return named
    raise PerfDocsError(
        "cannot name this machine's CPU: neither `lscpu` (util-linux) nor /proc/cpuinfo "
        "gave a model name; install util-linux, or run the benchmark without --write-docs"
    )


def _fields(text: str) -> dict[str, str]:
    """``label: value`` lines as a dict (the first of each label), values' runs of
    blanks made one."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        label, sep, value = line.partition(":")
        if sep and value.strip():
            out.setdefault(label.strip(), " ".join(value.split()))
    return out


def _described(fields: dict[str, str], name: str, family: str, model: str, flags: str) -> str:
    """:func:`cpu_model`'s text from one source's fields (empty without a model name)."""
    if not fields.get(name):
        return ""
    details = []
    if fields.get(family) and fields.get(model):
        details.append(f"family {fields[family]} model {fields[model]}")
    present = set(fields.get(flags, "").split())
    widest = "AVX-512" if "avx512f" in present else "AVX2" if "avx2" in present else ""
    if widest:
        details.append(widest)
    return fields[name] + (f" ({', '.join(details)})" if details else "")


def _cell(text: str) -> str:
    """One Markdown table cell: a pipe would start another cell, a newline end the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells, pipes escaped as ``\\|`` kept inside their cell."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    parts: list[str] = [""]
    i = 0
    while i < len(inner):
        if inner.startswith("\\|", i):
            parts[-1] += "\\|"
            i += 2
        elif inner[i] == "|":
            parts.append("")
            i += 1
        else:
            parts[-1] += inner[i]
            i += 1
    return [p.strip() for p in parts]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def merge_rows(
    text: str,
    table: Table,
    rows: Sequence[Sequence[str]],
    machine: str,
    day: datetime.date,
) -> str:
    """``text`` (the page) with ``rows`` stamped with ``machine`` and ``day`` in
    ``table``: each replaces the row of the same key and machine, else is added after
    the table's last row."""
    start, stop = text.find(table.begin), text.find(table.end)
    if start < 0 or stop < start:
        raise PerfDocsError(
            f"no table {table.name!r} in the page: add the lines {table.begin!r} and "
            f"{table.end!r} where its rows should go"
        )
    header = [*table.columns, *STAMP_COLUMNS]
    new: list[list[str]] = []
    for row in rows:
        if len(row) != len(table.columns):
            raise PerfDocsError(
                f"table {table.name!r} has {len(table.columns)} columns "
                f"({', '.join(table.columns)}) before machine and date; a row gave "
                f"{len(row)}: {list(row)!r}"
            )
        new.append([_cell(c) for c in row] + [_cell(machine), day.isoformat()])
    body = text[start + len(table.begin) : stop]
    kept: list[list[str]] = []
    for line in body.splitlines():
        if not line.strip().startswith("|"):
            continue
        cells = _cells(line)
        if cells == header or set("".join(cells)) <= set("-: "):
            continue  # the header and its rule are written afresh
        if len(cells) != len(header):
            raise PerfDocsError(
                f"table {table.name!r}: a row has {len(cells)} cells, the header "
                f"{len(header)}; mend or delete the row: {line.strip()!r}"
            )
        kept.append(cells)
    machine_at = len(table.columns)

    def key(cells: list[str]) -> tuple[str, ...]:
        return (*cells[: table.key_columns], cells[machine_at])

    fresh = {key(r): r for r in new}
    merged = [fresh.pop(key(r), r) for r in kept]  # a row measured again keeps its place
    merged += fresh.values()  # a new one goes last
    lines = [_line(header), _line(["---"] * len(header)), *(_line(r) for r in merged)]
    return text[:start] + table.begin + "\n" + "\n".join(lines) + "\n" + text[stop:]


def write_rows(
    table: Table,
    rows: Sequence[Sequence[str]],
    page: Path = PERFORMANCE_MD,
    machine: str | None = None,
    day: datetime.date | None = None,
) -> Path:
    """Write ``rows`` into ``table`` of ``page``, stamped with this machine's CPU model
    (or ``machine``) and today's date (or ``day``); returns the page written."""
    try:
        text = page.read_text(encoding="utf-8")
    except OSError as e:
        raise PerfDocsError(f"cannot read {page}: {e.strerror or e}; give --write-docs "
                            "the path of docs/performance.md") from e  # fmt: skip
    stamped = merge_rows(text, table, rows, machine or cpu_model(), day or datetime.date.today())
    page.write_text(stamped, encoding="utf-8")
    return page


def add_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--write-docs [PAGE]`` option every regenerating benchmark takes."""
    parser.add_argument(
        "--write-docs", nargs="?", const=str(PERFORMANCE_MD), metavar="PAGE",
        help="also write the figures into docs/performance.md (or PAGE), each row with "
        "this machine's CPU model (lscpu) and today's date",
    )  # fmt: skip


def checked_writer(
    table: Table, page: str | None
) -> Callable[[Sequence[Sequence[str]]], str] | None:
    """What ``--write-docs`` asked for: None without it, else a function that writes the
    rows and says where. The page's markers and the machine's name are checked now, so a
    benchmark refuses before its hour of measuring rather than after it."""
    if page is None:
        return None
    path = Path(page)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SystemExit(f"--write-docs: cannot read {path}: {e.strerror or e}; give it "
                         "the path of docs/performance.md") from None  # fmt: skip
    try:
        machine = cpu_model()
        merge_rows(text, table, [], machine, datetime.date.today())
    except PerfDocsError as e:
        raise SystemExit(f"--write-docs: {e}") from None

    def write(rows: Sequence[Sequence[str]]) -> str:
        write_rows(table, rows, path, machine=machine)
        return f"{len(rows)} rows of table {table.name!r} written to {path} ({machine})"

    return write

"""The ``tensorplug`` command line (also ``python -m tensorplug``).

Each subcommand is a :class:`Command`: a name, a help line, a function
``run(args) -> int`` and optionally ``add_arguments(parser)``. The core's own are in
:data:`COMMANDS`: ``devices`` and ``doctor`` here, ``check``, ``bench`` and ``cache`` as
:class:`~tensorplug.commands.CommandSpec` s naming their modules, which are imported only
when their subcommand runs. Other distributions add theirs through the entry-point group
``tensorplug.commands`` (:mod:`tensorplug.commands`), found each time the command starts.

Output is rich tables on a terminal and plain aligned text otherwise (or with ``--plain``,
or without rich, an optional dependency), so that the output can be piped, grepped and
pasted into bug reports.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from . import settings
from .commands import CommandRecord, CommandSpec, CommandStatus, discover
from .discovery import Source
from .errors import TensorplugError
from .extras import available
from .version import API_VERSION, __version__

if TYPE_CHECKING:
    from .device import Device
    from .discovery import PluginRecord

__all__ = [
    "COMMANDS",
    "Command",
    "Output",
    "count_argument",
    "format_bytes",
    "format_bytes_of",
    "main",
    "smoke_test",
]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    lazy_arguments: bool = False  # add_arguments imports a module: call it only when chosen

    @classmethod
    def from_spec(cls, spec: CommandSpec, distribution: str | None = None) -> Command:
        """The subcommand a :class:`~tensorplug.commands.CommandSpec` describes: its
        module is imported when the subcommand runs (or its arguments are needed), and a
        module that fails to import is this subcommand's error, nobody else's.
        ``distribution`` is where the spec came from (None: tensorplug itself)."""
        pkg = distribution or "tensorplug"

        def run(args: argparse.Namespace) -> int:
            try:
                module = spec.load()
            except (Exception, SystemExit) as e:  # a module calling sys.exit() included
                fix = f"reinstall or upgrade {pkg} (pip install -U {pkg}), install what it "
                fix += "is missing, or uninstall it" if distribution else "is missing"
                print(
                    f"tensorplug {spec.name}: error: its module {spec.module} (from {pkg}) "
                    f"could not be imported: {type(e).__name__}: {e}. Fix: {fix}.",
                    file=sys.stderr,
                )
                return 2
            return int(module.main(args))

        def add_arguments(parser: argparse.ArgumentParser) -> None:
            try:
                module = spec.load()
            except (Exception, SystemExit):
                return  # run() reports it, with the fix
            if (add := getattr(module, "add_arguments", None)) is not None:
                add(parser)

        return cls(spec.name, spec.help, run, add_arguments, lazy_arguments=True)

    @classmethod
    def broken(cls, record: CommandRecord) -> Command:
        """A stand-in for a command whose entry point could not be read: listed, and
        explaining itself when run, rather than an "invalid choice"."""

        def run(args: argparse.Namespace) -> int:
            print(f"tensorplug {record.name}: error: {record.error_message()}", file=sys.stderr)
            return 2

        return cls(record.name, f"(broken: {type(record.exception).__name__}; see doctor)", run)


# -- output -------------------------------------------------------------------------------


class Output:
    """Headings, tables and text, through rich on a terminal or as plain text."""

    def __init__(self, plain: bool) -> None:
        self.plain = plain or not available("rich")  # rich is optional: tensorplug[rich]
        if not self.plain:
            from rich.console import Console

            self.console = Console(highlight=False)

    def heading(self, text: str) -> None:
        if self.plain:
            print(f"\n{text}\n{'-' * len(text)}")
        else:
            self.console.rule(f"[bold]{text}", align="left")

    def text(self, text: str, style: str = "") -> None:
        if self.plain:
            print(text)
        else:
            self.console.print(text, style=style or None, markup=False, soft_wrap=True)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """One line per row however long on plain output: cells come from drivers and
        exceptions, whose text may hold newlines or tabs, and a row split over lines
        breaks ``grep`` and ``cut``. On a terminal a row may take several lines: short
        columns (names, numbers, statuses) keep their width and the prose ones wrap into
        what is left, so that a narrow terminal never squeezes a column to nothing."""
        rows = [[_one_line(str(c)) for c in row] for row in rows]
        if self.plain:
            widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
            for row in (headers, *rows):
                cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
                print("  ".join(cells).rstrip())
            return
        fitted = _column_widths(headers, rows, self.console.width)
        if fitted is None:  # too narrow for the columns side by side: one record a row
            self._records(headers, rows)
            return
        from rich.table import Table

        table = Table(header_style="bold")
        for header, width in zip(headers, fitted, strict=True):
            table.add_column(header, width=width, overflow="fold")
        for row in rows:
            table.add_row(*(_styled(str(c)) for c in row))
        self.console.print(table)

    def _records(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Each row as ``header: value`` lines, its first one flush left, the others
        indented under it; empty cells are left out."""
        from rich.text import Text

        for row in rows:
            for i, (header, cell) in enumerate(zip(headers, row, strict=True)):
                if cell or i == 0:
                    line = Text(f"{'  ' if i else ''}{header}: ", style="bold")
                    self.console.print(line.append_text(_styled(cell)), overflow="fold")


#: On a terminal, a column whose cells all fit this many characters is kept whole; a
#: wider one holds prose and wraps, but not narrower than its longest word up to
#: ``_WORD`` characters (a name or a path cut anywhere is hard to read), nor ``_PROSE_MIN``.
_SHORT_COLUMN = 16
_PROSE_MIN = 12
_WORD = 20


def _column_widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int
) -> list[int] | None:
    """Each column's width in a rich table ``width`` characters wide, or None when the
    columns do not fit side by side at their narrowest.

    Short columns get their longest cell (a header wraps at its spaces). The room left
    goes to the prose columns as water fills a vessel: the narrow ones get all they
    need, the widest share the rest."""
    needs, floors = [], []
    for i, header in enumerate(headers):
        column = [row[i] for row in rows]
        longest_cell = max((len(c) for c in column), default=0)
        need = max(longest_cell, *(len(w) for w in header.split()), 1)
        words = [len(w) for c in (header, *column) for w in c.split()]
        needs.append(need)
        floors.append(need if need <= _SHORT_COLUMN else max(_PROSE_MIN, min(max(words), _WORD)))
    room = width - (3 * len(headers) + 1)  # a space either side of a cell, and the rules
    if sum(floors) > room:
        return None
    level = max(needs)  # lowered until the table fits; no column goes below its floor
    while sum(max(f, min(n, level)) for n, f in zip(needs, floors, strict=True)) > room:
        level -= 1
    return [max(f, min(n, level)) for n, f in zip(needs, floors, strict=True)]


def _one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines, tabs) made one space."""
    return " ".join(text.split())


_STYLES = {"loaded": "green", "ok": "green", "failed": "bold red", "FAILED": "bold red"}


def _styled(cell: str) -> Any:
    from rich.text import Text

    word = cell.split(" ", 1)[0]
    return Text(cell, style=_STYLES.get(word, ""))


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def count_argument(what: str) -> Callable[[str], int]:
    """An argparse ``type`` for a count of ``what`` (``"a thread count"``): an integer
    of at least 1, else argparse's usage error saying so (``'0' is not a thread count
    (an integer >= 1)``), never a traceback."""

    def count(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (an integer >= 1)")
        return n

    return count


def _unit_of(n: float) -> int:
    i = 0
    while n >= 1024 and i < len(_UNITS) - 1:
        n, i = n / 1024, i + 1
    return i


def format_bytes(n: float, unit: int | None = None) -> str:
    """``n`` bytes in binary units: its own (``1.5 GiB``), or ``unit`` (an index into
    B, KiB, MiB, GiB, TiB) so that figures read side by side share one unit."""
    i = _unit_of(n) if unit is None else unit
    return f"{n:.0f} B" if i == 0 else f"{n / 1024**i:.1f} {_UNITS[i]}"


def format_bytes_of(part: float, whole: float) -> str:
    """``part / whole`` in the whole's unit: ``0.5 / 5.6 GiB``, never ``512.0 MiB / 5.6 GiB``."""
    i = _unit_of(whole)
    return f"{format_bytes(part, i).rsplit(' ', 1)[0]} / {format_bytes(whole, i)}"


# -- devices --------------------------------------------------------------------------------


def _caps(dev: Device) -> str:
    caps = dev.caps
    names = [
        ("async", caps.asynchronous),
        ("host_buffer", caps.host_buffer),
        ("from_host_ptr", caps.buffer_from_host_ptr),
        ("events", caps.events),
    ]
    return ", ".join(n for n, on in names if on) or "-"  # spaced: a terminal wraps it


def _device_rows(devs: Sequence[Device]) -> list[list[str]]:
    from . import registry

    rows = []
    for dev in devs:
        try:
            free, total = dev.memory()
            memory = format_bytes_of(free, total)
        except Exception as e:
            memory = f"error: {e}"
        same = [d.name for d in registry.device_aliases(dev)]
        notes = [f"same device as {', '.join(same)}"] if same else []
        try:
            extra = [b.name for b in registry.extra_buffer_types(dev)]
        except Exception as e:  # a plugin's hook: shown, not fatal to the listing
            extra = [f"error: {e}"]
        if extra:
            notes.append(f"extra memory: {', '.join(extra)}")
        note = "; ".join(notes)
        backend = dev.reg.name if dev.reg else "?"
        row = [backend, dev.name, dev.type.value, dev.description, memory, _caps(dev), note]
        rows.append(row)
    return rows


_DEVICE_HEADERS = ["backend", "device", "type", "description", "memory free/total", "caps", "note"]


def cmd_devices(args: argparse.Namespace) -> int:
    """Every registered device, one row each."""
    out = Output(args.plain)
    devs = _loaded_devices()
    if devs:
        out.table(_DEVICE_HEADERS, _device_rows(devs))
    return _report_loading_error() or _no_devices(devs)


def _loaded_devices() -> list[Device]:
    """The registered devices, found through the records so that a failed requested
    backend (which makes ``registry.devices()`` raise) does not hide the others."""
    from . import registry

    return [d for r in registry.plugin_records() if r.reg is not None for d in r.reg.devices()]


def _no_devices(devs: Sequence[Device]) -> int:
    """Exit status 1 with advice when nothing is registered (as when a selection names
    nothing that loaded): a script checking `tensorplug devices` must see the failure."""
    if devs:
        return 0
    print(
        "tensorplug: error: no devices. Install a backend plugin (from a tensorplug checkout: "
        "pip install -e plugins/cpu), check TENSORPLUG_DISABLE / TENSORPLUG_BACKENDS, and "
        "run `tensorplug doctor` to see why installed plugins did not load",
        file=sys.stderr,
    )
    return 1


def _report_loading_error() -> int:
    from . import registry

    err = registry.loading_error()
    if err is None:
        return 0
    print(f"tensorplug: error: {err}", file=sys.stderr)
    return 1


# -- doctor ---------------------------------------------------------------------------------


def smoke_test(dev: Device) -> tuple[bool, str]:
    """Start a backend on ``dev``, write two tensors, compute ``(a + b) * a`` and one
    matrix product there and check the results against numpy: a backend whose
    ``graph_compute`` is broken must not show ``ok``. Ops the device does not support
    are left out and said so (the transfers are still checked)."""
    import numpy as np

    from . import ops
    from .alloc import alloc_tensors
    from .graph import Graph
    from .tensor import new_tensor
    from .transfer import get_array, set_array

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    va = rng.standard_normal((8, 32)).astype(np.float32)
    vb = rng.standard_normal((8, 32)).astype(np.float32)
    try:
        backend = dev.init_backend()
        try:
            a, b = new_tensor("f32", (8, 32), name="a"), new_tensor("f32", (8, 32), name="b")
            nodes = [ops.mul(ops.add(a, b), a), ops.mul_mat(a, b)]
            wants = [(va + vb) * va, vb @ va.T]
            run = [(n, w) for n, w in zip(nodes, wants, strict=True) if _all_supported(dev, n)]
            leafs = [a, b, *(n for n, _ in run)]
            inner = [s for n, _ in run for s in n.src if s not in leafs]
            buf = alloc_tensors([*leafs, *inner], dev.buffer_type())
            try:
                set_array(a, va)
                set_array(b, vb)
                t1 = time.perf_counter()
                if run:
                    backend.graph_compute(Graph([n for n, _ in run]))
                compute_ms = (time.perf_counter() - t1) * 1e3
                for node, want in run:
                    got = get_array(node)
                    if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
                        worst = float(np.abs(got - want).max())
                        return False, f"FAILED: {node.op.value} is wrong (off by up to {worst:.3g})"
                if not np.array_equal(get_array(a), va):
                    return False, "FAILED: the bytes read back differ from those written"
            finally:
                if buf is not None:
                    buf.free()
        finally:
            backend.free()
    except Exception as e:
        return False, f"FAILED {type(e).__name__}: {e}"
    total_ms = (time.perf_counter() - t0) * 1e3
    if not run:
        return True, f"ok: transfers only, no test op supported ({total_ms:.1f} ms)"
    computed = " and ".join("(a+b)*a" if n.op.value == "mul" else n.op.value for n, _ in run)
    return True, f"ok: computed {computed} ({compute_ms:.1f} ms; {total_ms:.1f} ms in all)"


def _all_supported(dev: Device, node: Any) -> bool:
    from .opcodes import VIEW_OPS

    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if id(n) in seen or n.op.value == "none":
            continue
        seen.add(id(n))
        if n.op not in VIEW_OPS and not dev.supports_op(n):
            return False
        todo.extend(n.src)
    return True


def _plugin_row(rec: PluginRecord) -> list[str]:
    api = "{}.{}".format(*rec.api_version) if rec.api_version else "?"
    if rec.source is Source.ENTRY_POINT:
        where = f"{rec.distribution or '?'} {rec.version or ''}".strip()
    else:
        where = f"{rec.source.value}: {rec.spec}"
    status = ("timed out" if rec.timed_out else rec.status.value) + (
        f" ({rec.stage})" if rec.stage else ""
    )
    score = "-" if rec.score is None else str(rec.score)
    why = "; ".join(x for x in (rec.reason, rec.detail) if x)
    if rec.failed and rec.exception is not None:  # the Failures section has the rest
        why = f"{type(rec.exception).__name__}: {rec.exception}"
        why = why if len(why) <= 72 else why[:69] + "..."
    return [rec.label, where, api, score, status, f"{rec.import_ms:.1f}", why]


def cmd_doctor(args: argparse.Namespace) -> int:
    """Everything about plugin discovery, for humans and bug reports."""
    from . import registry

    if not args.verbose:  # the failures are shown below; the registry's warning would repeat them
        logging.getLogger("tensorplug.registry").setLevel(logging.ERROR)
    out = Output(args.plain)
    out.text(
        f"tensorplug {__version__}, plugin API {API_VERSION[0]}.{API_VERSION[1]}, Python "
        f"{platform.python_version()} ({sys.executable}), {platform.platform()}"
    )
    out.heading("Settings")
    problems = [s.problem() for s in settings.SETTINGS]  # said here, not at first use
    rows = [[s.env, (s.raw() or "(unset)") + (" (invalid)" if p else ""), s.help]
            for s, p in zip(settings.SETTINGS, problems, strict=True)]  # fmt: skip
    out.table(["variable", "value", "meaning"], rows)
    for problem in filter(None, problems):
        out.text(problem, style="bold red")

    records = registry.plugin_records()
    out.heading(f"Plugins ({len(records)} found)")
    headers = ["backend", "from", "API", "score", "status", "import ms", "reason"]
    out.table(headers, [_plugin_row(r) for r in records])

    failed = [r for r in records if r.failed]
    if failed:
        out.heading(f"Failures ({len(failed)})")
        for rec in failed:
            out.text(rec.error_message(), style="bold red")
            out.text("    " + rec.traceback.rstrip().replace("\n", "\n    "), style="dim")
    _doctor_contract(out, records)

    devs = _loaded_devices()
    out.heading(f"Devices ({len(devs)})")
    if devs:
        rows = _device_rows(devs)
        for row, dev in zip(rows, devs, strict=True):
            row.insert(-1, smoke_test(dev)[1])
        out.table([*_DEVICE_HEADERS[:-1], "smoke test", "note"], rows)
    _doctor_commands(out, getattr(args, "command_records", None))
    return _report_loading_error() or _no_devices(devs)


def _doctor_contract(out: Output, records: Sequence[PluginRecord]) -> None:
    """For each loaded plugin declaring an older op contract: the features it does not
    declare (its nodes needing them run on another backend) and the fix."""
    from .contract import LATEST_VERSION, features_after, version_label

    newest = version_label(LATEST_VERSION)
    out.heading(f"Op contract (newest {newest})")
    behind = [(r, r.reg.api_version) for r in records if r.reg is not None]
    behind = [(r, v) for r, v in behind if v < LATEST_VERSION]
    if not behind:
        out.text(f"every loaded plugin declares op contract {newest}: it is judged on every op")
        return
    for rec, declared in behind:
        out.text(
            f"{rec.label} ({rec.short_origin}) declares op contract {version_label(declared)}; "
            "nodes needing these later features run on another backend:",
            style="yellow",
        )
        for f in features_after(declared):
            ops = ", ".join(op.value for op in f.ops)
            out.text(f"  - {version_label(f.version)} {f.name} ({ops}): {f.summary}")
        upgrade = f"pip install -U {rec.distribution}" if rec.distribution else "upgrade it"
        out.text(
            f"  Fix: its authors implement them and declare api_version={LATEST_VERSION} "
            "(docs/writing-a-backend.md, 'Upgrading a plugin'); "
            f"users: {upgrade} once they have."
        )


def _doctor_commands(out: Output, records: list[CommandRecord] | None) -> None:
    """The subcommands: the core's, then those added through entry points, with what
    went wrong for any that could not be added."""
    if records is None:
        records = _discover()
    rows = [[c.name, f"tensorplug {__version__}", "", "built in", ""] for c in COMMANDS]
    for rec in records:
        note = rec.detail
        if rec.exception is not None:
            note = f"{type(rec.exception).__name__}: {rec.exception}"
            note = note if len(note) <= 72 else note[:69] + "..."
        module = rec.spec.module if rec.spec is not None else rec.value
        rows.append([rec.name, rec.origin, module, rec.status.value, note])
    out.heading(f"Commands ({len(rows)})")
    out.table(["command", "from", "module", "status", "note"], rows)
    for rec in records:
        if rec.status is CommandStatus.FAILED:
            out.text(rec.error_message(), style="bold red")
            out.text("    " + rec.traceback.rstrip().replace("\n", "\n    "), style="dim")


# -- the command line -------------------------------------------------------------------------

#: What ``tensorplug --help`` says first: plain text (the module's docstring is reST).
DESCRIPTION = "The tensorplug command line (also: python -m tensorplug)."

#: The core's own subcommands; a command from an entry point never replaces one of them.
COMMANDS: list[Command] = [
    Command("devices", "list every device of every loaded backend", cmd_devices),
    Command(
        "doctor", "diagnose plugin discovery: versions, scores, failures, smoke tests", cmd_doctor
    ),
    Command.from_spec(
        CommandSpec(
            "check", "check a backend op by op (conformance)", "tensorplug.testing.check_cli"
        )
    ),
    Command.from_spec(
        CommandSpec("bench", "time ops on a backend next to numpy", "tensorplug.testing.bench_cli")
    ),
    Command.from_spec(
        CommandSpec(
            "cache",
            "show, verify or clear what tensorplug keeps between runs",
            "tensorplug.cache_cli",
        )
    ),
]


def _all_commands(records: Sequence[CommandRecord]) -> list[Command]:
    """The core's commands, then each added one, then a stand-in for each broken one."""
    added = [
        Command.from_spec(r.spec, r.distribution)
        for r in records
        if r.status is CommandStatus.ADDED and r.spec is not None
    ]
    taken = {c.name for c in (*COMMANDS, *added)}
    broken = []
    for rec in records:
        if rec.status is CommandStatus.FAILED and rec.name not in taken:
            broken.append(Command.broken(rec))
            taken.add(rec.name)
    return [*COMMANDS, *added, *broken]


def _discover() -> list[CommandRecord]:
    """The installed ``tensorplug.commands`` entry points; the core's names are taken."""
    return discover(reserved=[c.name for c in COMMANDS])


def _problems(records: Sequence[CommandRecord]) -> list[CommandRecord]:
    return [r for r in records if r.status is not CommandStatus.ADDED]


def _common(parser: argparse.ArgumentParser, default: Any) -> None:
    """Options accepted both before and after the subcommand; the subcommand's copies
    default to SUPPRESS so that they do not overwrite a value given before it."""
    plain_help = "plain text output (the default when stdout is not a terminal)"
    verbose_help = "log every discovery step (debug logging of tensorplug.registry)"
    parser.add_argument("--plain", action="store_true", default=default, help=plain_help)
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help=verbose_help)


def build_parser(
    argv: Sequence[str] = (), records: Sequence[CommandRecord] | None = None
) -> argparse.ArgumentParser:
    """The parser of every command: the core's and those of ``records`` (by default,
    what :func:`~tensorplug.commands.discover` finds now)."""
    if records is None:
        records = _discover()
    epilog = "Other distributions add commands through the entry-point group "
    epilog += "'tensorplug.commands'; `tensorplug doctor` lists them."
    if problems := _problems(records):
        listed = "; ".join(f"{r.name} from {r.origin}: {_short(r)}" for r in problems)
        epilog += f" Commands that could not be added: {listed}."
    parser = argparse.ArgumentParser(prog="tensorplug", description=DESCRIPTION, epilog=epilog)
    parser.add_argument("--version", action="version", version=f"tensorplug {__version__}")
    _common(parser, False)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in _all_commands(records):
        # argparse %-formats help: a third party's stray '%' must not break --help
        p = sub.add_parser(cmd.name, help=cmd.help.replace("%", "%%"), description=cmd.help)
        _common(p, argparse.SUPPRESS)
        if cmd.add_arguments is not None and (not cmd.lazy_arguments or cmd.name == chosen):
            cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run, _parser=p)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that an unknown option is the chosen
    command's error, with its usage (argparse leaves options a subcommand does not know
    to the top-level parser, whose usage lists commands and no options)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner: argparse.ArgumentParser = getattr(args, "_parser", parser)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _short(rec: CommandRecord) -> str:
    if rec.exception is not None:
        return f"{type(rec.exception).__name__}: {rec.exception}"
    return f"{rec.status.value}, {rec.detail}"


def _warn(records: Sequence[CommandRecord], command: str) -> None:
    """One line on stderr about commands that could not be added, as for failed backend
    plugins; not from ``doctor``, which shows them, nor from a broken command itself."""
    problems = [
        r
        for r in _problems(records)
        if not (r.status is CommandStatus.FAILED and r.name == command)  # says so itself
    ]
    if problems and command != "doctor":
        logging.getLogger("tensorplug.commands").warning(
            "%d tensorplug command(s) could not be added: %s. Run `tensorplug doctor` for the "
            "reasons.",
            len(problems),
            ", ".join(f"{r.name} ({r.origin}: {r.status.value})" for r in problems),
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit status.

    Ctrl-C is handled here, once for every command, the core's and those of other
    distributions: whatever the command was doing (importing its module, loading, in a
    kernel, waiting on stdin), it ends with one line and status 130 (128 + SIGINT, what
    a shell reports for a process killed by it), not a traceback through the frames it
    happened to be in."""
    own_process = argv is None  # the command itself (console script, python -m)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv, own_process)
    except KeyboardInterrupt:
        if own_process:
            # the command is ending: a second Ctrl-C must not turn the exit into a
            # traceback or a kill by the signal
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        command = next((a for a in argv if not a.startswith("-")), None)
        name = f"tensorplug {command}" if command else "tensorplug"
        # on a terminal the interrupted line (a streamed reply, a progress bar) is ended first
        start = "\n" if sys.stderr.isatty() else ""
        with contextlib.suppress(OSError, ValueError):  # stdout may be a closed pipe
            sys.stdout.flush()
        print(f"{start}{name}: interrupted", file=sys.stderr)
        if own_process:
            _exit_interrupted()
        return 130


def _exit_interrupted() -> NoReturn:
    """End the process with status 130 now.

    Not ``sys.exit(130)``: after a Ctrl-C during plugin loading the interpreter's
    finalization now and then killed the process with SIGINT after this line had been
    printed (exit -2, one run in ten under load; CPython's "unhandled KeyboardInterrupt"
    flag was set in each, see :mod:`tensorplug.signals`). Nothing of an interrupted
    command needs finalizing: logging and the standard streams are flushed, then the
    process ends."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(130)


def _main(argv: list[str], own_process: bool) -> int:
    if "-v" in argv or "--verbose" in argv:  # before the parser: it logs command discovery
        logging.basicConfig(format="%(name)s: %(message)s")
        logging.getLogger("tensorplug").setLevel(logging.DEBUG)
    records = _discover()
    args = _parse(build_parser(argv, records), argv)
    _warn(records, args.command)
    args.own_process = own_process
    args.command_records = records
    args.plain = args.plain or not sys.stdout.isatty() or not available("rich")
    try:
        return int(args._run(args))
    except TensorplugError as e:
        # a user's mistake (a bad file, an unknown device, a bad setting): the message
        # says what and how to fix it; a traceback would only bury it. Bugs of ours are
        # other exception types and still show theirs.
        print(f"tensorplug {args.command}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`tensorplug check | head`): stop quietly, as Unix tools do;
        # stdout goes to devnull so the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

"""Subcommands that other distributions add to the ``tensorplug`` command.

There is one ``tensorplug`` command for everything installed: the core brings
``devices``, ``doctor``, ``check`` and ``bench``; an application (``tensorplug-llm``:
``run``, ``chat``, ``tokenize``, ``demo``) or any third party adds its own through the
entry-point group ``tensorplug.commands``, as a backend arrives through
``tensorplug.backends``. The entry point names a :class:`CommandSpec`, a cheap object
read every time the command starts; the module that implements the command is imported
only when that subcommand runs or its ``--help`` is asked for::

    # tensorplug_foo/commands.py — imported whenever `tensorplug` starts: keep it tiny
    from tensorplug.commands import CommandSpec

    foo = CommandSpec("foo", "frobnicate a device", "tensorplug_foo.foo_cli")

    # pyproject.toml
    [project.entry-points."tensorplug.commands"]
    foo = "tensorplug_foo.commands:foo"

and ``tensorplug_foo/foo_cli.py`` defines ``main(args: argparse.Namespace) -> int`` (the
exit status) and optionally ``add_arguments(parser: argparse.ArgumentParser)``.

A command that cannot be added never takes the others down: an entry point that fails
to import or names something else is recorded as failed, and one whose name is taken
(by a core command, which always wins, or by a command found before it) as refused.
Either way the other commands work, ``tensorplug --help`` and ``tensorplug doctor`` say
what happened, and every other subcommand warns once on stderr.
"""

from __future__ import annotations

import enum
import importlib
import logging
import re
import time
import traceback
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any

from . import installed
from .installed import EntryPointInfo

__all__ = [
    "ENTRY_POINT_GROUP",
    "CommandRecord",
    "CommandSpec",
    "CommandStatus",
    "discover",
]

ENTRY_POINT_GROUP = "tensorplug.commands"

_log = logging.getLogger("tensorplug.commands")

#: Command names are typed on command lines: lower case, digits and inner dashes.
_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class CommandSpec:
    """A subcommand of ``tensorplug``: its name, its help line and the module behind it.

    ``module`` is a dotted module name (``"tensorplug_foo.foo_cli"``) defining
    ``main(args) -> int`` and optionally ``add_arguments(parser)``; naming it as a string
    is what keeps ``tensorplug --help`` from importing every command's code.
    """

    name: str
    help: str
    module: str

    def __post_init__(self) -> None:
        # Mistakes surface when the entry point is read, recorded against its distribution.
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(
                f"CommandSpec.name must be a command name such as 'run' or 'kv-dump' (lower "
                f"case letters and digits, inner dashes), got {self.name!r}"
            )
        if not isinstance(self.help, str) or not self.help.strip():
            raise ValueError(f"CommandSpec {self.name!r}: help must be a one-line description")
        if not isinstance(self.module, str) or not _MODULE_RE.match(self.module):
            raise ValueError(
                f"CommandSpec {self.name!r}: module must be a dotted module name such as "
                f"'tensorplug_foo.foo_cli' (with main(args) in it), got {self.module!r}"
            )

    @classmethod
    def coerce(cls, obj: Any) -> CommandSpec:
        """A :class:`CommandSpec`, or one made from an object with the same attributes."""
        if isinstance(obj, cls):
            return obj
        missing = [a for a in ("name", "help", "module") if not hasattr(obj, a)]
        if missing:
            raise TypeError(
                f"a {ENTRY_POINT_GROUP} entry point must name a tensorplug.commands.CommandSpec "
                f"(or an object with name, help and module), got {type(obj).__name__} without "
                f"{', '.join(missing)}"
            )
        return cls(name=obj.name, help=obj.help, module=obj.module)

    def load(self) -> ModuleType:
        """Import the module behind the command (when it runs, not when it is listed)."""
        return importlib.import_module(self.module)


class CommandStatus(enum.Enum):
    ADDED = "added"
    FAILED = "failed"  # the entry point could not be read: import error, not a CommandSpec
    REFUSED = "refused"  # its name is taken


@dataclass(eq=False)
class CommandRecord:
    """One command found through an entry point, or built into the core."""

    entry_point: str
    value: str  # the entry point's "module:attr", or the module of a built-in command
    #: the installed distribution declaring the entry point (None: built into the core)
    distribution: str | None = field(default=None, repr=False)
    spec: CommandSpec | None = None
    status: CommandStatus = CommandStatus.ADDED
    detail: str = ""  # why it was refused
    exception: BaseException | None = None
    traceback: str = ""
    import_ms: float = 0.0

    @cached_property
    def version(self) -> str | None:
        return None if self.distribution is None else installed.version(self.distribution)

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else self.entry_point

    @property
    def origin(self) -> str:
        """``tp-foo 1.2`` for an installed distribution, else the entry point's value."""
        if self.distribution:
            return f"{self.distribution} {self.version}"
        return self.value

    def fail(self, exc: BaseException) -> None:
        self.status, self.exception = CommandStatus.FAILED, exc
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        _log.debug("command %r from %s failed: %s", self.entry_point, self.origin, self.traceback)

    def error_message(self) -> str:
        """One paragraph: which command, from where, what went wrong, what to do."""
        where = f"command {self.name!r} from {self.origin} (entry point {self.value})"
        if self.status is CommandStatus.REFUSED:
            return f"{where} was refused: {self.detail}"
        if self.exception is None:
            return f"{where}: {self.status.value}"
        exc = self.exception
        fix = (
            f"reinstall or upgrade it (pip install -U {self.distribution}), or uninstall it"
            if self.distribution
            else "fix or remove it"
        )
        return (
            f"{where} could not be read: {type(exc).__name__}: {str(exc).rstrip('.')}. Fix: {fix}."
        )


def _read(ep: EntryPointInfo, record: CommandRecord) -> None:
    t0 = time.perf_counter()
    try:
        spec = CommandSpec.coerce(ep.load())
        if spec.name != ep.name:
            raise ValueError(
                f"the entry point is called {ep.name!r} but its CommandSpec {spec.name!r}; "
                "the entry point's name must be the command's"
            )
    except (Exception, SystemExit) as e:  # a module calling sys.exit() must not end ours
        record.fail(e)
    else:
        record.spec = spec
    record.import_ms = (time.perf_counter() - t0) * 1e3


def discover(reserved: Collection[str] = ()) -> list[CommandRecord]:
    """Every installed ``tensorplug.commands`` entry point, read and judged.

    ``reserved`` holds the core's own command names, which no entry point may take.
    Among entry points of one name the first in (name, distribution, value) order is
    added and the others are refused, so the outcome does not depend on install order.
    An entry point that fails to import may come from a kept list that no longer holds
    (:mod:`.installed`): the list is then read again, and judged again if it differs.
    """
    eps = installed.entry_points(ENTRY_POINT_GROUP)
    records = _judge(eps, reserved)
    gone = any(isinstance(r.exception, ImportError) for r in records)
    if gone and (fresh := installed.entry_points(ENTRY_POINT_GROUP, fresh=True)) != eps:
        records = _judge(fresh, reserved)
    return records


def _judge(eps: list[EntryPointInfo], reserved: Collection[str]) -> list[CommandRecord]:
    t0 = time.perf_counter()
    records = [CommandRecord(ep.name, ep.value, ep.distribution) for ep in eps]
    order = sorted(range(len(eps)), key=lambda i: (eps[i].name, records[i].origin, eps[i].value))
    taken: dict[str, CommandRecord] = {}
    for i in order:
        ep, rec = eps[i], records[i]
        if ep.name in reserved:  # not even imported: the core's command wins
            rec.status = CommandStatus.REFUSED
            rec.detail = f"'tensorplug {ep.name}' is a command of tensorplug itself"
            continue
        _read(ep, rec)
        if rec.spec is None:
            continue
        if (first := taken.get(rec.name)) is not None:
            rec.status = CommandStatus.REFUSED
            rec.detail = f"{first.origin} already adds a command {rec.name!r}"
            continue
        taken[rec.name] = rec
    _log.debug(
        "read %d entry points of group %r in %.1f ms: %s",
        len(eps),
        ENTRY_POINT_GROUP,
        (time.perf_counter() - t0) * 1e3,
        ", ".join(f"{r.entry_point}={r.value} ({r.status.value})" for r in records) or "none",
    )
    return [records[i] for i in order]

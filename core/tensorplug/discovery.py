"""Finding plugin candidates and judging them, without global state (the registry has that).

A candidate comes from an installed entry point, a ``module:attr`` or a plugin file,
and gets a :class:`PluginRecord`. The record follows it through import, API check,
scoring and variant selection, and keeps whatever went wrong with the traceback text, so
that ``tensorplug doctor`` can show it and the registry can raise it when the user
asked for that backend.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import installed, settings
from .budget import Overrun, OwnerLock, run_within
from .errors import ApiVersionError, PluginError, PluginTimeoutError
from .installed import EntryPointInfo
from .registration import Registration, api_compatible, check_api_version, resolve_object

if TYPE_CHECKING:
    from .device import Reg

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginRecord",
    "Problem",
    "PluginStatus",
    "Source",
    "explain",
    "explain_missing",
    "group_variants",
    "import_file",
    "prepare",
    "read_entry_points",
    "records_from_path",
    "within_budget",
]

ENTRY_POINT_GROUP = "tensorplug.backends"

T = TypeVar("T")

_log = logging.getLogger("tensorplug.registry")


class PluginStatus(enum.Enum):
    DISCOVERED = "discovered"  # registration read, not judged yet
    SCORED = "scored"  # eligible; waiting for variant selection
    LOADED = "loaded"
    FAILED = "failed"
    UNSUPPORTED = "unsupported"  # scored 0: cannot run on this machine
    NOT_SELECTED = "not selected"  # another variant of the same backend won
    DISABLED = "disabled"  # excluded by TENSORPLUG_DISABLE / TENSORPLUG_BACKENDS
    UNLOADED = "unloaded"


class Source(enum.Enum):
    ENTRY_POINT = "entry point"
    MODULE = "module"
    FILE = "file"
    CODE = "register()"


#: For each stage a plugin can fail at: what happened, and what the user can do about it.
_FAILURES = {
    "import": (
        "could not be imported",
        "reinstall or upgrade it ({upgrade}), install what it is missing, or uninstall it",
    ),
    "api": ("was refused", ""),  # the ApiVersionError message carries its own fix
    "score": (
        "failed to score itself",
        "report it to the plugin's authors; set TENSORPLUG_DISABLE={name} to skip it",
    ),
    "init": (
        "failed to initialise",
        "its backend could not start here; set TENSORPLUG_DISABLE={name} to skip it, or "
        "report it to the plugin's authors",
    ),
    "register": (
        "returned an invalid Reg",
        "report it to the plugin's authors; set TENSORPLUG_DISABLE={name} to skip it",
    ),
}


@dataclass(eq=False)
class PluginRecord:
    """Everything known about one plugin candidate; shown by ``tensorplug doctor``."""

    source: Source
    spec: str  # entry-point value, module:attr, file path, or repr of the registered Reg
    entry_point: str | None = None
    #: the installed distribution's name (``tensorplug-cpu``), None for files and code
    distribution: str | None = field(default=None, repr=False)
    backend: str | None = None
    api_version: tuple[int, int] | None = None
    score: int | None = None
    reason: str = ""  # why it scored what it did
    status: PluginStatus = PluginStatus.DISCOVERED
    detail: str = ""  # why it has this status: disabled by..., another variant won...
    stage: str | None = None  # where it failed: import, api, score, init, register
    exception: BaseException | None = None
    traceback: str = ""
    reg: Reg | None = None
    registration: Registration | None = field(default=None, repr=False)
    import_ms: float = 0.0
    warned: bool = False

    @cached_property
    def version(self) -> str | None:
        # asked only when a message needs it
        return None if self.distribution is None else installed.version(self.distribution)

    def __str__(self) -> str:
        return self.origin  # log lines pass the record, so the origin is built only if logged

    @property
    def origin(self) -> str:
        """Where the plugin comes from, for messages: ``tp-foo 1.2 (entry point 'foo')``."""
        if self.source is Source.ENTRY_POINT:
            dist = f"{self.distribution} {self.version}" if self.distribution else "plugin"
            return f"{dist} (entry point {self.entry_point!r} = {self.spec})"
        return f"{self.source.value} {self.spec}"

    @property
    def short_origin(self) -> str:
        """``tp-foo 1.2`` for an installed plugin, else the file or module it came from."""
        if self.distribution:
            return f"{self.distribution} {self.version}"
        return self.spec

    @property
    def label(self) -> str:
        """The best short name: the backend name once known, else the entry point's."""
        return self.backend or self.entry_point or self.spec

    @property
    def failed(self) -> bool:
        return self.status is PluginStatus.FAILED

    @property
    def timed_out(self) -> bool:
        """Failed by running past its time budget (``TENSORPLUG_PLUGIN_TIMEOUT``, or
        ``TENSORPLUG_PLUGIN_INIT_TIMEOUT`` for ``init()``)."""
        return isinstance(self.exception, PluginTimeoutError)

    def matches(self, name: str) -> bool:
        """True when the user's ``name`` means this plugin: its backend or entry-point
        name, or one of its device names (``JAX0`` for backend ``JAX``)."""
        key = name.casefold()
        names = {n.casefold() for n in (self.backend, self.entry_point) if n}
        return key in names or key.rstrip("0123456789") in names

    def fail(self, stage: str, exc: BaseException) -> None:
        self.status = PluginStatus.FAILED
        self.stage = stage
        self.exception = exc
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if isinstance(exc, PluginTimeoutError) and exc.stack:
            self.traceback += f"where the plugin's thread was:\n{exc.stack}"
        _log.debug("%s: failed at %s: %s", self, stage, self.traceback.rstrip())

    def error_message(self) -> str:
        """One paragraph: which plugin, what failed, the cause, and what to do about it."""
        if not self.failed or self.exception is None:
            return f"{self.label} ({self.origin}): {self.status.value} {self.reason}".rstrip()
        exc = self.exception
        what, remedy = _FAILURES.get(self.stage or "", ("failed", ""))
        cause = str(exc).rstrip(".")
        msg = f"plugin {self.label!r} from {self.origin} {what}: {type(exc).__name__}: {cause}"
        if remedy and self.distribution is None and self.stage == "import":
            remedy = f"fix or remove {self.spec}"
        if remedy:
            upgrade = f"pip install -U {self.distribution}"
            msg += ". Fix: " + remedy.format(upgrade=upgrade, name=self.label) + "."
        return msg


def read_entry_points(*, fresh: bool = False) -> list[EntryPointInfo]:
    """Every installed ``tensorplug.backends`` entry point, in a stable order (kept
    between processes: :mod:`tensorplug.installed`; ``fresh``: asked again)."""
    t0 = time.perf_counter()
    eps = installed.entry_points(ENTRY_POINT_GROUP, fresh=fresh)
    eps.sort(key=lambda ep: (ep.name, ep.value))
    _log.debug(
        "read %d entry points of group %r in %.1f ms: %s",
        len(eps),
        ENTRY_POINT_GROUP,
        (time.perf_counter() - t0) * 1e3,
        ", ".join(f"{ep.name}={ep.value}" for ep in eps) or "none",
    )
    return eps


def record_for_entry_point(ep: EntryPointInfo) -> PluginRecord:
    return PluginRecord(
        source=Source.ENTRY_POINT, spec=ep.value, entry_point=ep.name, distribution=ep.distribution
    )


def records_from_path(path: Path) -> list[PluginRecord]:
    """Records for a plugin file, or for every plugin module in a folder.

    In a folder, each ``*.py`` file and each sub-folder with an ``__init__.py`` is a
    plugin module, except names starting with ``_`` or ``.`` (helpers, caches).
    """
    path = Path(path).expanduser()
    if path.is_dir():
        found = sorted(
            p
            for p in path.iterdir()
            if not p.name.startswith(("_", "."))
            and ((p.suffix == ".py" and p.is_file()) or (p / "__init__.py").is_file())
        )
        _log.debug("plugin folder %s holds %d plugin modules", path, len(found))
        return [PluginRecord(source=Source.FILE, spec=str(p)) for p in found]
    return [PluginRecord(source=Source.FILE, spec=str(path))]


def import_file(path: Path) -> Any:
    """Import a plugin module from a file or package folder under a private unique name."""
    path = Path(path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"plugin file {str(path)!r} does not exist")
    init = path / "__init__.py" if path.is_dir() else path
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"tensorplug_plugin_{path.stem if path.is_file() else path.name}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    search = [str(path)] if path.is_dir() else None
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=search)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and relative imports look the module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_registration_object(record: PluginRecord, ep: EntryPointInfo | None) -> Any:
    if ep is not None:
        return ep.load()
    if record.source is Source.FILE:
        module = import_file(Path(record.spec))
        if not hasattr(module, "registration"):
            raise AttributeError(
                f"plugin file {record.spec!r} defines no module-level `registration` "
                "(a tensorplug.registration.Registration)"
            )
        return module.registration
    return resolve_object(record.spec)


def _never(name: str) -> str | None:
    return None


#: Plugin code that overran its budget, by the record's spec, while its thread runs: it
#: is not started again (a stuck import holds the module's import lock for ever).
_left_behind: dict[str, tuple[str, Overrun]] = {}


def within_budget(
    record: PluginRecord,
    stage: str,
    fn: Callable[[], T],
    seconds: float,
    *,
    lock: OwnerLock | None = None,
) -> T:
    """``fn()``, a plugin's code for ``stage`` (import, score, init), run in a worker
    thread for at most ``seconds``: past them, :class:`PluginTimeoutError` naming the
    plugin and the fix, with the stuck thread's stack as the record's traceback (set
    when the record fails). Code still stuck from an earlier attempt is not run again."""
    what = {"import": "import of its registration", "score": "score()", "init": "init()"}
    earlier = _left_behind.get(record.spec)
    if earlier is not None and earlier[1].thread.is_alive():
        raise _overrun_error(record, earlier[0], earlier[1], what, again=True)
    try:
        return run_within(fn, seconds, name=f"tensorplug plugin {record.label} {stage}", lock=lock)
    except Overrun as overrun:
        _left_behind[record.spec] = (stage, overrun)
        raise _overrun_error(record, stage, overrun, what, again=False) from None


def _overrun_error(
    record: PluginRecord, stage: str, overrun: Overrun, what: dict[str, str], *, again: bool
) -> PluginTimeoutError:
    when = "an earlier attempt's " if again else ""
    env = (settings.PLUGIN_INIT_TIMEOUT if stage == "init" else settings.PLUGIN_TIMEOUT).env
    err = PluginTimeoutError(
        f"its {when}{what.get(stage, stage)} did not return within {overrun.seconds:g} s "
        f"({env}) and was left running in the background; the plugin is skipped. If it is "
        f"only slow here, allow it more time, e.g. {env}={max(60, 4 * overrun.seconds):g}"
    )
    err.stack = overrun.stack
    return err


def prepare(
    record: PluginRecord,
    ep: EntryPointInfo | None = None,
    *,
    denied: Callable[[str], str | None] = _never,
    excluded: Callable[[str], str | None] = _never,
    timeout: float = settings.PLUGIN_TIMEOUT.default,
    lock: OwnerLock | None = None,
) -> None:
    """Import the registration, check its API version and score it, recording failures.

    ``denied(entry_point_name)`` and ``excluded(backend_name)`` return why a plugin is
    left out (e.g. ``TENSORPLUG_DISABLE``), or None. A plugin denied by its entry-point
    name is not even imported; an excluded backend is neither checked nor scored. The
    import and the score each get ``timeout`` seconds (:func:`within_budget`), with
    ``lock`` lent to them. Leaves the record SCORED, or FAILED / UNSUPPORTED / DISABLED.
    """
    if record.entry_point and (why := denied(record.entry_point)):
        record.status, record.detail = PluginStatus.DISABLED, why
        _log.debug("%s: %s; not imported", record, why)
        return
    t0 = time.perf_counter()
    try:
        reg_obj = within_budget(
            record, "import", lambda: _load_registration_object(record, ep), timeout, lock=lock
        )
        registration = Registration.coerce(reg_obj)
    except ApiVersionError as e:  # a malformed api_version: its message has the fix
        record.import_ms = (time.perf_counter() - t0) * 1e3
        record.fail("api", e)
        return
    except (Exception, SystemExit) as e:  # a plugin calling sys.exit() must not end the app
        record.import_ms = (time.perf_counter() - t0) * 1e3
        record.fail("import", e)
        return
    record.import_ms = (time.perf_counter() - t0) * 1e3
    record.registration = registration
    record.backend = registration.name
    record.api_version = registration.api_version
    _log.debug(
        "%s: registration %r (API %d.%d) imported in %.2f ms",
        record,
        registration.name,
        *registration.api_version,
        record.import_ms,
    )
    if why := excluded(registration.name):
        record.status, record.detail = PluginStatus.DISABLED, why
        _log.debug("%s: %s", record, why)
        return
    if not api_compatible(registration.api_version):
        try:
            package = record.distribution
            check_api_version(
                registration.api_version,
                plugin=record.short_origin if package else f"plugin {registration.name!r}",
                package=package,
            )
        except PluginError as e:
            record.fail("api", e)
            return
    try:
        record.score, record.reason = within_budget(
            record, "score", registration.evaluate_score, timeout, lock=lock
        )
    except (Exception, SystemExit) as e:  # as at import: a sys.exit() must not end the app
        record.fail("score", e)
        return
    record.status = PluginStatus.SCORED if record.score > 0 else PluginStatus.UNSUPPORTED
    _log.debug("%s: score %d (%s)", record, record.score, record.reason or "no reason")


def group_variants(records: Iterable[PluginRecord]) -> dict[str, list[PluginRecord]]:
    """SCORED records by backend name (case-insensitive), best variant first.

    Ties go to the record seen first (path plugins are offered before entry points).
    """
    groups: dict[str, list[PluginRecord]] = {}
    for rec in records:
        if rec.status is PluginStatus.SCORED and rec.backend:
            groups.setdefault(rec.backend.casefold(), []).append(rec)
    for key, variants in groups.items():
        variants.sort(key=lambda r: -(r.score or 0))  # stable: ties keep discovery order
        if len(variants) > 1:
            _log.debug(
                "backend %s has %d variants: %s",
                key,
                len(variants),
                ", ".join(f"{r.origin} (score {r.score})" for r in variants),
            )
    return groups


#: What explain() returns: a message and the exception that caused it, if any.
Problem = tuple[str, "BaseException | None"]


def explain(recs: Sequence[PluginRecord], prefix: str) -> Problem | None:
    """Why none of ``recs`` (the candidates for one name) is loaded, most telling first."""
    if failed := [r for r in recs if r.failed]:
        return f"{prefix} {failed[0].error_message()}", failed[0].exception
    by_status = {r.status: r for r in reversed(recs)}
    if r := by_status.get(PluginStatus.UNSUPPORTED):
        return f"{prefix} backend {r.label!r} ({r.origin}) cannot run here: {r.reason}.", None
    for status in (PluginStatus.DISABLED, PluginStatus.NOT_SELECTED, PluginStatus.UNLOADED):
        if r := by_status.get(status):
            return f"{prefix} backend {r.label!r} ({r.origin}) is {status.value}: {r.detail}.", None
    return None


def explain_missing(records: Sequence[PluginRecord], name: str, prefix: str) -> Problem:
    """Why no backend called ``name`` is registered, with the fix."""
    if found := explain([r for r in records if r.matches(name)], prefix):
        return found
    known = sorted({r.label for r in records})
    return (
        f"{prefix} no installed plugin provides a backend called {name!r} (plugins found: "
        f"{', '.join(known) or 'none'}). Fix: correct the name, or install the plugin that "
        "provides it (tensorplug's own are in the repository's plugins/ folder, e.g. "
        "pip install -e plugins/opencl); `tensorplug doctor` lists what is installed.",
        None,
    )

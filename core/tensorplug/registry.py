"""The backend registry: which plugins are loaded, their devices, and how to pick one.

It is ggml's registry (``ggml_backend_load_all``, ``ggml_backend_dev_by_type``,
``ggml_backend_init_best``...) with Python plugins found through the
``tensorplug.backends`` entry-point group instead of shared libraries on disk:

* Nothing happens at import. The first registry call (or :func:`load_all`) reads the
  entry points once, imports each plugin's cheap registration, scores it, keeps the
  best variant per backend name, and only then imports and initialises the winners.
* Loading is serialised by one re-entrant lock: another thread waits for it, while a
  plugin that calls back into the registry from its own ``init()`` sees what is
  registered so far instead of starting a second load.
* A plugin's registration import, ``score()`` and ``init()`` each run under a time
  budget (:mod:`tensorplug.budget`, ``TENSORPLUG_PLUGIN_TIMEOUT`` and
  ``TENSORPLUG_PLUGIN_INIT_TIMEOUT``): one that never returns cannot hang discovery.
* A plugin that fails is recorded (:func:`plugin_records`) and skipped, with one
  warning; the failure is raised only for backends the user named
  (``TENSORPLUG_BACKENDS``, :func:`init_by_name`) or under ``TENSORPLUG_STRICT_PLUGINS``.

Selection settings are described in :mod:`tensorplug.settings`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import discovery, settings
from .budget import OwnerLock
from .device import Device, DeviceType, Reg, is_host_cpu
from .discovery import PluginRecord, PluginStatus, Source
from .errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    InvalidArgumentError,
    OutOfBoundsError,
    PluginError,
)
from .installed import EntryPointInfo
from .registration import api_version_of, check_api_version
from .signals import deferred_ctrl_c

if TYPE_CHECKING:
    import pluggy

    from .backend import Backend
    from .buffer import BufferType

    #: A plugin candidate: its record, and its entry point when it is installed.
    Candidate = tuple[PluginRecord, EntryPointInfo | None]

__all__ = [
    "dev_by_name",
    "dev_by_type",
    "dev_count",
    "dev_get",
    "device_aliases",
    "devices",
    "discover",
    "duplicate_device_ids",
    "extra_buffer_types",
    "get_proc",
    "init_best",
    "init_by_name",
    "init_by_type",
    "load",
    "load_all",
    "load_all_from_path",
    "loading_error",
    "plugin_records",
    "reg_by_name",
    "reg_count",
    "reg_get",
    "register",
    "regs",
    "reset",
    "unload",
]

_log = logging.getLogger("tensorplug.registry")

#: ``init_best``'s order of preference (ggml: GPU, then integrated GPU, then CPU).
BEST_TYPES = (DeviceType.GPU, DeviceType.IGPU, DeviceType.CPU)


def _no_selection() -> settings.Selection:
    """What :func:`load` and :func:`load_all_from_path` apply: the caller chose which
    plugins, not the environment; the time budget is the environment's still."""
    return settings.Selection(
        timeout=settings.PLUGIN_TIMEOUT.get(), init_timeout=settings.PLUGIN_INIT_TIMEOUT.get()
    )


_Named = TypeVar("_Named", Reg, Device)


class _State:
    """Everything the registry holds; one instance, guarded by ``lock``."""

    def __init__(self) -> None:
        self.lock = OwnerLock()  # lent to the plugin code it waits for (budget.py)
        self.clear()

    def clear(self) -> None:
        self.loaded = False
        self.busy = False  # a load, unload or register is running (in the lock's owner)
        self.regs: list[Reg] = []
        self.devices: list[Device] = []
        self.hook_names: dict[int, list[str]] = {}
        self.records: list[PluginRecord] = []
        self.entry_points: list[EntryPointInfo] | None = None
        self.selection = settings.Selection()
        self.error: tuple[str, BaseException | None] | None = None
        self.pm: pluggy.PluginManager | None = None


_state = _State()


@contextmanager
def _mutating() -> Iterator[None]:
    """Hold the lock and mark the registry busy, so that re-entrant calls do not load."""
    with _state.lock:
        outer, _state.busy = _state.busy, True
        try:
            yield
        finally:
            _state.busy = outer


def _ensure_loaded(raise_errors: bool = True) -> None:
    if not _state.loaded:
        with _state.lock:
            if not _state.loaded and not _state.busy:
                _load_all_locked()
    if raise_errors and _state.error is not None and not _state.busy:
        message, cause = _state.error
        raise PluginError(message) from cause


def _entry_points() -> list[EntryPointInfo]:
    with _state.lock:
        if _state.entry_points is None:
            _state.entry_points = discovery.read_entry_points()
        return _state.entry_points


def _all_candidates(selection: settings.Selection) -> list[Candidate]:
    """Path plugins first (they win score ties), then installed entry points."""
    found: list[Candidate] = [
        (rec, None) for path in selection.paths for rec in discovery.records_from_path(path)
    ]
    return found + [(discovery.record_for_entry_point(ep), ep) for ep in _entry_points()]


def _prepare_all(candidates: Sequence[Candidate], selection: settings.Selection) -> None:
    for rec, ep in candidates:
        discovery.prepare(
            rec,
            ep,
            denied=selection.denied,
            excluded=selection.excluded,
            timeout=selection.timeout,
            lock=_state.lock,
        )


def _prepared(selection: settings.Selection) -> list[Candidate]:
    """Every candidate, prepared (imported, checked, scored). An installed entry point
    that fails to import may come from a kept list that no longer holds (a module
    edited away without reinstalling: :mod:`.installed`): the entry points are then read
    again from ``importlib.metadata``, and prepared again where they differ."""
    candidates = _all_candidates(selection)
    _prepare_all(candidates, selection)
    if any(rec.failed and rec.stage == "import" and ep is not None for rec, ep in candidates):
        with _state.lock:
            kept, _state.entry_points = _state.entry_points, discovery.read_entry_points(fresh=True)
            if _state.entry_points != kept:
                _log.debug("the kept entry points were out of date; read them again")
                candidates = _all_candidates(selection)
                _prepare_all(candidates, selection)
    return candidates


def _load_all_locked() -> None:
    selection = settings.Selection.from_env()  # a bad variable raises before anything changes
    _log.debug("loading plugins with %s", selection)
    with _mutating():
        before = (list(_state.regs), list(_state.devices), dict(_state.hook_names),
                  list(_state.records))  # fmt: skip
        try:
            _state.selection = selection
            with deferred_ctrl_c():  # native libraries load badly when interrupted (see there)
                _process(_prepared(selection), selection)
            _state.error = _requested_error(selection)
            _warn_failures()
        except BaseException:
            # interrupted (Ctrl-C in a plugin's score or init, a bug of ours): forget the
            # half load, so that the registry is not left "loaded" with half its backends
            # and the next call loads again
            _forget_load(*before)
            raise
        _state.loaded = True
    _log.debug(
        "registry ready: %d backends, %d devices (%s)",
        len(_state.regs),
        len(_state.devices),
        ", ".join(d.name for d in _state.devices) or "none",
    )


def _forget_load(
    regs: list[Reg],
    devices: list[Device],
    hook_names: dict[int, list[str]],
    records: list[PluginRecord],
) -> None:
    if _state.pm is not None:
        from .hooks import unregister_reg

        for key, names in _state.hook_names.items():
            if key not in hook_names:
                unregister_reg(_state.pm, names)
    _state.regs, _state.devices, _state.hook_names, _state.records = (
        regs, devices, hook_names, records,
    )  # fmt: skip
    _state.loaded = False


def _process(candidates: Sequence[Candidate], selection: settings.Selection) -> list[Reg]:
    """Initialise the best variant of each backend among prepared candidates."""
    loaded: list[Reg] = []
    _state.records.extend(rec for rec, _ in candidates)
    groups = discovery.group_variants(rec for rec, _ in candidates)
    for key in sorted(groups, key=selection.rank):
        winner: PluginRecord | None = None
        existing = _find_reg(key)
        for rec in groups[key]:
            if existing is not None:
                rec.status = PluginStatus.NOT_SELECTED
                rec.detail = f"backend {existing.name!r} was already registered ({existing!r})"
            elif winner is not None:
                rec.status = PluginStatus.NOT_SELECTED
                rec.detail = f"{winner.short_origin} scored higher ({winner.score} > {rec.score})"
            elif _init(rec, selection.init_timeout):
                winner = rec
                assert rec.reg is not None
                loaded.append(rec.reg)
            _log.debug("%s: %s %s", rec, rec.status.value, rec.detail)
    return loaded


def _init(rec: PluginRecord, timeout: float) -> bool:
    registration = rec.registration
    assert registration is not None
    _log.debug("%s: initialising backend %r", rec, rec.backend)
    try:
        reg = discovery.within_budget(
            rec, "init", registration.create_reg, timeout, lock=_state.lock
        )
    except (Exception, SystemExit) as e:
        rec.fail("init", e)
        return False
    try:
        _register(reg, rec)
    except Exception as e:
        rec.fail("register", e)
        return False
    return True


def _register(reg: Reg, rec: PluginRecord) -> None:
    """Validate ``reg`` and its devices, register its hooks, then add it (all or nothing)."""
    if not isinstance(reg, Reg):
        raise PluginError(f"{rec.origin} returned {type(reg).__name__}; expected a tensorplug.Reg")
    if any(r is reg for r in _state.regs):  # the plugin registered itself during init()
        rec.reg, rec.status = reg, PluginStatus.LOADED
        return
    name = reg.name
    if not isinstance(name, str) or not name:
        raise PluginError(f"{type(reg).__qualname__}.name must be a non-empty str, got {name!r}")
    if rec.backend and name.casefold() != rec.backend.casefold():
        raise PluginError(
            f"the registration is named {rec.backend!r} but init() returned a Reg named "
            f"{name!r}; give both the same name"
        )
    if (other := _find_reg(name)) is not None:
        raise PluginError(f"a backend named {name!r} is already registered ({other!r}); unload it")
    own = api_version_of(reg.api_version, plugin=f"Reg {name!r} ({type(reg).__qualname__})")
    check_api_version(own, plugin=f"Reg {name!r}", package=rec.distribution)
    declared = _declared_version(own, rec)
    devs = list(reg.devices())
    taken = {d.name.casefold(): d for d in _state.devices}
    for dev in devs:
        if not isinstance(dev, Device):
            raise PluginError(f"{name}.devices() holds {dev!r}, which is not a tensorplug.Device")
        if dev.reg is None:
            dev.reg = reg
        elif dev.reg is not reg:
            raise PluginError(f"device {dev.name!r} of {name} belongs to another Reg {dev.reg!r}")
        if not isinstance(dev.type, DeviceType):
            raise PluginError(f"device {dev.name!r}: type must be a DeviceType, got {dev.type!r}")
        if type(dev)._supports_op is Device._supports_op:
            raise PluginError(
                f"device {dev.name!r} of {name} ({type(dev).__qualname__}) does not implement "
                "_supports_op(op): say which nodes the device computes"
            )
        if (clash := taken.get(dev.name.casefold())) is not None:
            raise PluginError(
                f"backend {name!r} has a device named {dev.name!r}, but that name is already "
                f"used by {clash!r} of backend {clash.reg.name if clash.reg else '?'!r}"
            )
        taken[dev.name.casefold()] = dev
    from . import hooks

    hook_names = hooks.register_reg(_pm(), reg)
    if declared != reg.api_version:
        reg.api_version = declared  # what its devices' supports_op is filtered by
    rec.api_version = rec.api_version or declared
    _state.regs.append(reg)
    _state.devices.extend(devs)
    _state.hook_names[id(reg)] = hook_names
    rec.reg, rec.status, rec.backend = reg, PluginStatus.LOADED, rec.backend or name
    for dev in devs:
        _log.debug("registered device %s (%s) of backend %s", dev.name, dev.type.value, name)
        for alias in device_aliases(dev):
            _log.info(
                "devices %s and %s report the same device_id %r: they are one physical device",
                dev.name,
                alias.name,
                dev.device_id,
            )


def _declared_version(own: tuple[int, int], rec: PluginRecord) -> tuple[int, int]:
    """The plugin API (and op contract) a Reg is held to: its Registration's
    ``api_version``, the plugin's declaration, or the Reg's own (``own``) when that is
    older (a Reg registered in code declares through its ``api_version`` alone)."""
    if rec.registration is not None:
        return min(own, rec.registration.api_version)
    return own


def _pm() -> pluggy.PluginManager:
    if _state.pm is None:
        from .hooks import new_plugin_manager

        _state.pm = new_plugin_manager()
    return _state.pm


def _find_reg(name: str) -> Reg | None:
    return _named(_state.regs, name)


def _named(items: Sequence[_Named], name: str) -> _Named | None:
    key = name.casefold()
    return next((x for x in items if x.name.casefold() == key), None)


def _at(items: Sequence[_Named], index: int, what: str) -> _Named:
    if not 0 <= index < len(items):
        raise OutOfBoundsError(f"{len(items)} {what} are registered; {index} is out of range")
    return items[index]


def _devices_of(reg: Reg) -> list[Device]:
    """``reg``'s devices as registered (validated when the Reg was)."""
    return [d for d in _state.devices if d.reg is reg]


def _requested_error(selection: settings.Selection) -> tuple[str, BaseException | None] | None:
    """The error to raise at every use when a backend the user asked for is not there."""
    problems: list[tuple[str, BaseException | None]] = []
    for name in selection.allow:
        if _find_reg(name) is None:
            problems.append(
                discovery.explain_missing(
                    _state.records, name, f"{settings.BACKENDS.env} asks for {name!r}, but"
                )
            )
    if selection.strict:
        prefix = f"{settings.STRICT_PLUGINS.env}=1 and"
        failed = [r for r in _state.records if r.failed]
        problems += [(f"{prefix} {r.error_message()}", r.exception) for r in failed]
    if not problems:
        return None
    if len(problems) == 1:
        return problems[0]
    cause = next((c for _, c in problems if c is not None), None)
    return "\n".join([f"{len(problems)} plugin problems:", *(f"- {m}" for m, _ in problems)]), cause


def _warn_failures() -> None:
    """One warning per batch of new failures; the details are in ``tensorplug doctor``."""
    fresh = [r for r in _state.records if r.failed and not r.warned]
    for r in fresh:
        r.warned = True
    if fresh:
        _log.warning(
            "%d tensorplug plugin(s) failed and were skipped: %s. Run `tensorplug doctor` for "
            "the reasons and tracebacks.",
            len(fresh),
            ", ".join(f"{r.label} ({r.stage}: {type(r.exception).__name__})" for r in fresh),
        )


# -- loading ---------------------------------------------------------------------------


def load_all() -> None:
    """Discover, score and load every installed backend plugin (``ggml_backend_load_all``).

    Runs once per process; later calls, and calls from a plugin being loaded, return at
    once. Raises :class:`PluginError` when a backend the user asked for is missing or
    failed, and keeps raising it at every registry call until that is fixed.
    """
    _ensure_loaded()


def loading_error() -> PluginError | None:
    """The error :func:`load_all` raises, or None; lets tools report it without raising."""
    _ensure_loaded(raise_errors=False)
    if _state.error is None:
        return None
    message, cause = _state.error
    err = PluginError(message)
    err.__cause__ = cause
    return err


def discover() -> list[PluginRecord]:
    """Read and score every plugin candidate without initialising any (a dry run).

    Uses the environment's selection and the cached entry points; the registry itself
    is left untouched. Only plugins' registration modules are imported.
    """
    return [rec for rec, _ in _prepared(settings.Selection.from_env())]


def load(spec: str | os.PathLike[str]) -> Reg:
    """Load one plugin now and return its Reg (``ggml_backend_load``).

    ``spec`` is an installed entry-point name (``"cpu"``), a ``"module:attr"`` naming a
    registration, or a path (a ``.py`` file, or anything with a ``/``, e.g.
    ``"./my_plugin"`` for a package folder) whose module defines ``registration``.
    Environment selection does not apply: the caller asked for it. When several
    installed variants share the entry-point name, the best-scoring one loads. Any
    failure raises :class:`PluginError` with the cause.
    """
    with _mutating():
        candidates = _candidates_for(spec)
        chosen = _no_selection()
        _prepare_all(candidates, chosen)
        loaded = _process(candidates, chosen)
    if loaded:
        return loaded[0]
    found = discovery.explain([rec for rec, _ in candidates], f"load({os.fspath(spec)!r}):")
    message, cause = found or (f"load({os.fspath(spec)!r}): nothing to load", None)
    raise PluginError(message) from cause


def _candidates_for(spec: str | os.PathLike[str]) -> list[Candidate]:
    text = os.fspath(spec)
    if isinstance(spec, os.PathLike) or text.endswith(".py") or "/" in text or os.sep in text:
        return [(r, None) for r in discovery.records_from_path(Path(text))]
    if ":" in text:
        return [(PluginRecord(source=Source.MODULE, spec=text), None)]
    eps = [ep for ep in _entry_points() if ep.name.casefold() == text.casefold()]
    if not eps:
        names = ", ".join(sorted({ep.name for ep in _entry_points()})) or "none"
        raise PluginError(
            f"load({text!r}): no installed plugin has an entry point named {text!r} in group "
            f"{discovery.ENTRY_POINT_GROUP!r} (installed: {names}). Pass a 'module:attr' or a "
            "file path instead, or install the plugin."
        )
    return [(discovery.record_for_entry_point(ep), ep) for ep in eps]


def load_all_from_path(path: str | os.PathLike[str]) -> list[Reg]:
    """Load every plugin module in a folder (``ggml_backend_load_all_from_path``).

    Failures are recorded and skipped as in :func:`load_all` (raised under
    ``TENSORPLUG_STRICT_PLUGINS=1``); returns the Regs that were loaded.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise PluginError(f"load_all_from_path({str(path)!r}): not a folder")
    with _mutating():
        candidates = [(r, None) for r in discovery.records_from_path(folder)]
        chosen = _no_selection()
        _prepare_all(candidates, chosen)
        loaded = _process(candidates, chosen)
        _warn_failures()
    failed = [rec for rec, _ in candidates if rec.failed]
    if failed and settings.STRICT_PLUGINS.get():
        raise PluginError(failed[0].error_message()) from failed[0].exception
    return loaded


def register(reg: Reg) -> Reg:
    """Register a Reg built in code (``ggml_backend_register``); validates it first.

    This does not trigger discovery. Registering before the registry's first use makes
    this Reg take precedence over an installed plugin with the same backend name.
    """
    rec = PluginRecord(source=Source.CODE, spec=repr(reg))  # its api_version, once checked
    with _mutating():
        _register(reg, rec)
        _state.records.append(rec)
    return reg


def unload(reg: Reg | str) -> None:
    """Remove a backend and its devices from the registry (``ggml_backend_unload``).

    Python cannot unload modules, so the plugin's code stays imported; its devices,
    hooks and Reg are no longer reachable through the registry.
    """
    _ensure_loaded(raise_errors=False)
    with _mutating():
        target = _resolve_reg(reg)
        devs = _devices_of(target)
        _state.regs.remove(target)
        _state.devices = [d for d in _state.devices if d.reg is not target]
        if _state.pm is not None:
            from .hooks import unregister_reg

            unregister_reg(_state.pm, _state.hook_names.pop(id(target), []))
        for rec in _state.records:
            if rec.reg is target:
                rec.status, rec.detail, rec.reg = PluginStatus.UNLOADED, "unload() was called", None
    _log.debug("unloaded backend %s and its %d devices", target.name, len(devs))


def reset() -> None:
    """Forget every backend, record and cached entry point, as in a fresh process (tests)."""
    with _state.lock:
        if _state.busy:
            raise PluginError("reset() cannot be called while plugins are loading")
        if _state.pm is not None:
            from .hooks import unregister_reg

            for names in _state.hook_names.values():
                unregister_reg(_state.pm, names)
        _state.clear()
    _log.debug("registry reset")


# -- queries (ggml's enumeration API) -------------------------------------------------------


def reg_count() -> int:
    _ensure_loaded()
    return len(_state.regs)


def reg_get(index: int) -> Reg:
    _ensure_loaded()
    return _at(_state.regs, index, "backends")


def reg_by_name(name: str) -> Reg | None:
    """The backend called ``name`` (case-insensitive), or None."""
    _ensure_loaded()
    return _find_reg(name)


def regs() -> tuple[Reg, ...]:
    _ensure_loaded()
    return tuple(_state.regs)


def dev_count() -> int:
    _ensure_loaded()
    return len(_state.devices)


def dev_get(index: int) -> Device:
    _ensure_loaded()
    return _at(_state.devices, index, "devices")


def dev_by_name(name: str) -> Device | None:
    """The device called ``name`` (case-insensitive), or None."""
    _ensure_loaded()
    return _named(_state.devices, name)


def dev_by_type(type: DeviceType | str) -> Device | None:
    """The first registered device of ``type``, or None."""
    _ensure_loaded()
    wanted = _device_type(type)
    return next((d for d in _state.devices if d.type is wanted), None)


def _device_type(type: DeviceType | str) -> DeviceType:
    if isinstance(type, DeviceType):
        return type
    try:
        return DeviceType(str(type).lower())
    except ValueError:
        kinds = ", ".join(t.value for t in DeviceType)
        raise InvalidArgumentError(
            f"unknown device type {type!r}; expected one of {kinds}"
        ) from None


def devices() -> tuple[Device, ...]:
    _ensure_loaded()
    return tuple(_state.devices)


def plugin_records() -> tuple[PluginRecord, ...]:
    """Every plugin candidate seen so far and what became of it; never raises."""
    _ensure_loaded(raise_errors=False)
    return tuple(_state.records)


def device_aliases(device: Device) -> list[Device]:
    """Other registered devices reporting ``device``'s ``device_id`` (the same hardware)."""
    did = device.device_id
    if did is None:
        return []
    return [d for d in _state.devices if d is not device and d.device_id == did]


def duplicate_device_ids() -> dict[str, tuple[Device, ...]]:
    """``device_id`` → devices, for ids that more than one registered device reports.

    Two backends can drive one physical GPU (CUDA and OpenCL); count it once.
    """
    _ensure_loaded()
    by_id: dict[str, list[Device]] = {}
    for d in _state.devices:
        if d.device_id is not None:
            by_id.setdefault(d.device_id, []).append(d)
    return {k: tuple(v) for k, v in by_id.items() if len(v) > 1}


# -- backends -----------------------------------------------------------------------------


def init_by_name(name: str, params: str | None = None) -> Backend:
    """A backend on the device called ``name``, or on the first device of backend ``name``.

    When that backend is installed but failed to load, the recorded failure is raised.
    """
    _ensure_loaded()
    dev = dev_by_name(name)
    if dev is None and (reg := _find_reg(name)) is not None:
        if not (devs := _devices_of(reg)):
            raise BackendNotFoundError(f"init_by_name({name!r}): backend {name!r} has no devices")
        dev = devs[0]
    if dev is not None:
        return dev.init_backend(params)
    recs = [r for r in _state.records if r.matches(name)]
    message, cause = discovery.explain_missing(_state.records, name, f"init_by_name({name!r}):")
    if any(r.failed for r in recs):
        raise PluginError(message) from cause
    if recs:
        raise BackendUnavailableError(message)
    message += f" Registered devices: {', '.join(d.name for d in _state.devices) or 'none'}."
    raise BackendNotFoundError(message)


def init_by_type(type: DeviceType | str, params: str | None = None) -> Backend:
    """A backend on the first device of ``type``."""
    dev = dev_by_type(type)
    if dev is None:
        have = ", ".join(f"{d.name} ({d.type.value})" for d in _state.devices) or "none"
        raise BackendNotFoundError(
            f"init_by_type: no {_device_type(type).value} device is registered (devices: {have})"
        )
    return dev.init_backend(params)


def init_best() -> Backend:
    """A backend on the best device: the first of ``TENSORPLUG_BACKENDS`` when set, else
    a GPU, else an integrated GPU, else a CPU (``ggml_backend_init_best``)."""
    _ensure_loaded()
    for name in _state.selection.allow:
        reg = _find_reg(name)
        if reg is not None and (devs := _devices_of(reg)):
            return _best_of(devs).init_backend()
    if _state.devices and (best := _best_of(_state.devices)).type in BEST_TYPES:
        return best.init_backend()
    summary = "; ".join(f"{r.label}: {r.status.value}" for r in _state.records) or "none found"
    raise BackendNotFoundError(
        f"no GPU, integrated GPU or CPU device is registered (plugins: {summary}). Fix: install a "
        "backend plugin (from a tensorplug checkout: pip install -e plugins/cpu); `tensorplug "
        "doctor` explains failures."
    )


def _best_of(devs: Sequence[Device]) -> Device:
    """GPU, then iGPU, then CPU; among CPU devices the host CPU backend first: an OpenCL
    driver running on the CPU (PoCL) only adds copies over it. Registration order breaks
    ties."""

    def rank(d: Device) -> tuple[int, bool]:
        kind = BEST_TYPES.index(d.type) if d.type in BEST_TYPES else len(BEST_TYPES)
        return kind, not is_host_cpu(d)

    return min(devs, key=rank)


# -- hooks --------------------------------------------------------------------------------


def _resolve_reg(reg: Reg | str) -> Reg:
    target = _find_reg(reg) if isinstance(reg, str) else reg
    if target is None or all(r is not target for r in _state.regs):
        names = ", ".join(r.name for r in _state.regs) or "none"
        raise BackendNotFoundError(f"backend {reg!r} is not registered (registered: {names})")
    return target


def get_proc(reg: Reg | str, name: str) -> Callable[..., Any] | None:
    """Extension function ``name`` of a backend: the Reg's own, else a hook's, else None."""
    _ensure_loaded()
    target = _resolve_reg(reg)
    fn = target.get_proc(name)
    if fn is None and _state.pm is not None:
        fn = _state.pm.hook.tensorplug_get_proc(reg=target, name=name)
    return fn


def extra_buffer_types(device: Device) -> list[BufferType]:
    """Buffer types that plugins offer for ``device`` beyond its default one."""
    from .buffer import BufferType

    _ensure_loaded()
    if _state.pm is None:
        return []
    found: list[BufferType] = []
    for answer in _state.pm.hook.tensorplug_extra_buffer_types(device=device):
        for buft in answer:
            if not isinstance(buft, BufferType):
                raise PluginError(
                    f"a tensorplug_extra_buffer_types hook returned {buft!r} for {device.name}; "
                    "expected BufferType instances"
                )
            found.append(buft)
    return found

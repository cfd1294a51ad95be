"""Every environment setting tensorplug reads, declared once with its type, default and help.

Settings are read when they are used (the registry reads them when it first loads
plugins), never when ``tensorplug`` is imported, so an application may set them after
``import tensorplug``. ``tensorplug doctor`` prints them with their help text.

How the registry settings combine, strongest first:

1. Code beats the environment: :func:`tensorplug.registry.load` and
   :func:`~tensorplug.registry.register` load what they are given regardless of the
   lists below.
2. ``TENSORPLUG_DISABLE`` removes backends (by backend or entry-point name) even when
   ``TENSORPLUG_BACKENDS`` lists them; a disabled plugin is not even imported when its
   entry-point name is listed.
3. ``TENSORPLUG_BACKENDS`` keeps only the listed backends, registers them in that
   order and makes the first one the default of ``init_best()`` (and where
   ``tensorplug run`` places a model). The host CPU backend (``CPU``) is kept whether
   listed or not, after the listed ones: the scheduler runs inputs and the ops other
   devices cannot run on it, so a selection without it could run nothing; only
   ``TENSORPLUG_DISABLE=CPU`` removes it. A listed backend that is missing, cannot run
   here or fails to load is an error.
4. ``TENSORPLUG_BACKEND_PATH`` adds plugin files and folders; they compete with
   installed entry points on score (a tie goes to the path).
5. ``TENSORPLUG_STRICT_PLUGINS=1`` turns every plugin failure into an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from .errors import TensorplugError

__all__ = [
    "BACKENDS",
    "FALLBACK_BACKEND",
    "MAX_COPIES",
    "CACHE",
    "DEVICE_CACHE",
    "BACKEND_PATH",
    "DISABLE",
    "PLUGIN_INIT_TIMEOUT",
    "PLUGIN_TIMEOUT",
    "SCHED_COPIES",
    "SCHED_DEBUG",
    "SETTINGS",
    "STRICT_PLUGINS",
    "Selection",
    "Setting",
    "SettingError",
    "parse_flag",
    "parse_folder",
]

T = TypeVar("T")

#: The backend that TENSORPLUG_BACKENDS never leaves out (only TENSORPLUG_DISABLE does).
FALLBACK_BACKEND = "CPU"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingError(TensorplugError, ValueError):
    """An environment variable has a value tensorplug cannot use."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: an environment variable, how to parse it, its default and meaning."""

    env: str
    default: T
    parse: Callable[[str], T]
    help: str
    example: str = ""

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, or None when it is unset or blank."""
        value = (os.environ if environ is None else environ).get(self.env)
        return value if value is not None and value.strip() else None

    def problem(self, environ: Mapping[str, str] | None = None) -> str | None:
        """What is wrong with the current value (the message :meth:`get` would raise),
        or None when it is unset or valid: for listings such as ``tensorplug doctor``."""
        try:
            self.get(environ)
        except SettingError as e:
            return str(e)
        return None

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The current value, read now; a malformed value raises :class:`SettingError`."""
        value = self.raw(environ)
        if value is None:
            return self.default
        try:
            return self.parse(value)
        except ValueError as e:
            hint = f" (for example {self.env}={self.example})" if self.example else ""
            raise SettingError(f"{self.env}={value!r}: {e}. {self.help}{hint}") from None


def _names(value: str) -> tuple[str, ...]:
    """Comma-separated names, stripped, duplicates dropped, order kept; at least one."""
    names: dict[str, str] = {}
    for part in value.split(","):
        name = part.strip()
        if name and name.casefold() not in names:
            names[name.casefold()] = name
    if not names:
        raise ValueError("it names no backend (unset it to mean every backend)")
    return tuple(names.values())


def _paths(value: str) -> tuple[Path, ...]:
    return tuple(Path(p).expanduser() for p in value.split(os.pathsep) if p.strip())


def parse_flag(value: str) -> bool:
    """An on/off setting's value: 1/true/yes/on or 0/false/no/off, any case.

    Public so that a plugin declares its own switches with the same words (a value
    outside them is a SettingError naming the variable, never silently "on").
    """
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")


BACKENDS: Setting[tuple[str, ...]] = Setting(
    "TENSORPLUG_BACKENDS",
    (),
    _names,
    "Comma-separated backend names to load, in order; the first is the default (init_best(), "
    "and where `tensorplug run` places the model). The CPU backend is loaded too, last, listed "
    "or not, as the fallback for inputs and unsupported ops (TENSORPLUG_DISABLE=CPU removes "
    "it). Unset: every installed backend that can run here.",
    example="CUDA,CPU",
)

DISABLE: Setting[tuple[str, ...]] = Setting(
    "TENSORPLUG_DISABLE",
    (),
    _names,
    "Comma-separated backend (or entry-point) names never to load, even if listed in "
    "TENSORPLUG_BACKENDS.",
    example="OpenCL",
)

BACKEND_PATH: Setting[tuple[Path, ...]] = Setting(
    "TENSORPLUG_BACKEND_PATH",
    (),
    _paths,
    f"Extra plugin files (.py) or folders of plugin modules, separated by {os.pathsep!r}; "
    "each module defines a module-level `registration`.",
    example=f"~/my_backend.py{os.pathsep}/opt/tensorplug-plugins",
)

STRICT_PLUGINS: Setting[bool] = Setting(
    "TENSORPLUG_STRICT_PLUGINS",
    False,
    parse_flag,
    "1 to make any plugin that fails to import, score or initialise an error instead of a "
    "logged warning.",
    example="1",
)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if not 0 < seconds < 1e6:  # NaN fails both
        raise ValueError("must be a number of seconds above 0")
    return seconds


PLUGIN_TIMEOUT: Setting[float] = Setting(
    "TENSORPLUG_PLUGIN_TIMEOUT",
    10.0,
    _seconds,
    "Seconds a plugin's registration import and its score() may each take (both are meant "
    "to be cheap); a plugin past them is left running in the background, recorded as timed "
    "out (`tensorplug doctor`) and skipped, so that a driver that never answers cannot "
    "hang discovery.",
    example="30",
)

PLUGIN_INIT_TIMEOUT: Setting[float] = Setting(
    "TENSORPLUG_PLUGIN_INIT_TIMEOUT",
    180.0,
    _seconds,
    "Seconds the winning plugin's init() may take (it may start a driver, or a cluster: "
    "the Ray plugin waits up to TENSORPLUG_RAY_START_TIMEOUT for its actors); past them it "
    "is left running in the background, recorded as timed out and skipped.",
    example="600",
)


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError("expected a whole number") from None


def _non_negative(value: str) -> int:
    n = _whole(value)
    if n < 0:
        raise ValueError("must be 0 or more")
    return n


#: Pipeline depth limit: each copy holds every split input and an event per backend
#: (ggml caps it at 4; beyond a few copies nothing more overlaps).
MAX_COPIES = 8


def _copies(value: str) -> int:
    n = _whole(value)
    if not 2 <= n <= MAX_COPIES:
        raise ValueError(f"pipeline parallelism needs 2 to {MAX_COPIES} copies")
    return n


SCHED_DEBUG: Setting[int] = Setting(
    "TENSORPLUG_SCHED_DEBUG",
    0,
    _non_negative,
    "1 to print every graph's split assignment (splits, their inputs, node -> backend) "
    "to stderr when a Scheduler splits it, like GGML_SCHED_DEBUG.",
    example="1",
)

SCHED_COPIES: Setting[int] = Setting(
    "TENSORPLUG_SCHED_COPIES",
    4,
    _copies,
    "How many copies of each split input a Scheduler(parallel=True) keeps, so that that "
    "many consecutive graph computes can overlap (ggml's GGML_SCHED_MAX_COPIES).",
    example="2",
)


def parse_folder(value: str) -> Path | bool:
    """A cache setting's value: a flag's words (``0``, ``off``…: False, kept nowhere;
    ``1``, ``on``…: True, the default folder), else a folder's path. Public so that a
    plugin's own cache settings read the same words."""
    try:
        return parse_flag(value)
    except ValueError:
        return Path(value.strip()).expanduser()


#: True (unset): the default folder; False: kept nowhere; a Path: that folder.
CACHE: Setting[Path | bool] = Setting(
    "TENSORPLUG_CACHE",
    True,
    parse_folder,
    "The folder where tensorplug keeps, between processes, what it learnt of the "
    "installation (what importlib.metadata said of the plugins, commands and versions) and "
    "of the GGUF files it opened (their headers), so that a launch neither imports "
    "importlib.metadata and gguf nor parses the header again. Each is asked again "
    "when what it came from changes (a folder on sys.path, the file), and used only where "
    "it checks out (a damaged or foreign file is a miss, with a warning). Unset: "
    "$XDG_CACHE_HOME/tensorplug, else ~/.cache/tensorplug (also 1); 0 to keep nothing. "
    "`tensorplug cache` shows, verifies and clears what is kept.",
    example="0",
)


#: True (unset): the default folder; False: kept nowhere; a Path: that folder. Read by
#: the GPU plugins (``tensorplug_kernels.runtime.probe``); declared here with the core's
#: cache so that ``tensorplug cache`` finds both folders without importing a plugin.
DEVICE_CACHE: Setting[Path | bool] = Setting(
    "TENSORPLUG_DEVICE_CACHE",
    True,
    parse_folder,
    "the folder where GPU plugins (OpenCL, WebGPU) keep the list of devices their drivers "
    "gave, so that a process that does not use a device does not start its driver (PoCL's "
    "LLVM, Vulkan: a large part of a short launch's time and memory on a machine with "
    "only software devices). The list is asked again when a driver package, manifest, "
    "device node or driver variable changes, and checked when a device is first used. Unset: "
    "$XDG_CACHE_HOME/tensorplug, else ~/.cache/tensorplug (also 1); 0 to ask the drivers "
    "in every process.",
    example="0",
)


#: Every setting, in the order ``tensorplug doctor`` shows them.
SETTINGS: tuple[Setting[Any], ...] = (
    BACKENDS,
    DISABLE,
    BACKEND_PATH,
    STRICT_PLUGINS,
    PLUGIN_TIMEOUT,
    PLUGIN_INIT_TIMEOUT,
    SCHED_DEBUG,
    SCHED_COPIES,
    CACHE,
    DEVICE_CACHE,
)


@dataclass(frozen=True)
class Selection:
    """The environment's say in which backends load, read once per load."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    paths: tuple[Path, ...] = ()
    strict: bool = False
    timeout: float = PLUGIN_TIMEOUT.default
    init_timeout: float = PLUGIN_INIT_TIMEOUT.default

    @classmethod
    def from_env(cls) -> Selection:
        return cls(
            allow=BACKENDS.get(),
            deny=DISABLE.get(),
            paths=BACKEND_PATH.get(),
            strict=STRICT_PLUGINS.get(),
            timeout=PLUGIN_TIMEOUT.get(),
            init_timeout=PLUGIN_INIT_TIMEOUT.get(),
        )

    def denied(self, name: str) -> str | None:
        if name.casefold() in {d.casefold() for d in self.deny}:
            return f"disabled by {DISABLE.env}={','.join(self.deny)}"
        return None

    def excluded(self, name: str) -> str | None:
        """Why backend ``name`` is left out, or None. The allow-list never leaves out
        the host CPU backend: it is every schedule's fallback (see the module's rule 3)."""
        if why := self.denied(name):
            return why
        listed = {a.casefold() for a in self.allow} | {FALLBACK_BACKEND.casefold()}
        if self.allow and name.casefold() not in listed:
            return f"not listed in {BACKENDS.env}={','.join(self.allow)}"
        return None

    def rank(self, name: str) -> tuple[int, str]:
        """Load order: the allow-list's order, then alphabetical."""
        folded = [a.casefold() for a in self.allow]
        key = name.casefold()
        return (folded.index(key) if key in folded else len(folded), key)

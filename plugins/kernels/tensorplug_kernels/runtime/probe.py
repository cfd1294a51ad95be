"""A GPU runtime's device list, kept on disk so that a process that never uses a device
never starts its driver.

Asking OpenCL for its platforms loads every installed driver (PoCL brings LLVM: 90 MB
of memory and 0.06 s), and asking wgpu for its adapters imports wgpu-native and starts
Vulkan (0.37 s, 30 MB). Every tensorplug process asked, to learn whether there is a GPU
to place a model on; on a machine whose only such devices are software ones (PoCL,
lavapipe), which no default placement uses, that was a third of launching a small model
and a quarter of its memory.

So a runtime describes each device as a record of plain JSON values (what placement,
``supports_op`` and ``tensorplug devices`` need: name, type, limits), and
:class:`DeviceProbe` keeps the last list in a file, keyed by what decides what the
drivers would say: the versions of the binding and driver packages, the driver
manifests (ICD files) and the libraries they name, the device nodes (``/dev/dri``,
``/dev/nvidia*``, ``/dev/kfd``), the boot, and the variables the drivers read. A device
is opened (its driver asked in this process) when it is first used, and its record
is checked against what the driver says then: a list that changed in a way the key
could not see (a driver library replaced in place) is rewritten for the next process,
and a device that is no longer what it was said to be refuses with
:class:`DeviceListChangedError` rather than run as something else.

``TENSORPLUG_DEVICE_CACHE`` names the folder (default ``$XDG_CACHE_HOME/tensorplug``,
else ``~/.cache/tensorplug``), or ``0`` to ask the drivers in every process. A file
that cannot be read or written is ignored: the drivers are asked, as without one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from tensorplug import files, installed
from tensorplug.errors import TensorplugError
from tensorplug.files import replace_file
from tensorplug.settings import Setting, parse_folder

__all__ = [
    "DEVICE_CACHE",
    "COMMON_VARIABLES",
    "DeviceListChangedError",
    "DeviceProbe",
    "Record",
    "cache_folder",
    "driver_key",
]

_log = logging.getLogger(__name__)

#: A device as a runtime describes it: JSON values only (it is written to disk).
Record = dict[str, Any]

Live = TypeVar("Live")

#: Bumped when what a file holds changes shape: an older file is then a miss.
FORMAT = 1

#: Variables that steer every runtime's drivers: where the dynamic loader finds them.
COMMON_VARIABLES = ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH")

#: Device nodes: a GPU that appears or goes changes them (Linux).
_DEVICE_NODES = ("/dev/dri", "/dev/kfd", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1")


def cache_folder() -> Path | None:
    """Where the device lists are kept now (None: nowhere)."""
    return files.cache_folder(DEVICE_CACHE.get())


#: True (unset): the default folder; False: kept nowhere; a Path: that folder.
DEVICE_CACHE: Setting[Path | bool] = Setting(
    "TENSORPLUG_DEVICE_CACHE",
    True,
    parse_folder,
    "the folder where GPU plugins (OpenCL, WebGPU) keep the list of devices their drivers "
    "gave, so that a process that does not use a device does not start its driver (PoCL's "
    "LLVM, Vulkan: about 0.4 s and 120 MB a launch on a machine with only software "
    "devices). The list is asked again when a driver package, manifest, device node or "
    "driver variable changes, and checked when a device is first used. Unset: "
    "$XDG_CACHE_HOME/tensorplug, else ~/.cache/tensorplug (also 1); 0 to ask the drivers "
    "in every process.",
    example="0",
)


class DeviceListChangedError(TensorplugError, RuntimeError):
    """A device opened for use is not the one the kept list described (a driver was
    replaced in place): the list has been rewritten, and the next process sees the
    devices as they are now."""


def _stat(path: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [path]
    return [path, st.st_mtime_ns, st.st_size]


def _manifest_libraries(path: str) -> list[str]:
    """The absolute library paths a Vulkan (JSON) or OpenCL (one line) manifest names."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(65536)
    except OSError:
        return []
    if path.endswith(".json"):
        try:
            icd = json.loads(text)
            found = [icd.get(k, {}).get("library_path") for k in ("ICD", "layer")]
        except (ValueError, AttributeError):
            return []
        return [p for p in found if isinstance(p, str) and os.path.isabs(p)]
    line = text.strip()
    return [line] if os.path.isabs(line) else []


def _manifests(folders: Iterable[str]) -> list[Any]:
    """Every file in ``folders`` (or a file itself), with the libraries it names."""
    seen: list[Any] = []
    for folder in folders:
        try:
            names = sorted(os.listdir(folder)) if os.path.isdir(folder) else None
        except OSError:
            names = []
        files = [folder] if names is None else [os.path.join(folder, n) for n in names]
        for path in files:
            seen.append(_stat(path))
            seen.extend(_stat(lib) for lib in _manifest_libraries(path))
    return seen


def _os() -> list[str]:
    """The OS, its kernel's release, the machine and the C library's version: what
    ``platform.platform()`` says, without its reading the interpreter's executable for
    the C library (2.7 ms of each launch with a GPU plugin installed, 2-core Zen 4)."""
    uname = platform.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # not glibc, not POSIX
        libc = ""
    mac = platform.mac_ver()[0] if uname.system == "Darwin" else ""
    return [uname.system, uname.release, uname.machine, libc, mac]


def _boot() -> str:
    """This boot's id on Linux (a new boot may bring other hardware), else nothing."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def driver_key(
    runtime: str,
    distributions: Sequence[str],
    manifest_folders: Sequence[str],
    variables: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> str:
    """What decides the device list a runtime's drivers give, hashed: equal keys, the
    same devices. ``distributions`` are the binding's and drivers' packages,
    ``manifest_folders`` the driver manifest folders (or files), ``variables`` the
    prefixes of the variables its drivers read; the device nodes, the boot, the OS and
    :data:`COMMON_VARIABLES` are every runtime's. Each runtime names only its own
    variables: another runtime's driver may set some of those while it is asked (Mesa's
    ``NODEVICE_SELECT``), which must not make this one's key differ between processes."""
    env = os.environ if environ is None else environ
    prefixes = (*variables, *COMMON_VARIABLES)
    nodes = []
    for node in _DEVICE_NODES:
        if os.path.isdir(node):
            with contextlib.suppress(OSError):
                nodes.append([node, sorted(os.listdir(node))])
        elif os.path.exists(node):
            nodes.append([node])
    parts = {
        "format": FORMAT,
        "runtime": runtime,
        "python": sys.version,
        "os": [*_os(), _boot()],
        "packages": {d: installed.version(d) for d in distributions},  # kept, as the list
        "manifests": _manifests(manifest_folders),
        "nodes": nodes,
        "variables": sorted((k, v) for k, v in env.items() if k.startswith(prefixes)),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class DeviceProbe(Generic[Live]):
    """One runtime's device list: :meth:`records` from the kept file when its key still
    matches (the drivers untouched), else from ``probe``; :meth:`open` gives a device's
    live driver object, asking the drivers once per process.

    ``probe`` asks the drivers and returns, per device in the runtime's order, its record
    and the live object the runtime works with (a pyopencl device; a wgpu adapter and
    its device). ``key`` computes the driver key (:func:`driver_key`) and is called once.
    ``check`` reads a kept record as the runtime will (raising KeyError, TypeError or
    ValueError where it cannot): a file written by another version of the plugin, or
    edited, is then a miss rather than a device described wrongly. ``volatile`` names
    the fields that describe a device's state rather than which device it is: a device
    whose kept record differs from the driver's only there is the same device (opened,
    and the list rewritten with the new values). PoCL's CPU reports a memory total that
    follows the host's memory, so a second process refused PoCL's device now and then.
    """

    def __init__(
        self,
        runtime: str,
        probe: Callable[[], Sequence[tuple[Record, Live]]],
        key: Callable[[], str],
        check: Callable[[Record], object] = lambda record: None,
        volatile: Collection[str] = (),
    ) -> None:
        self.runtime = runtime
        self._probe = probe
        self._key_of = key
        self._check = check
        self.volatile = frozenset(volatile)
        self._key: str | None = None
        self._records: list[Record] | None = None
        self._live: list[tuple[Record, Live]] | None = None
        self._lock = threading.RLock()

    @property
    def path(self) -> Path | None:
        """The file the list is kept in (None: kept nowhere)."""
        folder = cache_folder()
        return None if folder is None else folder / "devices" / f"{self.runtime}.json"

    @property
    def fresh(self) -> bool:
        """True once the drivers have been asked in this process."""
        return self._live is not None

    def records(self) -> list[Record]:
        """The devices, as the kept list has them when the drivers are unchanged, else as
        the drivers say (and then kept). The drivers' own errors propagate."""
        with self._lock:
            if self._records is None:
                self._records = self._read()
                if self._records is None:
                    self._records = self._ask()
            return self._records

    def open(self, index: int) -> Live:
        """The live object of device ``index``: the drivers are asked now if they were not
        yet in this process. Raises :class:`DeviceListChangedError` when that device is not
        the one :meth:`records` described."""
        described = self.records()
        with self._lock:
            if self._live is None:
                self._ask()
            assert self._live is not None
            now = [r for r, _ in self._live]
            if index < len(now) and self._same(now[index], described[index]):
                return self._live[index][1]
        was = described[index].get("name", f"device {index}")
        is_now = now[index].get("name", f"device {index}") if index < len(now) else "no device"
        if index < len(now) and is_now == was:  # the same device, described otherwise
            old, new = described[index], now[index]
            changed = [k for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
            is_now += " with " + ", ".join(
                f"{k} {new.get(k)!r} (was {old.get(k)!r})" for k in changed[:3]
            )
        raise DeviceListChangedError(
            f"{self.runtime}{index}: the drivers now give {is_now}, not {was} as the device "
            f"list kept in {self.path} said: a driver changed since the list was made. The "
            "list is rewritten; start the process again to see the devices as they are"
        )

    def _same(self, a: Record, b: Record) -> bool:
        """Whether two records describe the same device (they differ at most in the
        ``volatile`` fields)."""
        keys = {*a, *b} - self.volatile
        return all(a.get(k) == b.get(k) for k in keys)

    def forget(self) -> None:
        """Forget what this process was told: the next :meth:`records` reads the file or
        asks the drivers again (devices already opened keep what they opened)."""
        with self._lock:
            self._key = self._records = self._live = None

    # -- the file ---------------------------------------------------------------------------

    def _key_now(self) -> str:
        if self._key is None:
            self._key = self._key_of()
        return self._key

    def _read(self) -> list[Record] | None:
        path = self.path
        if path is None:
            return None
        try:
            with open(path, encoding="utf-8") as f:
                kept = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            _log.debug("%s: ignoring the kept device list %s (%s)", self.runtime, path, e)
            return None
        if not (
            isinstance(kept, dict)
            and kept.get("format") == FORMAT
            and kept.get("key") == self._key_now()
            and isinstance(kept.get("devices"), list)
            and all(isinstance(r, dict) for r in kept["devices"])
        ):
            return None
        try:
            for record in kept["devices"]:
                self._check(record)
        except (KeyError, TypeError, ValueError) as e:
            _log.debug("%s: the kept device list %s does not read (%r)", self.runtime, path, e)
            return None
        return list(kept["devices"])

    def _ask(self) -> list[Record]:
        """Ask the drivers (once per process) and keep what they said."""
        with self._lock:
            if self._live is None:
                self._key_now()  # before the drivers run: they may set variables it reads
                self._live = [(dict(r), live) for r, live in self._probe()]
                records = [r for r, _ in self._live]
                if records != self._records:
                    self._write(records)
            return [r for r, _ in self._live]

    def _write(self, records: list[Record]) -> None:
        path = self.path
        if path is None:
            return
        kept = {"format": FORMAT, "runtime": self.runtime, "key": self._key_now(),
                "devices": records}  # fmt: skip
        try:
            replace_file(path, json.dumps(kept, indent=1).encode())
        except (OSError, TypeError, ValueError) as e:
            _log.debug("%s: could not keep the device list in %s (%s)", self.runtime, path, e)

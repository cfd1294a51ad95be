"""A GPU runtime's device list, kept on disk so that a process that never uses a device
never starts its driver.

Asking OpenCL for its platforms loads every installed driver (PoCL brings LLVM, tens of
megabytes of it), and asking wgpu for its adapters imports wgpu-native and starts
Vulkan. Every tensorplug process would ask, to learn whether there is a GPU to place a
model on; on a machine whose only such devices are software ones (PoCL, lavapipe), which
no default placement uses, that is a large share of launching a small model, and of its
memory.

So a runtime describes each device as a record of plain JSON values (what placement,
``supports_op`` and ``tensorplug devices`` need: name, type, limits), and
:class:`DeviceProbe` keeps the last list in a file, keyed by what decides what the
drivers would say: the versions of the binding and driver packages, the driver
manifests (ICD files) and the libraries they name, the device nodes (``/dev/dri``,
``/dev/nvidia*``, ``/dev/kfd``), the boot, and the variables the drivers read. A device
is opened (its driver asked in this process) when it is first used, and its record
is checked against what the driver says then. The list only saves time, it never
decides a run: a device the drivers still give (the same ``identity``: its name,
platform...) is opened with what they say now, whatever else changed (PoCL's memory
and largest allocation follow the machine's free memory), and the list is rewritten
for the next process. Only a device the drivers no longer give at all refuses, with
:class:`DeviceListChangedError`, rather than run as another.

``TENSORPLUG_DEVICE_CACHE`` names the folder (default ``$XDG_CACHE_HOME/tensorplug``,
else ``~/.cache/tensorplug``), or ``0`` to ask the drivers in every process. The file
is read as every kept file is (:mod:`tensorplug.kept`: a regular file in a folder only
the user can write, bounded, validated): one that is not what this module writes, or
lists more than :data:`MAX_DEVICES` devices, is a miss with a warning, and the drivers
are asked, as without one.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from tensorplug import files, installed, kept
from tensorplug.errors import TensorplugError
from tensorplug.settings import DEVICE_CACHE

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

#: The most devices one runtime's list may hold (a machine has a few; 16 GPUs is large).
MAX_DEVICES = 256

#: The largest list file read (a device's record is ~1 KB).
MAX_BYTES = 4 << 20

#: Variables that steer every runtime's drivers: where the dynamic loader finds them.
COMMON_VARIABLES = ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH")

#: Device nodes: a GPU that appears or goes changes them (Linux).
_DEVICE_NODES = ("/dev/dri", "/dev/kfd", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1")


def cache_folder() -> Path | None:
    """Where the device lists are kept now (None: nowhere)."""
    return files.cache_folder(DEVICE_CACHE.get())


class DeviceListChangedError(TensorplugError, RuntimeError):
    """A device opened for use is no longer given by the drivers at all (it was removed,
    or a driver replaced in place no longer lists it): the list has been rewritten, and
    the next process sees the devices as they are now."""


def _by_name(record: Record) -> object:
    return record.get("name")


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
    the C library, which would be paid by each launch with a GPU plugin installed."""
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
    edited, is then a miss rather than a device described wrongly. ``identity`` gives
    what tells one device from another in a record (by default its ``name``): a device
    the drivers still give under the same identity is the same device, opened with the
    record the drivers give now (:meth:`record_now`), whatever else changed.
    """

    def __init__(
        self,
        runtime: str,
        probe: Callable[[], Sequence[tuple[Record, Live]]],
        key: Callable[[], str],
        check: Callable[[Record], object] = lambda record: None,
        identity: Callable[[Record], object] = _by_name,
    ) -> None:
        self.runtime = runtime
        self._probe = probe
        self._key_of = key
        self._check = check
        self.identity = identity
        self._key: str | None = None
        self._records: list[Record] | None = None
        self._live: list[tuple[Record, Live]] | None = None
        self._opened: dict[int, int] = {}  # a listed device's index -> the drivers' now
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
        yet in this process. The device the drivers give under the identity the list
        described is opened, whatever else of its record changed (then the list is
        rewritten); :class:`DeviceListChangedError` where they no longer give it."""
        described = self.records()
        with self._lock:
            if self._live is None:
                self._ask()
            assert self._live is not None
            if (found := self._find(described[index])) is not None:
                self._opened[index] = found
                return self._live[found][1]
        was = self._name(described[index], index)
        now = self._name(self._live[index][0], index) if index < len(self._live) else "no device"
        raise DeviceListChangedError(
            f"{self.runtime}{index}: the drivers no longer give {was} (device {index} is "
            f"now {now}), as the device list kept in {self.path} said: a device or driver "
            "was removed or replaced. The list is rewritten; start the process again to "
            "see the devices as they are"
        )

    def record_now(self, index: int) -> Record:
        """The record of device ``index`` as the drivers gave it in this process (after
        :meth:`open`; before, as listed): what a device describes itself by once open."""
        with self._lock:
            if self._live is not None and index in self._opened:
                return self._live[self._opened[index]][0]
        return self.records()[index]

    def _find(self, described: Record) -> int | None:
        """The index of the device the drivers give now under ``described``'s identity
        (the one at the same index first), or None."""
        assert self._live is not None
        try:
            wanted = self.identity(described)
            now = [self.identity(r) for r, _ in self._live]
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return next((i for i, identity in enumerate(now) if identity == wanted), None)

    @staticmethod
    def _name(record: Record, index: int) -> str:
        return str(record.get("name", f"device {index}"))[:200]

    def forget(self) -> None:
        """Forget what this process was told: the next :meth:`records` reads the file or
        asks the drivers again (devices already opened keep what they opened)."""
        with self._lock:
            self._key = self._records = self._live = None
            self._opened = {}

    # -- the file ---------------------------------------------------------------------------

    def _key_now(self) -> str:
        if self._key is None:
            self._key = self._key_of()
        return self._key

    def _read(self) -> list[Record] | None:
        folder, path = cache_folder(), self.path
        if folder is None or path is None:
            return None
        return kept.load_json(folder, path, MAX_BYTES, self._kept_records)

    def _kept_records(self, kept_list: Any) -> list[Record] | None:
        """The records a parsed file holds, None where they are of another format or
        key (kept before something changed: a miss without a word); raises where the
        file is not what :meth:`_write` writes."""
        if not isinstance(kept_list, dict) or not isinstance(kept_list.get("devices"), list):
            raise ValueError("expected an object with a list of 'devices'")
        if kept_list.get("format") != FORMAT or kept_list.get("key") != self._key_now():
            return None
        devices = kept_list["devices"]
        if len(devices) > MAX_DEVICES:
            raise ValueError(f"it lists {len(devices)} devices, more than {MAX_DEVICES}")
        for record in devices:
            if not isinstance(record, dict):
                raise TypeError(f"a device is described by {type(record).__name__}")
            self._check(record)
        return list(devices)

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
        folder, path = cache_folder(), self.path
        if folder is None or path is None or len(records) > MAX_DEVICES:
            return
        listing = {"format": FORMAT, "runtime": self.runtime, "key": self._key_now(),
                   "devices": records}  # fmt: skip
        try:
            data = json.dumps(listing, indent=1).encode()
        except (TypeError, ValueError) as e:
            _log.debug("%s: could not keep the device list in %s (%s)", self.runtime, path, e)
            return
        kept.save(folder, path, data)

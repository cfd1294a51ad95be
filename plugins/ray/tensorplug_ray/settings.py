"""The environment settings of the Ray plugin, declared once with their help text.

Nothing here starts or contacts a cluster: the registration only reads these to decide
whether the plugin may run, and the cluster is reached when the plugin is initialised.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorplug.settings import Setting

__all__ = ["ADDRESS", "DEVICES", "DeviceRequest", "LOCAL", "START_TIMEOUT", "parse_devices"]

#: The address word that asks the plugin to start a private cluster on this machine.
LOCAL = "local"


@dataclass(frozen=True)
class DeviceRequest:
    """``count`` remote devices, each an actor running the backend ``backend``."""

    backend: str
    count: int


def parse_devices(value: str) -> tuple[DeviceRequest, ...]:
    """``"CPU:2,OpenCL"`` → two CPU actors and one OpenCL actor (a missing count is 1)."""
    out: list[DeviceRequest] = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, count_text = item.partition(":")
        name = name.strip()
        if not name.isidentifier():
            raise ValueError(f"{item!r} does not start with a backend name such as CPU or CUDA")
        try:
            count = int(count_text) if sep else 1
        except ValueError:
            raise ValueError(f"{item!r}: the count after ':' must be a whole number") from None
        if not 1 <= count <= 64:
            raise ValueError(f"{item!r}: the count must be between 1 and 64")
        out.append(DeviceRequest(name, count))
    if not out:
        raise ValueError("no device named")
    return tuple(out)


def _address(value: str) -> str:
    return value.strip()


def _seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise ValueError("must be a positive number of seconds")
    return seconds


ADDRESS: Setting[str] = Setting(
    "TENSORPLUG_RAY_ADDRESS",
    "",
    _address,
    "The Ray cluster whose devices tensorplug uses: an address ray.init() accepts "
    "('auto', 'host:6379', 'ray://host:10001'), or 'local' to start a private cluster on "
    "this machine. Unset: the Ray plugin stays off, so installing it never starts a cluster.",
    example="local",
)

DEVICES: Setting[tuple[DeviceRequest, ...]] = Setting(
    "TENSORPLUG_RAY_DEVICES",
    (DeviceRequest("CPU", 1),),
    parse_devices,
    "Which remote devices to create, as BACKEND:COUNT pairs; each is one Ray actor running "
    "that backend (placed by Ray: CUDA actors ask for a GPU, the others for a CPU core).",
    example="CPU:2,CUDA:4",
)

START_TIMEOUT: Setting[float] = Setting(
    "TENSORPLUG_RAY_START_TIMEOUT",
    120.0,
    _seconds,
    "Seconds to wait for every remote device's actor to start before giving up with an "
    "error (an actor the cluster has no room for would otherwise wait forever).",
    example="30",
)

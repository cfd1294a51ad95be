"""The order in which applications hand devices to the scheduler.

Best first — GPUs, integrated GPUs, accelerators, CPU-type devices with their own
memory — and the host CPU backend last, because the scheduler runs inputs and
fallback ops on its last backend. A physical device reached through two backends
(the same ``device_id``) is used once.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import registry
from .device import Device, DeviceType, is_host_cpu
from .discovery import PluginStatus
from .errors import BackendNotFoundError
from .settings import DISABLE

__all__ = ["by_priority", "host_cpu"]

#: Device types in order of preference; the host CPU backend comes last.
_PRIORITY = {DeviceType.GPU: 0, DeviceType.IGPU: 1, DeviceType.ACCEL: 2, DeviceType.CPU: 3}


def host_cpu() -> Device:
    dev = next((d for d in registry.devices() if is_host_cpu(d)), None)
    if dev is None:
        cpu = [r for r in registry.plugin_records() if r.matches("CPU")]
        if cpu and cpu[0].detail:  # installed, but disabled or failed: say which
            why = f"the CPU plugin is installed but {cpu[0].status.value}: {cpu[0].detail}"
            disabled = cpu[0].status is PluginStatus.DISABLED
            fix = f"remove CPU from {DISABLE.env}" if disabled else "see `tensorplug doctor`"
        else:
            why = "no CPU backend plugin is installed"
            fix = "from a tensorplug checkout, pip install -e plugins/cpu"
        raise BackendNotFoundError(
            f"no CPU device is registered ({why}); the scheduler needs one for inputs and "
            f"the ops other devices cannot run. Fix: {fix}"
        )
    return dev


def by_priority(devs: Iterable[Device]) -> list[Device]:
    """GPUs, integrated GPUs, accelerators, CPU-type devices with device memory, then the
    host CPU; a physical device seen through two backends (same ``device_id``) once."""
    seen: set[str] = set()
    out: list[Device] = []
    for d in sorted(devs, key=lambda d: (_PRIORITY[d.type], is_host_cpu(d))):
        if any(d is o for o in out) or (d.device_id is not None and d.device_id in seen):
            continue
        out.append(d)
        if d.device_id is not None:
            seen.add(d.device_id)
    return out

"""The Metal registration: one device per ``MTLDevice``, in the order Metal lists them.

pyobjc is handed in rather than imported everywhere: every Metal call the plugin makes
goes through the ``Metal`` module object its devices hold — the real one, or in the
tests a fake of the handful of calls used (``tests/fake_metal.py``) whose dispatches
run the same kernels on PoCL. The ownership metadata (:mod:`.ownership`) is registered
before the first Metal object is created.
"""

from __future__ import annotations

from typing import Any

from tensorplug_kernels.runtime import GPUReg, process_wide

from .device import MetalDevice
from .ownership import register_ownership
from .probe import UNVERIFIED

__all__ = ["MetalReg", "create_reg", "discover_devices"]


def discover_devices(metal: Any) -> list[Any]:
    """Every Metal device (``MTLCopyAllDevices`` on macOS), else the default one."""
    copy_all = getattr(metal, "MTLCopyAllDevices", None)
    devices = list(copy_all() or []) if copy_all is not None else []
    if not devices:
        default = metal.MTLCreateSystemDefaultDevice()
        devices = [default] if default is not None else []
    return devices


class MetalReg(GPUReg):
    """Devices ``Metal0``, ``Metal1``, …"""

    runtime = "Metal"
    _devices: list[MetalDevice]

    def __init__(self, metal: Any, objc: Any) -> None:
        register_ownership(objc)
        self.metal, self.objc = metal, objc
        self._devices = [MetalDevice(self, i, d) for i, d in enumerate(discover_devices(metal))]

    def features(self) -> dict[str, str]:
        pyobjc = str(getattr(self.objc, "__version__", "unknown"))
        feats = {"pyobjc": pyobjc, "verified": UNVERIFIED}
        for dev in self._devices:
            info = dev.info
            memory = "unified memory" if info.unified_memory else "discrete memory"
            feats[dev.name] = (
                f"{info.name}, {memory}, working set {info.memory_total / 2**30:.1f} GiB, "
                f"largest buffer {info.max_buffer / 2**30:.1f} GiB"
            )
        return feats


def _over_pyobjc() -> MetalReg:
    import Metal
    import objc

    return MetalReg(Metal, objc)


#: The process-wide registration over pyobjc (libraries are compiled once).
create_reg = process_wide(_over_pyobjc)

"""The Metal registration: one device per ``MTLDevice``, in the order Metal lists them.

pyobjc is handed in rather than imported everywhere: every Metal call the plugin makes
goes through the ``Metal`` module object its devices hold — the real one, or in the
tests a fake of the handful of calls used (``tests/fake_metal.py``) whose dispatches
run the same kernels on PoCL. The ownership metadata (:mod:`.ownership`) is registered
before the first Metal object is created.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from tensorplug.device import Reg

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


class MetalReg(Reg):
    """Devices ``Metal0``, ``Metal1``, …"""

    def __init__(self, metal: Any, objc: Any) -> None:
        register_ownership(objc)
        self.metal, self.objc = metal, objc
        self._devices = [MetalDevice(self, i, d) for i, d in enumerate(discover_devices(metal))]

    @property
    def name(self) -> str:
        return "Metal"

    def devices(self) -> Sequence[MetalDevice]:
        return tuple(self._devices)

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


_REG: MetalReg | None = None
_LOCK = threading.Lock()


def create_reg() -> MetalReg:
    """The process-wide registration over pyobjc (libraries are compiled once)."""
    global _REG
    with _LOCK:
        if _REG is None:
            import Metal
            import objc

            _REG = MetalReg(Metal, objc)
        return _REG

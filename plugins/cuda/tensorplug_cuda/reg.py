"""The CUDA registration: one device per GPU the driver lists, in its order.

cupy is handed in rather than imported everywhere: the plugin's every CUDA call goes
through the ``cp`` object its devices hold, which is the ``cupy`` module in use and,
in the tests, a fake of it (``tests/fake_cupy.py``) whose kernel launches run the same
kernels on PoCL.
"""

from __future__ import annotations

from typing import Any

from tensorplug_kernels.runtime import GPUReg, process_wide

from .buffer import CUDAHostBufferType
from .device import CUDADevice
from .probe import VERIFIED_ON

__all__ = ["CUDAReg", "create_reg"]


class CUDAReg(GPUReg):
    """Devices ``CUDA0``, ``CUDA1``, … and the pinned host buffer type they share."""

    runtime = "CUDA"
    _devices: list[CUDADevice]

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.host_buffer_type = CUDAHostBufferType(cp)
        count = cp.cuda.runtime.getDeviceCount()
        self._devices = [CUDADevice(self, i, cp) for i in range(count)]

    def features(self) -> dict[str, str]:
        runtime = self.cp.cuda.runtime

        def version(v: int) -> str:
            return f"{v // 1000}.{v % 1000 // 10}"

        try:
            nvrtc = ".".join(str(v) for v in self.cp.cuda.nvrtc.getVersion())
        except Exception as e:  # the library is found at first use: say so, do not fail
            nvrtc = f"not found ({e}); pip install nvidia-cuda-nvrtc-cu12 (or -cu13)"
        feats = {
            "cupy": str(self.cp.__version__),
            "CUDA runtime": version(runtime.runtimeGetVersion()),
            "CUDA driver": version(runtime.driverGetVersion()),
            "NVRTC": nvrtc,
            "verified": VERIFIED_ON,
        }
        for dev in self._devices:
            info = dev.info
            feats[dev.name] = (
                f"{info.name}, {info.arch}, {info.memory_total / 2**30:.1f} GiB, "
                f"{info.bandwidth / 1e9:.0f} GB/s, PCI {info.device_id}"
            )
        return feats


def _over_cupy() -> CUDAReg:
    import cupy

    return CUDAReg(cupy)


#: The process-wide registration over the real cupy (programs are compiled once).
create_reg = process_wide(_over_cupy)

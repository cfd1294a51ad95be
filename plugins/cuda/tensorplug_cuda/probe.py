"""Can CUDA run here? Answered without importing cupy.

The registry scores every installed plugin at discovery, so this must be fast and
must not fail: it checks that a cupy wheel is installed (``find_spec`` and the
distribution's name, which says the CUDA major it was built for), loads the driver
library ``libcuda`` with ``ctypes`` and calls ``cuInit`` and ``cuDeviceGetCount`` —
the driver API needs no toolkit. Every "no" comes with the fix.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from tensorplug import installed

__all__ = ["VERIFIED_ON", "cupy_cuda_major", "load_libcuda", "probe_driver", "score"]

#: Said wherever the plugin presents itself: the GPUs scripts/gpu-check.sh has passed on
#: (an H200 and an H100, both sm_90, driver 580 for CUDA 13.0, cupy-cuda13x 14.2; the
#: plugin's README says when), and how to check any other. CUDA 12 wheels and other
#: architectures have not run on a GPU.
VERIFIED_ON = "verified on an NVIDIA H200 and H100 with CUDA 13; other GPUs: scripts/gpu-check.sh"

#: cupy distributions by the CUDA major version their wheels need.
CUPY_DISTRIBUTIONS = {"cupy-cuda12x": 12, "cupy-cuda13x": 13}

_INSTALL = "pip install 'tensorplug-cuda[cuda12]' (or [cuda13] for a CUDA 13 driver)"


def cupy_cuda_major() -> int | None:
    """The CUDA major of the installed cupy wheel, None when it cannot be told (a cupy
    built from source, or none installed)."""
    for dist, major in CUPY_DISTRIBUTIONS.items():
        if installed.version(dist) is not None:  # kept between processes where it can be
            return major
    return None


def load_libcuda() -> Any:
    """The NVIDIA driver library, or an ``OSError`` saying it is not there.

    The names the driver installs; elsewhere than Linux also what
    ``ctypes.util.find_library`` finds. On Linux that asks ``ldconfig -p`` in a
    subprocess for what loading ``libcuda.so.1`` already searched (the loader's cache,
    ``LD_LIBRARY_PATH``): a noticeable share of the launch of every process that loads
    the plugins on a machine with cupy and no driver, for nothing."""
    if sys.platform == "darwin":
        raise OSError("CUDA does not run on macOS (use the Metal backend)")
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so"]
    found = None
    if not sys.platform.startswith("linux"):
        # imports subprocess, tempfile and shutil: here, so that a Linux launch never pays it
        from ctypes.util import find_library

        found = find_library("cuda")
    if found and found not in names:
        names.append(found)
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise OSError(errors[0])  # the first name is the one the driver installs


def _error_name(lib: Any, code: int) -> str:
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({code})"
    except (AttributeError, OSError):
        pass
    return f"CUDA driver error {code}"


def probe_driver(lib: Any) -> tuple[int, int, str]:
    """``(devices, driver CUDA version as 12040, problem)`` from the driver API; the
    problem is "" when the driver started."""
    version = ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(version))
    status = lib.cuInit(0)
    if status != 0:
        return 0, version.value, f"cuInit failed: {_error_name(lib, status)}"
    count = ctypes.c_int(0)
    status = lib.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return 0, version.value, f"cuDeviceGetCount failed: {_error_name(lib, status)}"
    return count.value, version.value, ""


def score(loader: Callable[[], Any] = load_libcuda) -> tuple[int, str]:
    """How well CUDA can run here: 0 with the reason and the fix, else 10."""
    if importlib.util.find_spec("cupy") is None:
        return 0, f"cupy is not installed; {_INSTALL}"
    try:
        lib = loader()
    except OSError as e:
        return 0, (
            f"no NVIDIA driver found (libcuda could not be loaded: {e}); install the NVIDIA "
            "driver for your GPU, or use another backend on this machine"
        )
    try:
        count, version, problem = probe_driver(lib)
    except (AttributeError, OSError) as e:  # a libcuda without the driver API's symbols
        return 0, f"the NVIDIA driver library is unusable ({e}); reinstall the NVIDIA driver"
    driver = f"{version // 1000}.{version % 1000 // 10}" if version else "unknown"
    if problem:
        return 0, (
            f"the NVIDIA driver (CUDA {driver}) did not start: {problem}; check that the "
            "GPU is visible (nvidia-smi) and that the driver and kernel module match"
        )
    if count == 0:
        return 0, (
            f"the NVIDIA driver (CUDA {driver}) sees no GPU; check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES"
        )
    need = cupy_cuda_major()
    if need is not None and version and version // 1000 < need:
        have = version // 1000
        fix = (
            f"pip install 'tensorplug-cuda[cuda{have}]' in place of the installed cupy, or "
            if have in CUPY_DISTRIBUTIONS.values()
            else ""
        )
        return 0, (
            f"the installed cupy needs a CUDA {need} driver but this driver supports CUDA "
            f"{driver}; {fix}update the NVIDIA driver"
        )
    return 10, f"{count} NVIDIA GPU(s), driver for CUDA {driver} ({VERIFIED_ON})"

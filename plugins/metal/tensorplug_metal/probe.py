"""Can Metal run here? Answered without importing pyobjc.

The registry scores every installed plugin at discovery, so this must be fast, must
not fail and must work on every platform. Off macOS the answer is no at once. On
macOS it checks that pyobjc's Metal bindings are installed (``find_spec``) and asks
Metal itself, through ``ctypes``, for the system's default device:
``MTLCreateSystemDefaultDevice`` is a plain C function, so no Objective-C bridge is
needed to learn whether a GPU exists. Every "no" comes with the fix.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["count_default_device", "score"]

_METAL = "/System/Library/Frameworks/Metal.framework/Metal"
# MTLCreateSystemDefaultDevice returns nil in a process that has not loaded CoreGraphics
_CORE_GRAPHICS = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
_CORE_FOUNDATION = "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation"

UNVERIFIED = "not verified on Apple hardware"


def count_default_device() -> int:
    """1 when Metal has a default device, 0 when it has none; ``OSError`` when the
    Metal framework cannot be loaded."""
    ctypes.CDLL(_CORE_GRAPHICS)
    metal = ctypes.CDLL(_METAL)
    create = metal.MTLCreateSystemDefaultDevice
    create.restype = ctypes.c_void_p
    device = create()
    if not device:
        return 0
    release = ctypes.CDLL(_CORE_FOUNDATION).CFRelease  # the function returns +1
    release.argtypes = [ctypes.c_void_p]
    release(device)
    return 1


def score(
    platform: str = sys.platform, probe: Callable[[], Any] = count_default_device
) -> tuple[int, str]:
    """How well Metal can run here: 0 with the reason and the fix, else 10."""
    if platform != "darwin":
        return 0, (
            f"Metal runs only on macOS with an Apple GPU, and this is {platform}; use the "
            "CPU, OpenCL or CUDA backend here"
        )
    if importlib.util.find_spec("Metal") is None:
        return 0, (
            "pyobjc's Metal bindings are not installed: pip install pyobjc-framework-Metal "
            "(installing tensorplug-metal on macOS brings them)"
        )
    try:
        found = probe()
    except OSError as e:
        return 0, f"the Metal framework could not be loaded ({e}); Metal needs macOS 10.13 or newer"
    if not found:
        return 0, (
            "Metal reports no GPU (MTLCreateSystemDefaultDevice returned nil); a virtual "
            "machine or a remote session may hide it"
        )
    return 10, f"a Metal GPU is present ({UNVERIFIED})"

"""tensorplug-metal: a tensorplug backend for Apple GPUs, through pyobjc.

Importing this module is cheap and works on every platform: it defines the
registration the ``tensorplug.backends`` entry point names. :func:`score` imports no
pyobjc (which is slow to import and exists only on macOS): it asks Metal itself, through
``ctypes``, whether a device exists (:mod:`.probe`).

Not verified on Apple hardware: see the plugin README.
"""

from __future__ import annotations

from tensorplug.registration import Registration

from .probe import score

__all__ = ["registration", "score"]

registration = Registration(
    name="Metal",
    api_version=(1, 3),
    init="tensorplug_metal.reg:create_reg",
    score=score,
    description="Apple GPUs through pyobjc: the shared kernels as Metal Shading Language "
    "(not verified on Apple hardware)",
)

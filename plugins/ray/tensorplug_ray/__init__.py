"""tensorplug-ray: remote devices that live in Ray actors (``Ray0``, ``Ray1``, ...).

Importing this module is cheap: it holds the registration the ``tensorplug.backends``
entry point names. Ray is not imported at discovery, and the plugin scores 0 unless
``TENSORPLUG_RAY_ADDRESS`` names a cluster (or ``local``), so installing it never
starts a cluster by surprise.
"""

from __future__ import annotations

import importlib.util

from tensorplug.registration import Registration

from .settings import ADDRESS, DEVICES, LOCAL

__all__ = ["registration", "score"]


def score() -> tuple[int, str]:
    """0 with the fix when Ray is missing or no cluster is configured; else 5."""
    if importlib.util.find_spec("ray") is None:
        return 0, "ray is not installed (pip install 'ray>=2.9')"
    address = ADDRESS.get()
    if not address:
        return 0, (
            f"no cluster configured: set {ADDRESS.env} to a Ray address, or to '{LOCAL}' to "
            "start one on this machine"
        )
    wanted = ", ".join(f"{r.backend}:{r.count}" for r in DEVICES.get())
    where = "a private local cluster" if address == LOCAL else f"the cluster at {address!r}"
    return 5, f"remote devices {wanted} on {where}"


registration = Registration(
    name="Ray",
    api_version=(1, 3),
    init="tensorplug_ray.device:create_reg",
    score=score,
    description="remote devices in Ray actors, each running an ordinary tensorplug backend",
)

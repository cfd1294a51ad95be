"""A backend whose init() raises, as a GPU plugin does when the driver refuses it."""

from tensorplug.device import Reg
from tensorplug.registration import Registration


def _init() -> Reg:
    raise RuntimeError("device handshake failed (tp-broken-init)")


registration = Registration(name="BROKENINIT", api_version=(1, 0), init=_init, score=3)

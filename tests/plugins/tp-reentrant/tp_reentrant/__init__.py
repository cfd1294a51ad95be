"""A plugin that uses tensorplug's registry from inside its own loading."""

import tensorplug
from tensorplug.registration import Registration


def _init() -> tensorplug.Reg:
    from tp_good.device import make_reg

    from tensorplug import registry
    from tensorplug.device import DeviceType

    registry.load_all()  # re-entrant: must return at once, not load again or deadlock
    seen = registry.dev_count()
    best = registry.dev_by_type(DeviceType.GPU)
    return make_reg(
        "REENTRANT",
        [("REENTRANT0", DeviceType.ACCEL, None)],
        devices_seen=str(seen),
        gpu_seen=best.name if best else "",
    )


registration = Registration(name="REENTRANT", api_version=(1, 0), init=_init, score=1)

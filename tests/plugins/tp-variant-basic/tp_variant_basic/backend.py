"""The variant's heavy part: imported only if this variant wins."""

from tp_good.device import TestReg, make_reg

from tensorplug.device import DeviceType


def create_reg() -> TestReg:
    return make_reg("VARIANT", [("VARIANT0", DeviceType.GPU, "test-gpu-0")], variant="basic")

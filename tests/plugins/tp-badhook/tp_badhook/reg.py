from tp_good.device import TestReg, make_reg

from tensorplug.device import Device, DeviceType
from tensorplug.hooks import hookimpl


class BadHookReg(TestReg):
    @hookimpl
    def tensorplug_extra_buffer_type(self, device: Device) -> None:  # missing the final "s"
        return None


def create_reg() -> TestReg:
    return make_reg("BADHOOK", [("BADHOOK0", DeviceType.CPU, None)], reg_class=BadHookReg)

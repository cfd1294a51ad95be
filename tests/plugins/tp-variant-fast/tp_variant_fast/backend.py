"""The variant's heavy part; TP_VARIANT_FAST_FAIL=1 makes it fail, to test the fallback."""

import os

from tp_good.device import TestReg, make_reg

from tensorplug.device import DeviceType


def create_reg() -> TestReg:
    if os.environ.get("TP_VARIANT_FAST_FAIL"):
        raise RuntimeError("fast kernels failed their self-test (TP_VARIANT_FAST_FAIL)")
    return make_reg("VARIANT", [("VARIANT0", DeviceType.GPU, "test-gpu-0")], variant="fast")

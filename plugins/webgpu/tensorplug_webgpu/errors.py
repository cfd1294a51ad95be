"""wgpu's errors as tensorplug's: out of memory is recoverable, a lost device says so.

wgpu raises ``GPUOutOfMemoryError`` when the driver has no memory for a buffer (the
call changed nothing: the process may free buffers and go on), ``GPUValidationError``
for a call WebGPU refuses, and the same validation error, mentioning the loss, for any
call on a device the driver lost (a GPU reset or removal, a driver update): nothing on
it can be used again, so the message says to restart.
"""

from __future__ import annotations

from tensorplug_kernels.runtime import DeviceOutOfMemoryError, KernelLaunchError

__all__ = ["DeviceLostError", "translate"]


class DeviceLostError(KernelLaunchError):
    """The driver lost the device: its buffers and kernels are gone."""


def translate(err: BaseException, what: str, kernel: str | None = None) -> Exception:
    """The tensorplug exception for a wgpu error raised while doing ``what``."""
    import wgpu

    text = str(err).strip()
    if isinstance(err, wgpu.GPUOutOfMemoryError) or "out of memory" in text.lower():
        return DeviceOutOfMemoryError(
            f"{what}: the device is out of memory ({text}); nothing stored was changed: "
            "free buffers, use a smaller batch or context, or place part of the model on "
            "another device",
            kernel=kernel,
        )
    if "lost" in text.lower():
        return DeviceLostError(
            f"{what}: the WebGPU device was lost ({text}); its buffers and kernels are gone. "
            "Restart the process (a GPU reset or a driver update causes this)",
            kernel=kernel,
        )
    return KernelLaunchError(f"{what}: {text}", kernel=kernel)

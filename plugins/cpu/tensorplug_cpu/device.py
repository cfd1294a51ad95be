"""The CPU device and its registration (``ggml_backend_cpu_device`` / ``_reg``).

One device, "CPU", computing on the core's host buffer type. It can wrap memory that
someone else owns (a numpy array, an ``mmap`` of a model file) as a buffer without
copying, which is how weights are used straight from a mapped GGUF file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplug.device import Device, DeviceCaps, DeviceType, Reg
from tensorplug.hooks import hookimpl
from tensorplug.host import host_buffer_type

from . import system
from .backend import BACKEND_CALLS, CpuBackend
from .kernels import supports
from .kernels.jit import jit_status, load_jit
from .kernels.numpy_kernels import NUMPY_KERNELS
from .repack import PackedLayout
from .repack_buffer import RepackBufferType

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer, BufferType
    from tensorplug.tensor import Tensor

__all__ = ["EXTENSIONS", "CpuDevice", "CpuReg", "create_reg", "get_features", "parse_params"]


def parse_params(params: str | None) -> dict[str, Any]:
    """``init_backend`` parameters: ``"n_threads=4,jit=0"`` → keyword arguments.

    ``n_threads``: BLAS/JIT threads for this backend; ``jit``: 0 to use only the numpy
    kernels (no numba).
    """
    out: dict[str, Any] = {}
    for item in (params or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        try:
            if not sep:
                raise ValueError
            if key == "n_threads":
                out["n_threads"] = int(value)
            elif key == "jit":
                if value.lower() not in ("0", "1", "true", "false", "on", "off"):
                    raise ValueError
                out["use_jit"] = value.lower() in ("1", "true", "on")
            else:
                raise KeyError
        except (ValueError, KeyError):
            raise ValueError(
                f"CPU backend parameter {item!r} is not understood; use a comma-separated "
                "list of n_threads=<int> and jit=<0|1>, e.g. 'n_threads=4,jit=0'"
            ) from None
    return out


class CpuDevice(Device):
    """The host CPU. Besides host memory it offers ``CPU_REPACK`` (:mod:`.repack`), for
    the matrices of its integer products, through the registry's extra buffer types."""

    def __init__(self, reg: Reg | None = None) -> None:
        super().__init__(reg)
        self._repack = RepackBufferType(self, _compiled_moves)

    @property
    def name(self) -> str:
        return "CPU"

    @property
    def description(self) -> str:
        return system.cpu_name()

    @property
    def type(self) -> DeviceType:
        return DeviceType.CPU

    def memory(self) -> tuple[int, int]:
        return system.memory()

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps(
            asynchronous=False, host_buffer=False, buffer_from_host_ptr=True, events=False
        )

    def _init_backend(self, params: str | None) -> CpuBackend:
        options = parse_params(params)
        jit = load_jit() if options.pop("use_jit", True) else None
        return CpuBackend(self, kernels=NUMPY_KERNELS if jit is None else jit, **options)

    def buffer_type(self) -> BufferType:
        return host_buffer_type()

    def _supports_op(self, op: Tensor) -> bool:
        return supports(op)

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host or buft is self._repack

    def repack_buffer_type(self) -> RepackBufferType:
        """``CPU_REPACK``: matrices stored for the integer kernels (:mod:`.repack`)."""
        return self._repack

    def buffer_from_host_ptr(self, obj: Any, max_tensor_size: int = 0) -> Buffer:
        """Wrap ``obj`` (numpy array, mmap, bytearray, memoryview) as a buffer, no copy.

        The buffer keeps ``obj`` alive; read-only memory gives a buffer that refuses
        writes. ``max_tensor_size`` is accepted for ggml compatibility: host memory has
        no per-tensor limit.
        """
        return host_buffer_type().buffer_from_host_memory(obj)


class CpuReg(Reg):
    """The CPU backend registration: one device plus ggml's CPU extension functions."""

    def __init__(self) -> None:
        self._devices = (CpuDevice(self),)

    @property
    def name(self) -> str:
        return "CPU"

    def devices(self) -> Sequence[Device]:
        return self._devices

    def get_proc(self, name: str) -> Callable[..., Any] | None:
        return EXTENSIONS.get(name)

    def features(self) -> dict[str, str]:
        return get_features(self)

    @hookimpl
    def tensorplug_extra_buffer_types(self, device: Device) -> list[BufferType] | None:
        """``CPU_REPACK`` for this backend's device, when the numba kernels that read it
        are there (without them the products would unpack every matrix every time)."""
        if not isinstance(device, CpuDevice) or device.reg is not self or load_jit() is None:
            return None
        return [device.repack_buffer_type()]


def get_features(reg: Any = None) -> dict[str, str]:
    """``ggml_backend_get_features``: BLAS vendor, numpy's SIMD flags, JIT status."""
    return system.features(jit_status())


#: ``get_proc_address``'s names: the backend's calls and the features
EXTENSIONS: dict[str, Callable[..., Any]] = {
    **BACKEND_CALLS,
    "get_features": get_features,
    "ggml_backend_get_features": get_features,
}


def create_reg() -> CpuReg:
    """Entry for :class:`tensorplug.registration.Registration`'s ``init``."""
    return CpuReg()


def _compiled_moves(lay: PackedLayout, blocks: np.ndarray, out: np.ndarray) -> bool:
    """The compiled kernels' block moves into ``lay`` (False, nothing done, where there
    are no compiled kernels or they cannot: numpy moves them)."""
    jit = load_jit()
    return jit is not None and jit.repack_moves(lay, blocks, out)

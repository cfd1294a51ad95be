"""Running the shared kernels on PoCL for runtimes that cannot run here.

CI has no NVIDIA GPU and no Mac, yet the CUDA and Metal plugins' host code — which
kernel a node becomes, how its arguments struct is packed, which allocation and byte
offset each buffer parameter gets, how the grid is laid out — decides whether their
results are right. Their tests therefore run the plugins against small fakes of cupy
and of Metal whose "kernel launch" hands the very arguments the plugin produced to
:class:`PoclEmulator`, which runs the same kernel body on PoCL (the CPU OpenCL driver
from PyPI) in the portable dialect and writes the results back into the fake's memory.

What this proves: the plugin's host logic computes the right numbers with these
kernel bodies. What it does not: the CUDA or Metal compilers' code, warp or simdgroup
semantics, real memory, streams or timing. Tests built on it say so.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from tensorplug.errors import BackendUnavailableError

from .abi import TensorArg, kernel_abis
from .launch import Launch, scratch_bytes
from .source import render

__all__ = ["HostRuntimeBuffers", "PoclEmulator", "pocl_emulator"]

_POCL_PLATFORM = "Portable Computing Language"


class PoclEmulator:
    """The shared kernel library built once on PoCL with the portable primitives.

    ``wg`` must be the work-group size the emulated device's launches were encoded
    for (their ``Limits.wg``): the kernels size their local-memory tiles by it.
    """

    def __init__(self, wg: int) -> None:
        try:
            import pyopencl as cl
        except ImportError as e:
            raise BackendUnavailableError(
                "the kernel emulator needs pyopencl and PoCL: pip install pyopencl "
                "pocl-binary-distribution"
            ) from e
        devices = [
            d
            for p in cl.get_platforms()
            if p.name.strip() == _POCL_PLATFORM
            for d in p.get_devices()
        ]
        if not devices:
            raise BackendUnavailableError(
                "the kernel emulator runs on PoCL, and no PoCL device was found: "
                "pip install pocl-binary-distribution"
            )
        self._cl = cl
        self.wg = wg
        self.device = devices[0]
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context)
        options = [f"-DWG={wg}", "-DTP_PORTABLE", "-cl-fp32-correctly-rounded-divide-sqrt"]
        if self.device.single_fp_config & cl.device_fp_config.DENORM:
            options.append("-DTP_DENORMS")
        self.program = cl.Program(self.context, render("opencl").text).build(options=options)
        self._lock = threading.Lock()
        self.launches = 0  # how many kernels ran: tests check that work reached the kernels

    def launch(
        self,
        kernel: str,
        args: bytes,
        buffers: Sequence[np.ndarray],
        global_size: tuple[int, ...],
        local_size: tuple[int, ...],
    ) -> None:
        """Run ``kernel`` with its packed arguments struct over ``buffers`` (whole
        allocations as writable uint8 arrays, in parameter order) and write every
        buffer back. Sizes are OpenCL's: work-items per dimension, not groups."""
        cl = self._cl
        if any(g % ls for g, ls in zip(global_size, local_size, strict=True)):
            raise ValueError(
                f"{kernel}: global size {global_size} is not a multiple of the group size "
                f"{local_size}"
            )
        for i, b in enumerate(buffers):
            if b.dtype != np.uint8 or b.ndim != 1 or not b.flags.writeable:
                raise TypeError(f"{kernel}: buffer {i} must be a writable 1-D uint8 array")
        with self._lock:
            mf = cl.mem_flags
            # one device buffer per allocation: parameters bound to the same memory (a
            # node and its source in one compute buffer) must see each other's writes
            unique: dict[tuple[int, int], tuple[np.ndarray, Any]] = {}
            mems = []
            for b in buffers:
                key = (int(b.ctypes.data), b.size)
                if key not in unique:
                    mem = (
                        cl.Buffer(self.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=b)
                        if b.size
                        else cl.Buffer(self.context, mf.READ_WRITE, 16)
                    )
                    unique[key] = (b, mem)
                mems.append(unique[key][1])
            k = cl.Kernel(self.program, kernel)
            k.set_args(np.frombuffer(args, np.uint8), *mems)
            cl.enqueue_nd_range_kernel(self.queue, k, global_size, local_size)
            for b, m in unique.values():
                if b.size:
                    cl.enqueue_copy(self.queue, b, m)
            self.queue.finish()
            self.launches += 1

    def run(self, launch: Launch, memory: Callable[[Any], np.ndarray]) -> None:
        """Run an encoder's :class:`~tensorplug_kernels.Launch`; ``memory`` gives the
        allocation behind a tensor (for a :class:`TensorArg`) or a runtime buffer's name
        (``"err"``, ``"scratch"``: see :class:`HostRuntimeBuffers`)."""
        data, buffers = kernel_abis()[launch.kernel].pack(launch.args)
        arrays = [memory(b.tensor if isinstance(b, TensorArg) else b) for b in buffers]
        for b, a in zip(buffers, arrays, strict=True):
            if b == "scratch" and a.size < launch.scratch:
                raise ValueError(
                    f"{launch.kernel}: the scratch buffer holds {a.size} bytes, the launch "
                    f"needs {launch.scratch}; size it with scratch_bytes() before running"
                )
        self.launch(launch.kernel, bytes(data), arrays, launch.global_size, launch.local_size)


class HostRuntimeBuffers:
    """The runtime buffers of a backend emulated in host memory: the error word and a
    scratch buffer that grows to what the launches ask for (never shrinks, so bound
    addresses stay valid until it must grow)."""

    def __init__(self) -> None:
        self.err = np.zeros(8, np.uint8)
        self.scratch = np.zeros(0, np.uint8)

    def reserve(self, launches: Iterable[Launch]) -> None:
        """Grow the scratch buffer to what ``launches`` need together."""
        need = scratch_bytes(launches)
        if need > self.scratch.size:
            self.scratch = np.zeros(need, np.uint8)

    def __call__(self, name: str) -> np.ndarray:
        """The buffer called ``name`` (a kernel's extra buffer parameter)."""
        if name == "err":
            return self.err
        if name == "scratch":
            return self.scratch
        raise KeyError(f"no runtime buffer called {name!r}")


@functools.cache
def pocl_emulator(wg: int) -> PoclEmulator:
    """One emulator per work-group size for the process (building takes seconds)."""
    return PoclEmulator(wg)

"""A backend is one non-blocking CUDA stream, over the runtime base.

Everything it does is queued on the stream and returns at once: transfers, copies
between GPUs, kernels (one launch per encoded launch of each node, or a cuBLAS GEMM),
event records and waits. Only ``synchronize`` (and the blocking ``graph_compute``)
waits. Host memory handed to an asynchronous transfer must stay alive and unchanged
until then; the backend holds a reference to it meanwhile. Binding, plans, the scratch
buffer and the error word are the base's (:mod:`tensorplug_kernels.runtime.backend`).

A bound launch becomes what cupy's ``RawKernel`` takes: the grid in blocks, the block in
threads, then the packed arguments struct **by value** and one pointer per buffer.
cupy's launcher (``cupy/cuda/function.pyx``, ``_pointer``) hands a ``numpy.ndarray`` of
exactly one element to ``cuLaunchKernel`` as a pointer to its data, which the driver
copies as the parameter's bytes (cupy PR for issue #4828, in every release since
v10.0.0); a one-element array of the kernel's struct dtype — the exact C layout, parsed
from the kernel source by :mod:`tensorplug_kernels.abi` — is therefore the struct.

Mul_mat over many tokens goes to cuBLAS (:mod:`.matmul`, a library op of the base).

Plans are captured into CUDA graphs and replayed, and ``graph_compute`` replays the
graphs it has seen before the same way, through the base's
:mod:`tensorplug_kernels.runtime.replay` (the warm-up, the cache by graph signature, the
fallbacks). What is CUDA's is the capture itself — the bound launches issued between
``Stream.begin_capture`` and ``end_capture`` make a CUDA graph, replayed with one
``Graph.launch`` on the stream — and when it is refused: ``TENSORPLUG_CUDA_GRAPHS=0``,
and GPUs older than Volta (as in ggml). cupy refuses cuBLAS during a capture
(``NotImplementedError``), which the base's rule covers: plans with library nodes are
launched eagerly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from tensorplug.backend import Event
from tensorplug_kernels.runtime import BoundLaunch, CapturedPlan, GPUBackend, ReplayingBackend

from .buffer import D2D, D2H, H2D, CUDABuffer, host_address
from .errors import KernelLaunchError
from .matmul import CublasMatmul
from .settings import GRAPHS

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .device import CUDADevice

__all__ = ["CUDABackend", "CUDAGraphPlan"]

log = logging.getLogger(__name__)

#: CUDA's limits on grid extents (x; y and z).
_MAX_GRID_X, _MAX_GRID_YZ = 2**31 - 1, 65535


def _ptr(buf: Buffer) -> int:
    return cast(CUDABuffer, buf).ptr


class CUDAGraphPlan(CapturedPlan):
    """A graph plan captured into a CUDA graph once warm (``captured``, the
    ``cupy.cuda.Graph``; None until captured)."""

    backend: CUDABackend
    captured_as = "a CUDA graph"
    # cupy raises NotImplementedError for calls it cannot make during a capture
    capture_errors: ClassVar[tuple[type[BaseException], ...]] = (
        KernelLaunchError, NotImplementedError,
    )  # fmt: skip

    def _capture(self) -> Any:
        stream = self.backend.stream
        stream.begin_capture()
        try:
            self.backend.run(self.steps)
        except BaseException:
            try:
                stream.end_capture()  # leave capture mode; the partial graph is dropped
            except Exception as e:  # an invalidated capture reports itself here too
                log.debug("ending a failed capture: %s", e)
            raise
        return stream.end_capture()

    def _replay(self, handle: Any) -> None:
        handle.launch(self.backend.stream)


class CUDABackend(ReplayingBackend):
    device: CUDADevice
    plan_class = CUDAGraphPlan

    def __init__(self, device: CUDADevice) -> None:
        self.cp = cp = device.cp
        with device.current():
            self.stream = cp.cuda.Stream(non_blocking=True)
        self.matmul = CublasMatmul(self)
        self.library_ops = (self.matmul,)
        super().__init__(device)

    def capture_refused(self) -> str:
        """Why CUDA graphs are not used, "" when they are (the setting is read at each
        call: a user may change it between computes)."""
        if not GRAPHS.get():
            return "TENSORPLUG_CUDA_GRAPHS=0"
        if self.device.info.major < 7:
            return "CUDA graphs are used from Volta (compute capability 7.0) on"
        return ""

    # -- the runtime base's hooks ------------------------------------------------------------

    def _prepare(self, bound: BoundLaunch, replayed: bool) -> Any:
        if bound.grid[0] > _MAX_GRID_X or max(bound.grid[1:]) > _MAX_GRID_YZ:
            raise KernelLaunchError(
                f"{self.name}: {bound.kernel}: grid {bound.grid} exceeds CUDA's limits "
                "(x < 2^31, y and z <= 65535)",
                kernel=bound.kernel,
            )
        struct = np.frombuffer(bound.data, dtype=self.abi(bound.kernel).dtype)
        return self.device.program.kernel(bound.kernel), (struct, *bound.buffers)

    def _issue(self, bound: BoundLaunch) -> None:
        function, args = bound.call
        function(bound.grid, bound.block, args, stream=self.stream)

    def _synchronize(self) -> None:
        self.stream.synchronize()

    def _write_async(self, buf: Buffer, offset: int, data: memoryview) -> None:
        runtime = self.cp.cuda.runtime
        runtime.memcpyAsync(_ptr(buf) + offset, host_address(data), len(data), H2D, self.stream.ptr)
        self.keep(data)

    def _read_async(self, buf: Buffer, offset: int, out: memoryview) -> None:
        runtime = self.cp.cuda.runtime
        runtime.memcpyAsync(host_address(out), _ptr(buf) + offset, len(out), D2H, self.stream.ptr)
        self.keep(out)

    def _copy_async(
        self, src_backend: GPUBackend, src: Buffer, src_offset: int, dst: Buffer,
        dst_offset: int, size: int,
    ) -> None:  # fmt: skip
        """GPU to GPU on ``src_backend``'s stream, after its queued work; this stream
        waits for the copy (ggml's order). Peer access is enabled where the GPUs have it."""
        runtime = self.cp.cuda.runtime
        other = cast(CUDABackend, src_backend)
        s_dev, s_stream = other.device, other.stream
        dst_ptr, src_ptr = _ptr(dst) + dst_offset, _ptr(src) + src_offset
        if s_dev is not self.device:
            s_dev.enable_peer_access(self.device)
        with s_dev.current():
            if s_dev is self.device:
                runtime.memcpyAsync(dst_ptr, src_ptr, size, D2D, s_stream.ptr)
            else:
                runtime.memcpyPeerAsync(
                    dst_ptr, self.device.index, src_ptr, s_dev.index, size, s_stream.ptr
                )
            if other is not self:
                done = self.cp.cuda.Event(disable_timing=True)
                done.record(s_stream)
        if other is not self:
            self.stream.wait_event(done)

    def _record(self, event: Event) -> None:
        event.context.record(self.stream)

    def _waits_on_device(self, event: Event) -> bool:
        """An event of any GPU of this process is waited for on the GPU."""
        return getattr(event.device, "cp", None) is self.cp and event.context is not None

    def _wait(self, event: Event) -> None:
        self.stream.wait_event(event.context)

"""A backend is one in-order OpenCL command queue (a stream), over the runtime base.

Everything it does is enqueued and returns at once: transfers, copies between OpenCL
backends, graph computation, event markers. Only ``synchronize`` and the blocking
``graph_compute`` wait. Host memory handed to an asynchronous transfer must stay alive
until then. Plans, scratch memory and the error word are the base's
(:mod:`tensorplug_kernels.runtime.backend`).

A ``cl.Kernel`` carries its arguments and is slow to create on PoCL (longer than many a
launch), so an eager launch sets its arguments on the backend's own kernel object of
that name just before it is enqueued (the enqueue captures them), while a graph plan's
launch gets a kernel object of its own with its arguments set once.

pyopencl returns a transfer's event as a "nanny" that owns a reference to the host
memory and, when it is garbage-collected, waits for the transfer to finish. Dropping
it at once would make every asynchronous transfer synchronous (and, behind an
unsatisfied event, deadlock), so the backend keeps those events until the transfer
is known to be complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from tensorplug.backend import Event
from tensorplug_kernels.runtime import BoundLaunch, GPUBackend

from .buffer import OpenCLBuffer

if TYPE_CHECKING:
    from tensorplug.buffer import Buffer

    from .device import OpenCLDevice

__all__ = ["OpenCLBackend"]


def _mem(buf: Buffer) -> Any:
    return cast(OpenCLBuffer, buf).mem


class OpenCLBackend(GPUBackend):
    device: OpenCLDevice

    def __init__(self, device: OpenCLDevice) -> None:
        import pyopencl as cl

        self.queue = cl.CommandQueue(device.context, device.cl_device)
        self._kernels: dict[str, Any] = {}  # eager launches' kernel objects, by name
        self._in_flight: list[Any] = []  # transfer events, kept so they do not block
        super().__init__(device)

    def _keep_event(self, event: Any) -> None:
        """Hold a transfer's event until it completes (see the module docstring)."""
        import pyopencl as cl

        if len(self._in_flight) >= 64:  # a long run without synchronize: drop finished ones
            done = cl.command_execution_status.COMPLETE
            self._in_flight = [e for e in self._in_flight if e.command_execution_status != done]
        self._in_flight.append(event)

    # -- the runtime base's hooks ----------------------------------------------------------

    def _prepare(self, bound: BoundLaunch, replayed: bool) -> Any:
        if not replayed:
            return None
        kernel = self.device.program.kernel(bound.kernel)
        kernel.set_args(bound.data, *bound.buffers)
        return kernel

    def _issue(self, bound: BoundLaunch) -> None:
        import pyopencl as cl

        kernel = bound.call
        if kernel is None:
            kernel = self._kernels.get(bound.kernel)
            if kernel is None:
                kernel = self._kernels[bound.kernel] = self.device.program.kernel(bound.kernel)
            kernel.set_args(bound.data, *bound.buffers)
        cl.enqueue_nd_range_kernel(self.queue, kernel, bound.global_size, bound.local_size)

    def _synchronize(self) -> None:
        self.queue.finish()
        self._in_flight.clear()

    def _write_async(self, buf: Buffer, offset: int, data: memoryview) -> None:
        import pyopencl as cl

        self._keep_event(
            cl.enqueue_copy(self.queue, _mem(buf), data, dst_offset=offset, is_blocking=False)
        )

    def _read_async(self, buf: Buffer, offset: int, out: memoryview) -> None:
        import pyopencl as cl

        self._keep_event(
            cl.enqueue_copy(self.queue, out, _mem(buf), src_offset=offset, is_blocking=False)
        )

    def _copy_async(
        self, src_backend: GPUBackend, src: Buffer, src_offset: int, dst: Buffer,
        dst_offset: int, size: int,
    ) -> None:  # fmt: skip
        import pyopencl as cl

        other = cast(OpenCLBackend, src_backend)
        wait = [] if other is self else [cl.enqueue_marker(other.queue)]
        cl.enqueue_copy(
            self.queue, _mem(dst), _mem(src), byte_count=size, src_offset=src_offset,
            dst_offset=dst_offset, wait_for=wait,
        )  # fmt: skip

    def _record(self, event: Event) -> None:
        import pyopencl as cl

        event.context = cl.enqueue_marker(self.queue)

    def _wait(self, event: Event) -> None:
        import pyopencl as cl

        if event.context is not None:
            cl.enqueue_barrier(self.queue, wait_for=[event.context])

    def _free(self) -> None:
        self._kernels.clear()

"""The GPU runtime base: what every GPU backend does the same way, written once.

tinygrad's runtimes are an allocator, a compiler and a program launcher over one shared
device layer; tensorplug's are the same over this package. Base classes are template
methods: a public method adds the checks and the error context and calls an underscore
hook that the runtime fills in.

* :class:`GPUDevice` — name, buffer type, the kernel program built once, ops and buffer
  types it takes, driver calls with context (``device.driver(what)``). A runtime fills
  in ``_alloc``, ``kernel_arg``, ``buffer_class``, ``_build_program``, ``backend_class``,
  ``driver_errors``/``translate``, ``memory``, events, and ``current`` where the API
  has a current device per thread.
* :class:`GPUBufferType` / :class:`DeviceBuffer` — buffers over the device's allocator;
  a runtime fills in ``_write``, ``_read``, ``_fill``, ``_copy_in`` (``_release``).
* :class:`KernelProgram` — the compiled program and its kernels by name, each got once;
  a runtime fills in ``_compile(text, name)`` and ``_kernel(name)``.
* :class:`GPUBackend` / :class:`GPUGraphPlan` — node -> launches (the shared encoder,
  or a runtime's own), binding, plans, scratch growth, the error word and its
  read-back, plan ownership, transfers and events; a runtime fills in ``_prepare``,
  ``_issue``, ``_synchronize``, ``_write_async``, ``_read_async``, ``_copy_async``,
  ``_record``, ``_wait``.
* :class:`CapturedPlan` / :class:`ReplayingBackend` (``replay.py``) — plans captured
  once warm and replayed (CUDA graphs; WebGPU's recorded command buffers), and
  ``graph_compute``'s cache of them by graph signature (:class:`GraphCache`); a runtime
  fills in ``_capture``, ``_replay``, ``_release`` and ``capture_refused``.
* :class:`~.mapped.HostMemoryBuffer`, :class:`~.mapped.MappedBuffer` (``mapped.py``) —
  buffers that are host memory (Metal's shared storage), and host memory someone else
  owns (an mmap'ed model) seen through overlapping device views.
* :class:`LibraryOp` (``library.py``) — nodes a vendor library computes (cuBLAS), with
  the fallback to the kernels and a scratch buffer for converted operands; a runtime
  fills in ``_takes`` and ``_run``.
* :class:`GPUReg` and :func:`process_wide` — the registration and its one instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplug.lazy import lazy_exports

if TYPE_CHECKING:
    from .backend import BoundLaunch, GPUBackend, GPUGraphPlan, Step
    from .device import OFFLOAD_MIN_BATCH, GPUDevice, GPUReg, pci_address, process_wide
    from .errors import BuildFailed, DeviceOutOfMemoryError, KernelBuildError, KernelLaunchError
    from .library import LibraryOp
    from .memory import DeviceBuffer, DeviceMemory, GPUBufferType, overlapping
    from .program import KernelProgram
    from .replay import CapturedPlan, GraphCache, ReplayingBackend

__all__ = [
    "OFFLOAD_MIN_BATCH",
    "BoundLaunch",
    "BuildFailed",
    "CapturedPlan",
    "DeviceBuffer",
    "DeviceMemory",
    "DeviceOutOfMemoryError",
    "GPUBackend",
    "GPUBufferType",
    "GPUDevice",
    "GPUGraphPlan",
    "GPUReg",
    "GraphCache",
    "KernelBuildError",
    "KernelLaunchError",
    "KernelProgram",
    "LibraryOp",
    "ReplayingBackend",
    "Step",
    "overlapping",
    "pci_address",
    "process_wide",
]

#: Where each name above lives, imported on first use: a plugin's discovery describes its
#: devices (:mod:`.device`, :mod:`.probe`) without importing the backends, programs and
#: replay that only computing needs.
_HOMES = {
    "BoundLaunch": "backend", "GPUBackend": "backend", "GPUGraphPlan": "backend",
    "Step": "backend",
    "OFFLOAD_MIN_BATCH": "device", "GPUDevice": "device", "GPUReg": "device",
    "pci_address": "device", "process_wide": "device",
    "BuildFailed": "errors", "DeviceOutOfMemoryError": "errors", "KernelBuildError": "errors",
    "KernelLaunchError": "errors",
    "LibraryOp": "library",
    "DeviceBuffer": "memory", "DeviceMemory": "memory", "GPUBufferType": "memory",
    "overlapping": "memory",
    "KernelProgram": "program",
    "CapturedPlan": "replay", "GraphCache": "replay", "ReplayingBackend": "replay",
}  # fmt: skip

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

"""What an encoder may use of a device, in a module of its own: a GPU runtime describes
its devices with it when the plugins are discovered, which must not import the
encoders and the kernels' calling convention (:mod:`.launch` re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """What encoders need to know about a device.

    ``wg``: the work-group size the program was built with (``-DWG``, a power of two;
    a multiple of 32 for CUDA and Metal); ``local_mem``: bytes of local (shared,
    threadgroup) memory per work-group; ``gpu``: use the kernels written for GPUs
    (local-memory tiles, a work-group per matrix-vector output) rather than the ones for
    CPUs (long per-work-item dot products that rely on caches); ``scratch``: the runtime
    supplies the ``scratch`` buffer launches may ask for (:attr:`Launch.scratch`), so
    encoders may use kernels that take it (the 8-bit integer matrix-vector products). A
    runtime that does not sets it False and never sees such a launch.
    """

    wg: int
    local_mem: int
    gpu: bool = False
    scratch: bool = False

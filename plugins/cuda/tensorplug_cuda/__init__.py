"""tensorplug-cuda: a tensorplug backend for NVIDIA GPUs, through cupy.

Importing this module is cheap: it defines the registration the ``tensorplug.backends``
entry point names. :func:`score` imports no cupy (which takes a second or more): it
looks for the cupy package with ``find_spec`` and asks the NVIDIA driver itself,
through ``ctypes``, whether it can start and how many GPUs it sees (:mod:`.probe`).
"""

from __future__ import annotations

from tensorplug.registration import Registration

from .probe import score

__all__ = ["registration", "score"]

registration = Registration(
    name="CUDA",
    api_version=(1, 3),
    init="tensorplug_cuda.reg:create_reg",
    score=score,
    description="NVIDIA GPUs through cupy: NVRTC-compiled shared kernels, cuBLAS, CUDA graphs "
    "(verified on an NVIDIA H200 and H100 with CUDA 13)",
)

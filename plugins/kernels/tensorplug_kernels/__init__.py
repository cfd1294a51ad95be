"""One GPU kernel library for every tensorplug GPU backend (OpenCL, CUDA, Metal).

A library, not a backend: it registers nothing. It holds

* the kernels, one text per op in a small portable dialect (``src/*.tpk``), and one
  prelude per dialect mapping the dialect's words (``dialects/``) — see
  :mod:`.source`;
* the kernels' calling convention, parsed from those declarations — :mod:`.abi`;
* the node → launches encoder: which kernel, what grid, which arguments — :mod:`.encode`;
* the gates that check every kernel in every dialect without a GPU —
  ``python -m tensorplug_kernels check``;
* the GPU runtime base the GPU plugins share — :mod:`.runtime` (buffers, the program
  cache, plans, scratch, the error word, transfers and events around a few hooks).

A GPU plugin supplies only its runtime's hooks: allocate, copy, compile, launch,
synchronize, events.
"""

from __future__ import annotations

from .abi import KernelABI, TensorArg, kernel_abis
from .encode import encode, supports
from .launch import Launch, Limits, scratch_bytes, scratch_capacity
from .source import DIALECTS, Dialect, Rendered, Source, render

__all__ = [
    "DIALECTS",
    "Dialect",
    "KernelABI",
    "Launch",
    "Limits",
    "Rendered",
    "Source",
    "TensorArg",
    "encode",
    "kernel_abis",
    "render",
    "scratch_bytes",
    "scratch_capacity",
    "supports",
]

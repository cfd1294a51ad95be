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

from typing import TYPE_CHECKING

from tensorplug.lazy import lazy_exports

if TYPE_CHECKING:
    from .abi import KernelABI, TensorArg, kernel_abis
    from .encode import supports
    from .launch import Launch, scratch_bytes, scratch_capacity
    from .limits import Limits
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
    "kernel_abis",
    "render",
    "scratch_bytes",
    "scratch_capacity",
    "supports",
]

#: Where each name above lives. They are imported on first use (PEP 562): a GPU plugin's
#: registration imports this package for :mod:`.limits` and :mod:`.runtime.probe`, and
#: importing the encoders, the calling convention and the kernel texts would be a
#: noticeable share of every tensorplug process's launch where the plugin is installed,
#: whether or not a GPU computes anything. ``encode`` is the module (:mod:`.encode`); its
#: function is ``tensorplug_kernels.encode.encode``.
_HOMES = {
    "KernelABI": "abi", "TensorArg": "abi", "kernel_abis": "abi",
    "supports": "encode",
    "Launch": "launch", "scratch_bytes": "launch", "scratch_capacity": "launch",
    "Limits": "limits",
    "DIALECTS": "source", "Dialect": "source", "Rendered": "source", "Source": "source",
    "render": "source",
}  # fmt: skip


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

"""The meta device: one device made of several, tensors split across them.

See :func:`meta_device`; layouts are :class:`SplitState` values (ggml's split states).
"""

from __future__ import annotations

from .backend import MetaBackend
from .device import MetaBuffer, MetaBufferType, MetaDevice, SplitStateFn, meta_device
from .rules import MetaUnsupported
from .split import SplitAxis, SplitState, even_sizes

__all__ = [
    "MetaBackend",
    "MetaBuffer",
    "MetaBufferType",
    "MetaDevice",
    "MetaUnsupported",
    "SplitAxis",
    "SplitState",
    "SplitStateFn",
    "even_sizes",
    "meta_device",
]

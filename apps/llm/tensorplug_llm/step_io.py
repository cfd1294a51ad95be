"""Writing a step graph's inputs and reading its outputs through kept numpy views.

``set_array`` and ``get_array`` check and convert everything they are given, and reach
host memory through the buffer's byte interface, with the caches cold after a step of
the model; a generated token writes five inputs and reads its logits, and for a small
model those calls add up to a visible share of the token's time. A step graph's
inputs and outputs live in the same place from one step to the next, so for those in
host memory this keeps the typed numpy view of each (what ``set_array`` writes a
strided host tensor through) and copies into and out of it directly.

A view is kept while nothing has been placed anywhere since it was made
(:func:`~tensorplug.tensor.placement_epoch`: a scheduler allocating a graph moves its
tensors) and its buffer is alive; anything else, and any array whose shape or dtype
is not the tensor's, goes through ``set_array``/``get_array``, which check and convert
as always (and say what is wrong).
"""

from __future__ import annotations

import numpy as np

from tensorplug.buffer import Buffer
from tensorplug.host import tensor_array
from tensorplug.tensor import Tensor, placement_epoch
from tensorplug.transfer import get_array, set_array

__all__ = ["StepIO"]


class StepIO:
    """``write``/``read`` of graph inputs and outputs, with host views kept."""

    def __init__(self) -> None:
        self._epoch = -1
        # id(tensor) -> (tensor, its buffer, its view; None where there is no host view)
        self._views: dict[int, tuple[Tensor, Buffer, np.ndarray | None]] = {}

    def _view(self, tensor: Tensor) -> np.ndarray | None:
        """The tensor's host view while it is valid, else None (the checked path)."""
        epoch = placement_epoch()
        if epoch != self._epoch:  # something was placed: every view is made again
            self._views.clear()
            self._epoch = epoch
        kept = self._views.get(id(tensor))
        if kept is None:
            buf = tensor.require_allocated()
            view = tensor_array(tensor) if buf.is_host else None
            if view is not None and not view.flags.writeable:
                view = None
            kept = self._views[id(tensor)] = (tensor, buf, view)
        _, buf, view = kept
        return None if buf.is_freed else view

    def write(self, tensor: Tensor, values: np.ndarray) -> None:
        """``set_array(tensor, values)``."""
        view = self._view(tensor)
        if view is None or values.shape != view.shape or values.dtype != view.dtype:
            set_array(tensor, values)
        else:
            view[...] = values

    def read(self, tensor: Tensor) -> np.ndarray:
        """``get_array(tensor)``: a new C-contiguous array (the memory is the next
        step's)."""
        view = None if tensor.type.is_quantized else self._view(tensor)  # (raw rows)
        return get_array(tensor) if view is None else np.array(view, order="C")

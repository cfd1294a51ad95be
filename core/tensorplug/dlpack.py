"""DLPack: tensors shared with numpy, PyTorch, JAX, CuPy... without copying.

``Tensor.__dlpack__`` / ``__dlpack_device__`` let any DLPack consumer
(``np.from_dlpack(t)``, ``torch.from_dlpack(t)``) view a tensor that lives in host
memory; :func:`tensorplug.interop.from_dlpack` makes a tensor that views another library's host
array (the consumer side lives there, so that this module, which ``Tensor`` calls, never
builds a ``Tensor``).
Both are zero-copy, and refuse (with what to do instead) where sharing would be
wrong:

* memory a device owns that the host cannot address (OpenCL buffers): copy with
  :func:`tensorplug.get_array`;
* tensors in reusable compute memory (the graph allocator's buffers, which the next
  graph overwrites): copy, or mark the tensor as a graph output;
* quantized types, which no other library understands: only their raw blocks, as
  ``uint8``, when asked for (:func:`raw_blocks`);
* BF16, which numpy cannot hold: its bits as ``uint16`` via :func:`raw_blocks`.

The capsules themselves are numpy's: a tensor is exported as a numpy view of its
memory, which also keeps that memory alive for as long as the consumer holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .buffer import BufferUsage
from .errors import TensorplugError
from .types import Type

if TYPE_CHECKING:
    from .tensor import Tensor

__all__ = ["DLPackError", "KDL_CPU", "device", "export", "raw_blocks"]

#: DLPack's device type for host memory (``kDLCPU``).
KDL_CPU = 1


class DLPackError(TensorplugError, BufferError):
    """A tensor cannot be shared through DLPack as asked (the spec's ``BufferError``)."""


def _host_view(tensor: Tensor, raw: bool) -> np.ndarray:
    """The numpy view a DLPack export of ``tensor`` hands out, after every check."""
    from .host import tensor_array

    what = f"tensor {tensor.describe()}"
    buf = tensor.base.buffer
    if buf is None:
        raise DLPackError(f"{what} has no memory yet; allocate it before sharing it")
    buf.check_live()
    if not buf.is_host:
        raise DLPackError(
            f"{what} lives in {buf.name!r} memory, which the host cannot address: copy it "
            "instead (tensorplug.get_array(t) gives a numpy array)"
        )
    if buf.usage is BufferUsage.COMPUTE:
        raise DLPackError(
            f"{what} lives in reusable compute memory that the next graph overwrites: copy it "
            "(tensorplug.get_array(t)), or mark it as a graph output (t.set_output())"
        )
    if not raw and (tensor.type.is_quantized or tensor.type is Type.BF16):
        raise DLPackError(
            f"{what}: no other library understands {tensor.type.name}; share its raw "
            f"{'blocks' if tensor.type.is_quantized else 'bits'} with "
            "tensorplug.dlpack.raw_blocks(t), or convert it (ops.cpy to F32) first"
        )
    return tensor_array(tensor)


def export(
    tensor: Tensor,
    *,
    stream: Any = None,
    max_version: tuple[int, int] | None = None,
    dl_device: tuple[int, int] | None = None,
    copy: bool | None = None,
    raw: bool = False,
) -> Any:
    """``Tensor.__dlpack__``: a DLPack capsule viewing ``tensor`` (see the module doc)."""
    if stream is not None and stream != -1:
        raise DLPackError(f"host memory has no streams; got stream={stream!r} (pass None)")
    if dl_device is not None and tuple(dl_device) != (KDL_CPU, 0):
        raise DLPackError(
            f"tensor {tensor.describe()} is in host memory (DLPack device ({KDL_CPU}, 0)); "
            f"it cannot be exported to device {tuple(dl_device)}"
        )
    view = _host_view(tensor, raw)
    if copy:
        view = view.copy()
    kwargs: dict[str, Any] = {"copy": False if copy is None else copy}
    if max_version is not None:
        kwargs["max_version"] = max_version
    return view.__dlpack__(**kwargs)


def device(tensor: Tensor) -> tuple[int, int]:
    """``Tensor.__dlpack_device__``: ``(kDLCPU, 0)`` for a tensor in host memory."""
    buf = tensor.base.buffer
    if buf is not None and not buf.is_host:
        raise DLPackError(
            f"tensor {tensor.describe()} lives in {buf.name!r} memory, which DLPack cannot "
            "describe from here; copy it (tensorplug.get_array(t))"
        )
    return (KDL_CPU, 0)


class _RawBlocks:
    """What :func:`raw_blocks` returns: a DLPack producer of a tensor's raw bytes."""

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        return export(self.tensor, raw=True, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return device(self.tensor)


def raw_blocks(tensor: Tensor) -> Any:
    """A DLPack producer of ``tensor``'s storage as it is: a quantized tensor as
    ``uint8`` blocks of shape ``(*shape[:-1], n_blocks, block_bytes)``, BF16 as its
    ``uint16`` bits. ``np.from_dlpack(raw_blocks(t))`` views them without copying."""
    return _RawBlocks(tensor)

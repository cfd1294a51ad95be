"""tensorplug: ggml-backend for Python.

Describe tensors and compute graphs, then run them on whichever backends are
installed as plugins. Importing this package loads no plugin: discovery happens at
:func:`load_all` or at the first registry call.
"""

from __future__ import annotations

from . import ops
from .backend import Backend, Event, GraphPlan, Status
from .buffer import UNBOUNDED, Buffer, BufferType, BufferUsage, MultiBuffer
from .device import Device, DeviceCaps, DeviceProps, DeviceType, Reg
from .errors import (
    AllocationError,
    ApiVersionError,
    BackendNotFoundError,
    BufferFreedError,
    ComputeAbortedError,
    LayoutMismatchError,
    NotAllocatedError,
    OutOfBoundsError,
    PluginError,
    ShapeError,
    TensorplugError,
    TypeMismatchError,
    UnsupportedError,
)
from .graph import Graph
from .host import HOST_ALIGNMENT, HostBuffer, HostBufferType, host_buffer_type, tensor_array
from .opcodes import GluOp, Op, RopeMode, SortOrder, UnaryOp
from .tensor import MAX_DIMS, Tensor, TensorFlag, new_tensor
from .transfer import (
    get_array,
    same_layout,
    set_array,
    tensor_alloc,
    tensor_copy,
    tensor_copy_async,
    tensor_get,
    tensor_get_async,
    tensor_memset,
    tensor_set,
    tensor_set_async,
    view_init,
)
from .types import Type, row_size
from .version import API_VERSION, __version__

__all__ = [
    "API_VERSION",
    "HOST_ALIGNMENT",
    "MAX_DIMS",
    "UNBOUNDED",
    "AllocationError",
    "ApiVersionError",
    "Backend",
    "BackendNotFoundError",
    "Buffer",
    "BufferFreedError",
    "BufferType",
    "BufferUsage",
    "ComputeAbortedError",
    "Device",
    "DeviceCaps",
    "DeviceProps",
    "DeviceType",
    "Event",
    "GluOp",
    "Graph",
    "GraphPlan",
    "HostBuffer",
    "HostBufferType",
    "LayoutMismatchError",
    "MultiBuffer",
    "NotAllocatedError",
    "Op",
    "OutOfBoundsError",
    "PluginError",
    "Reg",
    "RopeMode",
    "ShapeError",
    "SortOrder",
    "Status",
    "Tensor",
    "TensorFlag",
    "TensorplugError",
    "Type",
    "TypeMismatchError",
    "UnaryOp",
    "UnsupportedError",
    "__version__",
    "get_array",
    "host_buffer_type",
    "new_tensor",
    "ops",
    "row_size",
    "same_layout",
    "set_array",
    "tensor_alloc",
    "tensor_array",
    "tensor_copy",
    "tensor_copy_async",
    "tensor_get",
    "tensor_get_async",
    "tensor_memset",
    "tensor_set",
    "tensor_set_async",
    "view_init",
]

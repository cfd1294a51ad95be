"""tensorplug: ggml-backend for Python.

Describe tensors and compute graphs, then run them on whichever backends are
installed as plugins. Importing this package loads no plugin: discovery happens at
:func:`load_all` or at the first registry call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import ops, quants
from .alloc import GraphAllocator, alloc_ctx_tensors, alloc_tensors
from .backend import Backend, Event, GraphPlan, Status
from .buffer import UNBOUNDED, Buffer, BufferType, BufferUsage, MultiBuffer
from .device import Device, DeviceCaps, DeviceProps, DeviceType, Reg
from .dlpack import DLPackError
from .errors import (
    AllocationError,
    ApiVersionError,
    BackendNotFoundError,
    BackendUnavailableError,
    BufferFreedError,
    ComputeAbortedError,
    GraphError,
    InvalidArgumentError,
    LayoutMismatchError,
    MissingDependencyError,
    NotAllocatedError,
    OpParamError,
    OutOfBoundsError,
    PluginError,
    RunError,
    ShapeError,
    TensorplugError,
    TypeMismatchError,
    UnsupportedError,
)
from .graph import Graph
from .graph_copy import GraphCopy, graph_copy
from .host import HOST_ALIGNMENT, HostBuffer, HostBufferType, host_buffer_type, tensor_array
from .interop import from_dlpack
from .meta import SplitAxis, SplitState, meta_device
from .opcodes import GluOp, Op, RopeMode, SortOrder, UnaryOp
from .registration import Registration
from .registry import (
    dev_by_name,
    dev_by_type,
    dev_count,
    dev_get,
    device_aliases,
    devices,
    discover,
    duplicate_device_ids,
    extra_buffer_types,
    get_proc,
    init_best,
    init_by_name,
    init_by_type,
    load,
    load_all,
    load_all_from_path,
    loading_error,
    plugin_records,
    reg_by_name,
    reg_count,
    reg_get,
    register,
    regs,
    unload,
)
from .sched import EvalCallback, Scheduler
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

if TYPE_CHECKING:
    from .testing import compare_graph_backend


def __getattr__(name: str) -> Any:
    # the conformance kit imports gguf; load it only when someone asks for it
    if name == "compare_graph_backend":
        from .testing import compare_graph_backend

        return compare_graph_backend
    raise AttributeError(f"module 'tensorplug' has no attribute {name!r}")


__all__ = [
    "API_VERSION",
    "HOST_ALIGNMENT",
    "MAX_DIMS",
    "UNBOUNDED",
    "AllocationError",
    "ApiVersionError",
    "Backend",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "DLPackError",
    "Buffer",
    "BufferFreedError",
    "BufferType",
    "BufferUsage",
    "ComputeAbortedError",
    "Device",
    "DeviceCaps",
    "DeviceProps",
    "DeviceType",
    "EvalCallback",
    "Event",
    "GluOp",
    "Graph",
    "GraphAllocator",
    "GraphCopy",
    "GraphPlan",
    "HostBuffer",
    "HostBufferType",
    "LayoutMismatchError",
    "MissingDependencyError",
    "MultiBuffer",
    "NotAllocatedError",
    "Op",
    "OutOfBoundsError",
    "PluginError",
    "Reg",
    "Registration",
    "RopeMode",
    "Scheduler",
    "SplitAxis",
    "SplitState",
    "InvalidArgumentError",
    "OpParamError",
    "RunError",
    "GraphError",
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
    "alloc_ctx_tensors",
    "alloc_tensors",
    "compare_graph_backend",
    "dev_by_name",
    "dev_by_type",
    "dev_count",
    "dev_get",
    "device_aliases",
    "devices",
    "discover",
    "duplicate_device_ids",
    "extra_buffer_types",
    "from_dlpack",
    "get_array",
    "get_proc",
    "graph_copy",
    "host_buffer_type",
    "init_best",
    "init_by_name",
    "init_by_type",
    "load",
    "load_all",
    "meta_device",
    "load_all_from_path",
    "loading_error",
    "new_tensor",
    "ops",
    "plugin_records",
    "quants",
    "reg_by_name",
    "reg_count",
    "reg_get",
    "register",
    "regs",
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
    "unload",
    "view_init",
]

"""One exception hierarchy, rooted in :class:`TensorplugError`.

Each class also derives from the built-in exception a Python user would expect to
catch (``ValueError`` for a bad shape, ``IndexError`` for out-of-bounds access,
``MemoryError`` for a failed allocation), so generic handlers keep working.
"""

from __future__ import annotations

__all__ = [
    "AllocationError",
    "ApiVersionError",
    "ApiVersionFormatError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "BufferFreedError",
    "ComputeAbortedError",
    "LayoutMismatchError",
    "MissingDependencyError",
    "NotAllocatedError",
    "InvalidArgumentError",
    "OutOfBoundsError",
    "PluginError",
    "PluginTimeoutError",
    "GraphError",
    "OpParamError",
    "RunError",
    "ShapeError",
    "TensorplugError",
    "TypeMismatchError",
    "UnsupportedError",
]


class TensorplugError(Exception):
    """Base of every error tensorplug raises on purpose."""


class ShapeError(TensorplugError, ValueError):
    """An operand's shape, strides or rank does not fit the operation."""


class TypeMismatchError(TensorplugError, TypeError):
    """An operand's element type is not accepted by the operation."""


class LayoutMismatchError(TensorplugError, ValueError):
    """Two tensors that must have the same layout (for a copy) do not."""


class OutOfBoundsError(TensorplugError, IndexError):
    """A read or write would go past the end of a tensor or buffer."""


class NotAllocatedError(TensorplugError, RuntimeError):
    """A tensor's data was accessed before it was given memory in a buffer."""


class BufferFreedError(TensorplugError, RuntimeError):
    """A buffer was used after :meth:`Buffer.free`."""


class AllocationError(TensorplugError, MemoryError):
    """Memory could not be allocated; nothing already stored is affected."""


class UnsupportedError(TensorplugError, NotImplementedError):
    """A backend, device or buffer does not implement an optional capability."""


class ComputeAbortedError(TensorplugError, RuntimeError):
    """A graph computation was cancelled by an abort or eval callback."""


class MissingDependencyError(TensorplugError, ImportError):
    """An optional package that this use of tensorplug needs is not installed; the
    message names the extra that brings it (``pip install 'tensorplug[gguf]'``)."""


class PluginError(TensorplugError, RuntimeError):
    """A backend plugin could not be discovered, loaded or initialised."""


class ApiVersionError(PluginError):
    """A plugin was built against an incompatible tensorplug API version."""


class ApiVersionFormatError(ApiVersionError, TypeError):
    """A plugin declares an ``api_version`` that is not a ``(major, minor)`` pair of
    small non-negative integers."""


class PluginTimeoutError(PluginError, TimeoutError):
    """A plugin's import, score or initialisation ran past its time budget and was
    left behind (``TENSORPLUG_PLUGIN_TIMEOUT``)."""

    #: where the plugin's thread was when its budget ran out, as traceback.format_stack
    stack: str = ""


class BackendNotFoundError(TensorplugError, LookupError):
    """No registered backend or device matches the requested name or type."""


class BackendUnavailableError(BackendNotFoundError):
    """The backend's plugin is installed but cannot run here (it scored 0: no driver,
    no device) or was left out by TENSORPLUG_BACKENDS / TENSORPLUG_DISABLE; the message
    gives the plugin's own reason. Test suites skip on it rather than fail."""


class GraphError(TensorplugError, ValueError):
    """A graph cannot be built as given (a cycle, a source that is not a tensor)."""


class OpParamError(TensorplugError, ValueError):
    """An op's parameter is out of its range (a negative epsilon, a fractional axis)."""


class InvalidArgumentError(TensorplugError, ValueError):
    """An API call was given a value it cannot take (an empty backend list, a byte
    value of 300, a negative thread count); the message names the argument and the
    range it must lie in."""


class RunError(TensorplugError, ValueError):
    """A model run was asked for something impossible: a context of -5 tokens, a token
    id outside the vocabulary, a prompt longer than the context."""

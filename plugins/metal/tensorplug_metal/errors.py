"""Metal failures as tensorplug exceptions, each naming what was being done.

Metal reports failures three ways: a ``new*`` call returns nil (no memory for a
buffer), an ``NSError`` comes back beside the result (the compiler's log, a pipeline
the GPU cannot run), or a committed command buffer ends with status *error* and an
``NSError`` (a fault while the GPU ran it). Callers here catch one hierarchy instead:
the runtime base's, and :class:`CommandBufferError` for the third.
"""

from __future__ import annotations

from typing import Any

from tensorplug.errors import TensorplugError
from tensorplug_kernels.runtime import KernelBuildError, KernelLaunchError

__all__ = ["CommandBufferError", "KernelBuildError", "KernelLaunchError", "describe_nserror"]


class CommandBufferError(TensorplugError, RuntimeError):
    """The GPU failed a committed command buffer; ``labels`` names what was in it."""

    def __init__(self, message: str, *, labels: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.labels = labels


def describe_nserror(error: Any) -> str:
    """An ``NSError``'s text (its description, then the reason when there is one)."""
    if error is None:
        return "no error object was returned"
    text = str(error.localizedDescription())
    reason = error.localizedFailureReason() if hasattr(error, "localizedFailureReason") else None
    return f"{text} ({reason})" if reason else text

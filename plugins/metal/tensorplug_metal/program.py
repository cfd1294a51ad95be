"""The kernel library: the shared kernels rendered as Metal Shading Language, compiled
from source once per device, and a pipeline per kernel built on first use (the runtime
base's :class:`~tensorplug_kernels.runtime.KernelProgram`).

All kernels live in one ``MTLLibrary`` (``newLibraryWithSource:options:error:``, the
public API ggml uses too), so a device pays for one compiler run per process; Metal
keeps its own cache of compiled functions on disk. The text is
:func:`tensorplug_kernels.render` ("msl"): the Metal prelude, then the portable bodies
behind ``#line`` directives, so the compiler's messages name the kernel file and line.

Fast math is off (``mathMode`` safe, or ``fastMathEnabled`` NO before macOS 15): the
kernels reproduce references that round as IEEE single precision does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorplug_kernels import Source
from tensorplug_kernels.runtime import BuildFailed
from tensorplug_kernels.runtime import KernelProgram as ProgramBase

from .errors import KernelLaunchError, describe_nserror

if TYPE_CHECKING:
    from .device import MetalDevice

__all__ = ["KernelProgram", "Pipeline", "compile_options"]

#: MTLMathModeSafe: no reassociation, no reciprocal tricks, denormals kept.
MATH_MODE_SAFE = 0


def compile_options(metal: Any, wg: int) -> Any:
    """``MTLCompileOptions``: fast math off and the row kernels' threadgroup size."""
    opts = metal.MTLCompileOptions.alloc().init()
    if hasattr(opts, "setMathMode_"):  # macOS 15 and later
        opts.setMathMode_(MATH_MODE_SAFE)
    else:
        opts.setFastMathEnabled_(False)
    opts.setPreprocessorMacros_({"WG": wg})
    return opts


@dataclass(frozen=True)
class Pipeline:
    """A kernel's compute pipeline and the most threads a threadgroup of it may have."""

    name: str
    state: Any
    max_threads: int


class KernelProgram(ProgramBase):
    """The compiled library of one device and its pipelines by kernel name."""

    dialect = "msl"
    runtime = compiler = "Metal"

    def __init__(self, device: MetalDevice, sources: tuple[Source, ...] | None = None) -> None:
        self.device = device
        self.options = compile_options(device.metal, device.limits.wg)
        super().__init__(device.name, sources)

    def _compile(self, text: str, name: str | None) -> Any:
        library, error = self.device.mtl.newLibraryWithSource_options_error_(
            text, self.options, None
        )
        if library is None:
            raise BuildFailed(describe_nserror(error))
        return library

    def _kernel(self, name: str) -> Pipeline:
        function = self.module.newFunctionWithName_(name)
        if function is None:
            raise KernelLaunchError(
                f"{self.label}: the compiled library lacks the function {name!r}", kernel=name
            )
        state, error = self.device.mtl.newComputePipelineStateWithFunction_error_(function, None)
        if state is None:
            raise KernelLaunchError(
                f"{self.label}: Metal could not make a pipeline for {name}: "
                f"{describe_nserror(error)}",
                kernel=name,
            )
        return Pipeline(name, state, int(state.maxTotalThreadsPerThreadgroup()))

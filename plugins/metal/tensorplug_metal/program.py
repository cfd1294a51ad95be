"""The kernel library: the shared kernels rendered as Metal Shading Language, compiled
from source once per device, and a pipeline per kernel built on first use.

All kernels live in one ``MTLLibrary`` (``newLibraryWithSource:options:error:``, the
public API ggml uses too), so a device pays for one compiler run per process; Metal
keeps its own cache of compiled functions on disk. The text is
:func:`tensorplug_kernels.render` ("msl"): the Metal prelude, then the portable bodies
behind ``#line`` directives, so the compiler's messages name the kernel file and line.

Fast math is off (``mathMode`` safe, or ``fastMathEnabled`` NO before macOS 15): the
kernels reproduce references that round as IEEE single precision does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorplug_kernels import Source, kernel_abis, render
from tensorplug_kernels.diagnostics import diagnostics
from tensorplug_kernels.source import body_sources

from .errors import KernelBuildError, KernelLaunchError, describe_nserror

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


class KernelProgram:
    """The compiled library of one device and its pipelines by kernel name."""

    def __init__(self, device: MetalDevice, sources: tuple[Source, ...] | None = None) -> None:
        self.device = device
        self.sources = body_sources() if sources is None else sources
        self.text = render("msl", self.sources).text
        self.options = compile_options(device.metal, device.limits.wg)
        library, error = device.mtl.newLibraryWithSource_options_error_(
            self.text, self.options, None
        )
        if library is None:
            raise self._build_error(describe_nserror(error))
        self.library = library
        self._pipelines: dict[str, Pipeline] = {}
        self._lock = threading.Lock()

    def _build_error(self, log: str) -> KernelBuildError:
        diags = [d for d in diagnostics(log, self.sources) if d.kind == "error"]
        kernel = next((d.kernel for d in diags if d.kernel), None)
        where = f" in {kernel} ({diags[0].where})" if kernel and diags else ""
        first = "\n".join(f"{d.where}: {d.text}" for d in diags[:12]) or log[-2000:]
        return KernelBuildError(
            f"{self.device.name}: Metal could not compile the tensorplug kernels{where}:\n"
            f"{first}\n(the full log is in the exception's .log attribute; "
            "TENSORPLUG_DISABLE=Metal skips this backend)",
            kernel=kernel,
            log=log,
        )

    def pipeline(self, name: str) -> Pipeline:
        """The compute pipeline of kernel ``name``, built once."""
        found = self._pipelines.get(name)
        if found is not None:
            return found
        if name not in kernel_abis():
            raise KernelLaunchError(
                f"{self.device.name}: the library has no kernel {name!r}; the installed "
                "tensorplug-metal and tensorplug-kernels do not match, reinstall them",
                kernel=name,
            )
        with self._lock:
            function = self.library.newFunctionWithName_(name)
            if function is None:
                raise KernelLaunchError(
                    f"{self.device.name}: the compiled library lacks the function {name!r}",
                    kernel=name,
                )
            state, error = self.device.mtl.newComputePipelineStateWithFunction_error_(
                function, None
            )
            if state is None:
                raise KernelLaunchError(
                    f"{self.device.name}: Metal could not make a pipeline for {name}: "
                    f"{describe_nserror(error)}",
                    kernel=name,
                )
            found = self._pipelines[name] = Pipeline(
                name, state, int(state.maxTotalThreadsPerThreadgroup())
            )
        return found

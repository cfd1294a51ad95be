"""The kernel program: the shared kernel library rendered as OpenCL C, built once per
context (the runtime base's :class:`~tensorplug_kernels.runtime.KernelProgram`).

All kernels live in one program so a device pays for one compiler run. On disk,
:meth:`pyopencl.Program.build` keeps compiled binaries keyed by the source, the build
options and the device's vendor, name, version and driver version — or, for drivers
that cache source builds themselves (PoCL, NVIDIA), leaves it to them.

A ``cl.Kernel`` carries its arguments, so every :meth:`KernelProgram.kernel` call makes
a new one for its caller to own: a backend keeps one per kernel for eager launches, a
graph plan one per launch (its arguments set once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorplug_kernels import Source
from tensorplug_kernels.runtime import BuildFailed, KernelBuildError
from tensorplug_kernels.runtime import KernelProgram as ProgramBase

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = ["KernelProgram"]

#: what to do when the driver's LLVM cannot name this CPU (PoCL passes the name it gets,
#: "generic" for a CPU newer than its LLVM, to its own front end, which refuses it)
UNKNOWN_CPU_HINT = (
    "this OpenCL driver's compiler does not know this CPU: the PoCL 3.0 bundled in "
    "pyopencl's wheel (LLVM 14) predates it. Install a newer PoCL, e.g. your "
    "distribution's (Debian/Ubuntu: apt-get install pocl-opencl-icd), which the plugin "
    "then uses for the host CPU instead, or use another OpenCL device (tensorplug devices)"
)


class KernelProgram(ProgramBase):
    """The built program of one context, and a factory of kernel objects from it."""

    dialect = "opencl"
    runtime = compiler = "OpenCL"
    cached = False
    located = True

    def __init__(
        self,
        context: cl.Context,
        device: cl.Device,
        options: list[str],
        sources: tuple[Source, ...] | None = None,
    ) -> None:
        self.context, self.cl_device, self.options = context, device, options
        super().__init__(f"OpenCL ({device.name.strip()!r})", sources)

    def _compile(self, text: str, name: str | None) -> Any:
        import pyopencl as cl

        try:
            return cl.Program(self.context, text).build(
                options=self.options, devices=[self.cl_device]
            )
        except cl.Error as e:
            raise BuildFailed(str(e)) from e

    def _build_error(self, log: str, name: str | None = None) -> KernelBuildError:
        error = super()._build_error(log, name)
        if "unknown target CPU" not in log:
            return error
        return KernelBuildError(f"{error}\n{UNKNOWN_CPU_HINT}", kernel=error.kernel, log=log)

    def _kernel(self, name: str) -> Any:
        import pyopencl as cl

        return cl.Kernel(self.module, name)

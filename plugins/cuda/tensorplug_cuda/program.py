"""The kernel program: the shared kernel library rendered as CUDA C++, compiled by
NVRTC once per GPU (the runtime base's :class:`~tensorplug_kernels.runtime.KernelProgram`).

All kernels live in one module, so a GPU pays for one compiler run. cupy's
``RawModule`` compiles it for the current GPU's architecture (it adds ``-arch=sm_XX``
itself, from the device) and caches the binary on disk under ``~/.cupy/kernel_cache``
(``CUPY_CACHE_DIR``), keyed by the source, the options, the architecture and the NVRTC
version: the first process pays seconds, later ones load the cached cubin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorplug_kernels import Source
from tensorplug_kernels.runtime import BuildFailed
from tensorplug_kernels.runtime import KernelProgram as ProgramBase

if TYPE_CHECKING:
    from .device import CUDADevice

__all__ = ["KernelProgram", "compile_options"]

#: The C++ standard the prelude's lane structs are written for (cupy >= 14 also
#: defaults to it; 13 does not).
CXX_STANDARD = "--std=c++17"


def compile_options(wg: int) -> tuple[str, ...]:
    """NVRTC options: the work-group size the row kernels are written for and the
    language standard. The architecture comes from the device (cupy adds it)."""
    return (CXX_STANDARD, f"-DWG={wg}")


class KernelProgram(ProgramBase):
    """The compiled module of one GPU and its kernels (``RawKernel``\\ s) by name."""

    dialect = "cuda"
    runtime, compiler = "CUDA", "NVRTC"

    def __init__(self, device: CUDADevice, sources: tuple[Source, ...] | None = None) -> None:
        self.device = device
        self.options = compile_options(device.limits.wg)
        super().__init__(f"{device.name} ({device.info.arch})", sources)

    def _compile(self, text: str, name: str | None) -> Any:
        cp = self.device.cp
        module = cp.RawModule(code=text, options=self.options, backend="nvrtc")
        with self.device.current():
            try:
                module.compile()
            except cp.cuda.compiler.CompileException as e:
                raise BuildFailed(str(e)) from e
        return module

    def _kernel(self, name: str) -> Any:
        with self.device.driver(f"loading kernel {name}", kernel=name):
            return self.module.get_function(name)

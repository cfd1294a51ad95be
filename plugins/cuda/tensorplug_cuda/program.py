"""The kernel program: the shared kernel library rendered as CUDA C++, compiled by
NVRTC once per GPU.

All kernels live in one module, so a GPU pays for one compiler run. cupy's
``RawModule`` compiles it on first use for the current GPU's architecture (it adds
``-arch=sm_XX`` itself, from the device) and caches the binary on disk under
``~/.cupy/kernel_cache`` (``CUPY_CACHE_DIR``), keyed by the source, the options, the
architecture and the NVRTC version: the first process pays seconds, later ones load
the cached cubin. Here it is kept for the life of the process.

The text is :func:`tensorplug_kernels.render` ("cuda"): the CUDA prelude, then the
portable bodies behind ``#line`` directives, so NVRTC's messages name the kernel file
and line, which :func:`tensorplug_kernels.diagnostics.diagnostics` maps to a kernel.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from tensorplug_kernels import Source, kernel_abis, render
from tensorplug_kernels.diagnostics import diagnostics
from tensorplug_kernels.source import body_sources

from .errors import KernelBuildError, KernelLaunchError, translate

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


class KernelProgram:
    """The compiled module of one GPU and its kernels by name."""

    def __init__(self, device: CUDADevice, sources: tuple[Source, ...] | None = None) -> None:
        cp = device.cp
        self.device = device
        self.sources = body_sources() if sources is None else sources
        self.options = compile_options(device.limits.wg)
        self.text = render("cuda", self.sources).text
        self.module = cp.RawModule(code=self.text, options=self.options, backend="nvrtc")
        self._kernels: dict[str, Any] = {}
        self._lock = threading.Lock()
        with device.context():
            try:
                self.module.compile()
            except cp.cuda.compiler.CompileException as e:
                raise self._build_error(str(e)) from e

    def _build_error(self, log: str) -> KernelBuildError:
        diags = [d for d in diagnostics(log, self.sources) if d.kind == "error"]
        kernel = next((d.kernel for d in diags if d.kernel), None)
        where = f" in {kernel} ({diags[0].where})" if kernel and diags else ""
        first = "\n".join(f"{d.where}: {d.text}" for d in diags[:12]) or log[-2000:]
        return KernelBuildError(
            f"{self.device.name}: NVRTC could not compile the tensorplug kernels for "
            f"{self.device.info.arch}{where}:\n{first}\n(the full log is in the exception's "
            ".log attribute; TENSORPLUG_DISABLE=CUDA skips this backend)",
            kernel=kernel,
            log=log,
        )

    def kernel(self, name: str) -> Any:
        """The kernel ``name`` (a cupy ``RawKernel``), looked up once."""
        found = self._kernels.get(name)
        if found is not None:
            return found
        cp = self.device.cp
        if name not in kernel_abis():
            raise KernelLaunchError(
                f"{self.device.name}: the program has no kernel {name!r}; the installed "
                "tensorplug-cuda and tensorplug-kernels do not match, reinstall them",
                kernel=name,
            )
        with self._lock, self.device.context():
            try:
                found = self._kernels[name] = self.module.get_function(name)
            except (cp.cuda.driver.CUDADriverError, cp.cuda.runtime.CUDARuntimeError) as e:
                what = f"{self.device.name}: loading kernel {name}"
                raise translate(cp, e, what, kernel=name) from e
        return found

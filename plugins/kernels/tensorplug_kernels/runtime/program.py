"""A device's kernel program: compiled source and its kernels by name, each got once.

:meth:`KernelProgram.compile` is the template around a runtime's compile hook: the hook
takes a source text (and, for a runtime that compiles kernel by kernel, the kernel's
name) and either returns the compiled module or raises :class:`BuildFailed` with the
compiler's log, which becomes a :class:`KernelBuildError` naming the kernel the first
error points into (:mod:`tensorplug_kernels.diagnostics` reads every compiler's format).

A runtime of the shared dialect (``dialect`` set: "opencl", "cuda", "msl") gets the
whole library rendered and compiled into ``module`` when the program is made, so a
device pays for one compiler run. A runtime whose kernels are written otherwise (WGSL)
leaves ``dialect`` None and compiles in ``_kernel``, through :meth:`compile`, the text
of the one kernel asked for.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import Any, ClassVar

from ..abi import kernel_abis
from ..diagnostics import diagnostics
from ..source import Dialect, Source, body_sources, render
from .errors import BuildFailed, KernelBuildError, KernelLaunchError

__all__ = ["KernelProgram"]


class KernelProgram(ABC):
    """Compiled kernels of one device. ``label`` names the device in messages."""

    #: the shared dialect the library is rendered in, None for kernels of the runtime's own
    dialect: ClassVar[Dialect | None] = None
    #: the runtime (``TENSORPLUG_DISABLE=<runtime>`` skips it) and its compiler, for messages
    runtime: ClassVar[str]
    compiler: ClassVar[str]
    #: False where a kernel object carries its arguments (OpenCL's ``cl.Kernel``): every
    #: ``kernel()`` then makes a new one, for a backend or a graph plan to own
    cached: ClassVar[bool] = True
    #: build errors name the kernel with its file and line (OpenCL's have always)
    located: ClassVar[bool] = False

    def __init__(self, label: str, sources: tuple[Source, ...] | None = None) -> None:
        self.label = label
        self.sources = body_sources() if sources is None else sources
        self._kernels: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.text = render(self.dialect, self.sources).text if self.dialect else ""
        self.module: Any = self.compile(self.text) if self.dialect else None

    # -- hooks ---------------------------------------------------------------------------

    @abstractmethod
    def _compile(self, text: str, name: str | None) -> Any:
        """Compile ``text`` (the whole library when ``name`` is None, else the source of
        kernel ``name``); raise :class:`BuildFailed` with the log when it is refused."""

    @abstractmethod
    def _kernel(self, name: str) -> Any:
        """The runtime's kernel object for ``name`` (called once per name when cached)."""

    @property
    def kernel_names(self) -> Collection[str]:
        """The kernels this program has (default: every kernel of the shared library)."""
        return kernel_abis()

    # -- written once ----------------------------------------------------------------------

    def compile(self, text: str, name: str | None = None) -> Any:
        """``_compile`` with a refusal turned into a :class:`KernelBuildError`."""
        try:
            return self._compile(text, name)
        except BuildFailed as e:
            raise self._build_error(e.log, name) from (e.__cause__ or e)

    def kernel(self, name: str) -> Any:
        """The kernel ``name``: got once and kept, or new at each call (``cached``)."""
        found = self._kernels.get(name)
        if found is not None:
            return found
        if name not in self.kernel_names:
            raise KernelLaunchError(
                f"{self.label}: the program has no kernel {name!r}; the installed "
                f"tensorplug-{self.runtime.lower()} and tensorplug-kernels do not match, "
                "reinstall them",
                kernel=name,
            )
        with self._lock:
            found = self._kernels.get(name) or self._kernel(name)
            if self.cached:
                self._kernels[name] = found
        return found

    def _build_error(self, log: str, name: str | None = None) -> KernelBuildError:
        """The error for a refused text; ``name``, the kernel that was being compiled
        (runtimes that compile kernel by kernel), names it when the log cannot."""
        errors = [d for d in diagnostics(log, self.sources) if d.kind == "error"]
        first = next((d for d in errors if d.kernel), None)
        kernel = first.kernel if first else name
        where = f" in {kernel} ({first.where})" if first else (f" in {kernel}" if kernel else "")
        shown = "\n".join(f"{d.where}: {d.text}" for d in errors[:12]) or log[-2000:]
        return KernelBuildError(
            f"{self.label}: {self.compiler} could not compile the tensorplug kernels{where}:"
            f"\n{shown}\n(the full log is in the exception's .log attribute; "
            f"TENSORPLUG_DISABLE={self.runtime} skips this backend)",
            kernel=f"{kernel} ({first.where})" if first and self.located else kernel,
            log=log,
        )

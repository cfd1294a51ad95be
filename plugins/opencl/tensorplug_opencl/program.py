"""The kernel program: the shared kernel library rendered as OpenCL C, built once per
context.

All kernels live in one program so a device pays for one compiler run. The text comes
from :func:`tensorplug_kernels.render` (the OpenCL prelude, then the portable bodies),
each fragment behind a ``#line`` directive so compiler messages point at the real file
and line.

Caching: the built program is kept by the device for the life of the process. On
disk, :meth:`pyopencl.Program.build` keeps compiled binaries keyed by the source,
the build options and the device's vendor, name, version and driver version — or,
for drivers that cache source builds themselves (PoCL, NVIDIA), leaves it to them.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from tensorplug_kernels import Source, render
from tensorplug_kernels.source import body_sources

from .errors import KernelBuildError, KernelLaunchError

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = ["KernelProgram"]

_LOCATION = re.compile(r"([\w./<>-]+\.(?:tpk|h)(?:\[\w+\])?):(\d+)")
_KERNEL_DEF = re.compile(r"^\s*TP_KERNEL\s+(?:TP_REQD_GROUP\([^)]*\)\s*)?(\w+)\s*\(", re.MULTILINE)


def _failing_kernel(log: str, sources: tuple[Source, ...]) -> str | None:
    """The kernel (or file:line) the first compiler error points into."""
    m = next(
        (m for line in log.splitlines() if "error" in line and (m := _LOCATION.search(line))),
        None,
    )
    if m is None:
        return None
    where, line = m.group(1).strip(), int(m.group(2))
    for src in sources:
        if src.name != where:
            continue
        enclosing = None
        for k in _KERNEL_DEF.finditer(src.text):
            if src.text.count("\n", 0, k.start()) + 1 <= line:
                enclosing = k.group(1)
        # in a template instance the kernel is named by a macro parameter
        enclosing = dict(src.macros).get(enclosing or "", enclosing)
        return f"{enclosing} ({where}:{line})" if enclosing else f"{where}:{line}"
    return f"{where}:{line}"


class KernelProgram:
    """The built program of one context, and a factory of kernel objects from it."""

    def __init__(
        self,
        context: cl.Context,
        device: cl.Device,
        options: list[str],
        sources: tuple[Source, ...] | None = None,
    ) -> None:
        import pyopencl as cl

        self.sources = body_sources() if sources is None else sources
        self.options = options
        text = render("opencl", self.sources).text
        try:
            self._program = cl.Program(context, text).build(options=options, devices=[device])
        except cl.Error as e:
            log = str(e)
            kernel = _failing_kernel(log, self.sources)
            where = f" in {kernel}" if kernel else ""
            raise KernelBuildError(
                f"OpenCL: building the tensorplug kernels for {device.name.strip()!r} failed"
                f"{where}; the compiler said:\n{_first_errors(log)}\n(the full log is in "
                "the exception's .log attribute; a driver that cannot compile these kernels "
                "can be skipped with TENSORPLUG_DISABLE=OpenCL)",
                kernel=kernel,
                log=log,
            ) from e
        self._names = frozenset(self._program.get_info(cl.program_info.KERNEL_NAMES).split(";"))
        self._lock = threading.Lock()

    @property
    def kernel_names(self) -> frozenset[str]:
        return self._names

    def kernel(self, name: str) -> Any:
        """A new, independent kernel object (its arguments are its own to set)."""
        import pyopencl as cl

        if name not in self._names:
            raise KernelLaunchError(
                f"OpenCL: the program has no kernel {name!r} (it has {len(self._names)} "
                "kernels); the installed tensorplug-opencl and tensorplug-kernels do not "
                "match, reinstall them",
                kernel=name,
            )
        with self._lock:
            try:
                return cl.Kernel(self._program, name)
            except cl.Error as e:
                raise KernelLaunchError(
                    f"OpenCL: could not create kernel {name!r}: {e}", kernel=name
                ) from e


def _first_errors(log: str, limit: int = 12) -> str:
    lines = [ln for ln in log.splitlines() if "error" in ln or "warning" in ln]
    return "\n".join(lines[:limit]) if lines else log[-2000:]

"""The kernel program: OpenCL C sources shipped in the package, built once per context.

All kernels live in one program so a device pays for one compiler run. The sources
are concatenated in a fixed order, each preceded by a ``#line`` directive so that
compiler messages point at the real file and line. The mul_mat kernels are templates
instantiated by :func:`package_sources`: ``mm_tile.cl`` (register tiles, for CPUs)
once per weight type and tile height, ``mm_local.cl`` (local-memory tiles and a
matrix-vector kernel, for GPUs) once per weight type.

Caching: the built program is kept by the device for the life of the process. On
disk, :meth:`pyopencl.Program.build` keeps compiled binaries keyed by the source,
the build options and the device's vendor, name, version and driver version — or,
for drivers that cache source builds themselves (PoCL, NVIDIA), leaves it to them.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from tensorplug.types import Type

from .errors import KernelBuildError, KernelLaunchError

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = [
    "KERNEL_FILES",
    "MM_TILES",
    "MM_TILE_TYPES",
    "KernelProgram",
    "Source",
    "mm_kernel_name",
    "mm_local_kernel_name",
    "mv_kernel_name",
    "package_sources",
]

#: Kernel sources in build order; ``common.cl`` must come first.
KERNEL_FILES = (
    "common.cl",
    "quant.cl",
    "elementwise.cl",
    "rows.cl",
    "matmul.cl",
    "attention.cl",
)

#: Weight types with a register-tiled mul_mat kernel.
MM_TILE_TYPES = (
    Type.F32,
    Type.F16,
    Type.BF16,
    Type.Q8_0,
    Type.Q4_0,
    Type.Q4_1,
    Type.Q5_0,
    Type.Q5_1,
)

#: Tile shapes of the tiled mul_mat: rows of b (tokens) -> rows of a (outputs) per
#: work-item. The 1-row variant serves matrix-vector products (one token).
MM_TILES = {4: 2, 1: 4}


@dataclass(frozen=True)
class Source:
    """A fragment of the program: a name for compiler messages, its text and, for a
    template instance, the macro parameters (which name its kernels)."""

    name: str
    text: str
    macros: tuple[tuple[str, str], ...] = ()

    def with_line_directive(self) -> str:
        return f'#line 1 "{self.name}"\n{self.text}\n'


def mm_kernel_name(weight: Type, tm: int) -> str:
    """The register-tiled kernel for ``weight`` with ``tm`` rows of b per work-item."""
    return f"k_mm_{weight.name.lower()}_{tm}"


def mm_local_kernel_name(weight: Type) -> str:
    """The local-memory tiled kernel (GPUs) for ``weight``."""
    return f"k_mm_local_{weight.name.lower()}"


def mv_kernel_name(weight: Type) -> str:
    """The matrix-vector kernel (GPUs: one work-group per output value) for ``weight``."""
    return f"k_mv_{weight.name.lower()}"


def _read(name: str) -> str:
    kernels = resources.files(__package__).joinpath("kernels")
    return kernels.joinpath(name).read_text(encoding="utf-8")


def package_sources() -> list[Source]:
    """Every kernel source of the package, templates instantiated, in build order."""
    sources = [Source(name, _read(name)) for name in KERNEL_FILES]
    template = _read("mm_tile.cl")
    local_template = _read("mm_local.cl")
    for weight in MM_TILE_TYPES:
        macros = {
            "MM_NAME_LOCAL": mm_local_kernel_name(weight),
            "MM_NAME_VEC": mv_kernel_name(weight),
            "MM_T": weight.name.lower(),
        }
        sources += _instance(f"mm_local.cl[{weight.name.lower()}]", local_template, macros)
        for tm, tn in MM_TILES.items():
            name = mm_kernel_name(weight, tm)
            macros = {
                "MM_NAME": name,
                "MM_T": weight.name.lower(),
                "MM_TM": str(tm),
                "MM_TN": str(tn),
            }
            sources += _instance(f"mm_tile.cl[{name}]", template, macros)
    return sources


def _instance(name: str, template: str, macros: dict[str, str]) -> list[Source]:
    """A template's text between the #defines of its parameters and their #undefs."""
    head = "".join(f"#define {k} {v}\n" for k, v in macros.items())
    tail = "".join(f"#undef {k}\n" for k in macros)
    return [
        Source(f"<{name} parameters>", head),
        Source(name, template, tuple(macros.items())),
        Source(f"<{name} end>", tail),
    ]


_LOCATION = re.compile(r"([\w.<>-]+\.cl(?:\[\w+\])?):(\d+)")
_KERNEL_DEF = re.compile(
    r"^\s*kernel\s+(?:__attribute__\(\(.*?\)\)\s*)?void\s+(\w+)\s*\(", re.MULTILINE
)


def _failing_kernel(log: str, sources: list[Source]) -> str | None:
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
        sources: list[Source] | None = None,
    ) -> None:
        import pyopencl as cl

        self.sources = package_sources() if sources is None else sources
        self.options = options
        text = "".join(s.with_line_directive() for s in self.sources)
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
                "kernels); the installed tensorplug-opencl is inconsistent, reinstall it",
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

"""Kernel sources: the portable bodies in ``src/``, the preludes in ``dialects/``, and
how they become one program text per dialect.

A rendered program is ``prelude(dialect)`` followed by the bodies, each fragment behind
a ``#line`` directive so compiler messages point at the real file and line. The bodies
are the same text for every dialect — the kernel check proves it — so a kernel that
passes on PoCL is, apart from the prelude, the kernel CUDA and Metal compile.

The mul_mat kernels are templates instantiated here: ``mm_tile.tpk`` (register tiles,
for CPUs) once per weight type and tile height, ``mm_local.tpk`` (local-memory tiles and
a matrix-vector kernel, for GPUs) once per weight type, ``mmvq.tpk`` (8-bit integer
matrix-vector products on Q8_1 activations, for GPUs) once per quantized weight type.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from tensorplug.types import Type

__all__ = [
    "BODY_FILES",
    "DIALECTS",
    "MM_TILES",
    "MM_TILE_TYPES",
    "MMVQ_TYPES",
    "Dialect",
    "Rendered",
    "Source",
    "body_sources",
    "mm_kernel_name",
    "mm_local_kernel_name",
    "mmvq_kernel_name",
    "mv_kernel_name",
    "prelude",
    "render",
]

Dialect = Literal["opencl", "cuda", "msl"]

#: Every dialect, with the prelude file that defines it.
DIALECTS: dict[Dialect, str] = {"opencl": "opencl.h", "cuda": "cuda.h", "msl": "metal.h"}

#: Kernel sources in program order; ``common.tpk`` must come first.
BODY_FILES = (
    "common.tpk",
    "quant.tpk",
    "elementwise.tpk",
    "rows.tpk",
    "matmul.tpk",
    "q8_1.tpk",
    "attention.tpk",
)

#: Block types the kernels decode (every read path goes through load_elem).
QUANT = frozenset(
    {Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0}
    | {Type.Q2_K, Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K}
    | {Type.IQ4_NL, Type.IQ4_XS}
)
#: Block types the kernels also encode (cpy and set_rows into them): ggml's GPU
#: backends do not quantize into K-quants or IQ4_XS either; such nodes run on the CPU.
QUANTIZE = frozenset({Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0})

#: Weight types with tiled mul_mat kernels.
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

#: Weight types with 8-bit integer matrix-vector kernels (mmvq.tpk, on Q8_1 activations).
MMVQ_TYPES = (
    Type.Q8_0,
    Type.Q4_0,
    Type.Q4_1,
    Type.Q5_0,
    Type.Q5_1,
    Type.Q2_K,
    Type.Q3_K,
    Type.Q4_K,
    Type.Q5_K,
    Type.Q6_K,
)

#: Tile shapes of the register-tiled mul_mat: rows of b (tokens) -> rows of a (outputs)
#: per work-item. The 1-row variant serves matrix-vector products (one token).
MM_TILES = {4: 2, 1: 4}


@dataclass(frozen=True)
class Source:
    """A fragment of a program: a name for compiler messages, its text and, for a
    template instance, the macro parameters (which name its kernels)."""

    name: str
    text: str
    macros: tuple[tuple[str, str], ...] = ()

    def with_line_directive(self) -> str:
        return f'#line 1 "{self.name}"\n{self.text}\n'


@dataclass(frozen=True)
class Rendered:
    """One dialect's program: its prelude, the bodies (identical in every dialect) and
    the whole text handed to the compiler."""

    dialect: Dialect
    prelude: str
    body: str

    @property
    def text(self) -> str:
        return self.prelude + self.body


def mm_kernel_name(weight: Type, tm: int) -> str:
    """The register-tiled kernel for ``weight`` with ``tm`` rows of b per work-item."""
    return f"k_mm_{weight.name.lower()}_{tm}"


def mm_local_kernel_name(weight: Type) -> str:
    """The local-memory tiled kernel (GPUs) for ``weight``."""
    return f"k_mm_local_{weight.name.lower()}"


def mv_kernel_name(weight: Type) -> str:
    """The matrix-vector kernel (GPUs: one work-group per output value) for ``weight``."""
    return f"k_mv_{weight.name.lower()}"


def mmvq_kernel_name(weight: Type) -> str:
    """The 8-bit integer matrix-vector kernel (GPUs, a few tokens) for ``weight``."""
    return f"k_mvq_{weight.name.lower()}"


def _read(folder: str, name: str) -> str:
    return resources.files(__package__).joinpath(folder).joinpath(name).read_text(encoding="utf-8")


_INCLUDE = re.compile(r'^#include "([\w.]+)"\s*$', re.MULTILINE)


@functools.cache
def prelude(dialect: Dialect) -> str:
    """The dialect's prelude with its local includes inlined, then the portable
    fallbacks for every primitive the dialect does not define natively."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown kernel dialect {dialect!r}; expected one of {sorted(DIALECTS)}")

    def inline(name: str) -> str:
        text = _read("dialects", name)
        return _INCLUDE.sub(lambda m: inline(m.group(1)).rstrip("\n"), text)

    head = Source(f"dialects/{DIALECTS[dialect]}", inline(DIALECTS[dialect]))
    fallbacks = Source("dialects/portable.h", _read("dialects", "portable.h"))
    return head.with_line_directive() + fallbacks.with_line_directive()


@functools.cache
def body_sources() -> tuple[Source, ...]:
    """Every kernel body, templates instantiated, in program order."""
    sources = [Source(f"src/{name}", _read("src", name)) for name in BODY_FILES]
    template = _read("src", "mm_tile.tpk")
    local_template = _read("src", "mm_local.tpk")
    for weight in MM_TILE_TYPES:
        suffix = weight.name.lower()
        macros = {
            "MM_NAME_LOCAL": mm_local_kernel_name(weight),
            "MM_NAME_VEC": mv_kernel_name(weight),
            "MM_T": suffix,
        }
        sources += _instance(f"src/mm_local.tpk[{suffix}]", local_template, macros)
        for tm, tn in MM_TILES.items():
            name = mm_kernel_name(weight, tm)
            macros = {"MM_NAME": name, "MM_T": suffix, "MM_TM": str(tm), "MM_TN": str(tn)}
            sources += _instance(f"src/mm_tile.tpk[{name}]", template, macros)
    mmvq_template = _read("src", "mmvq.tpk")
    for weight in MMVQ_TYPES:
        macros = {"MV_NAME": mmvq_kernel_name(weight), "MV_T": weight.name.lower()}
        sources += _instance(f"src/mmvq.tpk[{weight.name.lower()}]", mmvq_template, macros)
    return tuple(sources)


def _instance(name: str, template: str, macros: dict[str, str]) -> list[Source]:
    """A template's text between the #defines of its parameters and their #undefs."""
    head = "".join(f"#define {k} {v}\n" for k, v in macros.items())
    tail = "".join(f"#undef {k}\n" for k in macros)
    return [
        Source(f"<{name} parameters>", head),
        Source(name, template, tuple(macros.items())),
        Source(f"<{name} end>", tail),
    ]


def render(dialect: Dialect, sources: tuple[Source, ...] | None = None) -> Rendered:
    """The whole program for ``dialect`` (``sources`` replaces the packaged bodies,
    which tests use to compile a deliberately broken kernel)."""
    bodies = body_sources() if sources is None else sources
    return Rendered(dialect, prelude(dialect), "".join(s.with_line_directive() for s in bodies))

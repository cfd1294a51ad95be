"""Which kernel multiplies a weight matrix by activation rows: one table, read top down.

A ``mul_mat`` on the CPU can run a dozen ways: integer kernels over repacked weights,
integer or float kernels fused with decoding for a few rows, float kernels that read
each float weight once, or decoding chunks of the weights for BLAS, each with numba or
with numpy alone. Which one runs depends on the weight type, its layout (the file's,
or ``CPU_REPACK``), the number of activation rows, whether numba is there, and a few
facts about the arrays (:data:`FACTS`). :data:`TABLE` says it all in one place, as
data: the first :class:`Path` that takes a product is the one that computes it. The
kernels' builders (:mod:`.matmul`, :mod:`.jit`, :mod:`.siblings`) ask :func:`select`;
the plugin's README prints the table, generated from it (``python -m
tensorplug_cpu.kernels --write``; a test fails when the README is stale).

The CPU's features (:func:`tensorplug_cpu.system.kernel_features`) do not change the
path, only the instructions its kernels compile to: each path names its form for
each level (AVX512-VNNI or AVX-VNNI, AVX2, portable), and :func:`select` says which
one this CPU gets. The IR modules choose that form themselves when they compile
(``_numba_ir.HAS_*``), from the same probe.

The row limits are here too: :data:`MATVEC_MAX_TOKENS_BY_TYPE` and
:data:`FLOAT_MATVEC_MAX_TOKENS`, set where the fused kernels stop beating
decoding and BLAS, and :data:`INT8_ROWS`, the weight rows each integer kernel takes at
a time (the numba kernels compile these in, so the kernel cache hashes this file).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FilePath

from tensorplug.quants import SUPPORTED_TYPES
from tensorplug.types import Type

from ..repack import LAYOUTS as PACKED_LAYOUTS
from ..system import LEVELS, KernelFeatures, kernel_features
from .kernel_shapes import INT8_ROWS

__all__ = [
    "FACTS",
    "FLOAT_MATVEC_MAX_TOKENS",
    "INT8_ROWS",
    "LAYOUTS",
    "MANY",
    "MATVEC_MAX_TOKENS",
    "MATVEC_MAX_TOKENS_BY_TYPE",
    "MATVEC_MOST_TOKENS",
    "TABLE",
    "Choice",
    "Path",
    "fused_path",
    "markdown",
    "matvec_max_tokens",
    "path",
    "select",
]

# -- the inputs -------------------------------------------------------------------------------

#: the layouts of a weight matrix: the file's (ggml's), or eight rows interleaved
PLAIN, REPACKED = "plain", "CPU_REPACK"
LAYOUTS = (PLAIN, REPACKED)

#: facts about a product's arrays that some paths need (:func:`select`'s flags)
NUMBA = "numba"
CONTIGUOUS = "contiguous blocks"
MATRIX = "2-d"
UNIT_STRIDE = "unit-stride rows"
FACTS: Mapping[str, str] = {
    NUMBA: "numba imports and the backend uses it (not `jit=0`, not `TENSORPLUG_CPU_JIT=0`)",
    CONTIGUOUS: "each weight row's blocks lie back to back (a byte row per weight row)",
    MATRIX: "one weight matrix times one set of rows, no batch axes (for decoding: a "
    "2-d chunk of weights; a batched product's whole weights are 3-d or 4-d)",
    UNIT_STRIDE: "the weights', activations' and results' rows are unit-stride",
}

#: a row count past every limit: what a product takes that decodes its weights (a
#: prompt's; ``mul_mat_id`` asks for its experts' decoders this way)
MANY = 1 << 62

QUANT = tuple(t for t in SUPPORTED_TYPES if t.is_quantized)
FLOATS = (Type.F32, Type.F16, Type.BF16)

# -- the limits -------------------------------------------------------------------------------

#: Up to this many activation rows, F32, F16 and BF16 weights take the numba kernels that
#: read each weight once (:mod:`._numba_fmatvec`): they stream the weights faster than
#: BLAS's sgemv, about twice as fast for one row and still ahead at eight, and far faster
#: for F16, which BLAS takes only widened first.
FLOAT_MATVEC_MAX_TOKENS = 8
#: Up to this many activation rows, quantized weights use the fused matvec kernels...
MATVEC_MAX_TOKENS = 8
#: ... and up to these many for the types whose integer kernels stay ahead of decoding
#: the matrix and calling BLAS for longer. A fused kernel's cost grows with each row, a
#: decode's is paid once: for Q4_0 and Q4_K the fused kernel is clearly ahead at 12 and
#: 16 rows and even at about 24; for Q4_1, Q8_0 and Q6_K it is ahead or even at 12 rows
#: and even or behind at 16; Q5_0 and Q5_1 are already behind at 12, so they keep
#: :data:`MATVEC_MAX_TOKENS`. Short prompts (a chat turn) gain most.
MATVEC_MAX_TOKENS_BY_TYPE: Mapping[Type, int] = {
    Type.Q4_0: 16, Type.Q4_K: 16, Type.Q4_1: 12, Type.Q8_0: 12, Type.Q6_K: 12,
}  # fmt: skip
#: the most rows any type's fused kernel takes (and so the most a joint product of one
#: activation by several plain matrices takes, :mod:`.siblings`)
MATVEC_MOST_TOKENS = max(MATVEC_MAX_TOKENS, *MATVEC_MAX_TOKENS_BY_TYPE.values())


def matvec_max_tokens(t: Type) -> int:
    """The most activation rows a product of ``t`` weights takes a fused kernel for."""
    return MATVEC_MAX_TOKENS_BY_TYPE.get(t, MATVEC_MAX_TOKENS)


# -- the table --------------------------------------------------------------------------------

#: an activation-row limit: at most this many, at most a per-type number
#: (:func:`matvec_max_tokens`), or any
Rows = int | str | None
FUSED_ROWS = "fused"  # the per-type limit of :func:`matvec_max_tokens`


@dataclass(frozen=True)
class Path:
    """One way to compute a product, and when it is taken."""

    #: what the builders branch on
    name: str
    #: the weight types it takes
    types: tuple[Type, ...]
    #: the weight layout it reads
    layout: str
    #: the most activation rows it takes: an int, :data:`FUSED_ROWS`, or None for any
    rows: Rows
    #: what else must hold (:data:`FACTS`)
    needs: frozenset[str]
    #: the code that runs
    kernel: str
    #: why it is chosen there
    why: str
    #: the instructions it compiles to, per level of :data:`~..system.LEVELS` (all
    #: levels alike when given one ``"*"`` entry)
    forms: Mapping[str, str] = field(default_factory=lambda: {"*": "numpy and BLAS"})

    def most_rows(self, t: Type) -> int | None:
        """The most activation rows this path takes for ``t`` weights (None: any)."""
        if self.rows == FUSED_ROWS:
            return matvec_max_tokens(t)
        assert not isinstance(self.rows, str)
        return self.rows

    def takes(self, t: Type, layout: str, rows: int, facts: frozenset[str]) -> bool:
        """Whether this path takes a product of ``rows`` activation rows by ``t`` weights
        stored in ``layout`` when ``facts`` hold."""
        most = self.most_rows(t)
        return (
            t in self.types and layout == self.layout and (most is None or rows <= most)
            and self.needs <= facts
        )  # fmt: skip

    def form(self, level: str) -> str:
        """The instructions of this path at ``level`` (one of :data:`~..system.LEVELS`)."""
        return self.forms.get(level, self.forms.get("*", ""))


# the paths' names, which the builders branch on
REPACKED_INT8 = "repacked-int8"
REPACKED_DECODE = "repacked-decode"
INT8 = "int8-fused"
FLOAT_FUSED = "float-fused"
FLOAT_MATVEC = "float-matvec"
BLAS = "blas"
F16_WIDEN = "f16-widen+blas"
F16_NUMPY = "f16-numpy+blas"
BF16_SHIFT = "bf16-shift+blas"
DECODE_VECTOR = "decode-vector+blas"
DECODE_SCALAR = "decode-scalar+blas"
DECODE_NUMPY = "decode-numpy+blas"

_INT8_FORMS = {
    "avx2": "`vpmaddubsw` + `vpmaddwd` (Q4_0, Q4_K: four rows folded by `vphaddw`); "
    "F16 scales by `vcvtph2ps` (F16C) or a table",
    "portable": "widening vector IR LLVM lowers for the host",
}
_INT8_FORMS["vnni"] = _INT8_FORMS["avx2"]
_VECTORIZED = {"*": "numba loops LLVM vectorizes for the host"}
_F16 = "F16 by `vcvtph2ps` (F16C) or a table"

#: Every way a ``mul_mat`` runs on the CPU, in the order :func:`select` tries them.
TABLE: tuple[Path, ...] = (
    Path(
        REPACKED_INT8, tuple(PACKED_LAYOUTS), REPACKED, None, frozenset({NUMBA}),
        "`_numba_repack.packed_kernels(types)` (`.serial` on one thread, `.siblings` for "
        "one activation by several matrices; only the model's types compiled): tiles of 8 "
        "weight rows × 1–8 activation rows (`tile_rows`)",
        "eight rows' codes in one 32-byte load, each row's sum in a lane of its own: "
        "faster than decoding and BLAS even for a prompt's products",
        {"vnni": "`vpdpbusd`",
         "avx2": "`vpmaddubsw` + `vpmaddwd` (16-bit sums widened before they overflow)",
         "portable": "widening vector IR LLVM lowers for the host"},
    ),
    Path(
        REPACKED_DECODE, tuple(PACKED_LAYOUTS), REPACKED, None, frozenset(),
        "`PackedLayout.unpack`, `tensorplug.quants.dequantize_blocks`, BLAS, at each compute",
        "a backend without numba beside weights repacked for another: slow, the same "
        "products",
    ),
    Path(
        INT8, tuple(INT8_ROWS), PLAIN, FUSED_ROWS, frozenset({NUMBA, CONTIGUOUS}),
        "`_numba_kint8.matvec_int8` (`_serial` on one thread or for fewer than 4 weight "
        "rows, `_siblings` for one activation by several matrices) over "
        "`_numba_introw.rows{n}_dot_{type}`: "
        + ", ".join(
            f"{n} weight row{'s' * (n > 1)} at a time for "
            + " ".join(t.name for t in INT8_ROWS if INT8_ROWS[t] == n)
            for n in sorted(set(INT8_ROWS.values()), reverse=True)
        ),
        "activations quantized as ggml does for the type (Q8_0, Q8_1, Q8_K: see the "
        "rounding table) and integer dot products, each block "
        "decoded in registers, the matrix read once: ahead of decoding and BLAS up to the "
        "row limit",
        _INT8_FORMS,
    ),
    Path(
        FLOAT_FUSED, QUANT, PLAIN, FUSED_ROWS, frozenset({NUMBA}),
        "`_numba_quant.matvec_{type}`, `_numba_kquant.matvec_k`, `_numba_iquant.matvec_{type}`",
        "types without an integer kernel (and weights whose blocks are not contiguous): "
        "each block decoded in registers into float32 dot products, the matrix never "
        "written out",
        _VECTORIZED,
    ),
    Path(
        FLOAT_MATVEC, FLOATS, PLAIN, FLOAT_MATVEC_MAX_TOKENS,
        frozenset({NUMBA, MATRIX, UNIT_STRIDE}),
        "`_numba_fmatvec.matvec_float` (`_serial` on one thread)",
        "each weight read once, F16 and BF16 widened in registers: faster than OpenBLAS's "
        "sgemv, which takes F16 weights only widened first",
        {"*": f"8-wide float IR; {_F16}"},
    ),
    Path(
        BLAS, (Type.F32,), PLAIN, None, frozenset(),
        "`numpy.matmul` (BLAS on one thread) per chunk of weight rows on the worker pool",
        "float32 weights read in place",
    ),
    Path(
        F16_WIDEN, (Type.F16,), PLAIN, None, frozenset({NUMBA, MATRIX}),
        "`JitKernels.widen_f16` per chunk of weight rows, then BLAS",
        "numpy's widening of F16 would be most of a prompt's time",
        {"*": _F16},
    ),
    Path(
        F16_NUMPY, (Type.F16,), PLAIN, None, frozenset(),
        "numpy's conversion, then BLAS",
        "no numba, or a batched product's whole weights",
    ),
    Path(
        BF16_SHIFT, (Type.BF16,), PLAIN, None, frozenset(),
        "`numpy.left_shift` into float32, then BLAS",
        "a BF16 value is the top half of a float32",
    ),
    Path(
        DECODE_VECTOR,
        (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K, Type.Q6_K),
        PLAIN, None, frozenset({NUMBA, CONTIGUOUS}),
        "`_numba_decode.dequantize_rows32`, `dequantize_{type}_rows` per chunk of weight "
        "rows, then BLAS",
        "one load, integer unpacking, one conversion and one multiply a block (more than "
        "twice as fast as scalar loops), bit-identical to `tensorplug.quants`",
        {"*": "LLVM vectors of 16 or 32 floats"},
    ),
    Path(
        DECODE_SCALAR, QUANT, PLAIN, None, frozenset({NUMBA}),
        "`_numba_quant.dequantize_{type}`, `_numba_kquant.dequantize_k`, "
        "`_numba_iquant.dequantize_{type}` per chunk of weight rows, then BLAS",
        "Q2_K, Q3_K, IQ4_NL and IQ4_XS have no vector decoder (nor do blocks that are not "
        "contiguous)",
        _VECTORIZED,
    ),
    Path(
        DECODE_NUMPY, QUANT, PLAIN, None, frozenset(),
        "`tensorplug.quants.dequantize_blocks`, then BLAS",
        "no numba",
    ),
)  # fmt: skip

_BY_NAME = {p.name: p for p in TABLE}


def path(name: str) -> Path:
    """The path named ``name``."""
    return _BY_NAME[name]


@dataclass(frozen=True)
class Choice:
    """What :func:`select` chose: the path, and the instructions it runs here."""

    path: Path
    #: the level of :data:`~..system.LEVELS` the kernels compile for
    level: str

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def form(self) -> str:
        return self.path.form(self.level)


@functools.lru_cache(maxsize=4096)
def _first(t: Type, layout: str, rows: int, facts: frozenset[str]) -> Path:
    for p in TABLE:
        if p.takes(t, layout, rows, facts):
            return p
    have = ", ".join(sorted(facts)) or "nothing"
    raise LookupError(
        f"no CPU kernel multiplies {t.name} weights ({layout}) by {rows} activation rows "
        f"given {have}: the table of tensorplug_cpu.kernels.dispatch has no row for it"
    )


# plans ask per chunk of a prompt's weights: a hit skips walking the table
@functools.lru_cache(maxsize=4096)
def select(
    t: Type,
    layout: str,
    rows: int,
    *,
    numba: bool,
    features: KernelFeatures | None = None,
    blocks_contiguous: bool = True,
    matrix: bool = True,
    unit_stride: bool = True,
) -> Choice:
    """The path of a product of ``rows`` activation rows by ``t`` weights stored in
    ``layout`` (:data:`PLAIN` or :data:`REPACKED`), and the instructions its kernels run
    on a CPU with ``features`` (this one's unless given). The flags are the
    :data:`FACTS` a path may need; :data:`MANY` rows asks for the decoding path.
    Raises :class:`LookupError` for a product no path takes (``supports_op`` turns
    those away first)."""
    facts = frozenset(
        name for name, holds in ((NUMBA, numba), (CONTIGUOUS, blocks_contiguous),
                                 (MATRIX, matrix), (UNIT_STRIDE, unit_stride)) if holds
    )  # fmt: skip
    level = (features if features is not None else kernel_features()).level
    return Choice(_first(t, layout, rows, facts), level)


@functools.lru_cache(maxsize=64)
def fused_path(t: Type, blocks_contiguous: bool = True) -> str:
    """The name of the fused kernel path a few rows by ``t`` weights take with numba
    (:data:`INT8` or :data:`FLOAT_FUSED`): the kernels' own question, whose callers
    have kept the rows within :func:`matvec_max_tokens`."""
    facts = frozenset({NUMBA, CONTIGUOUS} if blocks_contiguous else {NUMBA})
    return _first(t, PLAIN, 1, facts).name


# -- the table in the README ------------------------------------------------------------------

BEGIN = "<!-- dispatch table: generated by `python -m tensorplug_cpu.kernels --write` -->"
END = "<!-- end of dispatch table -->"
_LEVEL_NAMES = {"vnni": "AVX512-VNNI or AVX-VNNI", "avx2": "AVX2", "portable": "portable"}


def _types(types: Sequence[Type]) -> str:
    if set(types) == set(QUANT):
        return "every quantized type"
    return " ".join(t.name for t in types)


def _rows(p: Path) -> str:
    if p.rows is None:
        return "any"
    if p.rows != FUSED_ROWS:
        return f"≤ {p.rows}"
    by_limit: dict[int, list[str]] = {}
    for t in sorted(p.types):
        by_limit.setdefault(matvec_max_tokens(t), []).append(t.name)
    return "; ".join(f"≤ {n}: {' '.join(names)}" for n, names in
                     sorted(by_limit.items(), reverse=True))  # fmt: skip


def _forms(p: Path) -> str:
    if "*" in p.forms:
        return p.forms["*"]
    parts: list[tuple[list[str], str]] = []
    for level in LEVELS:
        text = p.form(level)
        if parts and parts[-1][1] == text:
            parts[-1][0].append(_LEVEL_NAMES[level])
        else:
            parts.append(([_LEVEL_NAMES[level]], text))
    return "; ".join(f"{' / '.join(names)}: {text}" for names, text in parts)


def markdown() -> str:
    """The table as the README prints it, between :data:`BEGIN` and :data:`END`."""
    order = [NUMBA, CONTIGUOUS, MATRIX, UNIT_STRIDE]
    lines = [
        BEGIN,
        "",
        "| # | Path | Weights | Layout | Activation rows | Needs | Kernel |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, p in enumerate(TABLE, 1):
        needs = ", ".join(f for f in order if f in p.needs) or "—"
        lines.append(f"| {i} | `{p.name}` | {_types(p.types)} | {p.layout} | {_rows(p)} | "
                     f"{needs} | {p.kernel} |")  # fmt: skip
    lines += ["", "The first row that takes a product computes it. Needs:", ""]
    lines += [f"- *{name}*: {FACTS[name]}" for name in order]
    lines += ["", "Why each path, and the instructions its kernels compile to:", ""]
    lines += [f"{i}. `{p.name}`: {p.why}. *{_forms(p)}*" for i, p in enumerate(TABLE, 1)]
    lines += ["", END]
    return "\n".join(lines)


def readme_block(text: str) -> str:
    """The dispatch block of README ``text``, markers included ('' when it has none)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return ""
    return text[start : end + len(END)]


def write_readme(readme: FilePath) -> bool:
    """Put :func:`markdown` between the markers of ``readme``; whether it changed."""
    text = readme.read_text(encoding="utf-8")
    old = readme_block(text)
    if not old:
        raise ValueError(f"{readme} has no dispatch table markers ({BEGIN} … {END})")
    new = text.replace(old, markdown())
    readme.write_text(new, encoding="utf-8")
    return new != text


#: the plugin's README, beside the package in a source checkout
README = FilePath(__file__).resolve().parents[2] / "README.md"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorplug_cpu.kernels",
        description="The CPU plugin's mul_mat dispatch table, as the README prints it.",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table (default)")
    parser.add_argument(
        "--write",
        nargs="?",
        const=str(README),
        metavar="README",
        help=f"rewrite the table between the markers of README ({README})",
    )
    args = parser.parse_args(argv)
    if args.write:
        changed = write_readme(FilePath(args.write))
        print(f"{args.write}: {'updated' if changed else 'already up to date'}")
        return 0
    print(markdown())
    return 0

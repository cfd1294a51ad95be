"""The CPU plugin's environment settings, declared once with their help text.

Read when they are used (the first time the numba kernels are asked for), never when the
plugin is imported; a value a setting cannot read is refused with a
:class:`tensorplug.settings.SettingError` that names the values it takes.
"""

from __future__ import annotations

import os

from tensorplug.settings import Setting, parse_flag

__all__ = [
    "ALL_ROWS",
    "COMPILE_AHEAD",
    "EXACT_ATTENTION_ROWS",
    "GGML_PRODUCT_ORDER",
    "JIT",
    "MAX_NUMBA_THREADS",
    "NUMBA_INTERNALS",
    "NUMBA_LAYERS",
    "NUMBA_THREADS",
    "PROGRAM",
    "SETTINGS",
    "SPIN",
    "THREADING_LAYER",
]

#: Most threads numba is let start. More than the machine's cores never run at once, and
#: numba itself crashes the process (a segfault, no exception) starting 100000 of them.
MAX_NUMBA_THREADS = max(256, 4 * (os.cpu_count() or 1))

#: the values of ``NUMBA_THREADING_LAYER`` numba knows (its documented ones)
NUMBA_LAYERS = ("default", "safe", "threadsafe", "forksafe", "tbb", "omp", "workqueue")


def _threads(value: str) -> int:
    n = int(value)
    if n < 1:
        raise ValueError("numba needs at least 1 thread")
    return n


def _layer(value: str) -> str:
    word = value.strip().lower()  # numba compares it lower-cased
    if word not in NUMBA_LAYERS:
        raise ValueError(f"numba knows the threading layers {', '.join(NUMBA_LAYERS)}")
    return word


JIT: Setting[bool] = Setting(
    "TENSORPLUG_CPU_JIT",
    True,
    parse_flag,
    "0 to compute with the numpy kernels alone in this process, never importing numba "
    "(the CPU_REPACK buffer type is then not offered either); a backend can also be made "
    "without them by init_backend('jit=0').",
    example="0",
)

COMPILE_AHEAD: Setting[bool] = Setting(
    "TENSORPLUG_CPU_COMPILE_AHEAD",
    True,
    parse_flag,
    "0 to compile every numba kernel in this process as it is first needed; by default a "
    "graph's kernels that numba's disk cache lacks and that its steps reach last "
    "(attention, the one-thread products) are compiled by a second process meanwhile, "
    "into the same cache (a first run's compiles on two cores instead of one).",
    example="0",
)

NUMBA_INTERNALS: Setting[bool] = Setting(
    "TENSORPLUG_CPU_NUMBA_INTERNALS",
    True,
    parse_flag,
    "0 to load and run every numba kernel through numba's public API alone; by default, "
    "where numba and llvmlite are versions the plugin was tested with, the machine code "
    "of each kernel numba has run is kept and a later launch loads it without importing "
    "numba (a faster launch, the same results).",
    example="0",
)

SPIN: Setting[bool] = Setting(
    "TENSORPLUG_CPU_SPIN",
    True,
    parse_flag,
    "0 to run a generation step's products and attention on more than one thread as "
    "numba parallel regions, whose worker threads sleep between regions (microseconds "
    "to wake each, dozens of times a token), rather than on helper threads that spin "
    "for ~2 ms after each job and sleep after that (kernels/pool.py).",
    example="0",
)

PROGRAM: Setting[bool] = Setting(
    "TENSORPLUG_CPU_PROGRAM",
    True,
    parse_flag,
    "0 to run a generation step's graph as one Python call a node; by default each run "
    "of consecutive nodes that have a compiled job (products, attention, norms, rope, "
    "the KV cache's new rows, activations, adds) runs as one call into compiled code "
    "(kernels/program.py): the same numbers, without a Python call's overhead a node.",
    example="0",
)

#: the value ``all`` reads as: more query rows than any step has
ALL_ROWS = 2**62


def _rows(value: str) -> int:
    if value.strip().lower() == "all":
        return ALL_ROWS
    n = int(value)
    if n < 0:
        raise ValueError("a number of query rows (0 or more), or 'all'")
    return n


EXACT_ATTENTION_ROWS: Setting[int] = Setting(
    "TENSORPLUG_CPU_EXACT_ATTENTION_ROWS",
    ALL_ROWS,
    _rows,
    "query rows up to which attention runs llama.cpp's arithmetic, each row on its own "
    "(so a row's numbers do not depend on the rows beside it and batching changes no "
    "bit); steps with more rows use BLAS, which rounds by the step's row count. Default "
    "'all'; a number lowers it (on a prompt's many rows the exact kernel is slower "
    "than BLAS).",
    example="16",
)

GGML_PRODUCT_ORDER: Setting[bool | None] = Setting(
    "TENSORPLUG_CPU_GGML_PRODUCT_ORDER",
    None,
    parse_flag,
    "the arithmetic order of every CPU backend, over what an application asks of each. "
    "Unset: ggml's own orders (llama.cpp's bits: Q5_0 and Q8_0 products in eight float "
    "sums a row as vec_dot_q8_0_q8_0, Q6_K from 8 activation rows as ggml's tiled "
    "product, Q4_K's rows in ggml's gemm groups of four, the weights times V of two "
    "query rows or more in tinyBLAS's order, so that a row's bits depend on its step's "
    "row count as ggml's do), except on a backend an application made batch-invariant "
    "(the set_batch_invariant extension, which the LLM engine behind tensorplug serve "
    "asks for), where each block's sum is one exact integer and a row's bits never "
    "depend on the rows beside it. 1: ggml's orders everywhere; 0: batch-invariant "
    "everywhere (Q5_0 and Q8_0 products are then cheaper from 4 activation rows, and "
    "slightly cheaper for one).",
    example="0",
)

# numba's own variables, read by numba when it is imported: declared here so that they
# are checked before it reads them (numba crashes the process on a bad value, or fails
# at the first parallel kernel, deep in its own code) and listed with the plugin's settings
NUMBA_THREADS: Setting[int | None] = Setting(
    "NUMBA_NUM_THREADS",
    None,
    _threads,
    "numba's own: how many threads its parallel kernels start (default: the machine's "
    f"cores); more than {MAX_NUMBA_THREADS} is lowered to that with a warning.",
    example="4",
)

THREADING_LAYER: Setting[str] = Setting(
    "NUMBA_THREADING_LAYER",
    "default",
    _layer,
    "numba's own: the threading layer of its parallel kernels "
    f"({', '.join(NUMBA_LAYERS)}); 'default' takes TBB when it loads.",
    example="tbb",
)

#: every setting of the plugin
SETTINGS = (
    JIT,
    COMPILE_AHEAD,
    NUMBA_INTERNALS,
    EXACT_ATTENTION_ROWS,
    GGML_PRODUCT_ORDER,
    NUMBA_THREADS,
    THREADING_LAYER,
    SPIN,
    PROGRAM,
)

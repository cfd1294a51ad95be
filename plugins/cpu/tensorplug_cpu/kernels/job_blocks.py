"""The argument blocks of the compiled jobs and programs, and the constants that both
the Python that fills them and the compiled code that reads them know.

A job of the spinning helpers (:mod:`._numba_pool`) reads an ``int64`` block by address;
a program (:mod:`.program`) is rows of jobs; the helpers poll a mailbox. Binding a plan
writes those blocks, and needs their layouts, but not numba: with every kernel kept
(:mod:`.kept_code`), a launch binds its plans and runs them without importing numba's
Python package, whose import is a large share of a small model's launch. So the layouts
live here, and the compiled modules (:mod:`._numba_pool`, :mod:`._numba_jobs`,
:mod:`._numba_repack`, :mod:`._numba_attention`) take them from here; this file is one
of the kernels' sources (:data:`.kernel_identity.SOURCES`), since their machine code
holds its numbers.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from tensorplug.types import Type

from .activations import vec_dot_type

__all__ = [
    "ATTEND_K", "ATTEND_LANES", "ATTEND_MASK", "ATTEND_ORDER", "ATTEND_ORDER_N", "ATTEND_OUT",
    "ATTEND_PARTS", "ATTEND_Q", "ATTEND_RUNS", "ATTEND_SCALE", "ATTEND_SOFTCAP",
    "ATTEND_TABLE", "ATTEND_UNIT", "ATTEND_USED", "ATTEND_V", "ATTEND_VISIBLE", "MAT_BYTES",
    "MAT_GROUPS", "MAT_KIND", "MAT_OUT", "MAT_OUT_COLS", "MAT_PACKED", "MAT_START",
    "PACKED_CHUNKS", "PACKED_COLS", "PACKED_KIND", "PACKED_MATS", "PACKED_ROWS",
    "PACKED_TABLE", "PACKED_TOTAL", "PACKED_X", "PACKED_XD", "PACKED_XQ", "PACKED_XS",
    "PACKED_XS_COLS",
    "ADD", "ARGS", "ARRAY4_FIELDS", "ATTEND_FIELDS", "AWAKE", "CHECKED", "CHUNKED", "CHUNKS",
    "DIV", "DONE", "FN", "GEGLU", "HAS_PREAD", "JOB", "MAILBOX_SIZE", "MUL", "OWN_SUMS",
    "PACKED_HEAD", "PACKED_MAT_FIELDS", "PER", "PROGRAM_FIELDS", "QUANTIZE_APART_ROWS",
    "ROWS_32", "ROWS_F16", "ROWS_F32", "ROWS_PER_TASK", "ROWS_Q4_K", "ROWS_Q5_K",
    "ROWS_Q6_K", "ROW_DECODER_CODES", "SHARED", "SPIN_NS", "SPIN_ROUNDS", "STATUS", "STOP",
    "SUB", "SUMS_OF_16", "SWIGLU", "TICKET", "TYPES32", "WANTED", "activation_form",
    "FLASH_FIELDS", "FLASH_GROUPED", "FLASH_K", "FLASH_MASK", "FLASH_ORDER", "FLASH_ORDER_N",
    "FLASH_ORDER_SEEN",
    "FLASH_OUT", "FLASH_Q", "FLASH_RUNS", "FLASH_SCALE", "FLASH_SOFTCAP", "FLASH_TABLE",
    "FLASH_KV_SPAN", "FLASH_TILED", "FLASH_USED", "FLASH_V", "FLASH_VISIBLE", "WHOLE_ROW_CHUNKS",
    "flash_job_block",
    "attend_job_block", "block_size", "describe4", "job_block", "job_parts",
    "packed_job_block", "sums_span",
]  # fmt: skip

# --- the helpers' mailbox (:mod:`._numba_pool` has the protocol) ----------------------
#: mailbox fields (int64 indices), eight apart: one 64-byte cache line each for what the
#: helpers poll, what the caller writes per job, and what every chunk's end bumps
TICKET = 0
FN, JOB, CHUNKS = 8, 9, 10
DONE = 16
WANTED, STOP = 24, 25
AWAKE = 32
MAILBOX_SIZE = 40

#: How long a helper spins after its last job before it sleeps: more than the Python
#: between two tokens' steps (sampling, detokenizing), less than a person notices a
#: core busy. Where there is no monotonic clock to read (Windows), ``SPIN_ROUNDS``
#: idle rounds (a few ``pause`` s and a yield each) bound it instead.
SPIN_NS = 2_000_000
SPIN_ROUNDS = 4000

#: :func:`._numba_pool.run_program`'s flags of a job: its chunks go to the helpers too;
#: its block's first field says whether it refused its input (nonzero: the program stops
#: there)
SHARED, CHECKED = 1, 2
#: a program's row: the job function, its block, its chunk count, its flags
PROGRAM_FIELDS = 4

#: int64 fields :func:`describe4` writes: the address, four extents, four byte strides
ARRAY4_FIELDS = 9


def describe4(block: np.ndarray, at: int, array: np.ndarray) -> None:
    """Write 4-d ``array`` into a job's argument block from field ``at`` (as
    :func:`._numba_pool.view4` reads it back in the job, any strides)."""
    block[at] = array.ctypes.data
    block[at + 1 : at + 5] = array.shape
    block[at + 5 : at + 9] = array.strides


# --- the step jobs (:mod:`._numba_jobs`) ----------------------------------------------
#: the block's status field, its rows a chunk (the row jobs'), and where its arrays start
STATUS, PER, ARGS = 0, 1, 2
#: the jobs that take their rows in chunks (the others run whole, as one chunk)
CHUNKED = frozenset({"binary", "rms_norm", "rope", "glu"})
#: :func:`._numba_jobs._binary_job`'s operations (field ``ARGS + 3·A4``)
ADD, SUB, MUL, DIV = 0, 1, 2, 3
#: :func:`._numba_jobs._get_rows_job`'s decoders: how a table's byte rows become float32
#: (field ``ARGS + 5·A4 + 4``): copied, widened from f16, or a row decoder of
#: :mod:`._numba_decode` (``ROWS_32``: :func:`~._numba_decode.dequantize_rows32`)
ROWS_F32, ROWS_F16, ROWS_32, ROWS_Q4_K, ROWS_Q5_K, ROWS_Q6_K = range(6)
#: the row decoders' codes, by the name of the decoder in :mod:`._numba_decode`
ROW_DECODER_CODES = {"dequantize_rows32": ROWS_32, "dequantize_q4_k_rows": ROWS_Q4_K,
                     "dequantize_q5_k_rows": ROWS_Q5_K,
                     "dequantize_q6_k_rows": ROWS_Q6_K}  # fmt: skip
#: the types :func:`._numba_decode.dequantize_rows32` decodes (told which by id)
TYPES32 = (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0)
#: libc has ``pread`` where the OS is POSIX; elsewhere (Windows) a table in a file keeps
#: its step, which reads the rows itself (:func:`.program._get_rows` lowers none there)
HAS_PREAD = sys.platform != "win32"
#: :func:`._numba_rows.glu_rows`'s gated activations
SWIGLU, GEGLU = 0, 1


def block_size(arrays: int, scalars: int) -> int:
    """The int64 fields of a block of ``arrays`` arrays and ``scalars`` numbers."""
    return ARGS + ARRAY4_FIELDS * arrays + scalars


def job_block(arrays: Any, ints: Any = (), scalars: Any = (), per: int = 0) -> np.ndarray:
    """The argument block of a step job over 4-d ``arrays`` (which must outlive it), then
    ``ints``, then ``scalars`` (float64 bits); ``per``: a row job's rows a chunk."""
    at = ARGS + ARRAY4_FIELDS * len(arrays)
    block = np.zeros(block_size(len(arrays), len(ints) + len(scalars)), np.int64)
    block[PER] = per
    for k, a in enumerate(arrays):
        describe4(block, ARGS + ARRAY4_FIELDS * k, a)
    block[at : at + len(ints)] = ints
    block.view(np.float64)[at + len(ints) :] = scalars
    return block


# --- the repacked products (:mod:`._numba_repack`) ------------------------------------
#: the weight types whose products read activation sums of their own making in ``xs``,
#: which ``_numba_repack._quantize`` makes after ggml's rounding: Q2_K's over 16 values,
#: Q6_K's over 16 times ``−Q6_K_OFFSET``, Q5_K's scaled by their block's ``d`` (float bits)
OWN_SUMS = frozenset({Type.Q2_K, Type.Q5_K, Type.Q6_K})
#: ... of those, the types whose sums cover 16 values (``xs`` a column per 16), not 32
SUMS_OF_16 = frozenset({Type.Q2_K, Type.Q6_K})
#: the rows from which a step's products and attention run as numba regions, a repacked
#: product's activations quantized first on numba's threads
#: (:func:`._numba_repack.quantize_rows`); fewer run on the spinning helpers
#: (:mod:`.pool`), their activations quantized by the job's prologue on one thread, and
#: the step can be one program (:mod:`.program`). Sixteen was the bound once, and a
#: server's sixteen busy slots made a step of exactly that many rows: a call from Python
#: per product, each waking TBB's workers, markedly slower than fifteen rows' program.
#: On two threads the helpers are as fast as the regions or faster for every step
#: measured below this bound (generation steps of 16-48 rows, prompts of 16-100 tokens,
#: batch-invariant and in ggml's orders; four models: ``docs/performance.md``); a long
#: prompt keeps the regions, whose quantizing is shared out.
QUANTIZE_APART_ROWS = 128


def activation_form(t: Type) -> Type | str:
    """What the repacked products make of the activations for ``t`` weights: ``t``
    itself where its products read sums of their own (:data:`OWN_SUMS`), else its
    ``vec_dot_type``, whose sums every such product reads alike. Products of one
    activation share one quantization only when this is the same (Q4_K's integer sums
    beside Q5_K's scaled ones would read float bits as integers)."""
    return t if t in OWN_SUMS else vec_dot_type(t)


def sums_span(t: Type) -> int:
    """The activation values each of ``xs``'s sums covers for ``t`` weights."""
    return 16 if t in SUMS_OF_16 else 32


#: A block of :func:`._numba_repack.packed_job` (int64): the head, then one record per
#: matrix. The head's fields:
(PACKED_MATS, PACKED_TOTAL, PACKED_X, PACKED_ROWS, PACKED_COLS, PACKED_XQ, PACKED_XD,
 PACKED_XS, PACKED_XS_COLS, PACKED_TABLE, PACKED_KIND, PACKED_CHUNKS) = range(12)  # fmt: skip
PACKED_HEAD = 12
#: per matrix: its packed groups (address, groups, bytes a group), its result (address,
#: columns), its type id and the first of its groups in the range the matrices share
(MAT_PACKED, MAT_GROUPS, MAT_BYTES, MAT_OUT, MAT_OUT_COLS, MAT_KIND,
 MAT_START) = range(7)  # fmt: skip
PACKED_MAT_FIELDS = 7


def packed_job_block(
    x: np.ndarray, packs: list[np.ndarray], outs: list[np.ndarray], kinds: list[Type],
    xq: np.ndarray, xd: np.ndarray, xs: np.ndarray, table: np.ndarray, chunks: int,
) -> np.ndarray:  # fmt: skip
    """The argument block of :func:`._numba_repack.packed_job` for the products
    ``packs[m] · x → outs[m]`` (what the sibling driver takes as arrays, by address),
    their groups shared out in ``chunks`` runs. Every array must be C-contiguous and
    outlive the block: the caller keeps them."""
    arrays = [x, xq, xd, xs, table, *packs, *outs]
    if not all(a.flags.c_contiguous for a in arrays):
        raise ValueError("packed_job_block: every array must be C-contiguous")
    block = np.zeros(PACKED_HEAD + PACKED_MAT_FIELDS * len(packs), np.int64)
    block[:PACKED_HEAD] = (len(packs), sum(p.shape[0] for p in packs), x.ctypes.data,
                           x.shape[0], x.shape[1], xq.ctypes.data, xd.ctypes.data,
                           xs.ctypes.data, xs.shape[1], table.ctypes.data, int(kinds[0]),
                           chunks)  # fmt: skip
    start = 0
    for m, (packed, out, t) in enumerate(zip(packs, outs, kinds, strict=True)):
        at = PACKED_HEAD + PACKED_MAT_FIELDS * m
        block[at : at + PACKED_MAT_FIELDS] = (packed.ctypes.data, packed.shape[0],
                                              packed.shape[1], out.ctypes.data,
                                              out.shape[1], int(t), start)  # fmt: skip
        start += packed.shape[0]
    return block


# --- flash attention (:mod:`._numba_attention`) ---------------------------------------
#: Query rows per task of the parallel kernel and the job (any split gives the same bits).
ROWS_PER_TASK = 16
#: The block of :func:`._numba_attention.attend_job` (int64): q, k, v, the mask its
#: visible columns are read from, the mask its biases are read from, and out, each as
#: :func:`describe4` writes it; then order, the scalars, and what the prologue finds.
ATTEND_Q, ATTEND_K, ATTEND_V, ATTEND_VISIBLE, ATTEND_MASK, ATTEND_OUT = (
    i * ARRAY4_FIELDS for i in range(6)
)
(ATTEND_ORDER, ATTEND_ORDER_N, ATTEND_SCALE, ATTEND_SOFTCAP, ATTEND_LANES, ATTEND_TABLE,
 ATTEND_RUNS, ATTEND_UNIT, ATTEND_PARTS, ATTEND_USED) = range(
    6 * ARRAY4_FIELDS, 6 * ARRAY4_FIELDS + 10)  # fmt: skip
ATTEND_FIELDS = 6 * ARRAY4_FIELDS + 10


def job_parts(n_hk: int, group: int, runs: int, threads: int) -> tuple[int, int]:
    """How the attention job shares a step's query heads among its tasks: ``(unit,
    parts)``, each of the ``parts`` a run of whole units of ``unit`` query heads. Whole
    KV heads (``unit = group``) wherever there is one for each thread, or the query rows
    make at least as many runs as there are threads (the runs balance the tasks):
    ggml's cache holds each cell's KV heads side by side, and a task that takes them
    all reads it as it lies, a K or V row once for every query head of its group.
    Single query heads (``unit = 1``) only where a thread would have no KV head at all:
    Gemma 3 (1 KV head) on two threads would run its four query heads on one thread;
    split 2 : 2, both threads read the head's rows, and its generation at a long context
    is faster for it. Where the KV heads are as many as the threads but do not divide
    among them, query heads would split the compute evenly but read the shared head's
    rows twice, from memory at a long context, which costs more than the uneven split:
    SmolLM2 (3 KV heads) on two threads generates faster with its heads 1 : 2, so they
    stay so. Any split gives the same bits."""
    if threads == 1:
        return group, 1
    if n_hk >= threads or runs >= threads:
        return group, min(n_hk, threads)
    return 1, min(threads, n_hk * group)


def attend_job_block(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, mask: np.ndarray,
    order: np.ndarray, scale: float, softcap: float, lanes: int, out: np.ndarray,
    table: np.ndarray, threads: int,
) -> tuple[np.ndarray, int]:  # fmt: skip
    """The argument block of :func:`._numba_attention.attend_job` for the flash
    attention kernel's arguments (F16 ``k``, ``v`` and ``mask`` as raw ``uint16``;
    ``visible``: the mask as the step slices it, whose last visible column the prologue
    finds), and the job's chunk count: its tasks, as the parallel kernel has them on
    ``threads`` threads. The arrays must outlive the block."""
    block = _attention_block(ATTEND_FIELDS, q, k, v, visible, mask, order, scale, softcap,
                             out, table)  # fmt: skip
    block[ATTEND_LANES] = lanes
    runs = (q.shape[2] + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    unit, parts = job_parts(k.shape[1], q.shape[1] // k.shape[1], runs, threads)
    block[ATTEND_RUNS], block[ATTEND_UNIT], block[ATTEND_PARTS] = runs, unit, parts
    return block, q.shape[0] * parts * runs


# --- ggml's flash attention kernel's arithmetic (:mod:`._numba_flash`) ------------------
#: The block of :func:`._numba_flash.flash_job` (int64): q, k, v, the mask its visible
#: columns are read from, the mask its biases are read from, and out, each as
#: :func:`describe4` writes it; then order, the scalars, the way (tiled or a row at a
#: time), the f16 table, the runs of query rows, whether a chunk takes a KV head's query
#: heads together, and what the prologue finds: the visible columns, and how much of
#: order holds them (the cells past it are hidden from every row: none reads them); then
#: how many KV heads a chunk of query heads taken together takes (:data:`WHOLE_ROW_CHUNKS`).
# the attention block's fields, where both blocks have them (_attention_block)
FLASH_Q, FLASH_K, FLASH_V, FLASH_VISIBLE = ATTEND_Q, ATTEND_K, ATTEND_V, ATTEND_VISIBLE
FLASH_MASK, FLASH_OUT, FLASH_ORDER = ATTEND_MASK, ATTEND_OUT, ATTEND_ORDER
FLASH_ORDER_N, FLASH_SCALE, FLASH_SOFTCAP = ATTEND_ORDER_N, ATTEND_SCALE, ATTEND_SOFTCAP
FLASH_TILED, FLASH_TABLE = ATTEND_LANES, ATTEND_TABLE  # the way where the other has lanes
FLASH_RUNS, FLASH_GROUPED, FLASH_USED, FLASH_ORDER_SEEN, FLASH_KV_SPAN = range(
    ATTEND_TABLE + 1, ATTEND_TABLE + 6
)
FLASH_FIELDS = FLASH_KV_SPAN + 1
#: The chunks per thread from which a flash job whose chunks take a KV head's query heads
#: together takes a query row's every KV head in one chunk: its visible cells (a walk of
#: the cells of every sequence in the step: with 16 decoding sequences, sixteen times
#: its own) are then found once for the row, not once per KV head. Fewer rows (one
#: generated token's) keep a KV head a chunk, so that their attention still splits over
#: the threads.
WHOLE_ROW_CHUNKS = 2


def flash_job_block(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, mask: np.ndarray,
    order: np.ndarray, scale: float, softcap: float, tiled: bool, out: np.ndarray,
    table: np.ndarray, threads: int = 1,
) -> tuple[np.ndarray, int]:  # fmt: skip
    """The argument block of :func:`._numba_flash.flash_job` (F16 ``k``, ``v`` and
    ``mask`` as raw ``uint16``; ``visible``: the mask as the step slices it, whose last
    visible column the prologue finds; ``q`` and ``out`` of any strides), and its chunk
    count: where rows go one at a time and one mask serves every head, one query row
    of one KV head's query heads a chunk, or of every KV head's from
    :data:`WHOLE_ROW_CHUNKS` rows per thread of ``threads``; else a run of
    :data:`ROWS_PER_TASK` query rows of one query head (every row is computed alone, so
    any split gives the same bits). The arrays must outlive the block."""
    block = _attention_block(FLASH_FIELDS, q, k, v, visible, mask, order, scale, softcap, out,
                             table)  # fmt: skip
    block[FLASH_TILED] = int(tiled)
    runs = (q.shape[2] + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    grouped = not tiled and mask.shape[1] == 1
    block[FLASH_RUNS], block[FLASH_GROUPED] = runs, int(grouped)
    rows, n_kv_heads = q.shape[0] * q.shape[2], k.shape[1]
    span = n_kv_heads if rows >= WHOLE_ROW_CHUNKS * max(threads, 1) else 1
    block[FLASH_KV_SPAN] = span
    if grouped:
        return block, rows * (n_kv_heads // span)
    return block, q.shape[0] * q.shape[1] * runs


def _attention_block(
    size: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray,
    mask: np.ndarray, order: np.ndarray, scale: float, softcap: float, out: np.ndarray,
    table: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """A block of ``size`` fields with what both attention jobs read at the same places
    (the six arrays, order, scale and softcap, the f16 table); the caller adds its own."""
    block = np.zeros(size, np.int64)
    arrays = (q, k, v, visible, mask, out)
    fields = (ATTEND_Q, ATTEND_K, ATTEND_V, ATTEND_VISIBLE, ATTEND_MASK, ATTEND_OUT)
    for at, a in zip(fields, arrays, strict=True):
        describe4(block, at, a)
    block[ATTEND_ORDER], block[ATTEND_ORDER_N] = order.ctypes.data, order.shape[0]
    block[ATTEND_SCALE : ATTEND_SOFTCAP + 1] = np.array([scale, softcap], np.float64).view(np.int64)
    block[ATTEND_TABLE] = table.ctypes.data
    return block

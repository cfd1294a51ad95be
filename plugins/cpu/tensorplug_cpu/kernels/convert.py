"""Copies with type conversion, and row gathers/scatters (cpy, dup, cont, get/set_rows).

Copies map element ``k`` of the source (C order) to element ``k`` of the destination,
so shapes may differ. Quantized data moves as whole blocks: a quantized source is
decoded with :func:`tensorplug.quants.dequantize_blocks`, a quantized destination is
encoded row by row with :func:`tensorplug.quants.quantize`, byte-identical to GGUF.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.errors import OutOfBoundsError
from tensorplug.files import FileRange
from tensorplug.host import HostBuffer
from tensorplug.quants import dequantize_blocks, quantize
from tensorplug.types import Type

from .common import BuildContext, Step, from_f32, reshape_view, to_f32
from .jit_steps import settle

if TYPE_CHECKING:
    from tensorplug.tensor import Tensor

    from .provider import CompiledKernels

__all__ = [
    "GetRowsStep", "SetRowsStep", "build_copy", "build_get_rows", "build_pad", "build_repeat",
    "build_set_rows",
]  # fmt: skip


def _copy_step(src: np.ndarray, src_type: Type, dst: np.ndarray, dst_type: Type) -> Step:
    """Copy/convert ``src`` into ``dst`` element by element in C order."""
    if src_type == dst_type or (src_type, dst_type) in ((Type.F32, Type.F16), (Type.F16, Type.F32)):
        # same storage (quantized data as raw blocks, which reshape like any bytes), or a
        # cast numpy performs exactly as ggml (exact widening, round-to-nearest-even
        # narrowing)
        view = reshape_view(src, dst.shape)
        if view is not None:
            return partial(np.copyto, dst, view, casting="unsafe")
        return lambda: np.copyto(dst, src.reshape(dst.shape), casting="unsafe")

    def run() -> None:
        if src_type.is_quantized:
            values = dequantize_blocks(src, src_type)
        else:
            values = to_f32(src, src_type)
        if dst_type.is_quantized:
            rows = values.reshape((*dst.shape[:-2], -1))
            np.copyto(dst, quantize(rows, dst_type).reshape(dst.shape))
        else:
            np.copyto(dst, from_f32(values.reshape(dst.shape), dst_type))

    return run


def build_copy(node: Tensor, ctx: BuildContext) -> Step:
    """cpy / dup / cont: write ``src[0]``'s values, converted, into the node.

    For cpy(a, b) the node is a view of ``b``; dup and cont are same-type contiguous
    copies, cont possibly with a new shape.
    """
    a = node.src[0]
    return _copy_step(ctx.view(a), a.type, ctx.view(node), node.type)


def _index_error(node: Tensor, e: Exception) -> OutOfBoundsError:
    return OutOfBoundsError(
        f"{node.op.value} {node.describe()}: a row index is outside the table "
        f"{node.src[0].describe()} ({e}); indices must lie in [0, n_rows)"
    )


def build_get_rows(node: Tensor, ctx: BuildContext) -> Step:
    """Gather rows of ``a`` per outer batch; quantized rows are decoded after the gather.
    A table whose buffer says where its bytes are in a file (a GGUF model's token
    embeddings: ``HostBuffer.file_rows``) has its rows read from the file, so its pages
    are never mapped into the process (:mod:`tensorplug.files`)."""
    a_t, rows_t = node.src
    a, rows, out = ctx.view(a_t), ctx.view(rows_t), ctx.view(node)
    # negative indices seen as uint32 become huge, so numpy's bounds check rejects them
    # instead of wrapping around as Python indexing would
    rows_u = rows.view(np.uint32)
    batches = [
        (a[i], rows_u[i], out[i]) for i in itertools.product(*(range(d) for d in a_t.shape[:-2]))
    ]
    t = a_t.type
    # the provider's decoder, bound once here (numba's decodes a token's embedding row in
    # microseconds; bound at each call, it would cost every generated token)
    decodes = ctx.kernels.supports(t)
    file_rows = _file_rows(a_t)
    # the rows are gathered into a scratch array of each batch's where they are decoded
    # after, or where they are read from the file
    taken_by: dict[int, np.ndarray] = {}
    decoders: dict[int, Callable[[np.ndarray], np.ndarray]] = {}
    for i, (table, idx, dst) in enumerate(batches):
        decode_here = decodes and dst.flags.c_contiguous
        if decode_here or file_rows is not None:
            taken = taken_by[i] = ctx.scratch((idx.size, *table.shape[1:]), table.dtype)
            if decode_here:
                decoders[i] = ctx.kernels.bind_dequantize(t, taken, dst)
    # each batch's reader fills that batch's scratch (a table in a file is 2-d: one batch)
    readers = {} if file_rows is None else {
        i: _row_reader(file_rows, a_t, taken) for i, taken in taken_by.items()
    }  # fmt: skip

    def take(i: int, table: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of ``table``, in the batch's scratch where it has one."""
        into = taken_by.get(i)
        if into is None:
            return np.take(table, idx, axis=0)
        if i in readers:
            readers[i](idx)
        else:
            np.take(table, idx, axis=0, out=into)
        return into

    def gather(i: int, table: np.ndarray, idx: np.ndarray, dst: np.ndarray) -> None:
        if i in decoders:
            take(i, table, idx)
            decoded = decoders[i](dst)
            if decoded is not dst:  # numpy's codec makes its own array
                np.copyto(dst, decoded)
        elif t in (Type.F32, Type.I32):
            if i in taken_by:
                np.copyto(dst, take(i, table, idx))
            else:
                np.take(table, idx, axis=0, out=dst)
        elif t.is_quantized:
            np.copyto(dst, dequantize_blocks(take(i, table, idx), t))
        else:
            np.copyto(dst, to_f32(take(i, table, idx), t))

    def run() -> None:
        try:
            for i, (table, idx, dst) in enumerate(batches):
                gather(i, table, idx, dst)
        except IndexError as e:
            raise _index_error(node, e) from e

    if len(batches) != 1:  # a table of several matrices: no job form
        return run
    table, idx, dst = batches[0]
    return GetRowsStep(run, a_t.type, table, idx, dst, taken_by.get(0), file_rows, a_t)


class GetRowsStep:
    """A 2-d table's rows gathered (decoded, where the table is not float32): the step
    (``run``, as :func:`build_get_rows` builds it), and what a program's job needs to do the same
    (:func:`.program._get_rows`: one compiled call for a token, its embedding row
    included). ``table``: the table as numpy sees it (its file's pages, where
    ``file_rows`` says where its bytes are: never read through memory then); ``taken``:
    the scratch rows a file's rows are read into; ``first``, ``stride``: where row 0 is
    in ``file_rows``, and the bytes from a row to the next."""

    def __init__(self, run: Step, t: Type, table: np.ndarray, idx: np.ndarray,
                 out: np.ndarray, taken: np.ndarray | None, file_rows: FileRange | None,
                 table_tensor: Tensor) -> None:  # fmt: skip
        self._run = run
        self.type, self.table, self.idx, self.out, self.taken = t, table, idx, out, taken
        self.file_rows = file_rows
        self.first, self.stride = table_tensor.offset, table_tensor.strides[0]

    def __call__(self) -> None:
        self._run()


def _file_rows(table: Tensor) -> FileRange | None:
    """Where ``table``'s rows are read from, where its buffer says they are a file's
    (``HostBuffer.file_rows``) and they lie whole in it: a 2-d table of its own memory
    whose rows are dense; else None (read through memory)."""
    buf = table.base.buffer
    if not isinstance(buf, HostBuffer) or buf.file_rows is None:
        return None
    if table.ndim != 2 or table.view_src is not None or not table.rows_contiguous:
        return None
    return buf.file_rows


def _row_reader(
    file_rows: FileRange, table: Tensor, into: np.ndarray
) -> Callable[[np.ndarray], None]:
    """``read(idx)``: rows ``idx`` of ``table`` from ``file_rows`` into ``into`` (its
    rows in order), an index past the table an ``IndexError`` as numpy's ``take``
    raises. One ``pread`` a row: a generated token's one row, a prompt's each of its."""
    n_rows, stride, first = table.shape[0], table.strides[0], table.offset
    dests = [row.data for row in into.reshape(into.shape[0], -1).view(np.uint8)]

    def read(idx: np.ndarray) -> None:
        for dest, r in zip(dests, idx.tolist(), strict=True):
            if r >= n_rows:
                raise IndexError(f"index {r} is out of bounds for axis 0 with size {n_rows}")
            file_rows.read(dest, first + r * stride)

    return read


class SetRowsStep:
    """A KV cache's new rows: every index checked, then the rows written, in one kernel
    call (:meth:`.provider.CompiledKernels.set_rows`); a job of a program too (:mod:`.program`),
    which reads ``table`` (float32, or f16 as ``uint16``), ``values`` and ``idx``."""

    def __init__(self, node: Tensor, compiled: CompiledKernels, table: np.ndarray,
                 values: np.ndarray, idx: np.ndarray) -> None:  # fmt: skip
        self.node, self.table, self.values, self.idx = node, table, values, idx
        compiled.expect(compiled.set_rows, table, values, idx)
        self._set_rows = compiled.bound(compiled.set_rows, table, values, idx)

    def settle(self, called: Collection[str]) -> None:
        settle(self._set_rows, called)

    def __call__(self) -> None:
        bad = int(self._set_rows())
        if bad >= 0:
            message = f"index {int(self.idx[bad])} with {self.table.shape[0]} rows"
            raise _index_error(self.node, IndexError(message))


class BlockRowsStep:
    """New rows of a quantized KV cache (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), encoded as
    ggml's ``from_float`` encodes them (:mod:`._numba_encode`) straight into the raw
    rows ``table`` (rows, bytes): every index checked, then the rows written."""

    def __init__(self, node: Tensor, compiled: CompiledKernels, table: np.ndarray,
                 values: np.ndarray, idx: np.ndarray) -> None:  # fmt: skip
        self.node, self.table, self.idx = node, table, idx
        self._write = compiled.bind_set_rows_blocks(table, values, idx, int(node.type))

    def settle(self, called: Collection[str]) -> None:
        settle(self._write, called)

    def __call__(self) -> None:
        bad = int(self._write())
        if bad >= 0:
            message = f"index {int(self.idx[bad])} with {self.table.shape[0]} rows"
            raise _index_error(self.node, IndexError(message))


#: the quantized types whose rows :class:`BlockRowsStep` encodes
ENCODED = frozenset({Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.IQ4_NL})
#: Up to this many rows per batch, set_rows checks and writes them one by one.
FEW_ROWS = 8


def build_set_rows(node: Tensor, ctx: BuildContext) -> Step:
    """Scatter rows of ``b`` into ``a`` (the node is a view of ``a``), converting them."""
    _, b_t, rows_t = node.src
    dst, b, rows = ctx.view(node), ctx.view(b_t), ctx.view(rows_t)
    t = node.type
    signed64 = rows_t.type == Type.I64
    if not signed64:
        rows = rows.view(np.uint32)  # negatives become out of range, see build_get_rows
    # rows (…, k) broadcasts over b's outer axes (each 1 or equal)
    outer = b.shape[:-2]
    rows = rows.reshape((1,) * (len(outer) + 1 - rows.ndim) + rows.shape)
    batches = []
    for i in itertools.product(*(range(d) for d in outer)):
        extents: tuple[int, ...] = rows.shape[:-1]
        r = tuple(0 if d == 1 else ii for ii, d in zip(i, extents, strict=True))
        batches.append((dst[i], b[i], rows[r]))

    def scatter(table: np.ndarray, values: np.ndarray, idx: np.ndarray) -> None:
        if t in (Type.F32, Type.F16):
            table[idx] = values
        elif t == Type.BF16:
            table[idx] = from_f32(values, t)
        else:
            table[idx] = quantize(values, t).reshape(values.shape[0], *table.shape[1:])

    few = all(idx.size <= FEW_ROWS for _, _, idx in batches) and t in (Type.F32, Type.F16)
    compiled = ctx.compiled  # its one kernel for a cache's rows (a job of a program too)
    if compiled is not None and t in (Type.F32, Type.F16) and len(batches) == 1:
        table, values, idx = batches[0]
        if values.dtype == np.float32 and table.ndim == values.ndim == 2:
            raw = table.view(np.uint16) if t == Type.F16 else table
            signed = idx if signed64 else idx.view(np.int32)
            return SetRowsStep(node, compiled, raw, values, signed)

    if compiled is not None and t in ENCODED and len(batches) == 1:
        table, values, idx = batches[0]
        rows2 = reshape_view(table, (table.shape[0], -1)) if table.ndim == 3 else None
        if rows2 is not None and values.dtype == np.float32 and values.ndim == 2:
            signed = idx if signed64 else idx.view(np.int32)
            return BlockRowsStep(node, compiled, rows2, values, signed)

    def run_few() -> None:
        # a generation step's one row per cache: Python ints beat numpy's masks on so few
        # values; the same check-everything-first rule as run()
        lists = [(idx.astype(np.int64) if signed64 else idx.view(np.int32)).tolist()
                 for _, _, idx in batches]  # fmt: skip
        for (table, _, _), ids in zip(batches, lists, strict=True):
            for i in ids:
                if not 0 <= i < table.shape[0]:
                    raise _index_error(node, IndexError(f"index {i} with {table.shape[0]} rows"))
        for (table, values, _), ids in zip(batches, lists, strict=True):
            for k, i in enumerate(ids):
                table[i] = values[k]

    def run() -> None:
        # every index checked before any row is written: a bad one must not leave the
        # table (a KV cache) half updated
        for table, _, idx in batches:
            if idx.size:
                signed = idx.astype(np.int64) if signed64 else idx.view(np.int32)
                bad = signed[(signed < 0) | (signed >= table.shape[0])]
                if bad.size:
                    raise _index_error(
                        node, IndexError(f"index {int(bad[0])} with {table.shape[0]} rows")
                    )
        for table, values, idx in batches:
            scatter(table, values, idx)

    return run_few if few else run


def build_repeat(node: Tensor, ctx: BuildContext) -> Step:
    """Tile ``a`` onto the node: every axis of the node split into ``(reps, a's extent)``
    (a view) receives ``a`` broadcast over ``reps``; stored values move unchanged."""
    a_t = node.src[0]
    a, out = ctx.view(a_t), ctx.view(node)
    ap = a.reshape((1,) * (out.ndim - a.ndim) + a.shape)
    split_out: list[int] = []
    split_a: list[int] = []
    pairs: list[tuple[int, int]] = list(zip(out.shape, ap.shape, strict=True))
    for do, da in pairs:
        split_out += [do // da, da]
        split_a += [1, da]
    o = reshape_view(out, tuple(split_out))
    src = reshape_view(ap, tuple(split_a))
    assert o is not None and src is not None  # splitting axes never copies
    return partial(np.copyto, o, src)


def build_pad(node: Tensor, ctx: BuildContext) -> Step:
    """Zero the node, then copy ``a`` into its leading corner (converted like a copy)."""
    a_t = node.src[0]
    out = ctx.view(node)
    corner = out[tuple(slice(0, d) for d in a_t.shape)]
    copy = _copy_step(ctx.view(a_t), a_t.type, corner, node.type)

    def run() -> None:
        out.fill(0)  # zero bits are +0.0 in every float type, BF16 included
        copy()

    return run

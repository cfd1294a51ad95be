"""The ``CPU_REPACK`` buffer: memory for matrices stored as the CPU's integer kernels read
them (the layouts of :mod:`.repack`).

The buffer reads and writes tensors in ggml's layout: ``set_tensor`` repacks,
``get_tensor`` unpacks, any byte range of a tensor, so nothing outside the CPU backend
sees the difference. Only the CPU's matrix products read such a tensor
(``supports_op`` says so, and the scheduler places them on the CPU); a model loader
puts matrices here and leaves everything else (token embeddings, read by ``get_rows``)
in ordinary memory, as llama.cpp does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tensorplug.buffer import Buffer, BufferType, BufferUsage
from tensorplug.errors import UnsupportedError
from tensorplug.host import HOST_ALIGNMENT, aligned_bytes
from tensorplug.types import Type

from .repack import GROUP_ROWS, LAYOUTS, PackedLayout, layout_of, packed_size

if TYPE_CHECKING:
    from tensorplug.device import Device
    from tensorplug.tensor import Tensor

__all__ = ["Moves", "RepackBuffer", "RepackBufferType", "pack_blocks", "packed_rows",
           "ready_packing"]  # fmt: skip


#: compiled word moves of blocks into a layout (the CPU's compiled kernels'
#: ``repack_moves``): whether they did it (False: numpy moves them)
Moves = Callable[[PackedLayout, np.ndarray, np.ndarray], bool]


def pack_blocks(
    lay: PackedLayout, blocks: np.ndarray, out: np.ndarray, moves: Moves | None = None
) -> None:
    """:meth:`PackedLayout.pack`, its word moves done by ``moves`` where they can be
    (compiled: a block's moves all done while it is in the cache), in numpy elsewhere;
    the same bytes either way."""
    lay.pack(blocks, out, moved=moves is not None and moves(lay, blocks, out))


def ready_packing(moves: Moves | None) -> None:
    """Have the compiled ``moves`` loaded (or compiled) now, by repacking one block. A
    buffer does this before its memory is allocated: a thread makes that memory's pages
    resident while the loader fills it (:mod:`tensorplug.prefault`), and holds the
    process's memory map meanwhile, which loading machine code would wait for."""
    if moves is not None:
        lay = LAYOUTS[Type.Q4_0]
        blocks = np.zeros((GROUP_ROWS, 1, lay.type.type_size), np.uint8)
        moves(lay, blocks, np.zeros((1, 1, lay.block), np.uint8))


def packed_rows(tensor: Tensor) -> np.ndarray:
    """A repacked tensor's bytes, one group of eight rows per row: ``(G, nb·block)``."""
    buf = tensor.require_allocated()
    if not isinstance(buf, RepackBuffer):
        raise UnsupportedError(f"{tensor.describe()} is not stored repacked (it is in {buf.name})")
    return buf.packed(tensor).reshape(tensor.shape[0] // GROUP_ROWS, -1)


class RepackBufferType(BufferType):
    """``CPU_REPACK``: memory for matrices the CPU's products read repacked. Not host
    memory in ggml's sense (its bytes are not in ggml's layout), so only the CPU device,
    which offers it, uses it; :meth:`accepts` says which tensors it can hold. ``moves``:
    the compiled kernels' block moves (:func:`pack_blocks`), where there are any."""

    def __init__(self, device: Device, moves: Moves | None = None) -> None:
        super().__init__(device)
        self.moves = moves

    @property
    def name(self) -> str:
        return "CPU_REPACK"

    @property
    def alignment(self) -> int:
        return HOST_ALIGNMENT

    def accepts(self, tensor: Tensor) -> bool:
        return layout_of(tensor) is not None

    def alloc_size(self, tensor: Tensor) -> int:
        lay = layout_of(tensor)
        return tensor.nbytes if lay is None else packed_size(tensor, lay)

    def _alloc_buffer(self, size: int) -> RepackBuffer:
        ready_packing(self.moves)  # before the memory (see there)
        # weights, every byte written as they load: on huge pages they stream faster
        return RepackBuffer(self, aligned_bytes(size, self.name, huge_pages=True))


class RepackBuffer(Buffer):
    """Host memory whose tensors are stored repacked (see the module's docstring)."""

    def __init__(self, buft: RepackBufferType, data: np.ndarray) -> None:
        super().__init__(buft, int(data.nbytes), BufferUsage.WEIGHTS)
        self.moves = buft.moves
        self.data = data
        # the tensors placed here (offset → tensor): clear() writes each in its layout
        self._placed: dict[int, Tensor] = {}

    @property
    def base(self) -> int:
        return int(self.data.ctypes.data)

    def layout(self, tensor: Tensor) -> PackedLayout:
        lay = layout_of(tensor)
        if lay is None:
            kinds = ", ".join(t.name for t in LAYOUTS)
            raise UnsupportedError(
                f"{self.name} cannot hold {tensor.describe()}: it stores 2-d contiguous "
                f"matrices of {kinds} whose row count is a multiple of {GROUP_ROWS}; place "
                "this tensor in the CPU's ordinary buffer type instead"
            )
        return lay

    def packed(self, tensor: Tensor) -> np.ndarray:
        """The tensor's repacked blocks, ``(G, nb, block)`` (a view)."""
        lay = self.layout(tensor)
        groups, nb = tensor.shape[0] // GROUP_ROWS, tensor.shape[1] // lay.type.block_size
        start = tensor.offset
        if tensor.view_src is not None:  # whole groups of its base (checked by init_tensor)
            base = tensor.view_src
            start = base.offset + tensor.view_offs // (GROUP_ROWS * base.row_bytes) * nb * lay.block
        mem = self.data[start : start + packed_size(tensor, lay)]
        return mem.reshape(groups, nb, lay.block)

    def _init_tensor(self, tensor: Tensor) -> None:
        if tensor.view_src is not None:
            self._check_view(tensor)
            return
        self.layout(tensor)
        self._placed[tensor.offset] = tensor

    def _check_view(self, view: Tensor) -> None:
        """Refuse a view that would not be exact. A view's offset and shape count bytes in
        ggml's layout, which this memory does not hold: a group of eight rows is one run
        of bytes (longer than eight rows for Q4_K), so only whole groups of the base's
        rows — ``8·k`` full rows from a row that is a multiple of 8 — map onto the stored
        bytes; any other view would read and write the wrong ones."""
        base = view.view_src
        assert base is not None
        group = GROUP_ROWS * base.row_bytes
        whole_groups = (
            len(base.shape) == 2 and len(view.shape) == 2 and view.type == base.type
            and view.is_contiguous and view.shape[1] == base.shape[1]
            and view.shape[0] > 0 and view.shape[0] % GROUP_ROWS == 0
            and view.view_offs % group == 0
        )  # fmt: skip
        if not whole_groups:
            raise UnsupportedError(
                f"{self.name} cannot give view {view.describe()} (byte offset "
                f"{view.view_offs}) of {base.describe()}: this memory stores each "
                f"{GROUP_ROWS} rows interleaved, so a view must be whole rows in groups of "
                f"{GROUP_ROWS} starting at a row that is a multiple of {GROUP_ROWS} (byte "
                f"offset a multiple of {group}); view such rows, or read the tensor with "
                "get_array() and slice the copy"
            )

    def _reset(self) -> None:
        self._placed.clear()

    def _groups(self, tensor: Tensor, offset: int, size: int) -> tuple[int, int, int]:
        """The bytes of a group of eight rows in ggml's layout, and the first and
        past-the-last group that bytes ``offset..offset+size`` fall in."""
        group = tensor.nbytes // (tensor.shape[0] // GROUP_ROWS)
        return group, offset // group, -(-(offset + size) // group)

    def _natural(self, tensor: Tensor, g0: int, g1: int) -> np.ndarray:
        """Groups ``g0..g1-1`` of the tensor in ggml's layout (a new array)."""
        lay = self.layout(tensor)
        nb = tensor.shape[1] // lay.type.block_size
        out = np.empty(((g1 - g0) * GROUP_ROWS, nb, lay.type.type_size), np.uint8)
        lay.unpack(self.packed(tensor)[g0:g1], out)
        return out

    def _write(self, tensor: Tensor, offset: int, size: int, fill: np.ndarray | int) -> None:
        """Bytes ``offset..offset+size`` of the tensor in ggml's layout become ``fill``
        (bytes, or one byte value); groups only partly covered are unpacked, patched
        and packed again."""
        lay = self.layout(tensor)
        group, g0, g1 = self._groups(tensor, offset, size)
        if isinstance(fill, np.ndarray) and offset % group == 0 and size % group == 0:
            natural = fill.reshape(-1, tensor.shape[1] // lay.type.block_size, lay.type.type_size)
        else:
            natural = self._natural(tensor, g0, g1)
            start = offset - g0 * group
            natural.reshape(-1)[start : start + size] = fill
        pack_blocks(lay, natural, self.packed(tensor)[g0:g1], self.moves)

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        self._write(tensor, offset, len(data), np.frombuffer(data, dtype=np.uint8))

    def _get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        group, g0, g1 = self._groups(tensor, offset, len(out))
        start = offset - g0 * group
        natural = self._natural(tensor, g0, g1).reshape(-1)
        np.frombuffer(out, dtype=np.uint8)[...] = natural[start : start + len(out)]

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._write(tensor, offset, size, value)

    def _clear(self, value: int) -> None:
        self.data[...] = value
        for tensor in self._placed.values():  # filled in ggml's layout, stored in ours
            self._write(tensor, 0, tensor.nbytes, np.full(tensor.nbytes, value, np.uint8))

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        sbuf = src.buffer
        if sbuf is None or not sbuf.is_host or (src.type, src.shape) != (dst.type, dst.shape):
            return False
        mem = sbuf.host_array()[src.offset : src.offset + src.nbytes]
        self._write(dst, 0, dst.nbytes, mem)
        return True

    def _free(self) -> None:
        self.data = np.empty(0, dtype=np.uint8)
        self._placed.clear()
